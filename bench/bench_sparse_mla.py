#!/usr/bin/env python
"""One-run H200 benchmark of the Triton sparse-MLA kernel (issue 4).

    . bench/gpu_env.sh && python3 bench/bench_sparse_mla.py --out $OUT    # ~2-5 minutes on one H200

Does, in this order, in one process, each measurement in its own try (a config that does
not compile or fit is a recorded result, never the end of the run):

1. the torch-native baseline (gather + two batched matmuls, fp32 softmax) at T 4K / 16K x
   H 64 / 128 x K 640 / 1152, random valid indices into a 1M-row cache, first and alone,
   so nothing Triton does can lose it;
2. per swept config (``kernels.sparse_mla.SWEEP``): what Triton compiled (registers,
   spills, shared memory), correctness against the torch reference at the real shapes
   (D_qk = d_v = 512, PAD inside and past the length, sink), time at T 16K, K 640, H 64 / 128;
3. the TFLOP/s table, 2*T*H*K*(D_qk + d_v) / time, over the same cells as 1 for the swept
   best config and the shipped default, with a correctness spot check of each cell;
4. decode (T 1 / 32 / 256): latency per call (CUDA-graph replay and eager) and the
   bandwidth achieved over the KV bytes read, for split-K settings and decode tile sizes;
5. raw JSON to ``--out`` (a directory gets ``bench_sparse_mla.json``), the short table last
   with a suggested ``TUNED`` row per head count. ``--budget`` (default 300 s) bounds the
   run: the sweep stops at 45% of it, the table at 75%, decode at 92%.

Run from the repository root with or without the package installed: the script loads
the package from this checkout. ``--config name=value,...`` (repeatable) replaces the
sweep list; ``SWA_SPARSE_MLA_CONFIG`` overrides the shipped default. Without a GPU it runs
a tiny smoke version through Triton's interpreter (plumbing only, no numbers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


from _pack import load_pack as _load_pack  # noqa: E402  (one loader for every bench script)


import torch  # noqa: E402

PACK = _load_pack()
from swa_backends.testing.conformance import mismatch  # noqa: E402
from swa_backends.common.device import current_device  # noqa: E402
from swa_backends.common.ops import OPS  # noqa: E402
from swa_backends.kernels import interpreter  # noqa: E402


REF = OPS["sparse_mla"].reference
D = DV = 512
S_CACHE = 1 << 20  # rows of the latent cache: 1M x 512 bf16 = 1 GiB, mostly missing L2

# What one run measures. "tiny" walks the same code on a CPU through the interpreter
# (tests/test_bench_sparse_mla.py), so a GPU run never meets an untried line.
PLANS = {
    "h200": dict(D=512, S=S_CACHE, sweep=[(16384, 64, 640), (16384, 128, 640)], check_T=512, check_K=1152,
                 spot=128, table_H=(64, 128), table_T=(4096, 16384), table_K=(640, 1152),
                 decode_H=(64, 128), decode_T=(1, 32, 256), decode_K=640, decode_splits=("auto", 1, 2, 4, 10),
                 decode_configs=(dict(block_n=32), dict(block_n=32, split_s=True, num_stages=5)), reps=5),
    "tiny": dict(D=32, S=3000, sweep=[(3, 16, 40), (3, 32, 40)], check_T=9, check_K=70, spot=4,
                 table_H=(16,), table_T=(3,), table_K=(40, 70), decode_H=(16,), decode_T=(1, 3), decode_K=40,
                 decode_splits=("auto", 1, 3), decode_configs=(dict(block_n=16, split_s=True),), reps=1),
}


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


def log(*a):
    print(*a, flush=True)


def tflops(T, H, K, ms):
    return 2.0 * T * H * K * (D + DV) / (ms * 1e-3) / 1e12


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps=3, warmup=1):
    """Median milliseconds of ``fn()`` (CUDA events; wall clock off-GPU)."""
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(reps):
        if torch.cuda.is_available():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_us(fn, calls=20, reps=5):
    """Microseconds per call replaying a CUDA graph of ``calls`` back-to-back calls
    (off-GPU: eager wall clock)."""
    if not torch.cuda.is_available():
        return eager_us(fn, calls=2)
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / calls)
    del g
    return statistics.median(times)


def eager_us(fn, calls=50):
    fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync()
    return (time.perf_counter() - t0) * 1e6 / calls


def torch_baseline(q, kv, indices, lens, sm_scale, d_v, sink=None, max_bytes=2 << 30):
    """Torch-native sparse MLA: gather rows, bmm, fp32 softmax (+sink), bmm; chunked over
    tokens so the gathered rows stay under ``max_bytes``."""
    T, H, Dq = q.shape
    K = indices.shape[1]
    out = torch.empty(T, H, d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    chunk = max(1, max_bytes // (K * Dq * q.element_size()))
    j = torch.arange(K, device=q.device)
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        idx = indices[s:e].long()
        ok = (j[None, :] < lens[s:e, None]) & (idx >= 0)
        rows = kv[idx.clamp(min=0)]  # [t, K, D] gather
        sc = torch.bmm(q[s:e], rows.transpose(1, 2)).float() * sm_scale  # [t, H, K]
        sc.masked_fill_(~ok[:, None, :], float("-inf"))
        l = torch.logsumexp(sc, dim=-1)
        den = l if sink is None else torch.logaddexp(l, sink[None, :])
        p = torch.exp(sc - torch.where(torch.isfinite(den), den, 0.0)[..., None])
        out[s:e] = torch.bmm(p.to(q.dtype), rows[..., :d_v])
        lse[s:e] = l
    return out, lse


def make_inputs(T, H, K, *, pads=False, sink=False, seed=0, dev="cuda", dtype=torch.bfloat16, S=S_CACHE, kv=None):
    """Random q (never zeros), a cache (or ``kv``), random valid indices; ``pads`` adds
    PAD inside the length, all-PAD rows, short and empty rows and whole PAD tiles."""
    g = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(T, H, D, generator=g, device=dev, dtype=torch.float32).to(dtype)
    if kv is None:
        kv = torch.randn(S, D, generator=g, device=dev, dtype=torch.float32).to(dtype)
    idx = torch.randint(0, kv.shape[0], (T, K), generator=g, device=dev, dtype=torch.int32)
    lens = torch.full((T,), K, dtype=torch.int32, device=dev)
    if pads:  # PAD inside the length, all-PAD rows, short rows, empty rows
        hole = torch.rand(T, K, generator=g, device=dev) < 0.2
        idx = torch.where(hole, torch.full_like(idx, -1), idx)
        lens = torch.randint(0, K + 1, (T,), generator=g, device=dev, dtype=torch.int32)
        lens[::7] = K
        lens[3::11] = 0
        idx[5::13] = -1
        idx[6::17, 16:48] = -1  # whole tiles of PAD inside the length
    s = torch.randn(H, generator=g, device=dev) if sink else None
    return q, kv, idx, lens, s


def check(fn_out, q, kv, idx, lens, sink, n=None):
    """mismatch() of the first ``n`` tokens against the fp32 torch reference."""
    n = q.shape[0] if n is None else min(n, q.shape[0])
    want = REF(q[:n], kv, idx[:n], lens[:n], 1.0 / math.sqrt(D), DV, **({"sink": sink} if sink is not None else {}))
    got = (fn_out[0][:n], fn_out[1][:n])
    why = mismatch("sparse_mla", got, want)
    o, w = got[0].float(), want[0].float()
    rel = float((o - w).norm() / w.norm().clamp_min(1e-6))
    return why, rel


def file_sha(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return "unknown"


def git_commit() -> str:
    env = os.environ.get("SWA_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


# ---------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------


def main() -> int:
    global D, DV
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory (gets bench_sparse_mla.json) or .json path")
    ap.add_argument("--config", action="append", default=None,
                    help="a config to sweep, name=value,... (repeatable; replaces the built-in sweep)")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds; later sections shrink to fit")
    ap.add_argument("--quick", action="store_true", help="the first 4 sweep configs only")
    ap.add_argument("--plan", choices=sorted(PLANS), default=None,
                    help="h200 (default on a GPU) or tiny (default without one: interpreter, plumbing only)")
    ap.add_argument("--gluon", action="store_true",
                    help="the Gluon kernel's configs beside the shipped tl config and torch (see gluon_main); "
                         "with --quick only T 16K / K 640")
    ap.add_argument("--gluon-configs", default=None,
                    help="with --gluon: comma-separated Gluon configs (e.g. n64b2l0,ws) instead of the whole sweep")
    args = ap.parse_args()
    if args.gluon:
        return gluon_main(args)

    out_path = Path(args.out)
    if out_path.suffix != ".json":
        out_path.mkdir(parents=True, exist_ok=True)
        out_path = out_path / "bench_sparse_mla.json"
    t_start = time.time()
    on_gpu = torch.cuda.is_available()
    plan = PLANS[args.plan or ("h200" if on_gpu else "tiny")]
    D = DV = plan["D"]
    interpreter.setup(current_device() if on_gpu else PACK.parse_device("cpu"))
    from swa_backends.kernels import sparse_mla as K

    dev = "cuda" if on_gpu else "cpu"
    tdev = torch.device(dev)
    scale = 1.0 / math.sqrt(D)
    result: dict = {
        "meta": {
            "argv": sys.argv, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": git_commit(),
            "kernel_sha256_16": file_sha(ROOT / "kernels" / "sparse_mla.py"),
            "torch": torch.__version__, "triton": __import__("triton").__version__, "python": platform.python_version(),
            "device": torch.cuda.get_device_name() if on_gpu else "cpu (Triton interpreter: plumbing only, no numbers)",
            "sms": torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else None,
            "default_config_env": os.environ.get("SWA_SPARSE_MLA_CONFIG"), "plan": plan,
            "flops": "2*T*H*K*(D_qk+d_v)", "D_qk": D, "d_v": DV, "budget_s": args.budget,
        },
        "correctness": [], "sweep": [], "best": {}, "baseline": [], "table": [], "decode": [], "errors": [],
        "sections_s": {},
    }

    def elapsed():
        return time.time() - t_start

    def save():
        result["meta"]["elapsed_s"] = round(elapsed(), 1)
        out_path.write_text(json.dumps(result, indent=1, default=str))

    def err(where: str, exc: BaseException) -> str:
        """Record a failure (traceback in errors[]) and return its one-line reason."""
        why = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1][:240]}"
        result["errors"].append({"where": where, "why": why, "traceback": traceback.format_exc()[-2000:]})
        return why

    def section(name: str, t0: float):
        result["sections_s"][name] = round(time.time() - t0, 1)
        save()

    configs = args.config or (K.SWEEP[:4] if args.quick else list(K.SWEEP))
    configs = [K.parse_config(c, K.Config()) for c in configs]
    heads = sorted({H for _, H, _ in plan["sweep"]} | set(plan["table_H"]) | set(plan["decode_H"]))
    default = {H: K.pick_config(16384, H, D, DV, plan["decode_K"], tdev) for H in heads}
    log(f"device {result['meta']['device']}, torch {torch.__version__}, triton {result['meta']['triton']}")

    # one shared cache (1M rows on the GPU); inputs are sliced from it per shape
    g_kv = torch.randn(plan["S"], D, device=dev, dtype=torch.float32).to(torch.bfloat16)

    # ---- 1: torch baseline, alone (nothing Triton can fail takes it down) -------------
    t0 = time.time()
    for H in plan["table_H"]:
        q_all, _, idx_all, _, sink = make_inputs(max(plan["table_T"]), H, max(plan["table_K"]), kv=g_kv, sink=True,
                                                 seed=7 + H, dev=dev)
        for T in plan["table_T"]:
            for Kw in plan["table_K"]:
                q, idx = q_all[:T], idx_all[:T, :Kw].contiguous()
                lens = torch.full((T,), Kw, dtype=torch.int32, device=dev)
                row = {"T": T, "H": H, "K": Kw}
                try:
                    if T == plan["table_T"][0] and Kw == plan["table_K"][0]:  # the baseline's own check, once per H
                        n = plan["spot"]
                        bw, brel = check(torch_baseline(q[:n], g_kv, idx[:n], lens[:n], scale, DV, sink),
                                         q, g_kv, idx, lens, sink, n=n)
                        result["correctness"].append({"what": "torch baseline", "H": H, "config": "torch",
                                                      "ok": bw is None, "rel_err": brel, "why": bw})
                    ms = timed(lambda: torch_baseline(q, g_kv, idx, lens, scale, DV, sink), reps=min(2, plan["reps"]))
                    row.update(torch_ms=ms, torch_tflops=tflops(T, H, Kw, ms))
                except Exception as exc:
                    row["error"] = err(f"torch baseline T={T} H={H} K={Kw}", exc)
                result["baseline"].append(row)
                log(f"torch T={T} H={H} K={Kw}: {row.get('torch_tflops', float('nan')):.1f} TFLOP/s "
                    f"{row.get('torch_ms', float('nan')):.2f} ms {row.get('error', '')}")
                if on_gpu:
                    torch.cuda.empty_cache()
        del q_all, idx_all
    section("baseline", t0)

    # ---- 2: correctness and sweep per config, each config on its own ------------------
    t0 = time.time()
    for T, H, Kw in plan["sweep"]:
        # every timed call carries a sink (DeepSeek-V4.1 has one), so a config compiles once
        q, kv, idx, lens, sink = make_inputs(T, H, Kw, kv=g_kv, sink=True, seed=H, dev=dev)
        cq, ckv, cidx, clens, csink = make_inputs(plan["check_T"], H, plan["check_K"], pads=True, sink=True,
                                                  seed=100 + H, kv=g_kv, dev=dev)
        best = None
        for cfg in configs:
            if cfg.block_h > max(H, 64):  # (block_h is clipped to H: 128 on 64 heads repeats a 64 config)
                continue
            row = {"T": T, "H": H, "K": Kw, "config": cfg.short(), "config_fields": cfg.__dict__}
            if elapsed() > 0.45 * args.budget:
                row["status"] = "skipped (time budget)"
                result["sweep"].append(row)
                continue
            try:
                t1 = time.time()
                if on_gpu:  # what Triton made of it: registers, spills, shared memory
                    try:
                        row["compiled"] = K.compiled_info(q, kv, idx, lens, scale, DV, sink, config=cfg)
                    except Exception as exc:
                        row["compiled"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                got = K.launch(cq, ckv, cidx, clens, scale, DV, csink, config=cfg, fit=False)
                _sync()
                row["compile_s"] = round(time.time() - t1, 1)
                why, rel = check(got, cq, ckv, cidx, clens, csink)
                result["correctness"].append({"what": f"sweep config, PAD patterns + sink, K {plan['check_K']}",
                                              "H": H, "config": cfg.short(), "ok": why is None, "rel_err": rel,
                                              "why": why})
                if why is not None:
                    row["status"] = f"wrong: {why}"
                else:
                    ms = timed(lambda: K.launch(q, kv, idx, lens, scale, DV, sink, config=cfg, fit=False),
                               reps=plan["reps"])
                    row.update(status="ok", ms=ms, tflops=tflops(T, H, Kw, ms))
                    if best is None or ms < best[1]:
                        best = (cfg, ms)
            except Exception as exc:  # a config that does not compile or fit is a result, not a crash
                row["status"] = "error: " + err(f"sweep {cfg.short()} H={H}", exc)
            result["sweep"].append(row)
            c = row.get("compiled") or {}
            log(f"sweep T={T} H={H} K={Kw} {cfg.short():>22}: {row.get('status')} "
                f"{row.get('ms', float('nan')):.3f} ms {row.get('tflops', float('nan')):.1f} TFLOP/s "
                f"(regs {c.get('n_regs')}, spills {c.get('n_spills')}, smem {c.get('shared')})")
            save()
        result["best"][str(H)] = {"config": best[0].short(), "fields": dict(best[0].__dict__), "ms": best[1]} if best else None
        del q, idx, lens
    best_cfg = {H: (K.Config(**result["best"][str(H)]["fields"]) if result["best"].get(str(H)) else default[H])
                for H in heads}
    section("sweep", t0)

    # ---- 3: TFLOP/s table: best and default config, each cell on its own ---------------
    t0 = time.time()
    base = {(r["T"], r["H"], r["K"]): r for r in result["baseline"]}
    for H in plan["table_H"]:
        q_all, _, idx_all, _, sink = make_inputs(max(plan["table_T"]), H, max(plan["table_K"]), kv=g_kv, sink=True,
                                                 seed=7 + H, dev=dev)
        for T in plan["table_T"]:
            for Kw in plan["table_K"]:
                q = q_all[:T]
                idx = idx_all[:T, :Kw].contiguous()
                lens = torch.full((T,), Kw, dtype=torch.int32, device=dev)
                row = {"T": T, "H": H, "K": Kw, "best_config": best_cfg[H].short(), "default_config": default[H].short()}
                if elapsed() > 0.75 * args.budget:
                    row["error"] = "skipped (time budget)"
                else:
                    for name, cfg in (("triton", best_cfg[H]), ("default", default[H])):
                        if name == "default" and cfg == best_cfg[H]:
                            continue
                        try:
                            out = K.launch(q, g_kv, idx, lens, scale, DV, sink, config=cfg)
                            why, rel = check(out, q, g_kv, idx, lens, sink, n=plan["spot"])
                            del out
                            ms = timed(lambda: K.launch(q, g_kv, idx, lens, scale, DV, sink, config=cfg),
                                       reps=plan["reps"])
                            row.update({f"{name}_ms": ms, f"{name}_tflops": tflops(T, H, Kw, ms),
                                        f"{name}_correct": why is None, f"{name}_rel_err": rel})
                            if name == "triton":
                                row.update(correct=why is None, rel_err=rel, why=why)
                        except Exception as exc:
                            row[f"{name}_error"] = err(f"table {name} {cfg.short()} T={T} H={H} K={Kw}", exc)
                b = base.get((T, H, Kw), {})
                if "torch_ms" in b:
                    row.update(torch_ms=b["torch_ms"], torch_tflops=b["torch_tflops"])
                    if "triton_ms" in row:
                        row["speedup"] = b["torch_ms"] / row["triton_ms"]
                result["table"].append(row)
                log(f"table T={T} H={H} K={Kw}: triton {row.get('triton_tflops', float('nan')):.1f} TFLOP/s, "
                    f"torch {row.get('torch_tflops', float('nan')):.1f}, x{row.get('speedup', float('nan')):.2f}")
                save()
                if on_gpu:
                    torch.cuda.empty_cache()
        del q_all, idx_all
    section("table", t0)

    # ---- 4: decode latency and bandwidth ---------------------------------------------
    t0 = time.time()
    Kw = plan["decode_K"]
    for H in plan["decode_H"]:
        for T in plan["decode_T"]:
            q, kv, idx, lens, sink = make_inputs(T, H, Kw, kv=g_kv, sink=True, seed=T + H, dev=dev)
            kv_bytes = T * Kw * D * 2
            io_bytes = kv_bytes + q.numel() * 2 + T * H * DV * 2 + idx.numel() * 4
            row = {"T": T, "H": H, "K": Kw, "kv_bytes": kv_bytes, "variants": []}
            cands = [(best_cfg[H], sp) for sp in plan["decode_splits"]]
            cands += [(default[H].replace(**kw), "auto") for kw in plan["decode_configs"]]
            for base_cfg, sp in cands:
                if elapsed() > 0.92 * args.budget:
                    break
                cfg = base_cfg.replace(splits=None if sp == "auto" else sp)
                try:
                    r = K.resolve(cfg, T, H, D, DV, Kw, tdev)
                except Exception as exc:
                    row["variants"].append({"splits": sp, "config": cfg.short(), "error": err("decode resolve", exc)})
                    continue
                v = {"splits": sp, "resolved_splits": r["splits"], "config": cfg.short()}
                try:
                    fn = lambda: K.launch(q, kv, idx, lens, scale, DV, sink, config=cfg)  # noqa: E731
                    why, rel = check(fn(), q, kv, idx, lens, sink)
                    v.update(correct=why is None, rel_err=rel, why=why)
                    us = graph_us(fn)
                    v.update(graph_us=us, eager_us=eager_us(fn, calls=50 if on_gpu else 2),
                             kv_GBps=kv_bytes / (us * 1e-6) / 1e9, io_GBps=io_bytes / (us * 1e-6) / 1e9)
                except Exception as exc:
                    v["error"] = err(f"decode {cfg.short()} T={T} H={H}", exc)
                row["variants"].append(v)
            ok = [v for v in row["variants"] if "graph_us" in v and v.get("correct")]
            if ok:
                b = min(ok, key=lambda v: v["graph_us"])
                row.update(best_splits=b["splits"], best_config=b["config"], best_graph_us=b["graph_us"],
                           best_kv_GBps=b["kv_GBps"])
                auto = next((v for v in ok if v["splits"] == "auto"), None)
                if auto:
                    row.update(auto_graph_us=auto["graph_us"], auto_resolved_splits=auto["resolved_splits"])
            try:
                tb = lambda: torch_baseline(q, kv, idx, lens, scale, DV, sink)  # noqa: E731
                row["torch_graph_us"] = graph_us(tb, calls=5)
            except Exception as exc:
                row["torch_error"] = err(f"decode torch T={T} H={H}", exc)
            result["decode"].append(row)
            log(f"decode T={T} H={H}: best {row.get('best_graph_us', float('nan')):.1f} us "
                f"({row.get('best_config')}), {row.get('best_kv_GBps', float('nan')):.0f} GB/s of KV; "
                f"torch {row.get('torch_graph_us', float('nan')):.1f} us")
            save()
    section("decode", t0)

    save()
    print_summary(result)
    log(f"raw results: {out_path}")
    ok = all(c["ok"] for c in result["correctness"]) and not result["errors"]
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------
# --gluon: the Gluon (Hopper) kernel beside the shipped tl config and the torch baseline
# ---------------------------------------------------------------------------------------

GLUON_CELLS = [(T, H, Kw) for H in (64, 128) for T in (4096, 16384) for Kw in (640, 1152)]
GLUON_QUICK = [(16384, 64, 640), (16384, 128, 640)]


def gluon_main(args) -> int:
    """Per cell (T, H, K): the torch baseline, the shipped tl config (explicit, so never the
    Gluon path), every ``sparse_mla_gluon.SWEEP`` config and the default path (whatever
    :func:`sparse_mla` dispatches to). Each Gluon config is first checked against the
    reference on PAD patterns + sink (wrong -> not timed); all timings carry a sink."""
    global D, DV
    out_path = Path(args.out)
    if out_path.suffix != ".json":
        out_path.mkdir(parents=True, exist_ok=True)
        out_path = out_path / "bench_sparse_mla_gluon.json"
    t_start = time.time()
    if not torch.cuda.is_available():
        log("--gluon needs a CUDA GPU (Gluon kernels do not run in the interpreter)")
        out_path.write_text(json.dumps({"error": "no GPU"}))
        return 1
    D = DV = 512
    interpreter.setup(current_device())
    from swa_backends.kernels import sparse_mla as K

    G = K._gluon_module()
    dev, tdev = "cuda", torch.device("cuda")
    scale = 1.0 / math.sqrt(D)
    result: dict = {
        "meta": {"argv": sys.argv, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": git_commit(),
                 "kernel_sha256_16": file_sha(ROOT / "kernels" / "sparse_mla_gluon.py"),
                 "torch": torch.__version__, "triton": __import__("triton").__version__,
                 "device": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
                 "flops": "2*T*H*K*(D_qk+d_v)", "gluon": G if isinstance(G, str) else "available"},
        "compiled": [], "correctness": [], "cells": [], "errors": [],
    }

    def save():
        result["meta"]["elapsed_s"] = round(time.time() - t_start, 1)
        out_path.write_text(json.dumps(result, indent=1, default=str))

    def err(where, exc):
        why = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1][:240]}"
        result["errors"].append({"where": where, "why": why, "traceback": traceback.format_exc()[-2000:]})
        return why

    log(f"device {result['meta']['device']}, torch {torch.__version__}, triton {result['meta']['triton']}, "
        f"gluon: {result['meta']['gluon']}")
    if isinstance(G, str):
        save()
        return 1
    names = getattr(args, "gluon_configs", None)
    gcfgs = [G.parse_env(n) for n in names.split(",")] if names else list(G.SWEEP)
    g_kv = torch.randn(S_CACHE, D, device=dev, dtype=torch.float32).to(torch.bfloat16)
    bad: set = set()
    # compile + correctness per config and head count (PAD patterns, sink, poisoned outputs)
    for H in (64, 128):
        cq, ckv, cidx, clens, csink = make_inputs(512, H, 1152, pads=True, sink=True, seed=100 + H, kv=g_kv, dev=dev)
        for cfg in gcfgs:
            row = {"H": H, "config": cfg.short()}
            try:
                row.update(K.gluon_compiled_info(cq, ckv, cidx, clens, scale, DV, csink, config=cfg))
                out = torch.full((512, H, DV), float("nan"), dtype=torch.bfloat16, device=dev)
                lse = torch.full((512, H), float("nan"), dtype=torch.float32, device=dev)
                G.launch(cq, ckv, cidx, clens, scale, DV, csink, out, lse, config=cfg)
                why, rel = check((out, lse), cq, ckv, cidx, clens, csink)
                nan = bool(torch.isnan(out).any() or torch.isnan(lse).any())
                ok = why is None and rel <= 1e-2 and not nan
                result["correctness"].append({"H": H, "config": cfg.short(), "ok": ok, "rel_err": rel, "why": why,
                                              "nan": nan})
                if not ok:
                    bad.add((H, cfg))
            except Exception as exc:
                row["error"] = err(f"gluon compile/check {cfg.short()} H={H}", exc)
                bad.add((H, cfg))
            result["compiled"].append(row)
            log(f"gluon {cfg.short()} H={H}: regs {row.get('n_regs')} spills {row.get('n_spills')} "
                f"smem {row.get('shared')} correct {(H, cfg) not in bad} {row.get('error', '')}")
            save()
        del cq, cidx, clens
    cells = GLUON_QUICK if args.quick else GLUON_CELLS
    for T, H, Kw in cells:
        q, _, idx, _, sink = make_inputs(T, H, Kw, kv=g_kv, sink=True, seed=7 + H, dev=dev)
        lens = torch.full((T,), Kw, dtype=torch.int32, device=dev)
        row = {"T": T, "H": H, "K": Kw, "dispatch": K.dispatch_info(q, g_kv, idx, DV)}
        try:
            ms = timed(lambda: torch_baseline(q, g_kv, idx, lens, scale, DV, sink), reps=2)
            row.update(torch_ms=ms, torch_tflops=tflops(T, H, Kw, ms))
        except Exception as exc:
            row["torch_error"] = err(f"torch T={T} H={H} K={Kw}", exc)
        tl_cfg = K.pick_config(T, H, D, DV, Kw, tdev)
        runs = [("tl " + tl_cfg.short(), lambda: K.launch(q, g_kv, idx, lens, scale, DV, sink, config=tl_cfg)),
                ("default path", lambda: K.sparse_mla(q, g_kv, idx, lens, scale, DV, sink=sink))]
        for cfg in gcfgs:
            if (H, cfg) in bad:
                continue
            out = torch.empty(T, H, DV, dtype=torch.bfloat16, device=dev)
            lse = torch.empty(T, H, dtype=torch.float32, device=dev)
            runs.append((cfg.short(), lambda cfg=cfg, out=out, lse=lse:
                         G.launch(q, g_kv, idx, lens, scale, DV, sink, out, lse, config=cfg)))
        row["runs"] = {}
        for name, fn in runs:
            try:
                ms = timed(fn, reps=5)
                row["runs"][name] = {"ms": ms, "tflops": tflops(T, H, Kw, ms)}
            except Exception as exc:
                row["runs"][name] = {"error": err(f"{name} T={T} H={H} K={Kw}", exc)}
        result["cells"].append(row)
        log(f"T={T} H={H} K={Kw}: torch {row.get('torch_tflops', float('nan')):.1f} | " + " | ".join(
            f"{n} {r.get('tflops', float('nan')):.1f}" for n, r in row["runs"].items()) + " TFLOP/s")
        save()
        del q, idx, lens
        torch.cuda.empty_cache()
    save()
    nan = float("nan")
    names = ["tl " + K.pick_config(16384, 64, D, DV, 640, tdev).short(), "default path"] + [c.short() for c in gcfgs]
    log(f"\n== Gluon vs tl vs torch, TFLOP/s = 2*T*H*K*(D_qk+d_v)/time, 1M-row cache, random valid indices, sink ==")
    log(f"  {'T':>6} {'H':>4} {'K':>5} | {'torch':>6} | " + " | ".join(f"{n[:14]:>14}" for n in names)
        + " | best/torch")
    for r in result["cells"]:
        vals = [r["runs"].get(n, {}).get("tflops", nan) for n in names]
        if r["H"] == 128:  # tl config name differs per head count
            vals[0] = next((v.get("tflops", nan) for n, v in r["runs"].items() if n.startswith("tl ")), nan)
        best = max((v for v in vals if v == v), default=nan)
        log(f"  {r['T']:>6} {r['H']:>4} {r['K']:>5} | {r.get('torch_tflops', nan):6.1f} | "
            + " | ".join(f"{v:14.1f}" for v in vals) + f" | {best / r.get('torch_tflops', nan):.2f}x")
    okc = [c for c in result["correctness"] if c["ok"]]
    log(f"correctness: {len(okc)}/{len(result['correctness'])} ok; errors: {len(result['errors'])}"
        + (f" (first: {result['errors'][0]['where']}: {result['errors'][0]['why']})" if result["errors"] else ""))
    log(f"raw results: {out_path} ({result['meta']['elapsed_s']} s)")
    return 0 if len(okc) == len(result["correctness"]) and not result["errors"] else 1


def print_summary(result: dict) -> None:
    plan = result["meta"]["plan"]
    nan = float("nan")
    log(f"\n== sweep (T, H, K) in {plan['sweep']} (triton {result['meta']['triton']}) ==")
    for r in result["sweep"]:
        c = r.get("compiled") or {}
        log(f"  H={r['H']:<4} {r['config']:>18}  {r.get('status', '')[:44]:<44} {r.get('tflops', nan):7.1f} TFLOP/s"
            f"  regs {c.get('n_regs')} spills {c.get('n_spills')} smem {c.get('shared')}")
    log("best: " + ", ".join(f"H={h}: {b['config'] if b else None}" for h, b in result["best"].items()))
    for h, b in result["best"].items():
        if b:
            fields = ", ".join(f"{k}={v!r}" for k, v in b["fields"].items() if k != "splits")
            log(f"  suggested TUNED row for H={h}: Config({fields})")
    log(f"\n== prefill TFLOP/s (2*T*H*K*(D_qk+d_v)/time), D {plan['D']}, {plan['S']}-row cache, "
        "random valid indices, sink; torch = gather + 2 bmm, fp32 softmax ==")
    log(f"  {'T':>6} {'H':>4} {'K':>5} | {'best':>7} {'ms':>8} | {'default':>7} | {'torch':>6} | {'x':>5} | ok")
    for r in result["table"]:
        log(f"  {r['T']:>6} {r['H']:>4} {r['K']:>5} | {r.get('triton_tflops', nan):7.1f} "
            f"{r.get('triton_ms', nan):8.3f} | {r.get('default_tflops', r.get('triton_tflops', nan)):7.1f} | "
            f"{r.get('torch_tflops', nan):6.1f} | {r.get('speedup', nan):5.2f} | {r.get('correct')}"
            + (f"  {r.get('triton_error') or r.get('default_error') or r.get('error') or ''}"[:80]))
    log(f"\n== decode (K {plan['decode_K']}, sink): latency per call (CUDA-graph replay), KV bytes read / latency ==")
    log(f"  {'T':>4} {'H':>4} | {'best us':>8} {'config':>14} {'splits':>6} {'KV GB/s':>8} | {'auto us':>8} | "
        f"{'torch us':>9}")
    for r in result["decode"]:
        log(f"  {r['T']:>4} {r['H']:>4} | {r.get('best_graph_us', nan):8.1f} {str(r.get('best_config')):>14} "
            f"{str(r.get('best_splits')):>6} {r.get('best_kv_GBps', nan):8.0f} | {r.get('auto_graph_us', nan):8.1f} | "
            f"{r.get('torch_graph_us', nan):9.1f}")
    bad = [c for c in result["correctness"] if not c["ok"]]
    log(f"\ncorrectness: {len(result['correctness']) - len(bad)}/{len(result['correctness'])} checks ok"
        + (f"; WRONG: {[(c['H'], c['config']) for c in bad]}" if bad else ""))
    if result["errors"]:
        log(f"errors: {len(result['errors'])} (first: {result['errors'][0]['where']}: {result['errors'][0]['why']})")
    log(f"sections (s): {result['sections_s']}, total {result['meta'].get('elapsed_s')} s")


if __name__ == "__main__":
    sys.exit(main())
