"""Run 28 (diagnosis, not shipped): is the warp-specialised kernel memory-bound at H 64? The
shipped configs n64b2l0 and ws with indices folded into the first 64 / 16K / 1M rows of the
cache (64: every gather an L1/L2 hit), T 16K, K 640, H 64 / 128, as run 14 did for n64b2l0."""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import bench_sparse_mla as B  # noqa: E402  (loads the pack from this checkout)
from swa_backends.kernels import sparse_mla_gluon as G  # noqa: E402

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
    for rows in (64, 16384, B.S_CACHE):
        idx_r = torch.remainder(idx, rows).to(torch.int32)
        for name, cfg in (("n64b2l0", G.DEFAULT), ("ws", G.WS)):
            ms = B.timed(lambda: G.launch(q, kv, idx_r, lens, sc, 512, sink, out, lse, config=cfg), reps=5, warmup=2)
            res[f"{H}_{rows}_{name}"] = B.tflops(T, H, K, ms)
            line.append(f"{name}@{rows} {res[f'{H}_{rows}_{name}']:.0f}")
    print(f"H={H}: " + " | ".join(line), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "gluon_l2_resident_ws.json"), "w"), indent=1)
