"""``--smoke`` on a machine without a GPU: the script runs under Triton's interpreter.

Triton reads ``TRITON_INTERPRET`` when it decorates a kernel, so a script calls
:func:`use_interpreter` before anything imports Triton (``import swa_backends`` does not):

    from lib import smoke
    smoke.use_interpreter()  # before Triton loads
    import triton  # noqa: E402

This module imports nothing but the standard library at import time for that reason.
:func:`run_script` runs a script in this process (the CPU tests' way of running ``--smoke``).
"""

from __future__ import annotations

import os
import sys


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def use_interpreter(argv: list[str] | None = None, environ=None) -> bool:
    """Set ``TRITON_INTERPRET=1`` for this process when ``--smoke`` is among ``argv`` (default
    ``sys.argv[1:]``), there is no GPU and the variable is unset; True when it set it."""
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    if "--smoke" in argv and "TRITON_INTERPRET" not in environ and not _has_gpu():
        environ["TRITON_INTERPRET"] = "1"
        return True
    return False


def interpreted(environ=None) -> bool:
    """Whether Triton runs interpreted in this process."""
    return (os.environ if environ is None else environ).get("TRITON_INTERPRET", "0") == "1"


def refusal(smoke: bool, *, cpu_only: bool = True, environ=None) -> str | None:
    """Why this run cannot go on (None: it can): a GPU run without a GPU, a ``--smoke`` run on a
    GPU (``cpu_only``: the interpreter is process-wide) or on a CPU whose ``TRITON_INTERPRET``
    is set to something other than 1."""
    gpu = _has_gpu()
    if not smoke:
        return None if gpu else "needs a CUDA GPU (or --smoke: small sizes on a CPU through Triton's interpreter)"
    if gpu:
        return "--smoke runs on a CPU-only machine (Triton's interpreter is process-wide)" if cpu_only else None
    if not interpreted(environ):
        return "--smoke on a CPU needs Triton's interpreter: TRITON_INTERPRET is set to something other than 1"
    return None


def run_script(script, *args: str) -> int:
    """Run ``script`` in this process as ``python script args...`` runs it (its folder first on
    ``sys.path``, ``sys.argv`` set, as ``__main__``) and return its exit status; what a run
    changes process-wide (``sys.argv``, ``sys.path``, the environment, torch's thread count, the
    pack's validation setting, :mod:`lib.timing`'s smoke mode) is put back afterwards. An
    exception the script does not catch propagates. What the CPU test suite uses to check a
    script's ``--smoke`` without starting an interpreter per script."""
    import runpy
    from pathlib import Path

    import torch

    from swa_backends.common.validation import set_validation, validation_enabled

    from . import timing

    script = Path(script).resolve()
    saved = (sys.argv, list(sys.path), dict(os.environ), torch.get_num_threads(), validation_enabled(),
             timing.smoke())
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    finally:
        argv, path, environ, threads, validated, smoke_mode = saved
        sys.argv = argv
        sys.path[:] = path
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
        set_validation(validated)
        timing.set_smoke(smoke_mode)
