"""The Python interpreters whose Triton the offline-compile tests run: this one, plus any
named in ``SWA_EXTRA_TRITON_PYTHONS`` (``os.pathsep``-separated; e.g. the python of a venv
with ``triton==3.6.0``, the version on the H200 bench machine). Interpreters that do not
exist are skipped, so CI (one Triton, variable unset) runs one case.

The compile scripts (``tests/kernels/aot_compile*.py``, ``tests/backends/ascend/aot_compile_ascend.py``)
import the installed pack, so another interpreter needs this checkout installed in its environment
(``<python> -m pip install -e . --no-deps``); :func:`triton_version` skips the test, saying
so, when it is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEFAULT_EXTRA = ""
ROOT = Path(__file__).resolve().parents[2]

# What another interpreter reports: its Triton, and where its swa_backends comes from ("" when
# the pack is not importable there). Run outside the checkout so the working directory adds nothing.
_PROBE = """
import os, sys
import triton
print(triton.__version__)
try:
    import swa_backends
except ImportError:
    print("")
else:
    print(os.path.dirname(os.path.realpath(swa_backends.__file__)))
"""


def pythons() -> list[str]:
    extra = os.environ.get("SWA_EXTRA_TRITON_PYTHONS", DEFAULT_EXTRA)
    out = [sys.executable]
    for p in filter(None, extra.split(os.pathsep)):
        if p not in out:
            out.append(p)
    return out


def _install_hint(python: str) -> str:
    return f"install the pack into that environment: {python} -m pip install -e . --no-deps (from {ROOT})"


def triton_version(python: str) -> str | None:
    """``triton.__version__`` under ``python``; None when it is missing or has no Triton.

    When ``python`` has Triton but imports no ``swa_backends``, or one from another checkout,
    the calling test is skipped (``pytest.skip``) with the command that installs this one."""
    if python != sys.executable and not os.path.exists(python):
        return None
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if python != sys.executable:
        env.pop("PYTHONPATH", None)  # that environment's own packages only
    try:
        res = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120, env=env,
                             cwd=os.path.dirname(os.path.abspath(python)) or None)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        return None
    version = lines[0].strip()
    where = lines[1].strip() if len(lines) > 1 else ""
    if python != sys.executable and Path(where or "/nonexistent").resolve() != ROOT:
        import pytest

        why = "swa_backends is not importable there" if not where else f"its swa_backends is {where}, not {ROOT}"
        pytest.skip(f"{python} (Triton {version}): {why}; {_install_hint(python)}")
    return version


def run_compile_script(python: str, script, *args: str, timeout: int = 900, cwd=None):
    """``(triton version, CompletedProcess)`` of ``python script *args`` in compiled mode
    (TRITON_INTERPRET removed from the environment); the calling test is skipped when
    ``python`` is missing or has no Triton (see :func:`triton_version`)."""
    version = triton_version(python)
    if version is None:
        import pytest

        pytest.skip(f"{python}: no such interpreter, or no Triton there")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([python, str(script), *args], env=env, capture_output=True, text=True, timeout=timeout,
                         cwd=cwd)
    return version, out


def ids(python: str) -> str:
    return "this-python" if python == sys.executable else python


def _no_triton() -> str | None:
    from swa_backends.common.registry import import_reason

    return import_reason("triton", attr="jit", what="Triton")


#: Why the Triton tests cannot run here (None: Triton is importable). Interpreted on a CPU
#: (conftest sets TRITON_INTERPRET=1), compiled on a GPU; offline compiles run in their own
#: processes, compiled mode.
NO_TRITON = _no_triton()
