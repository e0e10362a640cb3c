"""The pack's decision for a vLLM configuration on a device, without starting a server.

``python -m swa_backends.integrations.vllm [--swa-device D] [--swa-platform P] <vllm serve engine arguments>``
builds vLLM's ``VllmConfig`` from the engine arguments ``vllm serve`` takes (``EngineArgs``;
a model id or a local directory with its ``config.json``, no weights read) and prints, as
JSON, the ``ServingConfig`` the integration derives, the pack's encoder/decoder decision with
its reasons, and what vLLM itself does with encoder replay, for the device ``--swa-device``
names (``cuda:sm90``, ``rocm:gfx942``, ...; default: vLLM's device here; the ``--swa-`` prefix
keeps clear of vLLM's own ``--device``). ``--swa-platform``: the platform vLLM's own encoder
gate assumes (default: the device's).

It runs on any machine with vLLM: where vLLM finds no platform (a machine without a GPU) it
builds the config on vLLM's CPU platform (``VLLM_TARGET_DEVICE=cpu``), and for a device on
another platform than the one the config was built on it re-derives, by the installed
release's own rules for that platform (its subpackage's ``target``), the fields vLLM resolves
per platform (model runner, graph mode, async scheduling, prefix caching; :mod:`.target`). The
JSON's ``inferred`` lists each with its value and rule, ``built_on`` the platform the config was
built on, ``release`` the release whose rules and seam table answered (the newest supported
for a vLLM without a subpackage), ``vllm_differs`` any seam of the installed vLLM that differs
from that release's pins (where the integration would leave vLLM untouched). Any error -- a
bad argument, an unreachable model id, vLLM refusing the configuration -- is one line on stderr
and exit status 1. vLLM's own log is quiet below ERROR
unless ``VLLM_LOGGING_LEVEL`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

PROG = "python -m swa_backends.integrations.vllm"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or repr(exc)
    if len(text) > 400:
        text = text[:397] + "..."
    return f"{type(exc).__name__}: {text}"


def _platform_of(current_platform) -> str:
    if current_platform.is_cuda():
        return "cuda"
    if current_platform.is_rocm():
        return "rocm"
    if current_platform.is_cpu():
        return "cpu"
    kind = str(getattr(current_platform, "device_type", "") or "unknown")
    return "ascend" if kind == "npu" else kind


def _choose_platform() -> str | None:
    """Where vLLM would find no platform, its CPU platform (``VLLM_TARGET_DEVICE=cpu``, set in
    this process before vLLM resolves one); returns why, or None when vLLM finds one."""
    if os.environ.get("VLLM_TARGET_DEVICE"):
        return None
    from vllm.platforms import resolve_current_platform_cls_qualname

    if resolve_current_platform_cls_qualname().rsplit(".", 1)[-1] != "UnspecifiedPlatform":
        return None
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    return "vLLM finds no platform here: the config is built on its CPU platform (VLLM_TARGET_DEVICE=cpu)"


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - every vLLM or network error is one line
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--swa-device", dest="swa_device", default=None)
    pre.add_argument("--swa-platform", dest="swa_platform", default=None)
    ours, _ = pre.parse_known_args(argv)
    target = None
    if ours.swa_device is not None:  # a bad device is refused before vLLM is imported
        from ...common.device import resolve_device

        target = resolve_device(ours.swa_device)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if os.environ["VLLM_LOGGING_LEVEL"].upper() in ("ERROR", "CRITICAL"):
        # the plugin's install line is about this machine, not the device asked about
        logging.getLogger("vllm.swa_backends").setLevel(logging.ERROR)
    why_cpu = _choose_platform()

    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from . import current_release, seams
    from .config import decide
    from .target import INFERRED_PLATFORMS, Given, infer

    release = current_release()
    table = release.seams

    parser = FlexibleArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--swa-device", dest="swa_device", default=None,
                        help="a platform:arch to decide for (cuda:sm90, rocm:gfx942, ...); default vLLM's device here")
    parser.add_argument("--swa-platform", dest="swa_platform", default=None,
                        help="vLLM's platform for its own encoder gate (cuda, rocm); default the device's")
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    engine_args = EngineArgs.from_cli_args(args)
    given = Given.from_engine_args(engine_args)  # before vLLM fills in its defaults
    cfg = engine_args.create_engine_config()

    built_on = _platform_of(current_platform)
    device = target if target is not None else getattr(cfg.device_config, "device", None)
    if target is None:
        from ...common.device import resolve_device

        target = resolve_device(device)
    on = target.platform
    inferred: dict = {}
    view = cfg
    if on != built_on:
        if on in INFERRED_PLATFORMS:
            view, inferred = infer(cfg, given, on, release.target)
        else:
            inferred = {"note": f"vLLM's resolution on {on} is its platform plugin's: the fields vLLM resolves per "
                                f"platform are {built_on}'s"}
    platform = args.swa_platform or (on if on in INFERRED_PLATFORMS else None)
    d = decide(view, target, platform=platform)
    report = d.as_dict()
    report["built_on"] = built_on + (f" ({why_cpu})" if why_cpu else "")
    report["inferred"] = inferred
    report["release"] = release.RELEASE
    seam_platform = on if on in INFERRED_PLATFORMS else None
    report["vllm_differs"] = (seams.check(table.SEAMS, files=table.FILES, platform=seam_platform)
                              + seams.check(table.SEAMS, files=table.FILES, scope="cli"))
    json.dump(report, sys.stdout, indent=2, default=str)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
