"""Where a run's raw result goes and what it says about the machine that made it.

Every script writes one JSON whose ``meta`` starts with :func:`machine` (date, commit, device,
versions), so a result read months later names what produced it; ``bench/results/<device>/``
keeps the latest such file per benchmark (bench/README.md, "Where raw results go").
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

#: the repository root (this file is bench/lib/results.py)
ROOT = Path(__file__).resolve().parents[2]


def gmean(values) -> float:
    """Geometric mean of positive ``values`` (the ratios a summary averages)."""
    values = list(values)
    if not values:
        raise ValueError("values: empty; expected at least one ratio")
    return math.exp(sum(map(math.log, values)) / len(values))


def log(*a) -> None:
    print(*a, flush=True)


def git_commit() -> str:
    """``$SWA_COMMIT`` (the GPU machine's copy has no git history), else the checkout's HEAD."""
    env = os.environ.get("SWA_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001 - no git, no checkout: the result still says so
        return "unknown"


def file_sha(path: Path) -> str:
    """First 16 hex digits of the file's sha256 ("unknown" when it cannot be read)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return "unknown"


def machine(dev=None) -> dict:
    """Date (UTC), commit, device (name, capability, SMs) and versions of this run."""
    gpu = dev is not None and torch.device(dev).type == "cuda" and torch.cuda.is_available()
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    props = torch.cuda.get_device_properties(dev) if gpu else None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "device": torch.cuda.get_device_name(dev) if gpu else "cpu",
        "capability": list(torch.cuda.get_device_capability(dev)) if gpu else None,
        "sms": props.multi_processor_count if gpu else None,
        "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None), "python": platform.python_version(), "host": platform.node(),
    }


def command_line() -> list[str]:
    """``sys.argv`` with the GPU machine's output folder written ``$OUT`` (a result names no path
    of the machine that made it)."""
    out = os.environ.get("OUT")
    return [a.replace(out, "$OUT") if out else a for a in sys.argv]


def out_file(out, name: str) -> Path:
    """``out`` itself when it names a ``.json`` file (its folder created), else ``out/name``
    (``out`` created)."""
    out = Path(out)
    if out.suffix == ".json":
        out.parent.mkdir(parents=True, exist_ok=True)
        return out
    out.mkdir(parents=True, exist_ok=True)
    return out / name


def write_json(path: Path, result: dict) -> Path:
    path = Path(path)
    path.write_text(json.dumps(result, indent=1, default=str))
    return path
