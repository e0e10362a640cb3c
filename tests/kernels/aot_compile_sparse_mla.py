"""Compile the sparse-MLA kernels for GPU targets on a machine without the GPU
(``python tests/kernels/aot_compile_sparse_mla.py [--report] cuda:90 hip:gfx942``).

The interpreter runs the kernel's Python, not Triton's compiler; this runs the real
launcher (``kernels.sparse_mla.launch``) on CPU tensors with every launch replaced by an
offline ``triton.compile`` per target (Triton's own binder and specialisation), for the
shipped config of each heads bucket and the split-K decode path (partial kernel + combine).
Prints one line per compiled kernel with its shared memory; fails if any config does not
compile or needs more shared memory than the target has. ``--report`` adds, for NVIDIA targets, what ptxas and
the SASS say of each forward kernel: registers, spill bytes, local loads/stores, HGMMA
instructions by shape, cp.async (LDGSTS) count, and from the TTGIR the number of KV tile
buffers and how many cp.async groups the loop leaves in flight at its wait. Own process:
compiled mode. Runs with whichever Triton the interpreter running it has (the tests run
it with every Triton they can find, see test_sparse_mla_compile.py).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("aot_compile_sparse_mla: TRITON_INTERPRET=1 is set; kernels must be decorated in compiled mode")

import swa_backends  # noqa: E402,F401  (the installed pack: pip install -e . in this environment)

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import aot_compile  # noqa: E402  (this folder: first on sys.path when run as a script or from its tests)


# Shared memory a block may use: H100/H200 227 KB (opt-in), MI300 (gfx942) LDS 64 KB, MI350 (gfx950) 160 KB.
SMEM_LIMIT = {"90": 232448, "gfx942": 65536, "gfx950": 163840}


def ptxas_verbose(k) -> str:
    """``ptxas -v`` of a compiled sm90 kernel's PTX (its register and spill report)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"
        ptx.write_text(k.asm["ptx"])
        arch = "sm_90a" if ".target sm_90a" in k.asm["ptx"] else "sm_90"
        return subprocess.run([get_ptxas(90).path, "-v", f"--gpu-name={arch}", str(ptx), "-o", str(Path(d) / "o")],
                              capture_output=True, text=True).stderr


def parse_target(spec: str) -> GPUTarget:
    return aot_compile.parse_target(spec, prog="aot_compile_sparse_mla")


class _Offline:
    """Stands in for a @triton.jit kernel: ``kernel[grid](*args, **kw)`` and
    ``kernel.warmup(*args, grid=..., **kw)`` compile offline (the launcher compiles a new
    config with warmup first, then launches it: one record per specialisation)."""

    def __init__(self, fn, target, record):
        self.fn, self.target, self.record = fn, target, record
        self.seen: set = set()

    def _compile(self, args, kwargs):
        spec = aot_compile.specialise(self.fn, self.target, args, kwargs)
        signature, constexprs, attrs, options = spec
        key = (str(signature), str(constexprs), str(attrs), str(sorted(options.__dict__.items())))
        if key in self.seen:
            return
        self.seen.add(key)
        self.record(self.fn.__name__, *aot_compile.compile_specialised(self.fn, self.target, spec))

    def warmup(self, *args, grid, **kwargs):
        self._compile(args, kwargs)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._compile(args, kwargs)


