"""Per-CTA fixed cost vs per-pair cost of the shipped Gluon kernels at H 64 (diagnosis, not
shipped): T 16K, K from 128 to 2048 (2 to 32 tiles of 64 rows), indices random into the 1M-row
cache and folded into 16K rows (L2-resident), ws and n64b2l0, rounds interleaved.

Each program does one token; its time is ``programs_per_SM * (F + P * pairs)`` if a fixed cost
``F`` (Q load, pipeline fill, epilogue) and a per-pair cost ``P`` add up. The least-squares fit
of the measured time per call against the pair count gives both: if ``F`` is large against
``P * 5`` (K 640), the gap to 320 TFLOP/s at K 640 is a per-token cost; if the per-pair rate at
large K stays near K 640's, it is the pairs themselves.

    . bench/gpu_env.sh && python3 bench/experiments/run_ws_k_sweep.py   # writes $OUT/ws_k_sweep.json
"""
import json
import math
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_sparse_mla as B  # noqa: E402  (loads the pack from this checkout)
from swa_backends.kernels import sparse_mla_gluon as g  # noqa: E402

T, H, ROUNDS = 16384, 64, 3
KS = (128, 256, 640, 1152, 2048)
CONFIGS = (("ws", g.WS), ("n64b2l0", g.DEFAULT))
dev = "cuda"
kv = torch.randn(B.S_CACHE, 512, device=dev, dtype=torch.float32).to(torch.bfloat16)
sc = 1 / math.sqrt(512)
out = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
lse = torch.empty(T, H, device=dev)
res: dict = {"T": T, "H": H, "rounds": ROUNDS, "ms": {}, "tflops": {}, "fit": {}}
for rows in (B.S_CACHE, 16384):
    for K in KS:
        q, _, idx, lens, sink = B.make_inputs(T, H, K, sink=True, kv=kv, seed=K)
        if rows != B.S_CACHE:
            idx = torch.remainder(idx, rows).to(torch.int32)
        for r in range(ROUNDS):
            for name, cfg in (CONFIGS if r % 2 == 0 else CONFIGS[::-1]):
                ms = B.timed(lambda: g.launch(q, kv, idx, lens, sc, 512, sink, out, lse, config=cfg), reps=5, warmup=2)
                res["ms"].setdefault(f"{rows}_{K}_{name}", []).append(ms)
        del q, idx, lens
        for name, _ in CONFIGS:
            ms = statistics.median(res["ms"][f"{rows}_{K}_{name}"])
            res["tflops"][f"{rows}_{K}_{name}"] = B.tflops(T, H, K, ms)
    for name, _ in CONFIGS:
        pairs = np.array([math.ceil(K / 128) for K in KS], dtype=float)
        t = np.array([statistics.median(res["ms"][f"{rows}_{K}_{name}"]) for K in KS])
        slope, intercept = np.polyfit(pairs, t, 1)
        res["fit"][f"{rows}_{name}"] = {"fixed_ms": intercept, "per_pair_ms": slope,
                                       "fixed_in_pairs": intercept / slope,
                                       "tflops_without_fixed_cost_k640": B.tflops(T, H, 640, slope * 5)}
        line = " | ".join(f"K {K} {res['tflops'][f'{rows}_{K}_{name}']:.0f}" for K in KS)
        f = res["fit"][f"{rows}_{name}"]
        print(f"rows={rows} {name}: {line} || fit: fixed {f['fixed_ms']:.3f} ms = {f['fixed_in_pairs']:.2f} pairs, "
              f"K 640 without it {f['tflops_without_fixed_cost_k640']:.0f} TFLOP/s", flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "ws_k_sweep.json"), "w"), indent=1)
