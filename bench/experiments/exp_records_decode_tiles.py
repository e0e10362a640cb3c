"""Decode-sized calls of the tl kernel on paged KV records: the table's record tiles against
smaller ones, which double or quadruple the split-K parallelism of a call with few tokens.

    . bench/gpu_env.sh && python3 bench/experiments/exp_records_decode_tiles.py --out DIR

For each record format (OCP e4m3 flavour), H 64 / 128 and T 1-64 (K 640 random indices over a
1M-slot cache, 64 records per page, sink on): the tl kernel on the bf16 rows (its table config),
on the records with the records table row (``RECORDS_TUNED``'s, as before ``DECODE_TUNED``)
and with each of ``CANDIDATES``; each candidate's output checked against the table row's (bf16
tolerance) before it is timed (``lib.sparse_mla.time_configs``). µs per call replaying a
CUDA graph of 20 calls (``lib.timing.graph_us``), ratio = bf16 / records. Writes
``DIR/exp_records_decode_tiles.json``. What ``DECODE_TUNED`` was chosen from.
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

HEADS, TOKENS = (64, 128), (1, 2, 4, 8, 16, 32, 64)
CANDIDATES = (
    K.Config(block_h=64, block_n=32, num_warps=8, num_stages=2, split_s=True),
    K.Config(block_h=64, block_n=16, num_warps=8, num_stages=2, split_s=True),
    K.Config(block_h=64, block_n=16, num_warps=8, num_stages=1, split_s=True, prefetch=True),
)


def graph_us(fn) -> float:
    return tm.graph_us(fn, calls=20, reps=5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--formats", default="v4_fp8,v41_mxfp8,v41_nvfp4",
                    help="record formats; 'rows': the bf16 rows themselves against TUNED's row")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds; later formats are skipped past it")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    dev, rows, res = records_setup(a.out, "µs per call, CUDA graph of 20 calls, median of 5 replays")
    end = time.time() + a.budget
    scale = 1.0 / math.sqrt(D)
    for fmt in a.formats.split(","):
        if time.time() > end:
            break
        kv = rows if fmt == "rows" else record_cache(fmt, rows, dev)
        rec = {} if fmt == "rows" else {"kv_format": fmt, "fp8": "e4m3fn"}
        for H in HEADS:
            for T in TOKENS:
                q, idx, lens, sink = make_inputs(T, H, KK, D, kv=rows, seed=T + H, dev=dev)
                table = K.table_config(K._platform(dev), D, H, fmt)  # TUNED's / RECORDS_TUNED's row, not DECODE_TUNED's
                launch = lambda cfg: K.launch(q, kv, idx, lens, scale, D, sink, config=cfg, fit=False, **rec)  # noqa: E731
                want = launch(table)
                bf16 = graph_us(lambda: K.launch(q, rows, idx, lens, scale, D, sink))
                row = {"format": fmt, "H": H, "T": T, "table": table.short(), "bf16_us": bf16,
                       "table_us": graph_us(lambda: launch(table)),
                       "configs": time_configs([c for c in CANDIDATES if c != table], launch, want, graph_us)}
                cells = ", ".join(f"{k} {v:.1f} ({bf16 / v:.2f}x)" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in row["configs"].items())
                print(f"{fmt:10} H {H:3} T {T:3}: bf16 {bf16:.1f} us, table {table.short()} {row['table_us']:.1f} "
                      f"({bf16 / row['table_us']:.2f}x); {cells}", flush=True)
                res["rows"].append(row)
                results.write_json(a.out / "exp_records_decode_tiles.json", res)
        kv = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
