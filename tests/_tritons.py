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


def _no_triton() -> str | None:
    from swa_backends.common.registry import import_reason

    return import_reason("triton", attr="jit", what="Triton")


#: Why the Triton tests cannot run here (None: Triton is importable). Interpreted on a CPU
#: (conftest sets TRITON_INTERPRET=1), compiled on a GPU; offline compiles run in their own
#: processes, compiled mode.
NO_TRITON = _no_triton()
