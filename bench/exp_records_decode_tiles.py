"""Decode-sized calls of the tl kernel on paged KV records: the table's record tiles against
smaller ones, which double or quadruple the split-K parallelism of a call with few tokens.

    . bench/gpu_env.sh && python3 bench/exp_records_decode_tiles.py --out DIR

For each record format (OCP e4m3 flavour), H 64 / 128 and T 1-64 (K 640 random indices over a
1M-slot cache, 64 records per page, sink on): the tl kernel on the bf16 rows (its table config),
on the records with the records table config and with each of ``CANDIDATES``; each candidate's
output checked against the table config's (bf16 tolerance) before it is timed. µs per call
replaying a CUDA graph of 20 calls (``bench_sparse_mla.graph_us``), ratio = bf16 / records.
Writes ``DIR/exp_records_decode_tiles.json``. What ``RECORDS_TUNED``'s decode rows were chosen from.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

# the sibling script (python puts the script's folder first on sys.path): inputs and timing
import bench_sparse_mla as bsm  # noqa: E402

import torch  # noqa: E402

from swa_backends.common.ops import _records as R  # noqa: E402
from swa_backends.kernels import sparse_mla as K  # noqa: E402

D, KK, S, BS = 512, 640, 1 << 20, 64
HEADS, TOKENS = (64, 128), (1, 2, 4, 8, 16, 32, 64)
CANDIDATES = (
    K.Config(block_h=64, block_n=32, num_warps=8, num_stages=2, split_s=True),
    K.Config(block_h=64, block_n=16, num_warps=8, num_stages=2, split_s=True),
    K.Config(block_h=64, block_n=16, num_warps=8, num_stages=1, split_s=True, prefetch=True),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--formats", default="v4_fp8,v41_mxfp8,v41_nvfp4")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds; later formats are skipped past it")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    a.out.mkdir(parents=True, exist_ok=True)
    end = time.time() + a.budget
    scale = 1.0 / math.sqrt(D)
    g = torch.Generator(device=dev).manual_seed(11)
    rows = torch.randn(S, D, generator=g, device=dev).to(torch.bfloat16)
    res = {"meta": {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                    "triton": __import__("triton").__version__, "K": KK, "cache_slots": S, "page": BS,
                    "time": "µs per call, CUDA graph of 20 calls, median of 5 replays"}, "rows": []}
    for fmt in a.formats.split(","):
        if time.time() > end:
            break
        kv = R.new_cache(S // BS, BS, fmt, device=dev)
        for c in range(0, S, 1 << 15):
            R.write(kv, rows[c:c + (1 << 15)], torch.arange(c, c + (1 << 15), device=dev), fmt, "e4m3fn")
        rec = {"kv_format": fmt, "fp8": "e4m3fn"}
        for H in HEADS:
            for T in TOKENS:
                q, idx, lens, sink = bsm.make_inputs(T, H, KK, D, kv=rows, seed=T + H, dev=dev)
                table = K.pick_config(T, H, D, D, KK, dev, fmt)
                want = K.launch(q, kv, idx, lens, scale, D, sink, **rec)
                bf16 = bsm.graph_us(lambda: K.launch(q, rows, idx, lens, scale, D, sink))
                row = {"format": fmt, "H": H, "T": T, "table": table.short(), "bf16_us": bf16,
                       "table_us": bsm.graph_us(lambda: K.launch(q, kv, idx, lens, scale, D, sink, **rec)),
                       "configs": {}}
                for cfg in CANDIDATES:
                    if cfg == table:
                        continue
                    try:
                        run = lambda: K.launch(q, kv, idx, lens, scale, D, sink, config=cfg, fit=False, **rec)  # noqa: E731
                        got = run()
                        if not torch.allclose(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2):
                            row["configs"][cfg.short()] = "wrong"
                            continue
                        row["configs"][cfg.short()] = bsm.graph_us(run)
                    except Exception as exc:  # noqa: BLE001 - a config that does not build is a finding
                        row["configs"][cfg.short()] = f"error: {type(exc).__name__}"
                cells = ", ".join(f"{k} {v:.1f} ({bf16 / v:.2f}x)" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in row["configs"].items())
                print(f"{fmt:10} H {H:3} T {T:3}: bf16 {bf16:.1f} us, table {table.short()} {row['table_us']:.1f} "
                      f"({bf16 / row['table_us']:.2f}x); {cells}", flush=True)
                res["rows"].append(row)
                (a.out / "exp_records_decode_tiles.json").write_text(json.dumps(res, indent=1))
        kv = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
