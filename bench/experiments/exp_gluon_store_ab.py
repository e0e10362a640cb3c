"""The one-item Gluon kernel (variant ``gluon``) before and after a change, same process, same rounds.

    git show <commit>:kernels/sparse_mla_gluon.py > before.py     # on a machine with the history
    . bench/gpu_env.sh && python3 bench/experiments/exp_gluon_store_ab.py --before before.py --out DIR

Written for the epilogue change that makes the kernel write O through a free KV buffer (16 bytes a
thread, 512 contiguous bytes a warp) instead of straight from the wgmma accumulator layout, but it
times any ``--before`` copy of ``kernels/sparse_mla_gluon.py`` against the pack's module:

1. correctness of both against the fp32 torch reference on PAD patterns (PAD inside the length,
   short, empty and all-PAD rows, whole PAD tiles) with a sink, at H 64, 96 (a partial 64-head
   block) and 128; a wrong kernel is not timed;
2. per cell (H 64 / 128, K 640 / 1152, T 4K / 16K, over a 1M-row and a 16K-row bf16 cache,
   ``D_qk = d_v = 512``, random valid indices, sink on): the median device time of 7 interleaved
   rounds (``lib.timing.interleaved_ms``, as ``bench_flashmla.py``), TFLOP/s and ``after/before`` (time
   before / time after).

Writes ``exp_gluon_store_ab.json`` under ``--out``; prints a line per check and cell.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

import swa_backends as sb  # noqa: E402
from lib import results, timing as tm  # noqa: E402
from lib.results import log  # noqa: E402
from lib.sparse_mla import DV, D, before_after_args, check, load_module_copy, make_inputs, tflops  # noqa: E402
from swa_backends.kernels import sparse_mla_gluon  # noqa: E402

CELLS = [(H, K, T, S) for S in (1 << 20, 1 << 14) for H in (64, 128) for K in (640, 1152) for T in (4096, 16384)]


def main(argv=None) -> int:
    args = before_after_args(__doc__, "sparse_mla_gluon.py", argv, reps=7)
    before = load_module_copy("_exp_gluon_before", args.before)
    fns = {"before": before.sparse_mla, "after": sparse_mla_gluon.sparse_mla}
    sb.set_validation(False)
    dev = torch.device("cuda")
    scale = 1.0 / D ** 0.5
    result = {**results.machine(dev), "before": args.before.name, "checks": {}, "cells": []}
    bad = set()
    for H in (64, 96, 128):
        kv = torch.randn(8192, D, device=dev).to(torch.bfloat16)
        q, idx, lens, sink = make_inputs(300, H, 1152, D, kv=kv, pads=True, seed=H)
        for name, fn in fns.items():
            why, rel = check(fn(q, kv, idx, lens, scale, DV, sink=sink), q, kv, idx, lens, scale, DV, sink)
            result["checks"][f"{name}/H{H}"] = {"ok": why is None, "why": why, "rel_err": rel}
            if why is not None:
                bad.add(name)
            log(f"check {name:<6} H {H:>3}: {why or 'ok'} (rel {rel:.2e})")
    if bad:
        log(f"not timed: {sorted(bad)} failed the checks")
    else:
        kvs = {}
        for H, K, T, S in CELLS:
            kv = kvs.setdefault(S, torch.randn(S, D, device=dev).to(torch.bfloat16))
            q, idx, lens, sink = make_inputs(T, H, K, D, kv=kv, seed=H * K + T)
            for fn in fns.values():
                fn(q, kv, idx, lens, scale, DV, sink=sink)  # compiled and warm
            ms = tm.interleaved_ms({n: (lambda f=f: f(q, kv, idx, lens, scale, DV, sink=sink)) for n, f in fns.items()},
                                   args.reps)
            row = {"H": H, "K": K, "T": T, "S": S, "ms": ms,
                   "tflops": {n: tflops(T, H, K, D, DV, v) for n, v in ms.items()},
                   "after/before": ms["before"] / ms["after"]}
            result["cells"].append(row)
            log(f"H {H:>3} K {K:>4} T {T:>5} S {S:>7}: before {row['tflops']['before']:6.1f}  after "
                f"{row['tflops']['after']:6.1f} TFLOP/s  after/before {row['after/before']:.3f}")
    results.write_json(args.out / "exp_gluon_store_ab.json", result)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
