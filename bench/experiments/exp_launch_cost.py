"""What one compiled launch of ``prepare_replay_step`` costs on the host, taken apart (one H200).

    . bench/gpu_env.sh && SWA_VLLM_KERNELS_DIR=.vllm_kernels python3 bench/experiments/exp_launch_cost.py --out DIR

The replay step's ablation (``exp_replay_step_ablation.py``) puts 17-25 µs of a step's host time
in the kernel launch alone. This experiment times, on the fused step of ``lib/replay_step.py``
(validation off, the integration's backend), back to back without a sync (host µs per call,
median of 7 interleaved rounds of 300 calls, ``lib.timing.host_interleaved_us``):

* ``op``: ``be.prepare_replay_step(...)`` whole (dispatch, argument list, launch);
* ``kernel``: the pack's ``Kernel.__call__`` with the op's recorded arguments (from fd23f75 on
  it calls the C launcher below directly on Triton 3.6);
* ``run_tensors``: Triton's compiled launcher (``CompiledKernel.run``) with them, tensors as given;
* ``run_addresses``: the same with every tensor replaced by its address, read beforehand
  (Triton's launcher takes an ``int`` as the pointer and skips ``data_ptr()`` and the driver's
  ``cuPointerGetAttribute`` check);
* ``run_addresses_read``: the same, reading the addresses in the timed call (what a launcher
  that passes addresses would pay);
* ``launcher_tensors``: Triton's C launcher itself (``CompiledKernel.run.launch``, under
  ``CompiledKernel.run``'s Python), tensors as given;
* ``launcher_addresses``: the same, addresses read beforehand: the least any launch path costs;
* ``one_pointer``: a Triton kernel of one pointer argument, through its compiled launcher (the
  floor of any Triton launch on this machine);
* ``torch_fill``: ``Tensor.fill_`` on a small tensor (one torch launch);
* ``current_device``, ``_cuda_getDevice``, ``current_stream``: what ``Kernel`` asks for each
  launch (Triton's driver's device getter is ``torch.cuda.current_device``, torch's
  ``_cuda_getDevice`` under it; its stream getter torch's ``_cuda_getCurrentRawStream``).

Then, in context: the first window group's step (``lib/replay_step.py``: ``vllm_step``, and
``pack_step`` as it is), the pack's with the
launch replaced by that least launch (``launcher_addresses``, recorded from the step's own
launch), and with the launch a no-op, at 1x1K and 1x16K, interleaved as there (host µs per step):
how far the pack's column can come down by its launch path alone.

Nothing is checked here beyond the op's outputs equalling the addressed launch's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

from lib import replay_step as rs, results, timing as tm  # noqa: E402
from lib.steps import STEPS  # noqa: E402
from swa_backends.kernels import prepare_replay_step as kp  # noqa: E402
from swa_backends.testing import vllm_kernels as vk  # noqa: E402
from swa_backends.testing.vllm_shims import routed_shims  # noqa: E402

SHAPES = {"1x1K": (1, 1024, 0), "8x4K+32d": (8, 4096, 32)}


@triton.jit
def _one_pointer(x_ptr):
    tl.store(x_ptr + tl.program_id(0), 1)


def timed(fns: dict, calls: int = 300, rounds: int = 7) -> dict:
    """``{name: {"median", "min", "max"}}`` host µs per call over ``rounds`` interleaved rounds
    (``lib.timing.host_interleaved_us``), after two untimed ones."""
    tm.host_interleaved_us(fns, calls=calls, rounds=2)
    times: dict = {}
    tm.host_interleaved_us(fns, calls=calls, rounds=rounds, per_round=times)
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in times.items()}


def recorded_launch(fn) -> tuple:
    """``(key, grid, args, compiled kernel, stream)`` of the ``prepare_replay_step`` launch one
    call of ``fn`` makes (after a warm call: the key is compiled)."""
    fn()
    got = {}
    real = kp._K

    def recorder(key, grid, *args):
        got.update(key=key, grid=grid, args=args)
        real(key, grid, *args)

    kp._K = recorder
    try:
        fn()
    finally:
        kp._K = real
    ck = real._compiled[(torch.cuda.current_device(), got["key"])]
    return got["key"], got["grid"], got["args"], ck, torch.cuda.current_stream().cuda_stream


def addresses_of(args) -> tuple:
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)


def shape_fns(name, shape, be, dev, rng) -> dict:
    s = rs.ServingStep(*shape, dev, rng)
    b = s.buffers()
    out = rs.fused_out(s, b)
    op = lambda: rs.fused_step(be, s, b, out)  # noqa: E731
    key, grid, args, ck, stream = recorded_launch(op)
    K = kp._K
    addresses = addresses_of(args)
    tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    g0, g1, g2 = grid
    fn, meta = ck.function, ck.packed_metadata

    def run_addresses_read():
        a = list(args)
        for i in tensor_at:
            a[i] = a[i].data_ptr()
        ck.run(g0, g1, g2, stream, fn, meta, None, None, None, *a)

    launch, coop, pdl = ck.run.launch, ck.run.launch_cooperative_grid, ck.run.launch_pdl

    def launcher_addresses():
        launch(g0, g1, g2, stream, fn, coop, pdl, None, None, meta, None, None, None, *addresses)

    before = {k: v.clone() for k, v in b.items() if isinstance(v, torch.Tensor)}
    ck.run(g0, g1, g2, stream, fn, meta, None, None, None, *addresses)
    torch.cuda.synchronize()
    for k, v in before.items():
        if not torch.equal(v, b[k]):
            raise AssertionError(f"{name}: the addressed launch wrote other values into {k}")
    print(f"{name}: {len(args)} arguments, {len(tensor_at)} tensors, grid {grid}")
    return {
        "op": op,
        "kernel": lambda: K(key, grid, *args),
        "run_tensors": lambda: ck.run(g0, g1, g2, stream, fn, meta, None, None, None, *args),
        "run_addresses": lambda: ck.run(g0, g1, g2, stream, fn, meta, None, None, None, *addresses),
        "run_addresses_read": run_addresses_read,
        "launcher_tensors": lambda: launch(g0, g1, g2, stream, fn, coop, pdl, None, None, meta, None, None, None,
                                           *args),
        "launcher_addresses": launcher_addresses,
    }


def step_columns(name, shape, be, shims, K, dev, rng) -> dict:
    """Host µs per step: vLLM's column, the pack's as it is, with the least launch, with none."""
    s = rs.ServingStep(*shape, dev, rng)
    b, bv = s.buffers(), s.buffers()
    g, target, scratch = rs.gather_out_view(s, b), rs.window_target(b), rs.step_scratch(s)
    pack = lambda: rs.pack_step(be, s, b, g, target, scratch, shims)  # noqa: E731
    _, grid, args, ck, stream = recorded_launch(pack)
    launch, real = ck.run.launch, kp._K
    least = (grid[0], grid[1], grid[2], stream, ck.function, ck.run.launch_cooperative_grid, ck.run.launch_pdl,
             None, None, ck.packed_metadata, None, None, None, *addresses_of(args))

    def with_launch(fake):
        def run():
            kp._K = fake
            try:
                pack()
            finally:
                kp._K = real
        return run

    fns = {"vllm": lambda: rs.vllm_step(K, s, bv), "pack": pack,
           "pack, least launch": with_launch(lambda key, grid, *a: launch(*least)),
           "pack, no launch": with_launch(lambda key, grid, *a: None)}
    tm.host_interleaved_us(fns, calls=300, rounds=2)  # untimed
    return tm.host_interleaved_us(fns, calls=300, rounds=7)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda", torch.cuda.current_device())
    be = rs.integration_backend(dev)
    rng = np.random.default_rng(0)
    x = torch.zeros(64, dtype=torch.int32, device=dev)
    ck1 = _one_pointer[(1,)](x)
    stream = torch.cuda.current_stream().cuda_stream
    base = {"one_pointer": lambda: ck1.run(1, 1, 1, stream, ck1.function, ck1.packed_metadata, None, None, None, x),
            "torch_fill": lambda: x.fill_(3), "current_device": torch.cuda.current_device,
            "_cuda_getDevice": torch._C._cuda_getDevice,
            "current_stream": lambda: torch._C._cuda_getCurrentRawStream(0)}
    res = {"meta": results.machine(dev), "steps": {}}
    for name, shape in SHAPES.items():
        fns = {**shape_fns(name, shape, be, dev, rng), **base}
        res["steps"][name] = timed(fns)
        print(f"\n{name}: host µs per call (median, min-max of 7 rounds of 300)")
        for k, v in res["steps"][name].items():
            print(f"  {k:>20} {v['median']:7.2f}  ({v['min']:.2f}-{v['max']:.2f})")
    K, origin = vk.load(None)
    res["meta"]["vllm_kernels"] = origin
    if K is not None:
        with routed_shims(lambda device: be) as shims:
            for name in ("1x1K", "1x16K"):
                shape = STEPS[name]
                row = res.setdefault("in_context", {})[name] = step_columns(name, shape, be, shims, K, dev, rng)
                print(f"\n{name} in context: host µs per step (median of 7 interleaved rounds of 300)")
                for k, v in row.items():
                    print(f"  {k:>20} {v:7.2f}  ({v / row['vllm']:.2f}x vLLM)")
    results.write_json(a.out / "exp_launch_cost.json", res)
    print(f"\nwrote {a.out / 'exp_launch_cost.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
