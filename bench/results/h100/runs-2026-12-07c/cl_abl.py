"""Ablations of the cluster kernel beside gluon_ws and FlashMLA in interleaved rounds (outputs of the
ablations are meaningless). Usage: python3 .ab/cl_abl.py OUT_JSON"""
import json, sys
from pathlib import Path
import torch
sys.path.insert(0, "bench"); sys.path.insert(0, "bench/experiments/cluster")
from lib.sparse_mla import make_inputs, tflops, D, DV
from lib import timing as tm
import sparse_mla_cluster as cl
from swa_backends.kernels import sparse_mla_gluon_ws as ws
dev = "cuda"
from swa_backends.backends.cuda import probes
FM, _why = probes.find_flashmla()
print("flashmla:", FM is not None, _why)
scale = D ** -0.5
res = {"cells": []}
kvs = {}
for (H, K, T, S) in [(64, 1152, 16384, 1 << 20), (64, 1152, 16384, 1 << 14), (128, 1152, 16384, 1 << 20), (128, 1152, 16384, 1 << 14), (64, 640, 4096, 1 << 14), (128, 640, 4096, 1 << 20)]:
    kv = kvs.get(S)
    if kv is None:
        kv = kvs[S] = torch.randn(S, D, device=dev).to(torch.bfloat16)
    q, idx, lens, sink = make_inputs(T, H, K, D, kv=kv, seed=H * K + T, dev=dev)
    fns = {"gluon_ws": lambda: ws.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink)}
    if FM is not None:
        fns["flashmla"] = lambda: FM.flash_mla_sparse_fwd(q, kv.unsqueeze(1), idx.unsqueeze(1), scale, DV, attn_sink=sink, topk_length=lens)
    for f in (0, 2, 4, 6):
        fns[f"cl{f}"] = (lambda f=f: cl.run(q, kv, idx, lens, scale, DV, sink, f))
    for fn in fns.values():
        fn(); fn()
    torch.cuda.synchronize()
    ms = tm.interleaved_ms(fns, 7)
    row = {"H": H, "K": K, "T": T, "S": S, "ms": ms, "tflops": {n: tflops(T, H, K, D, DV, v) for n, v in ms.items()}}
    res["cells"].append(row)
    print(f"H {H} K {K} T {T} S {S}: " + "  ".join(f"{n} {v:6.1f}" for n, v in row["tflops"].items()), flush=True)
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
