"""The pack's own C launcher for its Triton kernels (``_claunch.c``), built on first use.

Why: the metadata kernels launch once or twice per serving step on a host-bound path. With
Triton's compiled launcher the pack's shortcut (``_launch.Kernel``) still pays, per launch,
a Python call carrying every argument, one ``tensor.data_ptr()`` per pointer in Python,
then Triton's ``PyArg_ParseTuple`` of ~35 arguments, a GIL release and ``cuLaunchKernelEx``.
``Launcher`` does one C call: it reads each tensor's ``data_ptr()`` itself, packs the
parameters from a kinds string made once per compiled kernel, and calls ``cuLaunchKernel``.

When it is used (``launcher_for``): CUDA kernels compiled by a Triton whose launcher
layout is known (3.6 and 3.9: every non-constexpr argument in signature order, then the
global and profile scratch pointers; ``tests/test_claunch.py`` checks that against the
installed Triton's driver source), one CTA per cluster, no cooperative grid, no PDL, no
scratch, no tensor descriptors, scalar types it can pack. Anything else keeps the existing
path (Triton's launcher), and so does every launch when the module cannot be built.

Build: ``cc`` (``$CC`` if set) compiles the file against this Python's headers into
``$SWA_CACHE_DIR`` (default ``$XDG_CACHE_HOME/swa_backends``, else
``~/.cache/swa_backends``), named by a hash of the source, the Python version and the
compiler, written atomically; later processes load it. Nothing is built at import:
``load()`` runs on the first shortcut launch of a CUDA kernel. ``SWA_TRITON_C_LAUNCH=0``
turns the launcher off; a build failure is kept as ``reason()`` (and the launch goes
through Triton's launcher as before).

The driver's functions arrive as addresses taken from ``libcuda.so.1`` with ctypes, so the
C file includes no CUDA header: it builds, and its argument packing is tested, on machines
without CUDA (the module carries a recording launch function for that).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ENABLED = os.environ.get("SWA_TRITON_C_LAUNCH", "1") != "0"
SOURCE = Path(__file__).with_name("_claunch.c")
NAME = "_swa_claunch"
#: Triton versions whose CUDA launcher layout was read and is tested (see the module doc).
KNOWN_TRITONS = ("3.6.", "3.9.")
#: Scalar signature types and their kinds in ``_claunch.c``.
SCALAR_KINDS = {"i1": "b", "u1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u32": "I", "u64": "L",
                "fp32": "f", "f32": "f", "fp64": "d", "f64": "d"}  # (u8 / u16: Triton's launcher)

_module = None
_reason: str | None = None
_driver: tuple[int, int, int] | None = None


def cache_dir() -> Path:
    explicit = os.environ.get("SWA_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "swa_backends"


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return cc.split()[0] if shutil.which(cc.split()[0]) else None
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def load():
    """The compiled module, building it if needed; None (see :func:`reason`) where it
    cannot be built or loaded, or is turned off."""
    global _module, _reason
    if _module is not None or _reason is not None:
        return _module
    if not ENABLED:
        _reason = "turned off (SWA_TRITON_C_LAUNCH=0)"
        return None
    try:
        _module = _build_and_import()
    except Exception as exc:  # noqa: BLE001 -- any failure keeps Triton's launcher; the reason says why
        _reason = f"{type(exc).__name__}: {exc}"
    return _module


def reason() -> str | None:
    """Why :func:`load` gave None (None when it gave the module or was not called yet)."""
    return _reason


def _build_and_import():
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (cc, gcc, clang or $CC)")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise RuntimeError(f"Python.h not found in {include} (install the Python development headers)")
    src = SOURCE.read_bytes()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    tag = hashlib.sha256(src + sys.version.encode() + cc.encode()).hexdigest()[:16]
    target = cache_dir() / f"{NAME}.{tag}{suffix}"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=suffix, dir=target.parent)
        os.close(fd)
        try:
            cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(SOURCE), "-o", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd[:2])} ... failed: {proc.stderr.strip()[-600:]}")
            os.replace(tmp, target)  # atomic: a concurrent process loads a whole file or builds its own
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    spec = importlib.util.spec_from_file_location(NAME, target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Launch with ``cuLaunchKernelEx`` (as Triton does) instead of ``cuLaunchKernel``
#: (``SWA_TRITON_C_LAUNCH_EX=0``); both are timed by bench/bench_triton_ops.py.
EX = os.environ.get("SWA_TRITON_C_LAUNCH_EX", "1") != "0"


def _driver_functions() -> tuple[int, int, int]:
    """Addresses of ``cuLaunchKernel``, ``cuCtxGetCurrent`` and ``cuLaunchKernelEx`` in the
    CUDA driver."""
    global _driver
    if _driver is None:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        _driver = tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                        for name in ("cuLaunchKernel", "cuCtxGetCurrent", "cuLaunchKernelEx"))
    return _driver


def kinds(signature: dict, names: list[str], first_args: tuple) -> bytes | None:
    """The kinds string of a compiled kernel: one letter per argument the caller passes
    (``names``, constexprs included), from Triton's ``signature`` (name -> type) and the
    arguments of the key's first launch (a pointer that was a tensor stays one; one that
    was None, a constexpr to Triton, must stay None). None for a type it cannot pack."""
    out = []
    for name, arg in zip(names, first_args):
        ty = signature.get(name)
        if ty is None:
            return None
        if ty == "constexpr":
            out.append("z" if name.endswith("_ptr") and arg is None else "x")
        elif isinstance(ty, str) and ty.startswith("*"):
            out.append("p")
        elif ty in SCALAR_KINDS:
            out.append(SCALAR_KINDS[ty])
        else:
            return None  # tuples, tensor descriptors, fp16/bf16 scalars: Triton's launcher
    if len(out) != len(names) or len(names) != len(first_args):
        return None
    return "".join(out).encode()


def launcher_for(ck, names: list[str], first_args: tuple, *, stub: bool = False):
    """A ``Launcher`` for compiled kernel ``ck`` (``launcher(grid, stream, *args)``), or None
    where the pack's launcher does not apply (then the caller keeps Triton's). ``stub``:
    its driver call is the module's recording function (host-time profiling: nothing is
    launched)."""
    import triton

    if not triton.__version__.startswith(KNOWN_TRITONS):
        return None
    from ._launch import direct_call

    run = getattr(ck, "run", None)
    src = getattr(ck, "src", None)
    if direct_call(run) is None or src is None or getattr(run, "num_ctas", 1) != 1:
        return None  # not Triton's CUDA launcher, or it allocates scratch / runs GSan
    if getattr(run, "launch_cooperative_grid", False) or getattr(run, "launch_pdl", False):
        return None
    num_warps, num_ctas, shared = ck.packed_metadata
    if num_ctas != 1:
        return None
    k = kinds(dict(src.signature), names, first_args)
    if k is None:
        return None
    module = load()
    if module is None:
        return None
    launch, ctx, launch_ex = module.test_doubles() if stub else _driver_functions()
    return module.Launcher(ck.function, launch_ex if EX else launch, ctx, 32 * num_warps, shared, k, 2, EX)
