"""The environment of a child process the vLLM tests start (no vLLM import)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def child_env(drop: tuple[str, ...] = (), **values: str) -> dict[str, str]:
    """This process's environment without ``drop`` and the integration's switches, with
    ``values`` set. ``PYTHONPATH`` keeps its entries but the repository root (which would put
    the pack's ``kernels/`` where transformers looks for the hub package ``kernels``): a path
    that holds this checkout as ``swa_backends`` makes the child import this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "SWA_BACKENDS_VLLM", *drop)}
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    if keep:
        env["PYTHONPATH"] = os.pathsep.join(keep)
    else:
        env.pop("PYTHONPATH", None)
    env.update(values)
    return env