def sass_report(k) -> str:
    """Registers / spills (ptxas -v of the kernel's PTX with Triton's ptxas), instruction
    counts from the SASS, KV buffers and in-flight cp.async groups from the TTGIR."""
    from triton.backends.nvidia.compiler import get_ptxas

    bindir = Path(get_ptxas(90).path).parent
    cuobjdump = bindir / "cuobjdump"
    v = ptxas_verbose(k)
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(k.asm["cubin"])
        sass = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True).stdout
    regs = re.search(r"Used (\d+) registers", v)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", v)
    ops = Counter(m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", sass))
    # tensor-core instructions by shape: HGMMA (Hopper warpgroup MMA) or HMMA (mma.sync)
    mma = " ".join(f"{n}x{o.split('.')[0]}.{o.split('.')[1]}" for o, n in sorted(ops.items())
                   if o.startswith(("HGMMA.", "HMMA.")))
    count = lambda prefix: sum(n for o, n in ops.items() if o == prefix or o.startswith(prefix + "."))  # noqa: E731
    ttgir = k.asm.get("ttgir", "")
    bufs = re.findall(r"ttg.local_alloc : \(\) -> !ttg.memdesc<(\d+)x(\d+)x(\d+)xbf16", ttgir)
    kv_bufs = max((int(b[0]) for b in bufs), default=0)
    loop = ttgir[ttgir.find("scf.for"):]
    waits = re.findall(r"async_wait[^{]*\{num = (\d+)", loop)
    return (f"regs={regs.group(1) if regs else '?'} spill={spill.group(1) + '/' + spill.group(2) if spill else '?'} "
            f"LDL={count('LDL')} STL={count('STL')} MMA[{mma}] LDGSTS={count('LDGSTS')} BAR={count('BAR')} "
            f"kv_buffers={kv_bufs} loop_wait_num={waits[0] if waits else '-'} sass_ins={sum(ops.values())}")


def main(argv: list[str]) -> int:
    report = "--report" in argv
    targets = [parse_target(t) for t in argv if not t.startswith("--")] or [parse_target("cuda:90")]
    K = importlib.import_module("swa_backends.kernels.sparse_mla")
    fwd, combine = K._sparse_mla_fwd, K._sparse_mla_combine
    failures: list[str] = []
    count = 0

    for target in targets:
        arch = str(target.arch)
        platform = "cuda" if target.backend == "cuda" else "rocm"
        limit = SMEM_LIMIT.get(arch)
        # (label, config, heads, must fit)
        plan = [(f"{platform} table H={H}", K.table_config(platform, 512, H).replace(splits=1), H, True)
                for H in (16, 32, 64, 128)]
        plan.append((f"{platform} table decode", K.table_config(platform, 512, 64).replace(splits=4), 64, True))
        plan += [(f"{platform} few tokens", c.replace(splits=4), 64, True) for p, _, _, fmts, c in K.DECODE_TUNED
                 if p == platform and "rows" in fmts]
        for label, cfg, H, must_fit in plan:
            def record(name, k, secs, label=label, cfg=cfg, must_fit=must_fit, target=target):
                nonlocal count
                count += 1
                shared = k.metadata.shared
                fits = limit is None or shared <= limit
                extra = (" " + sass_report(k)) if report and target.backend == "cuda" and name == "_sparse_mla_fwd" else ""
                print(f"{target.backend}:{arch} {name} [{label}: {cfg.short()}] smem={shared} "
                      f"{'fits' if fits else 'DOES NOT FIT'} {secs:.1f}s{extra}", flush=True)
                if must_fit and not fits:
                    failures.append(f"{target.backend}:{arch} {label} {cfg.short()}: {shared} B of shared memory > {limit}")

            K._sparse_mla_fwd = _Offline(fwd, target, record)
            K._sparse_mla_combine = _Offline(combine, target, record)
            T = 1 if cfg.splits and cfg.splits > 1 else 2
            q = torch.zeros(T, H, 512, dtype=torch.bfloat16)
            kv = torch.zeros(64, 512, dtype=torch.bfloat16)
            idx = torch.zeros(T, 256, dtype=torch.int32)
            lens = torch.full((T,), 256, dtype=torch.int32)
            K._FITTED.clear()  # compile every config for every target, nothing remembered
            try:
                K.launch(q, kv, idx, lens, 0.04, 512, torch.zeros(H), config=cfg, fit=False)
            except Exception as exc:  # a compile error is the finding
                failures.append(f"{target.backend}:{arch} {label} {cfg.short()}: {type(exc).__name__}: "
                                f"{str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}")
                print(f"{target.backend}:{arch} [{label}: {cfg.short()}] FAILED: {failures[-1]}", flush=True)
    K._sparse_mla_fwd, K._sparse_mla_combine = fwd, combine
    for f in failures:
        print("FAIL", f, file=sys.stderr)
    print(f"compiled {count}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
