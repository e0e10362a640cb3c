"""Experiment (not shipped): L2 prefetch distance in the Gluon kernel. Run on the H200 from the repo root."""
import sys, math, json, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
import bench_sparse_mla as B  # loads the pack from this checkout
import gluon_pf as g

dev = "cuda"
kv = torch.randn(B.S_CACHE, 512, device=dev, dtype=torch.float32).to(torch.bfloat16)
res = {}
cfgs = [g.GluonConfig(block_n=64, nbuf=2, lazy=0, early=e) for e in (0, 1)] + \
       [g.GluonConfig(block_n=32, nbuf=4, lazy=0, early=e) for e in (0, 1)] + \
       [g.GluonConfig(block_n=32, nbuf=3, lazy=0, early=1), g.GluonConfig(block_n=32, nbuf=4, lazy=8, early=1)]
# correctness with PAD patterns and sink
for H in (64, 128):
    q, _, idx, lens, sink = B.make_inputs(512, H, 1152, pads=True, sink=True, kv=kv, seed=3)
    for c in cfgs:
        out = torch.full((512, H, 512), 7.0, device=dev, dtype=torch.bfloat16)
        lse = torch.full((512, H), 7.0, device=dev)
        g.launch(q, kv, idx, lens, 1 / math.sqrt(512), 512, sink, out, lse, config=c)
        why, rel = B.check((out, lse), q, kv, idx, lens, sink)
        print(f"check H={H} {c}: {why or 'ok'} rel={rel:.2e}", flush=True)
        res[f"check_{H}_{c}"] = [why, rel]
for T, H, K in [(16384, 64, 640), (16384, 128, 640), (4096, 64, 640), (16384, 64, 1152), (4096, 128, 1152)]:
    q, _, idx, lens, sink = B.make_inputs(T, H, K, sink=True, kv=kv, seed=1)
    out = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(T, H, device=dev)
    line = []
    for c in cfgs:
        ms = B.timed(lambda: g.launch(q, kv, idx, lens, 1 / math.sqrt(512), 512, sink, out, lse, config=c), reps=5, warmup=2)
        tf = B.tflops(T, H, K, ms)
        res[f"{T}_{H}_{K}_{c}"] = tf
        line.append(f"n{c.block_n}b{c.nbuf}l{c.lazy}e{c.early} {tf:.1f}")
    print(f"T={T} H={H} K={K}: " + " | ".join(line), flush=True)
    if T == 4096 and H == 128:
        break
json.dump({k: v for k, v in res.items()}, open(os.path.join(os.environ.get("OUT", "."), "early.json"), "w"), indent=1, default=str)
