"""The pack's decision for a vLLM configuration, without starting a server.

``python -m swa_backends.integrations.vllm [--swa-device D] [--swa-platform P] <vllm serve engine arguments>``
builds vLLM's ``VllmConfig`` from the same engine arguments ``vllm serve`` takes
(``EngineArgs``) and prints, as JSON, the ``ServingConfig`` the integration derives, the
pack's encoder/decoder decision with its reasons, and what vLLM itself does with encoder
replay. ``--swa-device``: a fake ``platform:arch`` (``cuda:sm90``, ``rocm:gfx942``) to judge
another machine (default: vLLM's device here; the ``--swa-`` prefix keeps clear of vLLM's own
``--device``); ``--swa-platform``: the platform vLLM's own encoder gate assumes. Run it where
vLLM can build the config (the model's config files reachable; a device vLLM recognises, or
``--swa-device``).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from .config import decide

    parser = FlexibleArgumentParser(prog="python -m swa_backends.integrations.vllm", description=__doc__)
    parser.add_argument("--swa-device", dest="swa_device", default=None,
                        help="a platform:arch to decide for (cuda:sm90, rocm:gfx942, ...); default vLLM's device")
    parser.add_argument("--swa-platform", dest="swa_platform", default=None,
                        help="vLLM's platform for its own encoder gate (cuda, rocm); default this process's")
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    engine_args = EngineArgs.from_cli_args(args)
    cfg = engine_args.create_engine_config()
    platform = args.swa_platform
    if platform is None and args.swa_device:
        platform = args.swa_device.split(":", 1)[0]
    d = decide(cfg, args.swa_device, platform=platform)
    json.dump(d.as_dict(), sys.stdout, indent=2, default=str)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
