"""Compile the two Gluon sparse-MLA kernels (variants ``gluon`` and ``gluon_ws``) for sm_90a
on a machine without the GPU (``python tests/kernels/aot_compile_sparse_mla_gluon.py [--report]
[--dump DIR]``).

Runs the real launcher (``kernels.sparse_mla_gluon.launch(..., warmup=True)``) on CPU
tensors with the kernel's ``warmup`` replaced by an offline ``triton.compile`` of a
``GluonASTSource`` (Triton's own binder and specialisation), for both kernels with and
without a sink, the ws kernel with both gather widths. One line per compiled kernel with its
shared memory; ``--report`` adds registers, spills, HGMMA shapes, LDGSTS and barrier counts
(the same reading of ptxas and the SASS as ``aot_compile_sparse_mla.py``); ``--dump DIR``
writes the TTGIR, PTX and SASS of each. Fails when a kernel does not compile, needs more than
the H200's 227 KB of shared memory, spills or makes ptxas serialise its wgmma. Exit 0 with
``SKIP:`` when this Triton has no Gluon Hopper API. Own process: compiled mode.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("aot_compile_sparse_mla_gluon: TRITON_INTERPRET=1 is set; Gluon kernels compile only")

import swa_backends  # noqa: E402,F401  (the installed pack: pip install -e . in this environment)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import aot_compile  # noqa: E402  (this folder: first on sys.path when run as a script or from its tests)

SMEM_LIMIT = 232448


class _Compiled(Exception):
    """Raised by the offline compile in place of the launch that would follow it."""


def _report(k) -> tuple[str, int]:
    from aot_compile_sparse_mla import sass_report

    line = sass_report(k)
    spill = line.split("spill=")[1].split()[0]
    stores = int(spill.split("/")[0]) if "/" in spill else -1
    return line, stores


def _ptxas_notes(k) -> str:
    """ptxas -v's performance notes (C7515: wgmma serialised) for the kernel's PTX."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"
        ptx.write_text(k.asm["ptx"])
        v = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(ptx), "-o", str(Path(d) / "o.cubin")],
                           capture_output=True, text=True).stderr
    return " ".join(ln.split("info    :")[-1].strip()[:60] for ln in v.splitlines() if "Performance Loss" in ln)


def _sass(k) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    cuobjdump = Path(get_ptxas(90).path).parent / "cuobjdump"
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(k.asm["cubin"])
        return subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True).stdout


def main(argv: list[str]) -> int:
    report = "--report" in argv
    dump = Path(argv[argv.index("--dump") + 1]) if "--dump" in argv else None
    try:
        G = importlib.import_module("swa_backends.kernels.sparse_mla_gluon")
        WS = importlib.import_module("swa_backends.kernels.sparse_mla_gluon_ws")
    except ImportError as exc:
        print(f"SKIP: no Gluon in this Triton ({exc})")
        return 0
    reason = WS.api_reason()
    if reason:
        print(f"SKIP: {reason}")
        return 0
    from triton.experimental.gluon._runtime import GluonASTSource

    target = GPUTarget("cuda", 90, 32)
    failures: list[str] = []
    count = 0

    def compile_offline(fn, name, sink_on, args, kwargs, wide=None, gated=False):
        nonlocal count
        k, seconds = aot_compile.compile_specialised(fn, target, aot_compile.specialise(fn, target, args, kwargs),
                                                     source=GluonASTSource)
        count += 1
        shared = k.metadata.shared
        label = f"{name}{' sink' if sink_on else ''}{' wide' if wide else ''}{' gated' if gated else ''}"
        extra = ""
        if report:
            extra, stores = _report(k)
            extra = " " + extra
            # no spills with any Triton: the persistent ws kernel with 780 B of spilled wgmma
            # descriptors ran slower than one item per program (H200, Triton 3.6)
            if stores > 0:
                failures.append(f"{label}: spills ({extra.strip()})")
            sass = _sass(k)
            depbar = sass.count("WARPGROUP.DEPBAR")
            notes = _ptxas_notes(k)
            extra += (f" wgmma_waits={depbar} MEMBAR={sass.count('MEMBAR')}" + (f" PTXAS: {notes}" if notes else ""))
            if notes:  # e.g. C7515: every wgmma of the kernel waits for the previous one
                failures.append(f"{label}: ptxas {notes}")
        fits = shared <= SMEM_LIMIT
        if not fits:
            failures.append(f"{label}: {shared} B of shared memory > {SMEM_LIMIT}")
        print(f"cuda:90 {fn.fn.__name__} [{label}] smem={shared} {'fits' if fits else 'DOES NOT FIT'} "
              f"{seconds:.1f}s{extra}", flush=True)
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            stem = dump / label.replace(" ", "_")
            for ext in ("ttgir", "ptx"):
                Path(f"{stem}.{ext}").write_text(k.asm[ext])
            Path(f"{stem}.sass").write_text(_sass(k))
        raise _Compiled  # compiled: stop the variant before it launches on CPU tensors

    kernels = {"gluon": (G._sparse_mla_gluon_fwd, "sparse_mla"), "gluon_ws": (WS._sparse_mla_gluon_ws_fwd, "sparse_mla")}
    real_wide = WS.wide_gathers
    plan = [("gluon", sink_on, None, False) for sink_on in (False, True)]
    plan += [("gluon_ws", sink_on, wide, False) for wide in (False, True) for sink_on in (False, True)]
    # the validated call's specialisations (behind its device check): one per gather width
    plan += [("gluon_ws", True, False, True), ("gluon_ws", False, True, True)]
    for name, sink_on, wide, gated in plan:
        fn = kernels[name][0]
        H, T = 128, 2
        q = torch.zeros(T, H, 512, dtype=torch.bfloat16)
        kv = torch.zeros(64, 512, dtype=torch.bfloat16)
        idx = torch.zeros(T, 640, dtype=torch.int32)
        lens = torch.full((T,), 640, dtype=torch.int32)
        sink = torch.zeros(H) if sink_on else None
        saved = fn.warmup
        fn.warmup = (lambda *a, grid, fn=fn, name=name, sink_on=sink_on, wide=wide, gated=gated, **kw:  # noqa: E731
                     compile_offline(fn, name, sink_on, a, kw, wide, gated))
        module = WS if name == "gluon_ws" else G
        WS.wide_gathers = real_wide if wide is None else (lambda kv, wide=wide: wide)  # CPU tensors: no L2 to ask
        try:  # the variant itself: its first call compiles (warmup) before it launches
            module._BUILT.clear()
            gate = {"gate": torch.zeros(1, dtype=torch.int32)} if gated else {}
            module.sparse_mla(q, kv, idx, lens, 0.04, 512, sink=sink, **gate)
        except Exception as exc:  # a compile error is the finding
            if isinstance(exc.__cause__, _Compiled):  # the variant turned it into KernelUnavailable
                continue
            msg = str(exc).strip().splitlines()
            if os.environ.get("SWA_AOT_TRACE"):
                traceback.print_exc()
            failures.append(f"{name}{' sink' if sink_on else ''}{' wide' if wide else ''}{' gated' if gated else ''}: "
                            f"{type(exc).__name__}: "
                            f"{' | '.join(msg[-6:])[:1500] if msg else ''}")
            print(f"cuda:90 [{name}] FAILED: {failures[-1]}", flush=True)
        finally:
            fn.warmup = saved
            WS.wide_gathers = real_wide
    for f in failures:
        print("FAIL", f, file=sys.stderr)
    print(f"compiled {count}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
