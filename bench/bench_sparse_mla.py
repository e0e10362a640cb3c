#!/usr/bin/env python
"""Sparse-MLA benchmark: every kernel variant against the torch-native baseline, one process, one GPU.

    . bench/gpu_env.sh && python3 bench/bench_sparse_mla.py --out $OUT                   # the table
    . bench/gpu_env.sh && python3 bench/bench_sparse_mla.py --out $OUT --sweep --decode  # + tl sweep, decode
    python bench/bench_sparse_mla.py --out /tmp/smla --smoke                             # CPU: plumbing only

(On one H200, torch 2.11, Triton 3.6, 2026-12-01: under a minute with ``--sweep --decode``, compiles included.)

What it runs, in this order, each measurement in its own ``try`` (a kernel that does not compile,
does not fit or is wrong is a recorded result, never the end of the run):

1. **torch**: the torch-native baseline (gather the rows, two batched matmuls, fp32 softmax with
   the sink), first and alone, at every cell of the table: T 4K / 16K x H 64 / 128 x K 640 / 1152,
   random valid indices into a 1M-row latent cache (1 GiB of bf16: mostly missing L2), sink on,
   ``D_qk = d_v = 512``.
2. **correctness**, per kernel and head count, against the fp32 torch reference on PAD patterns
   (PAD inside the length, short, empty and all-PAD rows, whole PAD tiles) with a sink: a kernel
   that is wrong here is not timed. Each timed cell also spot-checks its first tokens.
3. **the table**: per cell, the time of
   ``triton`` (the portable tl kernel, ``kernels/sparse_mla.py``, with its table config
   ``TUNED``), ``gluon`` (the one-item Hopper Gluon kernel), ``gluon_ws`` (the persistent
   warp-specialised Gluon kernel) and ``default`` (``swa_backends.select(device).sparse_mla``,
   validation off: whatever dispatch picks for the call, named in the row). A kernel whose
   declaration or per-call check rules out the device or the call is listed with the reason.
   TFLOP/s = 2*T*H*K*(D_qk + d_v) / time, and each kernel's ratio to torch of the same run.
   On a GPU the registers, spills and shared memory of every compiled kernel are recorded.
4. ``--sweep``: the tl kernel over launch configs (:data:`SWEEP`, or ``--config``) at T 16K /
   K 640 / H 64 and 128: correctness, what Triton compiled, time; best per head count and a
   suggested ``TUNED`` row.
5. ``--decode``: decode-sized calls (``--decode-t`` for other token counts), latency per call in
   a CUDA graph. CUDA decode attention stays vLLM's in serving: on sm90 vLLM decodes DeepSeek-V4.1
   with FlashMLA's ``flash_mla_with_kvcache`` over the V4 FP8 records (584 B per token), the
   window cache and (compressed layers) the compressed cache in one call. So the comparison with
   vLLM is that call (:func:`run_decode_vllm`: vLLM's arguments as its ``_forward_decode`` passes
   them, its tile-scheduler metadata from ``get_mla_metadata()`` planned on the first call and
   reused, as the layers of a step reuse it) against the pack's tl kernel on the same records and
   indices (the window and top-k rows of one call as one index row over both caches) and the
   pack's default dispatch on them: SWA-only layers (window 128) and compressed layers
   (window 128 + top-k 512), T 1-256 decode tokens, H 64 / 128. FlashMLA comes from vLLM or from
   ``.flashmla/`` (``fetch_flashmla.py``) on ``PYTHONPATH``; without it that column is a reason.
   Then the pack's own op at decode sizes on bf16 rows (K 640; T 1 / 32 / 256): the tl kernel's
   split-K settings, the default path (naming the variant it ran) and torch. No vLLM path makes
   those calls (vLLM's FlashMLA sparse *prefill* kernel is not its decode kernel): they size the
   pack's split-K configs, not a comparison with vLLM.
6. ``--records [FMT[:FP8],...]``: the tl kernel reading a paged DeepSeek-V4/V4.1 record cache
   (``kv_format``; default ``v4_fp8:e4m3fn``, the record SM90 and ROCm serve) beside the same
   kernel on bf16 rows, same indices, same run: a correctness check per format on PAD patterns,
   then decode-like calls (T 1..256, split-K, latency in a CUDA graph) and prefill calls (T 4K /
   16K), each with ``ratio = bf16 time / records time`` (goal: >= 1.3 at T <= 256, where the
   records' fewer bytes per row matter; >= 1.0 at prefill). The records hold the bf16 cache's rows,
   written with the pack's torch writer (vLLM's quantizer) into 64-record pages.

Raw JSON goes to ``--out`` (a directory gets ``bench_sparse_mla.json``); the tables print last.
``--budget`` (seconds, default 300) bounds the run: the table stops at 60% of it, the sweep at
85%, decode at 95%; what was skipped is recorded. Exit status 1 when a check failed or anything
raised.

``--smoke``: small sizes, every section (table, a 1-config sweep, decode; ``--records`` when
given), each measurement one call (``lib.timing``'s smoke mode: no timing loops). On a CPU-only
machine it runs under Triton's interpreter (the script sets ``TRITON_INTERPRET=1`` before Triton
is imported unless it is already set): only the torch baseline, the tl kernel and the CPU default
(the reference) run there, Gluon kernels do not run in the interpreter, and the numbers check the
script, not the kernels' speed. On a GPU ``--smoke`` runs D 512 at a few hundred tokens, compiled,
Gluon included (~1 minute, mostly compiles).

Imports the installed pack (``pip install -e .``; ``bench/gpu_env.sh`` on the GPU machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
import traceback

import torch

from lib import smoke

smoke.use_interpreter()  # before anything imports Triton
INTERPRET = smoke.interpreted()
KERNELS = ("torch", "triton", "gluon", "gluon_ws", "default", "validated")

import swa_backends  # noqa: E402
from lib import results, timing as tm  # noqa: E402
from lib.results import log  # noqa: E402
from lib.sparse_mla import REF, build_kernels, check, make_inputs, record_cache, tflops, torch_baseline  # noqa: E402
from swa_backends.common.device import resolve_device  # noqa: E402
from swa_backends.testing.conformance import mismatch  # noqa: E402

# What one run measures. "tiny" walks the same code on a CPU through the interpreter, one cell and
# one call per path (tests/e2e/test_bench_sparse_mla.py), so a GPU run never meets an untried line; "gpu-smoke" is the
# same on a GPU at D 512 with enough tokens (>= 132 (token, 64-head) programs) for the Gluon kernels.
PLANS = {
    "h200": dict(D=512, S=1 << 20, table_H=(64, 128), table_T=(4096, 16384), table_K=(640, 1152),
                 quick_T=(16384,), quick_K=(640,), sweep=[(16384, 64, 640), (16384, 128, 640)], check_T=512,
                 check_K=1152, spot=128, decode_H=(64, 128), decode_T=(1, 32, 256), decode_K=640,
                 decode_splits=("auto", 1, 2, 4, 10), reps=5, torch_reps=2),
    "gpu-smoke": dict(D=512, S=1 << 16, table_H=(64,), table_T=(256,), table_K=(128, 320), quick_T=(256,),
                      quick_K=(128,), sweep=[(256, 64, 128)], check_T=256, check_K=320, spot=16, decode_H=(64,),
                      decode_T=(1, 8), decode_K=128, decode_splits=("auto", 1, 2), reps=2, torch_reps=1),
    "tiny": dict(D=32, S=3000, table_H=(16,), table_T=(3,), table_K=(40,), quick_T=(3,), quick_K=(40,),
                 sweep=[(3, 16, 40)], check_T=9, check_K=70, spot=4, decode_H=(16,), decode_T=(1,), decode_K=40,
                 decode_splits=("auto", 1), reps=1, torch_reps=1),
}
# --records (D_qk = d_v = 512 always: the records' geometry): rows in the cache, records per page,
# decode-like and prefill token counts, heads, index width (SWA 128 + top-k 512), check tokens.
RECORD_PLANS = {
    "h200": dict(S=1 << 20, bs=64, decode_T=(1, 8, 32, 64, 128, 256), prefill_T=(4096, 16384), H=(64, 128), K=640,
                 check_T=256, reps=5),
    "gpu-smoke": dict(S=1 << 16, bs=64, decode_T=(1, 8), prefill_T=(256,), H=(64,), K=128, check_T=64, reps=2),
    "tiny": dict(S=600, bs=16, decode_T=(1,), prefill_T=(5,), H=(2,), K=20, check_T=9, reps=1),
}

# --decode against vLLM's decode (D_qk = d_v = 512, V4 FP8 records): rows in the record cache (half
# window pages, half compressed pages), records per page, decode tokens, heads, window and top-k widths.
VLLM_DECODE_PLANS = {
    "h200": dict(S=1 << 20, bs=64, T=(1, 8, 32, 64, 128, 256), H=(64, 128), window=128, topk=512, check_T=8),
    "gpu-smoke": dict(S=1 << 16, bs=64, T=(1, 8), H=(64,), window=128, topk=128, check_T=8),
    "tiny": dict(S=640, bs=16, T=(3,), H=(2,), window=16, topk=24, check_T=3),
}
DECODE_FORMAT, DECODE_FP8 = "v4_fp8", "e4m3fn"  # what vLLM 0.33 decodes over on sm90 (584 B per token)

# The tl kernel's launch configs swept by --sweep (kernels/sparse_mla.py:Config fields). Two levers,
# since 64 heads x 512 fp32 accumulators fill half the register file and Q + the KV tiles the shared
# memory of one program per SM:
# * split_s (suffix x): S computed once per tile, split across the two warpgroups (Q K^T HGMMAs of a
#   64-row tile 64 -> 32 per warpgroup);
# * look-ahead: Triton 3.6 issues a tile's gather after the previous tile's math, so only with >= 3
#   KV buffers (block_n 32 at 5 / 7 stages) is a gather in flight while a tile computes.
# Measured on one H200 (torch 2.11, Triton 3.6.0, 2026-11-29), T 16K / K 640, TFLOP/s at H 64 / H 128:
SWEEP: tuple[str, ...] = (
    "block_h=64,block_n=64,num_warps=8,num_stages=2",              # 201 / 213
    "block_h=64,block_n=64,num_warps=8,num_stages=3",              # 203 / 214: the index tile one step ahead
    "block_h=64,block_n=64,num_warps=8,num_stages=2,split_s=1",    # 232 / 248: the table config (TUNED)
    "block_h=64,block_n=64,num_warps=8,num_stages=3,split_s=1",    # 228 / 241
    "block_h=64,block_n=32,num_warps=8,num_stages=3",              # 151 / 157: no look-ahead
    "block_h=64,block_n=32,num_warps=8,num_stages=5",              # 161 / 167: 3 KV buffers, 2 tiles ahead
    "block_h=64,block_n=32,num_warps=8,num_stages=7",              # 158 / 159: 4 KV buffers, 3 tiles ahead
    "block_h=64,block_n=32,num_warps=8,num_stages=5,split_s=1",    # 195 / 197
    "block_h=64,block_n=32,num_warps=8,num_stages=7,split_s=1",    # 185 / 191
    "block_h=64,block_n=16,num_warps=4,num_stages=3,dv_split=2",   # 134 / 140: two programs per SM
)


def parse_config(text: str, base):
    """``"block_n=32,num_warps=8,split_s=1"`` -> a tl ``Config`` (unnamed fields from ``base``)."""
    fields = {f.name for f in dataclasses.fields(base)}
    kw: dict = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = (s.strip() for s in part.partition("="))
        if not sep or name not in fields:
            raise SystemExit(f"--config {text!r}: expected comma-separated name=value with names in {sorted(fields)}")
        if name in ("skip_empty", "split_s"):
            kw[name] = value.lower() in ("1", "true", "yes", "on")
        elif name == "splits" and value.lower() in ("none", "auto", ""):
            kw[name] = None
        else:
            kw[name] = int(value)
    return dataclasses.replace(base, **kw)


# ---------------------------------------------------------------------------------------
# what Triton compiled (GPU): registers, spills, shared memory
# ---------------------------------------------------------------------------------------


def _compiled_objects(jit_fns) -> dict[int, object]:
    """Every compiled kernel Triton holds for these ``triton.jit`` / ``gluon.jit`` functions
    (``JITFunction.device_caches``: per device, the kernel cache first)."""
    found = {}
    for fn in jit_fns:
        for entry in (getattr(fn, "device_caches", None) or {}).values():
            cache = entry[0] if isinstance(entry, tuple) else entry
            for ck in getattr(cache, "values", lambda: ())():
                found[id(ck)] = ck
    return found


def describe_compiled(ck) -> dict:
    """Registers, spills, shared memory and launch shape of one compiled kernel."""
    if hasattr(ck, "result"):  # a future (asynchronous compile)
        ck = ck.result()
    try:
        ck._init_handles()  # loads the binary: n_regs / n_spills come from the driver
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    md = ck.metadata
    return dict(name=getattr(md, "name", getattr(ck, "name", None)), n_regs=getattr(ck, "n_regs", None),
                n_spills=getattr(ck, "n_spills", None), shared=getattr(md, "shared", None),
                num_warps=getattr(md, "num_warps", None), num_stages=getattr(md, "num_stages", None))


def tl_compiled(K, cfg, q, kv, idx, lens, scale, d_v, sink) -> list[dict]:
    """What Triton made of the tl kernel's ``cfg`` for these inputs (compiles, or takes from
    Triton's cache, and launches nothing): the forward kernel (and the combine kernel when the
    call splits). Uses the kernel module's own launcher (``resolve``, ``_run(warmup=True)``)."""
    T, H, D = q.shape
    out = torch.empty(T, H, d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    r = K.resolve(cfg, T, H, D, d_v, idx.shape[1], q.device)
    return [describe_compiled(k) for k in K._run(q, kv, idx, lens, scale, d_v, sink, out, lse, r, warmup=True)]


class CompiledTracker:
    """What a kernel compiled between :meth:`mark` and :meth:`new` (GPU only; the interpreter
    compiles nothing)."""

    def __init__(self, jit_fns):
        self.fns = [f for f in jit_fns if f is not None]
        self._before: set = set()

    def mark(self):
        self._before = set(_compiled_objects(self.fns))

    def new(self) -> list[dict]:
        return [describe_compiled(ck) for k, ck in _compiled_objects(self.fns).items() if k not in self._before]


# ---------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (and bench/README.md) for what each section measures.")
    ap.add_argument("--out", required=True, help="directory (gets bench_sparse_mla.json) or a .json path")
    ap.add_argument("--kernels", default=",".join(KERNELS),
                    help=f"comma-separated columns of the table, from {','.join(KERNELS)} (default: all)")
    ap.add_argument("--quick", action="store_true",
                    help="the table at T 16K / K 640 only (both head counts); --sweep: its first 4 configs")
    ap.add_argument("--sweep", action="store_true", help="also sweep the tl kernel's launch configs (SWEEP)")
    ap.add_argument("--config", action="append", default=None, metavar="NAME=VALUE,...",
                    help="with --sweep: a tl Config to sweep instead of SWEEP (repeatable), e.g. "
                         "block_h=64,block_n=64,num_warps=8,num_stages=2,split_s=1")
    ap.add_argument("--decode", action="store_true",
                    help="also decode-sized calls (CUDA graphs): vLLM's FlashMLA decode over V4 FP8 records against "
                         "the pack on the same records; the pack's tl split-K settings, default path and torch on "
                         "bf16 rows")
    ap.add_argument("--decode-t", default=None, metavar="T,T,...",
                    help="with --decode: the token counts to time instead of the plan's (positive integers)")
    ap.add_argument("--records", nargs="?", const="v4_fp8:e4m3fn", default=None, metavar="FMT[:FP8],...",
                    help="also time the tl kernel reading paged KV records beside bf16 rows (same indices; decode-like "
                         "T <= 256 with split-K in CUDA graphs, and prefill): ratio = bf16 time / records time. "
                         "Formats v4_fp8, v41_mxfp8, v41_nvfp4; flavour e4m3fn (default) or e4m3fnuz; "
                         "default v4_fp8:e4m3fn")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds; later sections are skipped past it")
    ap.add_argument("--smoke", action="store_true",
                    help="small sizes, every section; on a CPU under Triton's interpreter (plumbing only)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    wanted = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = sorted(set(wanted) - set(KERNELS))
    if unknown:
        raise SystemExit(f"--kernels: unknown {unknown}; choose from {list(KERNELS)}")
    decode_t = None
    if args.decode_t is not None:
        parts = [p.strip() for p in args.decode_t.split(",")]
        if not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--decode-t: {args.decode_t!r}; expected comma-separated positive integers, e.g. 1,2,4")
        decode_t = tuple(int(p) for p in parts)
    why = smoke.refusal(args.smoke, cpu_only=False)
    if why:
        log(why)
        return 2
    on_gpu = torch.cuda.is_available()
    tm.set_smoke(args.smoke)
    if args.smoke:
        args.sweep = args.decode = True
    plan = PLANS["h200" if not args.smoke else ("gpu-smoke" if on_gpu else "tiny")]
    if decode_t is not None:
        plan = {**plan, "decode_T": decode_t}
    D = DV = plan["D"]
    out_path = results.out_file(args.out, "bench_sparse_mla.json")
    t_start = time.time()
    dev = "cuda" if on_gpu else "cpu"
    tdev = torch.device(dev, torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    device_info = resolve_device(str(tdev))
    scale = 1.0 / math.sqrt(D)
    from swa_backends.kernels import sparse_mla as tl_mod

    result: dict = {
        "meta": {
            **results.machine(tdev), "argv": results.command_line(),
            "kernel_sha256_16": {f: results.file_sha(results.ROOT / "kernels" / f) for f in
                                 ("sparse_mla.py", "sparse_mla_gluon.py", "sparse_mla_gluon_ws.py")},
            "interpret": INTERPRET, "smoke": args.smoke, "plan": plan, "budget_s": args.budget,
            "flops": "2*T*H*K*(D_qk+d_v)", "D_qk": D, "d_v": DV,
            "method": "median of CUDA-event times around each call; every call with a sink; random valid indices "
                      f"into a {plan['S']}-row cache; default = select(device).sparse_mla with validation off "
                      "(lib/timing.py)",
        },
        "not_run": {}, "dispatch": {}, "correctness": [], "compiled": [], "baseline": [], "table": [],
        "sweep": [], "best": {}, "decode_vllm": [], "decode": [], "records": [], "errors": [], "sections_s": {},
    }
    meta = result["meta"]

    def elapsed():
        return time.time() - t_start

    def save():
        meta["elapsed_s"] = round(elapsed(), 1)
        results.write_json(out_path, result)

    def err(where: str, exc: BaseException) -> str:
        """Record a failure (traceback in errors[]) and return its one-line reason."""
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        why = f"{type(exc).__name__}: {lines[-1][:240] if lines else ''}"
        result["errors"].append({"where": where, "why": why, "traceback": traceback.format_exc()[-2000:]})
        return why

    def section(name: str, t0: float):
        result["sections_s"][name] = round(time.time() - t0, 1)
        save()

    log(f"device {meta['device']}, torch {meta['torch']}, triton {meta['triton']}, plan "
        f"{'h200' if not args.smoke else 'smoke'} (D {D}, {plan['S']}-row cache)")
    if INTERPRET:
        log("TRITON_INTERPRET=1 (CPU smoke run): only the torch baseline, the tl kernel (variant triton) and the "
            "CPU default path run; Gluon kernels do not run in Triton's interpreter. Numbers check the script, "
            "not the kernels.")
    swa_backends.set_validation(False)  # the timed hot path; the validated column turns it on for its own calls
    kernels = build_kernels(device_info, tdev, wanted)
    for name, k in kernels.items():
        if k.why_not:
            result["not_run"][name] = k.why_not
            log(f"{name}: not run here: {k.why_not}")
    if "default" in kernels:
        expl = kernels["default"].backend.explain()
        result["dispatch"] = {"device": str(device_info), "chosen": list(expl.chosen.get("sparse_mla", ())),
                              "table": [{"variant": c.variant, "status": c.status, "reasons": list(c.reasons)}
                                        for c in expl.table if c.op == "sparse_mla"]}
        log(f"dispatch on {device_info}: sparse_mla tries {result['dispatch']['chosen']} in order")
    runnable = {n: k for n, k in kernels.items() if not k.why_not}
    g_kv = torch.randn(plan["S"], D, device=dev, dtype=torch.float32).to(torch.bfloat16)
    T_list = plan["quick_T"] if args.quick else plan["table_T"]
    K_list = plan["quick_K"] if args.quick else plan["table_K"]

    # ---- 1: torch baseline, alone (nothing a kernel can fail takes it down) -------------
    t0 = time.time()
    base: dict = {}
    if "torch" in runnable:
        for H in plan["table_H"]:
            q_all, idx_all, _, sink = make_inputs(max(T_list), H, max(K_list), D, kv=g_kv, seed=7 + H, dev=dev)
            for T in T_list:
                for Kw in K_list:
                    q, idx = q_all[:T], idx_all[:T, :Kw].contiguous()
                    lens = torch.full((T,), Kw, dtype=torch.int32, device=dev)
                    row = {"T": T, "H": H, "K": Kw}
                    try:
                        if T == T_list[0] and Kw == K_list[0]:  # the baseline's own check, once per H
                            n = plan["spot"]
                            why, rel = check(torch_baseline(q[:n], g_kv, idx[:n], lens[:n], scale, DV, sink),
                                             q, g_kv, idx, lens, scale, DV, sink, n=n)
                            result["correctness"].append({"kernel": "torch", "H": H, "what": f"{n} tokens",
                                                          "ok": why is None, "rel_err": rel, "why": why})
                        ms = tm.event_ms(lambda: torch_baseline(q, g_kv, idx, lens, scale, DV, sink), reps=plan["torch_reps"])
                        row.update(ms=ms, tflops=tflops(T, H, Kw, D, DV, ms))
                    except Exception as exc:
                        row["error"] = err(f"torch T={T} H={H} K={Kw}", exc)
                    base[(T, H, Kw)] = row
                    result["baseline"].append(row)
                    log(f"torch T={T} H={H} K={Kw}: {row.get('tflops', float('nan')):.1f} TFLOP/s "
                        f"{row.get('ms', float('nan')):.2f} ms {row.get('error', '')}")
                    if on_gpu:
                        torch.cuda.empty_cache()
            del q_all, idx_all
    section("baseline", t0)

    # ---- 2: correctness of every kernel on PAD patterns + sink, per head count ---------
    t0 = time.time()
    bad: set = set()
    for H in plan["table_H"]:
        cq, cidx, clens, csink = make_inputs(plan["check_T"], H, plan["check_K"], D, kv=g_kv, pads=True,
                                             seed=100 + H, dev=dev)
        cargs = (cq, g_kv, cidx, clens, scale, DV, csink)
        for name, k in runnable.items():
            if name == "torch":
                continue
            entry = {"kernel": name, "H": H, "what": f"PAD patterns + sink, T {plan['check_T']}, K {plan['check_K']}"}
            reasons = k.per_call(*cargs) if k.per_call else []
            if reasons:
                entry.update(ok=None, skipped="; ".join(reasons))
                log(f"check {name} H={H}: not taken ({entry['skipped']})")
                result["correctness"].append(entry)
                continue
            try:
                entry["label"] = k.label(*cargs)
                tracker = CompiledTracker(k.jit_fns)
                tracker.mark()
                got = k.call(*cargs)
                tm.sync()
                why, rel = check(got, *cargs)
                entry.update(ok=why is None, rel_err=rel, why=why)
                for info in tracker.new() if on_gpu else ():
                    result["compiled"].append({"kernel": name, "H": H, "label": entry["label"], **info})
                    log(f"compiled {name} H={H} {info.get('name')}: regs {info.get('n_regs')} spills "
                        f"{info.get('n_spills')} smem {info.get('shared')} warps {info.get('num_warps')}")
            except Exception as exc:
                entry.update(ok=False, why=err(f"check {name} H={H}", exc))
            if not entry["ok"]:
                bad.add((name, H))
            result["correctness"].append(entry)
            log(f"check {name} H={H} ({entry.get('label')}): {'ok' if entry['ok'] else 'WRONG'} "
                f"rel_err {entry.get('rel_err', float('nan')):.2e} {entry.get('why') or ''}")
            save()
        del cq, cidx, clens
    section("correctness", t0)

    # ---- 3: the table ------------------------------------------------------------------
    t0 = time.time()
    for H in plan["table_H"]:
        q_all, idx_all, _, sink = make_inputs(max(T_list), H, max(K_list), D, kv=g_kv, seed=7 + H, dev=dev)
        for T in T_list:
            for Kw in K_list:
                q, idx = q_all[:T], idx_all[:T, :Kw].contiguous()
                lens = torch.full((T,), Kw, dtype=torch.int32, device=dev)
                a = (q, g_kv, idx, lens, scale, DV, sink)
                row: dict = {"T": T, "H": H, "K": Kw, "runs": {}, "vs_torch": {}}
                b = base.get((T, H, Kw), {})
                if "ms" in b:
                    row["runs"]["torch"] = {"ms": b["ms"], "tflops": b["tflops"], "label": "gather + 2 bmm"}
                for name, k in runnable.items():
                    if name == "torch":
                        continue
                    r: dict = {}
                    row["runs"][name] = r
                    if elapsed() > 0.6 * args.budget:
                        r["skipped"] = "time budget"
                        continue
                    if (name, H) in bad:
                        r["skipped"] = "failed its correctness check"
                        continue
                    reasons = k.per_call(*a) if k.per_call else []
                    if reasons:
                        r["skipped"] = "; ".join(reasons)
                        continue
                    try:
                        r["label"] = k.label(*a)
                        fn = lambda k=k: k.call(*a)  # noqa: E731
                        why, rel = check(tm.call(fn), *a, n=plan["spot"])
                        r.update(correct=why is None, rel_err=rel, why=why)
                        if why is not None:
                            continue
                        ms = tm.event_ms(fn, reps=plan["reps"])
                        r.update(ms=ms, tflops=tflops(T, H, Kw, D, DV, ms))
                    except Exception as exc:
                        r["error"] = err(f"table {name} T={T} H={H} K={Kw}", exc)
                t_ms = row["runs"].get("torch", {}).get("ms")
                for name, r in row["runs"].items():
                    if t_ms and "ms" in r:
                        row["vs_torch"][name] = t_ms / r["ms"]
                result["table"].append(row)
                log(f"T={T} H={H} K={Kw}: " + " | ".join(
                    f"{n} {r.get('tflops', float('nan')):.1f}" for n, r in row["runs"].items()) + " TFLOP/s"
                    + (f" (default ran {row['runs']['default'].get('label')})" if "default" in row["runs"] else ""))
                save()
                del q, idx, lens, a
                if on_gpu:
                    torch.cuda.empty_cache()
        del q_all, idx_all
    section("table", t0)

    # ---- 4: --sweep: the tl kernel's launch configs ----------------------------------------
    if args.sweep:
        t0 = time.time()
        run_sweep(args, plan, result, g_kv, D, DV, scale, dev, tdev, tl_mod, elapsed, err, save)
        section("sweep", t0)

    # ---- 5: --decode: latency and bandwidth of decode-sized calls -------------------------
    if args.decode:
        t0 = time.time()
        vp = VLLM_DECODE_PLANS["h200" if not args.smoke else ("gpu-smoke" if on_gpu else "tiny")]
        if decode_t is not None:
            vp = {**vp, "T": decode_t}
        run_decode_vllm(plan, vp, result, dev, tdev, tl_mod, elapsed, args.budget, err, save)
        run_decode(args, plan, result, kernels, g_kv, D, DV, scale, dev, tl_mod, elapsed, err, save)
        section("decode", t0)

    # ---- 6: --records: the tl kernel on paged KV records beside bf16 rows ------------------
    if args.records:
        t0 = time.time()
        rplan = RECORD_PLANS["h200" if not args.smoke else ("gpu-smoke" if on_gpu else "tiny")]
        meta["records_plan"] = rplan
        run_records(args.records, rplan, result, dev, tdev, tl_mod, elapsed, args.budget, err, save)
        section("records", t0)

    save()
    print_summary(result)
    log(f"raw results: {out_path}")
    ok = all(c.get("ok") is not False for c in result["correctness"]) and not result["errors"]
    ok = ok and all(r.get("correct") is not False for row in result["table"] for r in row["runs"].values())
    ok = ok and all(r.get("correct") is not False for row in result["decode_vllm"]  # the pack's; FlashMLA's recorded
                    for n, r in row["runs"].items() if n != "flashmla")
    return 0 if ok else 1


def run_sweep(args, plan, result, g_kv, D, DV, scale, dev, tdev, K, elapsed, err, save) -> None:
    """Section 4: every config on its own (compile, check on PAD patterns, time)."""
    texts = args.config or list(SWEEP[:4] if args.quick else SWEEP[2:3] if args.smoke else SWEEP)
    configs = [parse_config(c, K.Config()) for c in texts]
    for T, H, Kw in plan["sweep"]:
        q, idx, lens, sink = make_inputs(T, H, Kw, D, kv=g_kv, seed=H, dev=dev)
        cq, cidx, clens, csink = make_inputs(plan["check_T"], H, plan["check_K"], D, kv=g_kv, pads=True,
                                             seed=100 + H, dev=dev)
        best = None
        for cfg in configs:
            if cfg.block_h > max(H, 64):  # block_h is clipped to H: 128 on 64 heads repeats a 64 config
                continue
            row = {"T": T, "H": H, "K": Kw, "config": cfg.short(), "config_fields": dataclasses.asdict(cfg)}
            result["sweep"].append(row)
            if elapsed() > 0.85 * args.budget:
                row["status"] = "skipped (time budget)"
                continue
            try:
                t1 = time.time()
                got = K.launch(cq, g_kv, cidx, clens, scale, DV, csink, config=cfg, fit=False)
                tm.sync()
                row["compile_s"] = round(time.time() - t1, 1)
                if torch.cuda.is_available():  # what Triton compiled: registers, spills, shared memory
                    try:
                        row["compiled"] = tl_compiled(K, cfg, q, g_kv, idx, lens, scale, DV, sink)
                    except Exception as exc:
                        row["compiled"] = [{"error": f"{type(exc).__name__}: {str(exc)[:200]}"}]
                why, rel = check(got, cq, g_kv, cidx, clens, scale, DV, csink)
                result["correctness"].append({"kernel": f"triton {cfg.short()}", "H": H, "ok": why is None,
                                              "rel_err": rel, "why": why,
                                              "what": f"sweep: PAD patterns + sink, K {plan['check_K']}"})
                if why is not None:
                    row["status"] = f"wrong: {why}"
                else:
                    ms = tm.event_ms(lambda: K.launch(q, g_kv, idx, lens, scale, DV, sink, config=cfg, fit=False),
                               reps=plan["reps"])
                    row.update(status="ok", ms=ms, tflops=tflops(T, H, Kw, D, DV, ms))
                    if best is None or ms < best[1]:
                        best = (cfg, ms)
            except Exception as exc:  # a config that does not compile or fit is a result, not a crash
                row["status"] = "error: " + err(f"sweep {cfg.short()} H={H}", exc)
            c = (row.get("compiled") or [{}])[0]
            log(f"sweep T={T} H={H} K={Kw} {cfg.short():>16}: {row.get('status')} "
                f"{row.get('tflops', float('nan')):.1f} TFLOP/s (regs {c.get('n_regs')}, spills {c.get('n_spills')}, "
                f"smem {c.get('shared')})")
            save()
        result["best"][str(H)] = ({"config": best[0].short(), "fields": dataclasses.asdict(best[0]), "ms": best[1],
                                   "table_config": K.pick_config(T, H, D, DV, Kw, tdev).short()} if best else None)
        del q, idx, lens, cq, cidx, clens


def flashmla_decode():
    """``(interface module, None)`` with vLLM's ``flash_mla_with_kvcache`` and ``get_mla_metadata``
    where the pack's probe finds FlashMLA (vLLM, or ``.flashmla/`` on ``PYTHONPATH``), else
    ``(None, why)``."""
    if not torch.cuda.is_available():
        return None, "no CUDA device (FlashMLA's sparse decode runs on sm90 / sm100)"
    from swa_backends.backends.cuda.probes import find_flashmla

    mod, why = find_flashmla()
    if mod is None:
        return None, why
    missing = [n for n in ("flash_mla_with_kvcache", "get_mla_metadata") if not hasattr(mod, n)]
    if missing:
        return None, f"{mod.__name__} has no {'/'.join(missing)}"
    return mod, None


def decode_indices(T: int, vp: dict, window_pages: int, comp_pages: int, g, dev):
    """One decode step's indices into a record cache whose first ``window_pages`` pages are the
    window cache and the next ``comp_pages`` the compressed one: each token's window (``window``
    consecutive positions over pages of its own, as a request's last window lies), its top-k
    (random compressed slots), and their lengths (a few short, most full)."""
    bs, W, k = vp["bs"], vp["window"], vp["topk"]
    span = -(-(W + bs) // bs)  # pages a window can touch
    pages = torch.rand(T, window_pages, generator=g, device=dev).argsort(dim=1)[:, :span].to(torch.int32)
    pos = torch.randint(0, bs, (T, 1), generator=g, device=dev, dtype=torch.int32) + torch.arange(
        W, device=dev, dtype=torch.int32)
    window = pages.gather(1, (pos // bs).long()) * bs + pos % bs
    topk = torch.randint(0, comp_pages * bs, (T, k), generator=g, device=dev, dtype=torch.int32)
    swa_len = torch.full((T,), W, dtype=torch.int32, device=dev)
    topk_len = torch.full((T,), k, dtype=torch.int32, device=dev)
    swa_len[1::4] = torch.randint(1, W + 1, (len(range(1, T, 4)),), generator=g, device=dev, dtype=torch.int32)
    topk_len[2::4] = torch.randint(1, k + 1, (len(range(2, T, 4)),), generator=g, device=dev, dtype=torch.int32)
    return window, swa_len, topk, topk_len


def run_decode_vllm(plan, vp, result, dev, tdev, K, elapsed, budget, err, save) -> None:
    """Section 5, against what vLLM runs: ``flash_mla_with_kvcache`` over V4 FP8 records (as
    ``DeepseekV4FlashMLAAttention._forward_decode`` calls it on sm90) and the pack's tl kernel
    and default dispatch on the same records and indices. The pack reads both caches in one
    index row: the records sit in one tensor whose leading pages FlashMLA gets as its window
    cache and the rest as its compressed (extra) cache, each a view."""
    from swa_backends.common.ops import _records as R

    D = R.HEAD_DIM
    scale = 1.0 / math.sqrt(D)
    fm, why_not = flashmla_decode()
    info = result["decode_vllm_meta"] = {
        "format": f"{DECODE_FORMAT}/{DECODE_FP8}", "record_bytes": R.FORMATS[DECODE_FORMAT].record_bytes,
        "plan": vp, "flashmla": why_not or f"{fm.__name__}.flash_mla_with_kvcache"}
    if why_not:
        log(f"decode vs vLLM: FlashMLA not run here: {why_not}")
    bs = vp["bs"]
    pages = -(-vp["S"] // bs)
    window_pages = pages // 2
    g = torch.Generator(device=dev).manual_seed(23)
    kv = R.new_cache(pages, bs, DECODE_FORMAT, device=dev)
    step = 1 << 15  # the torch writer's fp32 temporaries stay small
    for c in range(0, pages * bs, step):
        n = min(pages * bs, c + step) - c
        rows = torch.randn(n, D, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
        R.write(kv, rows, torch.arange(c, c + n, device=dev), DECODE_FORMAT, DECODE_FP8)
    tm.sync()
    swa_cache, comp_cache = kv[:window_pages], kv[window_pages:]  # views: one allocation, two caches
    rec = {"kv_format": DECODE_FORMAT, "fp8": DECODE_FP8}
    backend = swa_backends.select(tdev, checked=False)
    info["default_chain"] = list(backend.variants.get("sparse_mla", ()))
    for H in vp["H"]:
        for T in vp["T"]:
            q = torch.randn(T, H, D, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
            sink = torch.randn(H, generator=g, device=dev)
            window, swa_len, topk, topk_len = decode_indices(T, vp, window_pages, pages - window_pages, g, dev)
            j_w = torch.arange(vp["window"], device=dev)[None, :]
            j_k = torch.arange(vp["topk"], device=dev)[None, :]
            w_row = torch.where(j_w < swa_len[:, None], window, -1)  # the pack's rows: PAD past each length
            k_row = torch.where(j_k < topk_len[:, None], topk + window_pages * bs, -1)
            for layer in ("swa-only", "compressed"):
                row = {"layer": layer, "T": T, "H": H, "window": vp["window"],
                       "topk": vp["topk"] if layer == "compressed" else 0, "runs": {}}
                result["decode_vllm"].append(row)
                if elapsed() > 0.95 * budget:
                    row["skipped"] = "time budget"
                    continue
                if layer == "swa-only":
                    idx, lens = window.contiguous(), swa_len
                else:
                    idx = torch.cat([w_row, k_row], dim=1).contiguous()
                    lens = torch.full((T,), idx.shape[1], dtype=torch.int32, device=dev)
                row["K"] = idx.shape[1]
                n = min(T, vp["check_T"])
                want = REF(q[:n], kv, idx[:n], lens[:n], scale, D, sink=sink, **rec)
                runs = [("triton", lambda: K.launch(q, kv, idx, lens, scale, D, sink, **rec)),
                        ("default", lambda: backend.sparse_mla(q, kv, idx, lens, scale, D, sink=sink, **rec))]
                if fm is not None:
                    sched, _ = fm.get_mla_metadata()
                    out = torch.empty(T, 1, H, D, dtype=torch.bfloat16, device=dev)
                    extra = dict(extra_k_cache=comp_cache.unsqueeze(-2), extra_indices_in_kvcache=topk.view(T, 1, -1),
                                 extra_topk_length=topk_len) if layer == "compressed" else {}
                    # vLLM's _forward_decode: q [T, 1, H, D], the caches [pages, bs, 1, bytes], window
                    # indices [T, 1, W] with their lengths, the top-k ones as the extra cache's
                    runs.insert(0, ("flashmla", lambda: fm.flash_mla_with_kvcache(
                        q=q.unsqueeze(1), k_cache=swa_cache.unsqueeze(-2), block_table=None, head_dim_v=D,
                        tile_scheduler_metadata=sched, cache_seqlens=None, is_fp8_kvcache=True,
                        indices=window.view(T, 1, -1), topk_length=swa_len, softmax_scale=scale, attn_sink=sink,
                        out=out, **extra)))
                else:
                    row["runs"]["flashmla"] = {"not_run": why_not}
                for name, fn in runs:
                    r: dict = {}
                    row["runs"][name] = r
                    try:
                        if name == "default":
                            r["label"] = backend.variant_for("sparse_mla", q, kv, idx, lens, scale, D, sink=sink, **rec)
                        got = tm.call(fn)
                        got = (got[0].view(T, H, D)[:n], None)  # FlashMLA's lse is in its own layout: out only
                        r["why"] = mismatch("sparse_mla", got, (want[0], None))
                        r["correct"] = r["why"] is None
                        r["rel_err"] = float((got[0].float() - want[0].float()).norm()
                                             / want[0].float().norm().clamp_min(1e-6))
                        r["graph_us"] = tm.graph_us(fn, calls=20, reps=5)  # timed either way; the row says whether it matched
                    except Exception as exc:
                        r["error"] = err(f"decode vs vLLM {name} {layer} T={T} H={H}", exc)
                base = row["runs"].get("flashmla", {}).get("graph_us")
                for name, r in row["runs"].items():
                    if base and "graph_us" in r:
                        r["vs_flashmla"] = base / r["graph_us"]
                log(f"decode vs vLLM {layer} T={T} H={H} K={row['K']}: " + " | ".join(
                    f"{name} " + (f"{r['graph_us']:.1f} us" if "graph_us" in r else "not run" if "not_run" in r
                                  else r.get("error", "-")) + (f" ({r['label']})" if "label" in r else "")
                    for name, r in row["runs"].items()))
                save()
    del kv, swa_cache, comp_cache
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_decode(args, plan, result, kernels, g_kv, D, DV, scale, dev, K, elapsed, err, save) -> None:
    """Section 5, the pack's own op at decode sizes on bf16 rows (no vLLM path makes these calls);
    latency per call replayed in a CUDA graph (eager off-GPU)."""
    Kw = plan["decode_K"]
    tdev = torch.device(dev) if dev == "cpu" else torch.device(dev, torch.cuda.current_device())
    for H in plan["decode_H"]:
        for T in plan["decode_T"]:
            q, idx, lens, sink = make_inputs(T, H, Kw, D, kv=g_kv, seed=T + H, dev=dev)
            a = (q, g_kv, idx, lens, scale, DV, sink)
            kv_bytes = T * Kw * D * 2
            row = {"T": T, "H": H, "K": Kw, "kv_bytes": kv_bytes, "variants": []}
            table_cfg = K.pick_config(T, H, D, DV, Kw, tdev)
            cands = [(f"triton splits={sp}", table_cfg.replace(splits=None if sp == "auto" else sp))
                     for sp in plan["decode_splits"]]
            runs = [(n, (lambda cfg=cfg: K.launch(*a, config=cfg)), cfg) for n, cfg in cands]
            if "default" in kernels and not kernels["default"].why_not:
                runs.append(("default " + kernels["default"].label(*a), lambda: kernels["default"].call(*a), None))
            if "torch" in kernels:
                runs.append(("torch", lambda: torch_baseline(*a), None))
            for name, fn, cfg in runs:
                if elapsed() > 0.95 * args.budget:
                    row["variants"].append({"name": name, "skipped": "time budget"})
                    continue
                v: dict = {"name": name}
                if cfg is not None:
                    v["resolved_splits"] = K.resolve(cfg, T, H, D, DV, Kw, tdev)["splits"]
                try:
                    why, rel = check(tm.call(fn), *a)
                    v.update(correct=why is None, rel_err=rel, why=why)
                    us = tm.graph_us(fn, calls=20 if name != "torch" else 5, reps=5)
                    v.update(graph_us=us, kv_GBps=kv_bytes / (us * 1e-6) / 1e9)
                except Exception as exc:
                    v["error"] = err(f"decode {name} T={T} H={H}", exc)
                row["variants"].append(v)
            ok = [v for v in row["variants"] if "graph_us" in v and v.get("correct") and v["name"].startswith("triton")]
            if ok:
                b = min(ok, key=lambda v: v["graph_us"])
                row.update(best=b["name"], best_graph_us=b["graph_us"], best_kv_GBps=b["kv_GBps"])
            result["decode"].append(row)
            log(f"decode T={T} H={H} K={Kw}: " + " | ".join(
                f"{v['name']} {v.get('graph_us', float('nan')):.1f} us" for v in row["variants"]))
            save()


def parse_records(text: str) -> list[tuple[str, str]]:
    """``"v4_fp8,v41_mxfp8:e4m3fnuz"`` -> ``[("v4_fp8", "e4m3fn"), ("v41_mxfp8", "e4m3fnuz")]``."""
    from swa_backends.common.ops import _records as R

    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        fmt, _, fl = part.partition(":")
        if fmt not in R.FORMATS or (fl and fl not in R.FORMATS[fmt].fp8_flavours):
            raise SystemExit(f"--records {text!r}: expected FMT[:FP8] with FMT in {list(R.FORMATS)} and FP8 one of "
                             f"the format's flavours {({n: f.fp8_flavours for n, f in R.FORMATS.items()})}")
        out.append((fmt, fl or R.FORMATS[fmt].fp8_flavours[0]))
    return out


def run_records(spec: str, rp: dict, result: dict, dev, tdev, K, elapsed, budget, err, save) -> None:
    """Section 6: the tl kernel on a record cache beside the same kernel on bf16 rows (the records
    hold those rows quantized), same indices and sink, each call with the kernel's table config."""
    from swa_backends.common.ops import _records as R

    D = 512
    scale = 1.0 / math.sqrt(D)
    g = torch.Generator(device=dev).manual_seed(11)
    rows = torch.randn(rp["S"], D, generator=g, device=dev, dtype=torch.float32).to(torch.bfloat16)
    on_gpu = torch.cuda.is_available()
    for fmt, fl in parse_records(spec):
        name = f"{fmt}/{fl}"
        bs = rp["bs"]
        kv = record_cache(fmt, rows, dev, fp8=fl, bs=bs)
        tm.sync()
        rec_kw = {"kv_format": fmt, "fp8": fl}
        # correctness on PAD patterns, per head count, against the fp32 reference on the records
        for H in rp["H"]:
            q, idx, lens, sink = make_inputs(rp["check_T"], H, rp["K"], D, kv=rows, pads=True, seed=200 + H, dev=dev)
            entry = {"kernel": f"triton records {name}", "H": H, "what": f"PAD patterns + sink, T {rp['check_T']}"}
            try:
                tracker = CompiledTracker((K._sparse_mla_fwd, K._sparse_mla_combine))
                tracker.mark()
                got = K.launch(q, kv, idx, lens, scale, D, sink, **rec_kw)
                tm.sync()
                want = REF(q, kv, idx, lens, scale, D, sink=sink, **rec_kw)
                why = mismatch("sparse_mla", got, want)
                rel = float((got[0].float() - want[0].float()).norm() / want[0].float().norm().clamp_min(1e-6))
                entry.update(ok=why is None, rel_err=rel, why=why)
                for info in tracker.new() if on_gpu else ():
                    result["compiled"].append({"kernel": f"triton records {name}", "H": H, "label": "check", **info})
            except Exception as exc:
                entry.update(ok=False, why=err(f"records check {name} H={H}", exc))
            result["correctness"].append(entry)
            log(f"check records {name} H={H}: {'ok' if entry['ok'] else 'WRONG'} "
                f"rel_err {entry.get('rel_err', float('nan')):.2e} {entry.get('why') or ''}")
            if not entry["ok"]:
                continue
            for kind, T_list in (("decode", rp["decode_T"]), ("prefill", rp["prefill_T"])):
                for T in T_list:
                    row = {"format": name, "kind": kind, "T": T, "H": H, "K": rp["K"]}
                    result["records"].append(row)
                    if elapsed() > 0.97 * budget:
                        row["skipped"] = "time budget"
                        continue
                    try:
                        q, idx, lens, sink = make_inputs(T, H, rp["K"], D, kv=rows, seed=T + H, dev=dev)
                        bf16 = lambda: K.launch(q, rows, idx, lens, scale, D, sink)  # noqa: E731
                        rec = lambda: K.launch(q, kv, idx, lens, scale, D, sink, **rec_kw)  # noqa: E731
                        spot = min(T, 4)
                        got = tm.call(rec)
                        why = mismatch("sparse_mla", (got[0][:spot], got[1][:spot]),
                                       REF(q[:spot], kv, idx[:spot], lens[:spot], scale, D, sink=sink, **rec_kw))
                        if why is not None:
                            row["why"] = f"wrong: {why}"
                            continue
                        row["bf16_splits"] = K.resolve(K.pick_config(T, H, D, D, rp["K"], tdev), T, H, D, D, rp["K"],
                                                       tdev)["splits"]
                        row["records_splits"] = K.resolve(K.pick_config(T, H, D, D, rp["K"], tdev, fmt), T, H, D, D,
                                                          rp["K"], tdev, K.kv_spec(kv, fmt, fl, True, tdev))["splits"]
                        if kind == "decode":
                            row["bf16_us"] = tm.graph_us(bf16, calls=20, reps=5)
                            row["records_us"] = tm.graph_us(rec, calls=20, reps=5)
                            row["ratio"] = row["bf16_us"] / row["records_us"]
                            secs = row["records_us"] * 1e-6
                        else:
                            row["bf16_ms"] = tm.event_ms(bf16, reps=rp["reps"])
                            row["records_ms"] = tm.event_ms(rec, reps=rp["reps"])
                            row["ratio"] = row["bf16_ms"] / row["records_ms"]
                            row["records_tflops"] = tflops(T, H, rp["K"], D, D, row["records_ms"])
                            row["bf16_tflops"] = tflops(T, H, rp["K"], D, D, row["bf16_ms"])
                            secs = row["records_ms"] * 1e-3
                        row["records_kv_GBps"] = T * rp["K"] * R.FORMATS[fmt].record_bytes / secs / 1e9
                    except Exception as exc:
                        row["error"] = err(f"records {name} {kind} T={T} H={H}", exc)
                    log(f"records {name} {kind} T={T} H={H}: ratio {row.get('ratio', float('nan')):.2f} "
                        f"{row.get('why') or row.get('error') or ''}")
                    save()
                    if on_gpu:
                        torch.cuda.empty_cache()
        kv = None  # free this format's cache before the next one is written


def print_summary(result: dict) -> None:
    meta, nan = result["meta"], float("nan")
    names = [n for n in KERNELS if any(n in r["runs"] for r in result["table"])]
    log(f"\n== sparse MLA, {meta['device']}, torch {meta['torch']}, Triton {meta['triton']}: TFLOP/s = "
        f"2*T*H*K*(D_qk+d_v)/time, D_qk = d_v = {meta['D_qk']}, {meta['plan']['S']}-row cache, random valid indices, "
        "sink; torch = gather + 2 bmm (fp32 softmax), same run ==")
    if result["not_run"]:
        for n, why in result["not_run"].items():
            log(f"  not run: {n}: {why}")
    log(f"  {'T':>6} {'H':>4} {'K':>5} | " + " | ".join(f"{n:>8}" for n in names) + " | default ran | "
        + " | ".join(f"{n + '/torch':>14}" for n in names if n != "torch"))
    for r in result["table"]:
        vals = [r["runs"].get(n, {}).get("tflops", nan) for n in names]
        ratios = [r["vs_torch"].get(n, nan) for n in names if n != "torch"]
        log(f"  {r['T']:>6} {r['H']:>4} {r['K']:>5} | " + " | ".join(f"{v:8.1f}" for v in vals)
            + f" | {str(r['runs'].get('default', {}).get('label', '-')):>11} | "
            + " | ".join(f"{x:13.2f}x" for x in ratios))
    skipped = {(n, r["runs"][n].get("skipped")) for r in result["table"] for n in r["runs"] if r["runs"][n].get("skipped")}
    for n, why in sorted(skipped):
        log(f"  skipped: {n}: {why}")
    if result["compiled"]:
        log("compiled (regs / spills / shared bytes / warps): " + "; ".join(
            f"{c['kernel']} H={c['H']} {c.get('name')}: {c.get('n_regs')} / {c.get('n_spills')} / {c.get('shared')} / "
            f"{c.get('num_warps')}" for c in result["compiled"]))
    if result["sweep"]:
        log(f"\n== --sweep: the tl kernel's launch configs, (T, H, K) in {meta['plan']['sweep']} ==")
        for r in result["sweep"]:
            c = (r.get("compiled") or [{}])[0]
            log(f"  H={r['H']:<4} {r['config']:>16}  {r.get('status', '')[:44]:<44} {r.get('tflops', nan):7.1f} TFLOP/s"
                f"  regs {c.get('n_regs')} spills {c.get('n_spills')} smem {c.get('shared')}")
        for h, b in result["best"].items():
            if b:
                fields = ", ".join(f"{k}={v!r}" for k, v in b["fields"].items() if k != "splits")
                log(f"  best for H={h}: {b['config']} (table config: {b['table_config']}); TUNED row: Config({fields})")
    if result["records"]:
        rp = meta.get("records_plan", {})
        log(f"\n== --records (K {rp.get('K')}, sink, {rp.get('bs')}-record pages, {rp.get('S')} rows): the tl kernel on "
            "records vs on bf16 rows, same indices; decode: us per call in a CUDA graph; prefill: ms; "
            "ratio = bf16 / records (goal >= 1.3 at T <= 256, >= 1.0 at prefill) ==")
        for r in result["records"]:
            if "ratio" in r:
                unit, b, x = ("us", r["bf16_us"], r["records_us"]) if r["kind"] == "decode" else \
                    ("ms", r["bf16_ms"], r["records_ms"])
                log(f"  {r['format']:<18} {r['kind']:<7} T={r['T']:>5} H={r['H']:>4}: bf16 {b:9.2f} {unit} | records "
                    f"{x:9.2f} {unit} | ratio {r['ratio']:5.2f}x (splits {r.get('bf16_splits')}/{r.get('records_splits')})")
            else:
                log(f"  {r['format']:<18} {r['kind']:<7} T={r['T']:>5} H={r['H']:>4}: "
                    f"{r.get('skipped') or r.get('error') or r.get('why')}")
    if result["decode_vllm"]:
        dm = result.get("decode_vllm_meta", {})
        log(f"\n== --decode against vLLM's decode: flash_mla_with_kvcache over {dm.get('format')} records "
            f"({dm.get('record_bytes')} B per token) vs the pack on the same records and indices, us per call in a "
            "CUDA graph (ratio = FlashMLA / the pack's) ==")
        for r in result["decode_vllm"]:
            head = f"  {r['layer']:<10} T={r['T']:>4} H={r['H']:>4} K={r.get('K', '-'):>4}: "
            log(head + (r.get("skipped") or " | ".join(
                f"{n} " + (f"{v['graph_us']:.1f} us" if "graph_us" in v else (v.get("not_run") and "not run")
                           or v.get("error") or v.get("why") or "-")
                + ("" if v.get("correct", True) else f" WRONG ({v.get('why')})")
                + (f" ({v['vs_flashmla']:.2f}x)" if "vs_flashmla" in v and n != "flashmla" else "")
                + (f" [{v['label']}]" if "label" in v else "")
                for n, v in r["runs"].items())))
    if result["decode"]:
        log(f"\n== --decode, the pack's op on bf16 rows (K {meta['plan']['decode_K']}, sink; no vLLM path makes "
            "these calls): latency per call replayed in a CUDA graph, KV bytes read / latency ==")
        for r in result["decode"]:
            log(f"  T={r['T']:>4} H={r['H']:>4}: " + " | ".join(
                f"{v['name']} {v.get('graph_us', nan):.1f} us" + (f" ({v['kv_GBps']:.0f} GB/s)" if "kv_GBps" in v else "")
                for v in r["variants"]))
    checks = [c for c in result["correctness"] if c.get("ok") is not None]
    wrong = [c for c in checks if not c["ok"]]
    log(f"\ncorrectness: {len(checks) - len(wrong)}/{len(checks)} checks ok"
        + (f"; WRONG: {[(c['kernel'], c['H']) for c in wrong]}" if wrong else ""))
    if result["errors"]:
        log(f"errors: {len(result['errors'])} (first: {result['errors'][0]['where']}: {result['errors'][0]['why']})")
    if meta.get("interpret"):
        log("TRITON_INTERPRET=1: torch, the tl kernel and the CPU default path only; the numbers are not performance.")
    log(f"sections (s): {result['sections_s']}, total {meta.get('elapsed_s')} s")


if __name__ == "__main__":
    sys.exit(main())
