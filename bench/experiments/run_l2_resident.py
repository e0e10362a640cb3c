"""Run 14 (diagnosis, not shipped): is the Gluon kernel memory- or compute-bound? The same kernel
(d0bf195's, configs n64b2l0 and n64b2l0s) with indices folded into the first 64 ... 1M rows of the
cache, T 16K, K 640, H 64 / 128. Needs bench/experiments/gluon_p.py (see README.md here)."""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import bench_sparse_mla as B  # noqa: E402  (loads the pack from this checkout)
import gluon_p as g  # noqa: E402

dev = "cuda"
kv = torch.randn(B.S_CACHE, 512, device=dev, dtype=torch.float32).to(torch.bfloat16)
sc = 1 / math.sqrt(512)
res = {}
T, K = 16384, 640
for H in (64, 128):
    q, _, idx, lens, sink = B.make_inputs(T, H, K, sink=True, kv=kv, seed=1)
    out = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(T, H, device=dev)
    line = []
    for rows in (64, 2048, 16384, 65536, 262144, B.S_CACHE):
        idx_r = torch.remainder(idx, rows).to(torch.int32)
        for name, cfg in (("n64b2l0", g.GluonConfig(block_n=64, nbuf=2, lazy=0)),
                          ("n64b2l0s", g.GluonConfig(block_n=64, nbuf=2, lazy=0, p_smem=True))):
            ms = B.timed(lambda: g.launch(q, kv, idx_r, lens, sc, 512, sink, out, lse, config=cfg), reps=5, warmup=2)
            res[f"{H}_{rows}_{name}"] = B.tflops(T, H, K, ms)
            line.append(f"{name}@{rows} {res[f'{H}_{rows}_{name}']:.0f}")
    print(f"H={H}: " + " | ".join(line), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "l2.json"), "w"), indent=1)
