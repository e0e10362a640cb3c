"""The Python interpreters whose Triton the offline-compile tests run: this one, plus any
named in ``SWA_EXTRA_TRITON_PYTHONS`` (``os.pathsep``-separated; e.g. the python of a venv
with ``triton==3.6.0``, the version on the H200 bench machine). Interpreters that do not
exist are skipped, so CI (one Triton, variable unset) runs one case."""

from __future__ import annotations

import os
import subprocess
import sys

DEFAULT_EXTRA = ""


def pythons() -> list[str]:
    extra = os.environ.get("SWA_EXTRA_TRITON_PYTHONS", DEFAULT_EXTRA)
    out = [sys.executable]
    for p in filter(None, extra.split(os.pathsep)):
        if p not in out:
            out.append(p)
    return out


def triton_version(python: str) -> str | None:
    """``triton.__version__`` under ``python``; None when it is missing or has no Triton."""
    if python != sys.executable and not os.path.exists(python):
        return None
    try:
        res = subprocess.run([python, "-c", "import triton; print(triton.__version__)"], capture_output=True,
                             text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None


def ids(python: str) -> str:
    return "this-python" if python == sys.executable else python
