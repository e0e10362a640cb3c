"""Compile every Triton kernel specialisation of the serving path for a GPU target, on a
machine without that GPU (``python tests/kernels/aot_compile.py cuda:90 hip:gfx942``).

The interpreter (CPU tests) runs the kernels' Python, not Triton's compiler: a kernel can
pass there and still fail to compile (non-constexpr globals, a variable typed differently
in two branches, ...). This script runs ``Backend.warmup()``'s exact calls with every
launch replaced by an offline compile for each target (Triton's own binder, specialisation
and ``triton.compile``; no driver, no device), then a few random conformance cases per op.
Prints one line per compiled kernel and ``compiled N`` at the end; exits non-zero on any
compile error. Run in its own process: kernels must be decorated in compiled mode.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("aot_compile: TRITON_INTERPRET=1 is set; kernels must be decorated in compiled mode")

import swa_backends  # noqa: E402,F401  (the installed pack: pip install -e . in this environment)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.compiler import compile as triton_compile  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from swa_backends.testing.conformance import case_for  # noqa: E402
from swa_backends.common.device import DeviceInfo  # noqa: E402
from swa_backends.common.ops import HOST_OPS  # noqa: E402


def parse_target(spec: str, prog: str = "aot_compile") -> GPUTarget:
    """``cuda:<capability>`` or ``hip:<gfx arch>`` as Triton's target (shared by the aot scripts here)."""
    backend, _, arch = spec.partition(":")
    if backend == "cuda":
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip":
        return GPUTarget("hip", arch, 64)
    raise SystemExit(f"{prog}: target {spec!r}: expected cuda:<capability> or hip:<gfx arch>")


def specialise(fn, target: GPUTarget, args, kwargs=None) -> tuple:
    """What Triton's launcher would do for ``fn(*args, **kwargs)`` on ``target`` before
    compiling (its binder, specialisation and option packing), with no driver:
    ``(signature, constexprs, attrs, options)``. ``fn`` a ``@triton.jit`` (or Gluon) function."""
    backend = make_backend(target)
    kwargs = dict(kwargs or {}, debug=False)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return signature, constexprs, attrs, options


def compile_specialised(fn, target: GPUTarget, spec: tuple, source=ASTSource) -> tuple:
    """``triton.compile`` of a :func:`specialise` result: ``(compiled kernel, seconds)``
    (``source``: ``GluonASTSource`` for Gluon kernels)."""
    signature, constexprs, attrs, options = spec
    t0 = time.time()
    k = triton_compile(source(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    return k, time.time() - t0


def main(argv: list[str]) -> int:
    targets = [parse_target(t) for t in (argv or ["cuda:90"])]
    from swa_backends.kernels import METADATA_KERNELS, _launch

    # a CUDA DeviceInfo whose tensors live on the CPU: compiled mode, nothing launched
    device = DeviceInfo("cuda", "sm90", name="offline compile", torch_device="cpu", capability=(9, 0))
    done: dict[tuple, float] = {}

    def compile_only(self, key, grid, *args):
        for target in targets:
            if (target.arch, self.name, key) in done:
                continue
            _, done[(target.arch, self.name, key)] = compile_specialised(self.fn, target,
                                                                         specialise(self.fn, target, args))
            print(f"{target.backend}:{target.arch} {self.name} {key} {done[(target.arch, self.name, key)]:.2f}s",
                  flush=True)

    _launch.Kernel.__call__ = compile_only
    impls = {}
    for op, (impl, _) in METADATA_KERNELS.items():
        module, _, attr = impl.partition(":")
        impls[op] = getattr(importlib.import_module(f"swa_backends.kernels.{module}"), attr)

    class Offline:
        """What the warmup hook needs of a Backend: the device, the chosen variants, the ops."""

        def __init__(self):
            self.device = device
            self.variants = {op: ("triton",) for op in impls}
            for op, fn in impls.items():
                setattr(self, op, fn)
            for name, fn in HOST_OPS.items():
                setattr(self, name, fn)

    from swa_backends.kernels.warmup import warmup

    warmup(Offline(), W=128, block_size=64, num_groups=5, hidden_sizes=(7168,), hidden_dtypes=(torch.bfloat16,))
    rng = np.random.default_rng(0)
    for op, fn in impls.items():
        for _ in range(4):
            args, kwargs = case_for(op, rng, "cpu")
            fn(*args, **kwargs)
    # the validated forms whose kernels test their own values (Variant.self_checked), on the
    # calls the warmup makes of the plain ones
    from swa_backends.common.ops import OPS
    from swa_backends.common.ops._steps import WarmupStep
    from swa_backends.kernels import SELF_CHECKED

    from swa_backends.kernels import _verdict

    _verdict.Verdict.failed = lambda self: False  # compiled, never run: no verdict to wait for
    step = WarmupStep(torch.device("cpu"))

    def self_checked_calls():
        for op, path in SELF_CHECKED.items():
            module, _, attr = path.partition(":")
            fn = getattr(importlib.import_module(f"swa_backends.kernels.{module}"), attr)
            for args, kwargs in OPS[op].warmup(step):
                fn(None, *args, **kwargs)  # (home: any device)

    self_checked_calls()
    # the same with the workers' nap between reads of the gate (range_check.NAP_NS), which only
    # NVIDIA GPUs take (PTX nanosleep): for the CUDA targets
    from swa_backends.kernels import range_check

    if any(t.backend == "cuda" for t in targets):
        every = list(targets)
        targets[:] = [t for t in every if t.backend == "cuda"]
        range_check.naps = lambda device: True
        _verdict._local.verdicts = {}  # (a word decides its nap when first opened)
        self_checked_calls()
        targets[:] = every
    # the reader of validated calls' value checks (a CUDA or ROCm backend's): whole reads and
    # every kind of reduction, integer and floating, one launch and two
    from swa_backends.common.validation import Reduced
    from swa_backends.kernels import value_read

    i32, i64 = torch.arange(8, dtype=torch.int32), torch.arange(5000, dtype=torch.int64)
    table, lens = torch.zeros(4, 9, dtype=torch.int32), torch.ones(4, dtype=torch.int32)
    value_read.read([i32, Reduced(i64), Reduced(table, limit=lens, step=64), Reduced(i32, pad_as=3)])
    value_read.read([Reduced(torch.zeros(9)), i32, torch.ones(3, dtype=torch.bool), i64[:7], Reduced(i32)])
    # the device check of validated sparse_mla calls to a gated variant (sm90's gluon_ws): the flat
    # form (a contiguous index tensor) and the tiled one (a strided view), with and without a sink
    from swa_backends.kernels import sparse_mla_check

    q, kv = torch.zeros(2, 64, 8, dtype=torch.bfloat16), torch.zeros(16, 8, dtype=torch.bfloat16)
    lens = torch.full((2,), 8, dtype=torch.int32)
    for sink in (None, torch.zeros(64)):
        for ix in (torch.zeros(2, 8, dtype=torch.int32), torch.zeros(2, 16, dtype=torch.int32)[:, ::2]):
            sparse_mla_check.gate(q, kv, ix, lens, 0.5, 8, sink=sink)
    missing = set(_launch.KERNELS) - {name for _, name, _ in done}
    if missing:
        print(f"never compiled: {sorted(missing)}", file=sys.stderr)
        return 1
    print(f"compiled {len(done)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
