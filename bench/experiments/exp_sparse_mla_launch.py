#!/usr/bin/env python
"""The host time of one sparse-MLA call, its launches through the pack's ``launch_meta`` and
through Triton's ``kernel[grid]``, in the same rounds (one H200)::

    . bench/gpu_env.sh && PYTHONPATH=.flashmla:$PYTHONPATH python3 bench/experiments/exp_sparse_mla_launch.py --out $OUT

Two kernels: ``gluon_ws`` (the default on sm90) at prefill cells (H / K / T / cache rows), and
the portable tl kernel (variant ``triton``, what ROCm runs and sm90 runs ahead of FlashMLA for
decode-sized calls) at decode-sized ones. Per cell, host µs per call back to back (10 calls,
median of 9 interleaved rounds: ``lib.timing.host_interleaved_us``), validation off:

* ``triton``: the op's launches (recorded from one call: the tl kernel's split calls launch its
  combine kernel too) replayed as ``kernel[grid](*args, **meta)``, Triton's JIT launch (binding,
  specialisation and the compiled kernel's lookup every call): how they launched before;
* ``pack``: the same launches through ``kernels._launch.launch_meta`` (a key of the meta and the
  arguments' specialisation, then the compiled kernel's launcher);
* ``op``: the variant's function (its output allocations, config and launches);
* ``default``: ``select(device).sparse_mla`` unvalidated (dispatch, input checks, the variant it
  picks: ``default_variant``);
* ``flashmla_direct``: vLLM's FlashMLA sparse prefill called bare, when ``.flashmla/`` is on the
  path (at the prefill cells);
* ``empty2``: the two output allocations alone.

Before timing, the two replays must write the same outputs bit for bit. Writes
``exp_sparse_mla_launch.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

import swa_backends as sb  # noqa: E402
from lib import results, timing as tm  # noqa: E402
from lib.sparse_mla import DV, D, make_inputs, parse_cells  # noqa: E402
from swa_backends.backends.cuda import probes  # noqa: E402
from swa_backends.kernels import _launch, sparse_mla as tl_mla, sparse_mla_gluon, sparse_mla_gluon_ws as ws  # noqa: E402

GLUON_CELLS = [(64, 640, 4096, 1 << 14), (64, 1152, 16384, 1 << 20), (128, 640, 4096, 1 << 14),
               (128, 1152, 16384, 1 << 20)]
TL_CELLS = [(64, 640, 1, 1 << 14), (64, 640, 8, 1 << 14), (128, 640, 1, 1 << 14), (128, 640, 64, 1 << 14)]
CALLS, ROUNDS = 10, 9


def recorded(module, call) -> list:
    """``(fn, grid, args, meta)`` of every launch one ``call()`` makes through ``module.launch_meta``."""
    got: list = []
    real = module.launch_meta

    def record(fn, grid, args, meta):
        got.append((fn, grid, args, meta))
        real(fn, grid, args, meta)

    module.launch_meta = record
    try:
        call()
    finally:
        module.launch_meta = real
    return got


def replays(launches) -> dict:
    def triton_path():
        for fn, grid, args, meta in launches:
            fn[grid](*args, **meta)

    def pack_path():
        for fn, grid, args, meta in launches:
            _launch.launch_meta(fn, grid, args, meta)

    return {"triton": triton_path, "pack": pack_path}


def outputs(launches, inputs) -> list:
    """Copies of every tensor the launches take but ``inputs`` (their outputs and partials)."""
    skip = {id(t) for t in inputs}
    return [a.clone() for _, _, args, _ in launches for a in args if isinstance(a, torch.Tensor) and id(a) not in skip]


def cell_fns(kind: str, H, K, T, S, dev, backend, flashmla) -> tuple[dict, str]:
    kv = torch.randn(S, D, device=dev, dtype=torch.bfloat16)
    q, idx, lens, sink = make_inputs(T, H, K, D, kv=kv)
    scale = D ** -0.5
    lens = lens.contiguous()
    if kind == "gluon_ws":
        module = sparse_mla_gluon
        op = lambda: ws.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink)  # noqa: E731
    else:
        module = tl_mla
        op = lambda: tl_mla.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink)  # noqa: E731
    op()  # compiles this key (and fits the tl kernel's config)
    launches = recorded(module, op)
    paths = replays(launches)
    paths["triton"]()
    torch.cuda.synchronize()
    want = outputs(launches, (q, kv, idx, lens, sink))
    paths["pack"]()
    torch.cuda.synchronize()
    if not all(torch.equal(a, b) for a, b in zip(outputs(launches, (q, kv, idx, lens, sink)), want)):
        raise AssertionError(f"{kind} {H}/{K}/{T}/{S}: the pack's launch wrote other values than kernel[grid]'s")
    fns = {**paths, "op": op, "default": lambda: backend.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink),
           "empty2": lambda: (torch.empty(T, H, DV, dtype=q.dtype, device=dev),
                              torch.empty(T, H, dtype=torch.float32, device=dev))}
    if flashmla is not None and kind == "gluon_ws":
        fns["flashmla_direct"] = lambda: flashmla.flash_mla_sparse_fwd(q, kv.unsqueeze(1), idx.unsqueeze(1), scale, DV,
                                                                       attn_sink=sink, topk_length=lens)
    return fns, backend.variant_for("sparse_mla", q, kv, idx, lens, scale, DV, sink=sink)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cells", default="", metavar="H:K:T:ROWS,...", help="these gluon_ws cells instead of the four")
    p.add_argument("--tl-cells", default="", metavar="H:K:T:ROWS,...", help="these tl cells instead of the four")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        results.log("exp_sparse_mla_launch: needs a CUDA GPU (Hopper: the Gluon kernel)")
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    backend = sb.select(str(dev))
    flashmla, why = probes.find_flashmla()
    if flashmla is None:
        results.log(f"exp_sparse_mla_launch: no flashmla_direct column ({why})")
    plan = [("gluon_ws", c) for c in parse_cells(args.cells) or GLUON_CELLS]
    plan += [("triton", c) for c in parse_cells(args.tl_cells) or TL_CELLS]
    out = {"machine": results.machine(dev), "command": results.command_line(),
           "method": f"host µs per call, {CALLS} calls back to back, median of {ROUNDS} interleaved rounds; "
                     f"validation off", "cells": []}
    with sb.validation(False):
        for kind, (H, K, T, S) in plan:
            fns, picked = cell_fns(kind, H, K, T, S, dev, backend, flashmla)
            row = tm.host_interleaved_us(fns, calls=CALLS, rounds=ROUNDS)
            row["triton_over_pack"] = row["triton"] / row["pack"]
            out["cells"].append({"kernel": kind, "H": H, "K": K, "T": T, "rows": S, "default_variant": picked,
                                 "host_us": row})
            results.log(f"{kind:8s} H {H:3d} K {K:4d} T {T:5d} rows {S:7d}: "
                        + "  ".join(f"{k} {v:6.1f}" for k, v in row.items() if k != "triton_over_pack")
                        + f"  triton/pack {row['triton_over_pack']:.2f}x  (default: {picked})")
            del fns
            torch.cuda.empty_cache()
    path = results.write_json(results.out_file(args.out, "exp_sparse_mla_launch.json"), out)
    results.log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
