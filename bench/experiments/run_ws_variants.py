"""The warp-specialised Gluon kernel against variants of itself, in one run (T 16K, K 640,
H 64 / 128, random indices into the 1M-row cache and folded into 16K rows), rounds
interleaved so drift hits every variant alike (diagnosis, not shipped):

* ``ws``: the shipped kernel (``kernels/sparse_mla_gluon_ws.py``);
* ``ws_prev``: another version of it, ``ws_prev.py`` beside this script (write it first with
  ``git show <commit>:kernels/sparse_mla_gluon_ws.py > bench/experiments/ws_prev.py``; skipped
  when absent). Run 35 measured 54a9b99's kernel (consumer 1 publishing m_B, P_B under its
  P_A V_A wgmma) as ``ws`` against 3d14348's as ``ws_prev``: H 64 293 vs 296, H 128 315 vs 311
  TFLOP/s (1M rows), no gain and 8 B more spills; reverted, so today's ``ws`` is 3d14348's
  and 54a9b99's is the one to write into ``ws_prev.py``;
  Run 40 measured 479ab9c's persistent ws kernel (one program per SM over every grid-th
  item, the next item's Q and first tiles loaded under the current one's tail) as ``ws``
  against 3d14348's as ``ws_prev``: H 64 267 vs 301, H 128 308 vs 321 TFLOP/s (1M rows),
  334 vs 365 at H 64 with 16K rows: slower, its consumer 0 spills 780 B with Triton 3.6
  (wgmma descriptors hoisted out of the item loop stay live through the epilogue); reverted.
  Run 43 measured the persistent kernel again with per-pair shared-memory views (621acc1, no
  spills; shipped) as ``ws`` against 3d14348's as ``ws_prev``: 379 vs 281 (H 64), 363 vs 306
  (H 128);
* ``ws_evict_first``: the shipped kernel with ``eviction_policy="evict_first"`` on its
  cp.async gathers (made from its source text here);
* ``n64b2l0``: the one-token lockstep kernel, the anchor of earlier runs.

    . bench/gpu_env.sh && python3 bench/experiments/run_ws_variants.py   # writes $OUT/ws_variants.json
"""
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import torch  # noqa: E402

import bench_sparse_mla as B  # noqa: E402  (loads the pack from this checkout)
from swa_backends.kernels import sparse_mla_gluon as g  # noqa: E402

ROUNDS = 3


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


shipped_src = (HERE.parent.parent / "kernels" / "sparse_mla_gluon_ws.py").read_text()
call = "_cp_async(dst.slice(c * CHUNK, CHUNK, dim=1), ptrs, mask=mask)"
assert call in shipped_src, "the shipped kernel's cp.async call changed: update this script"
tmp = Path(tempfile.mkdtemp())
(tmp / "ws_evict_first.py").write_text(shipped_src.replace(call, call[:-1] + ', eviction_policy="evict_first")'))
VARIANTS = {"ws": g._ws_module(), "ws_evict_first": load("ws_evict_first", tmp / "ws_evict_first.py")}
if (HERE / "ws_prev.py").exists():
    VARIANTS["ws_prev"] = load("ws_prev", HERE / "ws_prev.py")
shipped_ws_module = g._ws_module


def _launch_one_item_per_program(mod, q, kv, indices, lens, sm_scale, sink, out, lse):
    """A ws kernel of one program per (token, head block), no NUM_ITEMS argument (the shipped
    one's layout): how run 40 launched 3d14348's kernel beside the persistent one (479ab9c)."""
    T, H, _ = q.shape
    num_hb = -(-H // 64)
    args = (q, kv, indices, lens, sink if sink is not None else lse, out, lse, H, num_hb,
            q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), out.stride(0), out.stride(1), lse.stride(0),
            float(sm_scale) * g.LOG2E)
    mod._sparse_mla_gluon_ws_fwd[(T * num_hb,)](*args, **mod.launch_meta(sink is not None))

dev = "cuda"
kv = torch.randn(B.S_CACHE, 512, device=dev, dtype=torch.float32).to(torch.bfloat16)
sc = 1 / math.sqrt(512)
T, K = 16384, 640
raw: dict[str, list[float]] = {}
for H in (64, 128):
    q, _, idx, lens, sink = B.make_inputs(T, H, K, sink=True, kv=kv, seed=1)
    out = torch.empty(T, H, 512, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(T, H, device=dev)
    for rows in (B.S_CACHE, 16384):
        idx_r = idx if rows == B.S_CACHE else torch.remainder(idx, rows).to(torch.int32)
        for r in range(ROUNDS):
            order = list(VARIANTS) + ["n64b2l0"]
            order = order[r % len(order):] + order[:r % len(order)]
            for name in order:
                if name == "n64b2l0":
                    cfg = g.DEFAULT
                else:
                    cfg = g.WS
                    g._ws_module = (lambda m=VARIANTS[name]: m)
                try:
                    if name != "n64b2l0" and "NUM_ITEMS" not in VARIANTS[name]._sparse_mla_gluon_ws_fwd.arg_names:
                        fn = lambda m=VARIANTS[name]: _launch_one_item_per_program(m, q, kv, idx_r, lens, sc, sink,  # noqa: E731
                                                                                   out, lse)
                    else:
                        fn = lambda: g.launch(q, kv, idx_r, lens, sc, 512, sink, out, lse, config=cfg)  # noqa: E731
                    if r == 0:  # every variant gives the shipped kernel's result (it runs first)
                        out.fill_(float("nan"))
                        fn()
                        assert not out.isnan().any(), name
                        if name == "ws":
                            ref_out = out.clone()
                        else:
                            err = (out.float() - ref_out.float()).abs().max().item()
                            assert err < 2e-2, (name, H, rows, err)
                    ms = B.timed(fn, reps=5, warmup=2)
                finally:
                    g._ws_module = shipped_ws_module
                raw.setdefault(f"{H}_{rows}_{name}", []).append(B.tflops(T, H, K, ms))
        line = " | ".join(f"{n} {statistics.median(raw[f'{H}_{rows}_{n}']):.0f} "
                          f"({min(raw[f'{H}_{rows}_{n}']):.0f}-{max(raw[f'{H}_{rows}_{n}']):.0f})"
                          for n in list(VARIANTS) + ["n64b2l0"])
        print(f"H={H} rows={rows}: {line}", flush=True)
json.dump({"T": T, "K": K, "rounds": ROUNDS, "tflops": raw},
          open(os.path.join(os.environ.get("OUT", "."), "ws_variants.json"), "w"), indent=1)
