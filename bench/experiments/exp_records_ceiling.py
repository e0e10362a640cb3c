"""How much can reading fewer bytes per row buy the sparse-MLA kernels? The ceiling behind #16's goal.

    . bench/gpu_env.sh && python3 bench/experiments/exp_records_ceiling.py --out DIR

The records goal (>= 1.3x the bf16 kernel at T <= 256) assumes the kernel waits on memory: a V4.1
record is 528 bytes where the bf16 row (plus RoPE) is 1152. This measures the assumption instead of
arguing it. At each goal shape (H 64 / 128, T 1-256 as decode-like calls, and a 4K-token prefill,
K 640, sink on) it times, same indices pattern, same run:

* ``bf16``: the tl kernel on bf16 rows, indices random over a 1M-row cache (the goal's baseline,
  as ``bench_sparse_mla.py --records`` times it);
* ``bf16_l2``: the same kernel and shapes with the indices random over an ``--l2-rows`` cache (8K
  rows, 9 MiB: resident in the H200's 60 MiB L2). Its time is what the bf16 pipeline costs with
  every DRAM byte free, so ``bf16 / bf16_l2`` bounds what any cut in bytes per row can buy a kernel
  that does this kernel's work: a records kernel reads fewer bytes but does the same matrix work
  plus the dequantisation;
* per record format, the tl kernel on the records over the 1M-row and the small cache (``records``,
  ``records_l2``): ``bf16 / records`` is the goal's ratio, ``bf16 / records_l2`` the ratio with the
  records' bytes free too;
* ``gluon_ws`` (sm90, where it runs): the pack's fastest bf16 pipeline over both caches, the
  ceiling of a records kernel built on it (a dequantising producer feeding its consumers).

The one design that changes the matrix work itself is FP8 tensor-core math (Q and P rounded to
e4m3 so the records' FP8 values feed the MMA without a bf16 copy): it runs first, on any device
(``--numerics-only``: only it, CPU included), as the output's relative error against the exact
math on the same dequantised records, beside the contract's tolerance (``mismatch``: 1e-2).

Decode-like calls: µs per call replaying a CUDA graph of 20 calls (``lib.timing.graph_us``, as the
records table); prefill: median of CUDA-event times (``lib.timing.event_ms``). Every
timed output is first checked against the reference on its first tokens. Writes
``DIR/exp_records_ceiling.json``.
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
from lib.sparse_mla import (REF, RECORDS_BS as BS, RECORDS_K as KK, D, build_kernels, make_inputs,  # noqa: E402
                            record_cache, records_setup)
from swa_backends.common.device import resolve_device  # noqa: E402
from swa_backends.common.ops import _records as R  # noqa: E402
from swa_backends.kernels import sparse_mla as K  # noqa: E402
from swa_backends.testing.conformance import mismatch  # noqa: E402

HEADS, DECODE_T, PREFILL_T = (64, 128), (1, 8, 32, 64, 128, 256), (4096,)


def fp8_mma_error(fmt: str, dev, T=32, H=64, S=8192, seed=0) -> dict:
    """Relative error (norm) of the attention output when Q, P or both are rounded to FP8 e4m3 (scaled
    per token and head: Q per row of 512, P per row of K) against fp32 math on the same dequantised
    records: what an FP8 tensor-core kernel would add to the contract's error; beside it the error
    of rounding P to bf16 alone, as the bf16 kernels do."""
    g = torch.Generator(device=dev).manual_seed(seed)
    rows = torch.randn(S, D, generator=g, device=dev).to(torch.bfloat16)
    kv = record_cache(fmt, rows, dev)
    idx = torch.randint(0, S, (T, KK), generator=g, device=dev)
    keys = R.dequantize(kv, idx.reshape(-1), fmt, "e4m3fn").float().reshape(T, KK, D)
    q = torch.randn(T, H, D, generator=g, device=dev).to(torch.bfloat16).float()

    def e4m3(x):
        a = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30) / 448.0
        return (x / a).to(torch.float8_e4m3fn).float() * a

    def attn(qq, round_p):
        p = torch.softmax(torch.einsum("thd,tkd->thk", qq, keys) / math.sqrt(D), dim=-1)
        return torch.einsum("thk,tkd->thd", round_p(p), keys)

    exact = attn(q, lambda p: p)
    bf16 = lambda p: p.to(torch.bfloat16).float()  # noqa: E731 - what the bf16 kernels do to P
    return {name: float((attn(qq, rp) - exact).norm() / exact.norm())
            for name, qq, rp in (("p_bf16 (the bf16 kernels)", q, bf16), ("q", e4m3(q), bf16),
                                 ("p", q, e4m3), ("q_and_p", e4m3(q), e4m3))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--formats", default="v4_fp8,v41_mxfp8,v41_nvfp4")
    ap.add_argument("--l2-rows", type=int, default=8192, help="rows of the L2-resident cache (a multiple of 64)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; later cells are skipped past it")
    ap.add_argument("--numerics-only", action="store_true", help="only the FP8-math error (runs on a CPU too)")
    a = ap.parse_args(argv)
    if a.l2_rows <= 0 or a.l2_rows % BS:
        raise SystemExit(f"--l2-rows {a.l2_rows}: expected a positive multiple of {BS}")
    formats = [f for f in a.formats.split(",") if f]
    bad = [f for f in formats if f not in R.FORMATS]
    if bad:
        raise SystemExit(f"--formats {a.formats!r}: {bad} not among {list(R.FORMATS)}")
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    fp8 = {f: fp8_mma_error(f, dev) for f in formats}
    for f, e in fp8.items():
        print(f"FP8 math on {f} records: output rel. error " + ", ".join(f"{k} {v:.4f}" for k, v in e.items())
              + " (contract: 0.01)", flush=True)
    if a.numerics_only:
        a.out.mkdir(parents=True, exist_ok=True)
        results.write_json(a.out / "exp_records_ceiling.json", {"meta": results.machine(dev), "fp8_mma_error": fp8})
        return 0
    if dev.type != "cuda":
        print("needs a CUDA GPU (or --numerics-only)")
        return 2
    dev, rows, res = records_setup(a.out, "decode: µs per call, CUDA graph of 20 calls, median of 5 replays; "
                                          "prefill: µs, median of 5 CUDA-event timed calls")
    res["meta"].update(l2_rows=a.l2_rows, l2_bytes=torch.cuda.get_device_properties(dev).L2_cache_size)
    res["fp8_mma_error"] = fp8
    end = time.time() + a.budget
    scale = 1.0 / math.sqrt(D)
    small = rows[:a.l2_rows].contiguous()
    caches = {f: (record_cache(f, rows, dev), record_cache(f, small, dev)) for f in formats}
    ws = build_kernels(resolve_device(str(dev)), dev, {"gluon_ws"})["gluon_ws"]
    res["meta"]["gluon_ws"] = ws.why_not or "runs"

    def timer(T):
        if T <= max(DECODE_T):
            return lambda fn: tm.graph_us(fn, calls=20, reps=5)
        return lambda fn: tm.event_ms(fn, reps=5) * 1e3

    def measure(T, fn, q, kv, idx, lens, sink, rec):
        """µs of ``fn`` after its first tokens matched the reference, or the reason it was not timed."""
        n = min(T, 4)
        got = fn()
        want = REF(q[:n], kv, idx[:n], lens[:n], scale, D, sink=sink, **rec)
        why = mismatch("sparse_mla", (got[0][:n], got[1][:n]), want)
        return f"wrong: {why}" if why else timer(T)(fn)

    for H in HEADS:
        for T in DECODE_T + PREFILL_T:
            if time.time() > end:
                res["rows"].append({"H": H, "T": T, "skipped": "time budget"})
                continue
            row = {"H": H, "T": T, "us": {}}
            for where, kv_rows in (("", rows), ("_l2", small)):
                q, idx, lens, sink = make_inputs(T, H, KK, D, kv=kv_rows, seed=T + H, dev=dev)
                args = (q, kv_rows, idx, lens, scale, D, sink)
                row["us"]["bf16" + where] = measure(T, lambda: K.launch(*args), *args[:4], sink, {})
                if not ws.why_not and not ws.per_call(*args):
                    row["us"]["gluon_ws" + where] = measure(T, lambda: ws.call(*args), *args[:4], sink, {})
                for f in formats:
                    kv = caches[f][0 if not where else 1]
                    rec = {"kv_format": f, "fp8": "e4m3fn"}
                    row["us"][f + where] = measure(T, lambda: K.launch(q, kv, idx, lens, scale, D, sink, **rec),
                                                   q, kv, idx, lens, sink, rec)
            us = {k: v for k, v in row["us"].items() if isinstance(v, float)}
            b = us.get("bf16")
            row["ratios"] = {k: b / v for k, v in us.items() if b and k != "bf16"}
            if "gluon_ws" in us and "gluon_ws_l2" in us:
                row["ratios"]["gluon_ws_bytes_ceiling"] = us["gluon_ws"] / us["gluon_ws_l2"]
            res["rows"].append(row)
            print(f"H {H:3} T {T:5}: " + ", ".join(
                f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row["us"].items()), flush=True)
            print("             bf16 / x: " + ", ".join(f"{k} {v:.2f}" for k, v in row["ratios"].items()), flush=True)
            results.write_json(a.out / "exp_records_ceiling.json", res)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
