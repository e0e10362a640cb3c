"""The sparse-MLA device check (``kernels/sparse_mla_check.py``, what a validated default call
runs ahead of the gated kernel) before and after a change of its tiling, same process, same rounds.

    git show <commit>:kernels/sparse_mla_check.py > before.py     # on a machine with the history
    . bench/gpu_env.sh && python3 bench/experiments/exp_check_tile.py --before before.py --out DIR

Written for the change from one program per 32-token tile looping over the columns (128 programs
at T 4K: fewer than the H200's SMs, each waiting on one load per column tile in turn) to a 2-D
grid of 16 x 256 tiles, one load each. Per ``bench_flashmla.py`` cell shape (T 4K / 16K, K 640 /
1152, H 128 sink; the check reads only indices, lengths and sink): first each module's verdict on
valid indices and on one bad index, length and sink; then the device µs of one ``gate()`` (the
check and an event behind it; before b0abf50 also the flag's fill and its copy to the host), L2
flushed and warm, in interleaved rounds (``lib.timing.gpu_pair_rounds``), beside the bytes the
check reads over that time.

Writes ``exp_check_tile.json`` under ``--out``; prints a line per check and cell.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

from lib import results, timing as tm  # noqa: E402
from lib.results import log  # noqa: E402
from lib.sparse_mla import D, DV, before_after_args, load_module_copy, make_inputs  # noqa: E402
from swa_backends.kernels import sparse_mla_check  # noqa: E402

SHAPES = [(T, K) for K in (640, 1152) for T in (4096, 16384)]
H, ROWS = 128, 1 << 14


def main(argv=None) -> int:
    args = before_after_args(__doc__, "sparse_mla_check.py", argv, rounds=5)
    before = load_module_copy("_exp_check_before", args.before)
    mods = {"before": before, "after": sparse_mla_check}
    dev = torch.device("cuda")
    scale = 1.0 / D ** 0.5
    kv = torch.randn(ROWS, D, device=dev).to(torch.bfloat16)
    result = {**results.machine(dev), "before": args.before.name, "checks": {}, "cells": []}
    bad = set()
    for T, K in SHAPES:
        q, idx, lens, sink = make_inputs(T, H, K, D, kv=kv, seed=T + K)
        call = (q, kv, idx, lens, scale, DV)
        wrong_idx, wrong_lens, wrong_sink = idx.clone(), lens.clone(), sink.clone()
        wrong_idx[T - 1, K - 1] = ROWS
        wrong_lens[T // 2] = K + 1
        wrong_sink[H - 1] = float("nan")
        cases = {"valid": (call, sink, False), "index": ((q, kv, wrong_idx, lens, scale, DV), sink, True),
                 "length": ((q, kv, idx, wrong_lens, scale, DV), sink, True), "sink": (call, wrong_sink, True)}
        for name, mod in mods.items():
            for case, (a, s, want) in cases.items():
                got = mod.gate(*a, sink=s).failed()
                ok = got == want
                result["checks"][f"{name}/T{T}/K{K}/{case}"] = ok
                if not ok:
                    bad.add(name)
                    log(f"check {name} T {T} K {K} {case}: failed={got}, expected {want}")
        if bad:
            continue
        us = tm.gpu_pair_rounds({n: (lambda m=m: m.gate(*call, sink=sink)) for n, m in mods.items()}, args.rounds)
        nbytes = idx.numel() * idx.element_size() + lens.numel() * 4 + H * 4
        row = {"T": T, "K": K, "H": H, "bytes": nbytes, "us": us,
               "GBps_flushed": {n: nbytes / v["flushed"] / 1e3 for n, v in us.items()},
               "after/before_flushed": us["before"]["flushed"] / us["after"]["flushed"],
               "after/before_warm": us["before"]["warm"] / us["after"]["warm"]}
        result["cells"].append(row)
        log(f"T {T:>5} K {K:>4}: before {us['before']['flushed']:6.1f} / {us['before']['warm']:6.1f} us, after "
            f"{us['after']['flushed']:6.1f} / {us['after']['warm']:6.1f} us (flushed / warm); "
            f"{nbytes / 1e6:.1f} MB, after {row['GBps_flushed']['after']:.0f} GB/s flushed")
    if bad:
        log(f"not timed: {sorted(bad)} gave a wrong verdict")
    results.write_json(args.out / "exp_check_tile.json", result)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
