"""Launch configs of the tl kernel on paged KV records, timed on a GPU: what ``RECORDS_TUNED``
in ``kernels/sparse_mla.py`` was chosen from.

    . bench/gpu_env.sh && python3 bench/experiments/sweep_records_configs.py --out DIR [--formats v4_fp8,...]

For each record format (OCP e4m3 flavour) and shape (H 64 / T 4K, H 128 / T 256, H 16 / T 4K,
H 16 / T 256; K 640 random indices over a 1M-slot cache, 64 records per page): the tl kernel
on the bf16 rows (its table config), on the records with the table config, and with each
candidate config (``CANDIDATES``); each result is checked against the table config's output
(bf16 tolerance) before it is timed. Median of 5 calls, CUDA events around each call, no L2
flush (``lib.timing.event_ms``, the same method for every column). Writes
``DIR/sweep_records_configs.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

from lib import results, timing as tm  # noqa: E402
from lib.sparse_mla import RECORDS_K as KK, D, make_inputs, record_cache, records_setup, time_configs  # noqa: E402
from swa_backends.kernels import sparse_mla as K  # noqa: E402

SHAPES = ((64, 4096), (128, 256), (16, 4096), (16, 256))
CANDIDATES = (
    K.Config(block_h=64, block_n=64, num_warps=8, num_stages=2, split_s=True),
    K.Config(block_h=64, block_n=32, num_warps=8, num_stages=2, split_s=True),
    K.Config(block_h=32, block_n=64, num_warps=8, num_stages=2),
    K.Config(block_h=32, block_n=32, num_warps=8, num_stages=2),
    K.Config(block_h=16, block_n=64, num_warps=8, num_stages=2),
    K.Config(block_h=16, block_n=64, num_warps=4, num_stages=2),
    K.Config(block_h=16, block_n=64, num_warps=4, num_stages=1),
    K.Config(block_h=16, block_n=32, num_warps=8, num_stages=2),
    K.Config(block_h=16, block_n=32, num_warps=4, num_stages=2),
    # the next tile's bytes loaded before this one is dequantized (prefetch)
    K.Config(block_h=64, block_n=64, num_warps=8, num_stages=2, split_s=True, prefetch=True),
    K.Config(block_h=64, block_n=64, num_warps=8, num_stages=1, split_s=True, prefetch=True),
    K.Config(block_h=64, block_n=32, num_warps=8, num_stages=1, split_s=True, prefetch=True),
    K.Config(block_h=16, block_n=32, num_warps=4, num_stages=2, prefetch=True),
    K.Config(block_h=16, block_n=32, num_warps=4, num_stages=1, prefetch=True),
    K.Config(block_h=16, block_n=64, num_warps=4, num_stages=1, prefetch=True),
    K.Config(block_h=16, block_n=32, num_warps=8, num_stages=1, prefetch=True),
    K.Config(block_h=16, block_n=16, num_warps=4, num_stages=2, prefetch=True),
    K.Config(block_h=16, block_n=16, num_warps=4, num_stages=1, prefetch=True),
    K.Config(block_h=16, block_n=32, num_warps=2, num_stages=1, prefetch=True),
    K.Config(block_h=16, block_n=16, num_warps=2, num_stages=1, prefetch=True),
    K.Config(block_h=16, block_n=16, num_warps=8, num_stages=1, prefetch=True),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--formats", default="v4_fp8,v41_mxfp8,v41_nvfp4")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds; later configs are skipped past it")
    ap.add_argument("--configs", default="", help="comma-separated short names (h64n64w8s2x, ...): only these")
    ap.add_argument("--heads", default="", help="comma-separated head counts of SHAPES: only these")
    a = ap.parse_args(argv)
    heads = {int(h) for h in a.heads.split(",") if h}
    shapes = [(H, T) for H, T in SHAPES if not heads or H in heads]
    only = {c for c in a.configs.split(",") if c}
    candidates = [c for c in CANDIDATES if not only or c.short() in only]
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    dev, rows, res = records_setup(a.out, "median of 5 calls, ms")
    end = time.time() + a.budget
    scale = 1.0 / math.sqrt(D)
    for fmt in a.formats.split(","):
        kv = record_cache(fmt, rows, dev)
        rec = {"kv_format": fmt, "fp8": "e4m3fn"}
        for H, T in shapes:
            q, idx, lens, sink = make_inputs(T, H, KK, D, kv=rows, seed=T + H, dev=dev)
            table = K.pick_config(T, H, D, D, KK, dev, fmt)
            want = K.launch(q, kv, idx, lens, scale, D, sink, **rec)
            row = {"format": fmt, "H": H, "T": T, "table": table.short(),
                   "bf16_ms": tm.event_ms(lambda: K.launch(q, rows, idx, lens, scale, D, sink), reps=5),
                   "table_ms": tm.event_ms(lambda: K.launch(q, kv, idx, lens, scale, D, sink, **rec), reps=5),
                   "configs": {}}
            row["configs"] = time_configs(
                [c for c in candidates if c.block_h <= H],
                lambda cfg: K.launch(q, kv, idx, lens, scale, D, sink, config=cfg, fit=False, **rec), want,
                lambda run: tm.event_ms(run, reps=5), deadline=end)
            timed_ = sorted((v, k) for k, v in row["configs"].items() if isinstance(v, float))
            print(f"{fmt:10} H {H:3} T {T:5}: bf16 {row['bf16_ms']:.3f} ms, table {table.short()} "
                  f"{row['table_ms']:.3f} ms ({row['bf16_ms'] / row['table_ms']:.2f}x bf16); fastest: "
                  + ", ".join(f"{k} {v:.3f} ({row['bf16_ms'] / v:.2f}x)" for v, k in timed_[:3]), flush=True)
            res["rows"].append(row)
            results.write_json(a.out / "sweep_records_configs.json", res)
        kv = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
