#!/usr/bin/env python
"""The host time of one ``gluon_ws`` call, through the pack's launcher and through Triton's
``kernel[grid]``, in the same rounds (one H200)::

    . bench/gpu_env.sh && PYTHONPATH=.flashmla:$PYTHONPATH python3 bench/experiments/exp_gluon_launch.py --out $OUT

Per cell (H / K / T / cache rows), host µs per call back to back (10 calls, median of 9
interleaved rounds: ``lib.timing.host_interleaved_us``), validation off, outputs allocated once
unless the path allocates its own:

* ``triton``: ``kernel[grid](*args, **meta)``, Triton's JIT launch (binding, specialisation and the
  compiled kernel's lookup every call): how the Gluon kernels launched before 4911e1e;
* ``pack``: ``sparse_mla_gluon.launch``, the pack's :class:`~swa_backends.kernels._launch.Kernel`
  (a key of the meta and the arguments' specialisation, then the compiled kernel's launcher);
* ``op``: ``sparse_mla_gluon_ws.sparse_mla`` (the two output allocations and ``pack``);
* ``default``: ``select(device).sparse_mla`` unvalidated (dispatch, input checks, ``op``);
* ``flashmla_direct``: vLLM's FlashMLA called bare, when ``.flashmla/`` is on the path;
* ``empty2``: the two output allocations alone.

Before timing, ``triton`` and ``pack`` write into their own buffers and must agree bit for bit.
Writes ``exp_gluon_launch.json``.
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
from swa_backends.kernels import sparse_mla_gluon as g, sparse_mla_gluon_ws as ws  # noqa: E402

CELLS = [(64, 640, 4096, 1 << 14), (64, 1152, 16384, 1 << 20), (128, 640, 4096, 1 << 14), (128, 1152, 16384, 1 << 20)]
CALLS, ROUNDS = 10, 9


def cell_fns(H, K, T, S, dev, backend, flashmla) -> dict:
    kv = torch.randn(S, D, device=dev, dtype=torch.bfloat16)
    q, idx, lens, sink = make_inputs(T, H, K, D, kv=kv)
    scale = D ** -0.5
    kernel = ws._sparse_mla_gluon_ws_fwd
    meta = ws._meta(True, ws.wide_gathers(kv), False)
    bufs = {n: (torch.empty(T, H, DV, dtype=q.dtype, device=dev), torch.empty(T, H, dtype=torch.float32, device=dev))
            for n in ("triton", "pack")}
    lens = lens.contiguous()
    ws.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink)  # compiles this key
    args = {n: g.launch_args(True, q, kv, idx, lens, scale, sink, *bufs[n]) for n in bufs}
    a_t, grid = args["triton"]

    def triton_launch():
        kernel[grid](*a_t, **meta)

    def pack_launch():
        g.launch(kernel, meta, True, q, kv, idx, lens, scale, DV, sink, *bufs["pack"])

    triton_launch()
    pack_launch()
    torch.cuda.synchronize()
    for got, want in zip(bufs["pack"], bufs["triton"]):
        if not torch.equal(got, want):
            raise AssertionError(f"{H}/{K}/{T}/{S}: the pack's launch wrote other values than kernel[grid]'s")
    fns = {
        "triton": triton_launch,
        "pack": pack_launch,
        "op": lambda: ws.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink),
        "default": lambda: backend.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink),
        "empty2": lambda: (torch.empty(T, H, DV, dtype=q.dtype, device=dev),
                           torch.empty(T, H, dtype=torch.float32, device=dev)),
    }
    if flashmla is not None:
        fns["flashmla_direct"] = lambda: flashmla.flash_mla_sparse_fwd(q, kv.unsqueeze(1), idx.unsqueeze(1), scale, DV,
                                                                       attn_sink=sink, topk_length=lens)
    return fns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cells", default="", metavar="H:K:T:ROWS,...", help="these cells instead of the four")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        results.log("exp_gluon_launch: needs a CUDA GPU (Hopper: the Gluon kernel)")
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    backend = sb.select(str(dev))
    flashmla, why = probes.find_flashmla()
    if flashmla is None:
        results.log(f"exp_gluon_launch: no flashmla_direct column ({why})")
    cells = parse_cells(args.cells) or CELLS
    out = {"machine": results.machine(dev), "command": results.command_line(),
           "method": f"host µs per call, {CALLS} calls back to back, median of {ROUNDS} interleaved rounds; "
                     f"validation off", "cells": []}
    with sb.validation(False):
        for H, K, T, S in cells:
            fns = cell_fns(H, K, T, S, dev, backend, flashmla)
            row = tm.host_interleaved_us(fns, calls=CALLS, rounds=ROUNDS)
            row["triton_over_pack"] = row["triton"] / row["pack"]
            out["cells"].append({"H": H, "K": K, "T": T, "rows": S, "host_us": row})
            results.log(f"H {H:3d} K {K:4d} T {T:5d} rows {S:7d}: "
                        + "  ".join(f"{k} {v:6.1f}" for k, v in row.items() if k != "triton_over_pack")
                        + f"  triton/pack {row['triton_over_pack']:.2f}x")
            del fns
            torch.cuda.empty_cache()
    path = results.write_json(results.out_file(args.out, "exp_gluon_launch.json"), out)
    results.log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
