"""Compile the sparse-MLA kernels for GPU targets on a machine without the GPU
(``python tests/aot_compile_sparse_mla.py [--sweep] cuda:90 hip:gfx942``).

The interpreter runs the kernel's Python, not Triton's compiler; this runs the real
launcher (``kernels.sparse_mla.launch``) on CPU tensors with every launch replaced by an
offline ``triton.compile`` per target (Triton's own binder and specialisation), for the
shipped config of each heads bucket, the split-K decode path (partial kernel + combine)
and, with ``--sweep``, every config the H200 benchmark sweeps. Prints one line per
compiled kernel with its shared memory, fails if a shipped config needs more than the
target has (configs only swept are reported, not failed). Own process: compiled mode.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("aot_compile_sparse_mla: TRITON_INTERPRET=1 is set; kernels must be decorated in compiled mode")

ROOT = Path(__file__).resolve().parents[1]
if "swa_backends" not in sys.modules:
    try:
        import swa_backends  # noqa: F401  (installed)
    except ImportError:
        spec = importlib.util.spec_from_file_location("swa_backends", ROOT / "__init__.py",
                                                      submodule_search_locations=[str(ROOT)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["swa_backends"] = module
        spec.loader.exec_module(module)

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.compiler import compile as triton_compile  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from swa_backends.common.device import DeviceInfo  # noqa: E402

# Shared memory a block may use: H100/H200 227 KB (opt-in), MI300 (gfx942) LDS 64 KB.
SMEM_LIMIT = {"90": 232448, "gfx942": 65536}


def parse_target(spec: str) -> GPUTarget:
    backend, _, arch = spec.partition(":")
    if backend == "cuda":
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip":
        return GPUTarget("hip", arch, 64)
    raise SystemExit(f"aot_compile_sparse_mla: target {spec!r}: expected cuda:<capability> or hip:<gfx arch>")


class _Offline:
    """Stands in for a @triton.jit kernel: ``kernel[grid](*args, **kw)`` compiles offline."""

    def __init__(self, fn, target, record):
        self.fn, self.target, self.record = fn, target, record

    def __getitem__(self, grid):
        def compile_only(*args, **kwargs):
            backend = make_backend(self.target)
            kwargs = dict(kwargs, debug=False)
            binder = create_function_from_signature(self.fn.signature, self.fn.params, backend)
            bound, specialization, options = binder(*args, **kwargs)
            options, signature, constexprs, attrs = self.fn._pack_args(backend, kwargs, bound, specialization, options)
            t0 = time.time()
            k = triton_compile(ASTSource(self.fn, signature, constexprs, attrs), target=self.target,
                               options=options.__dict__)
            self.record(self.fn.__name__, k.metadata.shared, time.time() - t0)

        return compile_only


def main(argv: list[str]) -> int:
    sweep = "--sweep" in argv
    targets = [parse_target(t) for t in argv if not t.startswith("--")] or [parse_target("cuda:90")]
    device = DeviceInfo("cuda", "sm90", name="offline compile", torch_device="cpu", capability=(9, 0))
    from swa_backends.kernels import interpreter

    interpreter.setup(device)
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
        if sweep and platform == "cuda":
            plan += [(f"sweep {t}", K.parse_config(t, K.Config()).replace(splits=1), 128, False) for t in K.SWEEP]
        for label, cfg, H, must_fit in plan:
            def record(name, shared, secs, label=label, cfg=cfg, must_fit=must_fit):
                nonlocal count
                count += 1
                fits = limit is None or shared <= limit
                print(f"{target.backend}:{arch} {name} [{label}: {cfg.short()}] smem={shared} "
                      f"{'fits' if fits else 'DOES NOT FIT'} {secs:.1f}s", flush=True)
                if must_fit and not fits:
                    failures.append(f"{target.backend}:{arch} {label} {cfg.short()}: {shared} B of shared memory > {limit}")

            K._sparse_mla_fwd = _Offline(fwd, target, record)
            K._sparse_mla_combine = _Offline(combine, target, record)
            T = 1 if cfg.splits and cfg.splits > 1 else 2
            q = torch.zeros(T, H, 512, dtype=torch.bfloat16)
            kv = torch.zeros(64, 512, dtype=torch.bfloat16)
            idx = torch.zeros(T, 256, dtype=torch.int32)
            lens = torch.full((T,), 256, dtype=torch.int32)
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
