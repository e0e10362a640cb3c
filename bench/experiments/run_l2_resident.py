"""Is the Gluon kernel memory- or compute-bound? Indices folded into the first N rows of the
cache (64: every gather an L1/L2 hit), T 16K, K 640, H 64 / 128 (diagnosis, not shipped).

* ``run_l2_resident.py`` (run 14): d0bf195's kernel from ``gluon_p.py`` (see README.md here),
  configs n64b2l0 and n64b2l0s, 64 ... 1M rows;
* ``run_l2_resident.py shipped`` (run 28): the shipped kernels, n64b2l0 and ws, 64 / 16K / 1M rows."""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import bench_sparse_mla as B  # noqa: E402  (loads the pack from this checkout)

if sys.argv[1:] == ["shipped"]:
    from swa_backends.kernels import sparse_mla_gluon as g  # noqa: E402
    CONFIGS = (("n64b2l0", g.DEFAULT), ("ws", g.WS))
    ROWS = (64, 16384, B.S_CACHE)
    OUT = "gluon_l2_resident_ws.json"
else:
    import gluon_p as g  # noqa: E402
    CONFIGS = (("n64b2l0", g.GluonConfig(block_n=64, nbuf=2, lazy=0)),
               ("n64b2l0s", g.GluonConfig(block_n=64, nbuf=2, lazy=0, p_smem=True)))
    ROWS = (64, 2048, 16384, 65536, 262144, B.S_CACHE)
    OUT = "l2.json"

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
    for rows in ROWS:
        idx_r = torch.remainder(idx, rows).to(torch.int32)
        for name, cfg in CONFIGS:
            ms = B.timed(lambda: g.launch(q, kv, idx_r, lens, sc, 512, sink, out, lse, config=cfg), reps=5, warmup=2)
            res[f"{H}_{rows}_{name}"] = B.tflops(T, H, K, ms)
            line.append(f"{name}@{rows} {res[f'{H}_{rows}_{name}']:.0f}")
    print(f"H={H}: " + " | ".join(line), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), OUT), "w"), indent=1)
