"""Where the ws data flow's gathers cost its tensor cores (issue 38 item 2): the kernel and exp_ws_floor's copies
over the same cells with the gathered rows' indices as drawn (random), folded into the first 1024 rows (L2-hot) and
into the first 64 (L1/L2-hot). Usage: python3 .ab/smem_probe.py OUT_JSON"""
import json, sys, tempfile
from pathlib import Path
import torch
sys.path.insert(0, "bench"); sys.path.insert(0, "bench/experiments")
from lib.sparse_mla import make_inputs, tflops, D, DV
from lib import timing as tm
import exp_ws_floor as f
from swa_backends.kernels import sparse_mla_gluon_ws as ws
from swa_backends.backends.cuda import probes
FM, _ = probes.find_flashmla()
dev = "cuda"; scale = D ** -0.5
with tempfile.TemporaryDirectory() as d:
    copies = f.load_copies(Path(d))
names = ["mma_only", "mma_gather", "no_math", "no_gather"]
res = {"cells": []}
for (H, K, T, S) in [(64, 1152, 16384, 1 << 14), (128, 1152, 16384, 1 << 14), (64, 1152, 16384, 1 << 20)]:
    kv = torch.randn(S, D, device=dev).to(torch.bfloat16)
    q, idx0, lens, sink = make_inputs(T, H, K, D, kv=kv, seed=H * K + T, dev=dev)
    for fold in (None, 1024, 64):
        idx = idx0 if fold is None else (idx0 % fold)
        fns = {"gluon_ws": lambda: ws.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink),
               "flashmla": lambda: FM.flash_mla_sparse_fwd(q, kv.unsqueeze(1), idx.unsqueeze(1), scale, DV,
                                                           attn_sink=sink, topk_length=lens)}
        for n in names:
            fns[n] = (lambda m=copies[n]: m.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink))
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        ms = tm.interleaved_ms(fns, 5)
        tf = {n: tflops(T, H, K, D, DV, v) for n, v in ms.items()}
        res["cells"].append({"H": H, "K": K, "T": T, "S": S, "fold": fold, "ms": ms, "tflops": tf})
        print(f"H {H} S {S} fold {fold}: " + "  ".join(f"{n} {v:6.1f}" for n, v in tf.items()), flush=True)
        Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
