"""Experiment (not shipped): persistent Gluon kernel vs the one-item-per-program kernel. H200, repo root."""
import sys, math, json, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
import bench_sparse_mla as B
import gluon_p as g

dev = "cuda"
kv = torch.randn(B.S_CACHE, 512, device=dev, dtype=torch.float32).to(torch.bfloat16)
res = {}
base = g.GluonConfig(block_n=64, nbuf=2, lazy=0)
sc = 1 / math.sqrt(512)
for H, T, K in ((64, 512, 1152), (128, 512, 1152), (64, 37, 640), (128, 1, 200), (96, 300, 640)):
    q, _, idx, lens, sink = B.make_inputs(T, H, K, pads=True, sink=True, kv=kv, seed=H + T)
    for name, fn in (("persistent", lambda o, l: g.launch_persistent(q, kv, idx, lens, sc, 512, sink, o, l)),
                     ("persistent_p7", lambda o, l: g.launch_persistent(q, kv, idx, lens, sc, 512, sink, o, l, programs=7))):
        out = torch.full((T, H, 512), 7.0, device=dev, dtype=torch.bfloat16)
        lse = torch.full((T, H), 7.0, device=dev)
        fn(out, lse)
        why, rel = B.check((out, lse), q, kv, idx, lens, sink)
        print(f"check H={H} T={T} K={K} {name}: {why or 'ok'} rel={rel:.2e}", flush=True)
        res[f"check_{H}_{T}_{K}_{name}"] = [why, rel]
for T, H, K in [(16384, 64, 640), (16384, 128, 640), (4096, 64, 640), (4096, 128, 640), (16384, 64, 1152),
                (16384, 128, 1152), (4096, 64, 1152), (4096, 128, 1152)]:
    q, _, idx, lens, sink = B.make_inputs(T, H, K, sink=True, kv=kv, seed=1)
    out = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(T, H, device=dev)
    line = []
    for name, fn in (("n64b2l0", lambda: g.launch(q, kv, idx, lens, sc, 512, sink, out, lse, config=base)),
                     ("persistent", lambda: g.launch_persistent(q, kv, idx, lens, sc, 512, sink, out, lse)),
                     ("persistent_2x", lambda: g.launch_persistent(q, kv, idx, lens, sc, 512, sink, out, lse, programs=264))):
        ms = B.timed(fn, reps=5, warmup=2)
        tf = B.tflops(T, H, K, ms)
        res[f"{T}_{H}_{K}_{name}"] = tf
        line.append(f"{name} {tf:.1f}")
    print(f"T={T} H={H} K={K}: " + " | ".join(line), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "persistent.json"), "w"), indent=1, default=str)
