"""End-to-end: the DeepSeek-V4.1-shaped example stack with both replay sides, through the pack.

One command (about 1 minute on one H200, torch 2.11, Triton 3.6):

    python bench/bench_e2e.py --out OUT

writes ``OUT/bench_e2e.json`` (raw per-step times and every summary), ``OUT/bench_e2e.png``
(saving vs ISL) and prints the tables. What it measures:

1. **Decoder trim** (cold prefills, chunked at ``--max-batched-tokens``): time of the replay
   layers (layers ``cut+1 .. L-1``, including the sub-batch's gather, metadata and scatter)
   and of the whole prefill with the trim off and on, for each ISL, one request and a batch.
   Compared with the ideal share of work removed (replay rows kept / rows) and with the
   upstream table (vLLM PR "Decoder-side SWA bounded replay", GB200 TP4 / DEP4 TTFT).
2. **Prefix-hit replay**: time to first token of a prompt whose whole prefix is cached (only
   its last window and the block remainder are recomputed) vs the same prompt cold.
3. **Drift**: relative difference of final hidden states, cold vs prefix hit and trim vs no
   trim, over random prompts, at this config's dtype.

``--prefer sparse_mla=triton`` runs an op through a named variant (``select``'s ``prefer``), to
compare variants on the same stack. Sizes that do not fit in memory are dropped (and listed).
``--plot-from OUT/bench_e2e.json`` redraws the PNG elsewhere (matplotlib may be missing on the GPU host).
CPU check of the script itself: ``python bench/bench_e2e.py --out /tmp/e2e --device cpu --config small``.

Device times are the example engine's own (``Engine(timing=True)``: CUDA events around each
phase of a step, what a serving engine would instrument), wall times the host clock; the result
file's machine info comes from ``lib/results.py``.

Imports the installed pack (``pip install -e .``; ``bench/gpu_env.sh`` on the GPU machine) and the
example stack through it (``swa_backends.examples.dsv41_stack``: examples/ is not in the wheel, so
this needs the editable install or the checkout on ``PYTHONPATH`` as ``swa_backends``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np
import swa_backends as sb
import torch
from lib.results import log, machine, write_json
from swa_backends.examples.dsv41_stack import Engine, Stack, StackConfig
from swa_backends.examples.dsv41_stack.engine import EAGER_TRIM_THRESHOLD
from swa_backends.examples.dsv41_stack.probe import ReadRecorder, drift_trial, summarize

# Upstream, decoder replay on / off, TTFT of one request in ms (GB200, V4.1-Flash), from the PR text.
UPSTREAM = {
    "TP4": {1024: (55, 55), 4096: (206, 185), 8192: (206, 191), 16384: (211, 285), 32768: (423, 573),
            65536: (831, 1178), 131072: (1667, 2552)},
    "DEP4": {1024: (209, 197), 4096: (212, 200), 8192: (215, 213), 16384: (240, 383), 32768: (479, 765),
             65536: (945, 1546), 131072: (1946, 3217)},
}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prompts(rng, n, isl, vocab):
    return [rng.integers(0, vocab, isl).tolist() for _ in range(n)]


def run_batch(eng: Engine, batch_prompts, tag):
    """Submit the prompts together (one generated token each) and run to completion."""
    reqs = [eng.submit(f"{tag}-{i}", p, max_new_tokens=1) for i, p in enumerate(batch_prompts)]
    sync(eng.device)
    t0 = time.perf_counter()
    steps = eng.run()
    wall = (time.perf_counter() - t0) * 1e3
    keys = ("metadata", "source_layers", "replay_layers", "output", "step")
    tot = {k: sum(s.times_ms.get(k, 0.0) for s in steps) for k in keys}
    return {
        "wall_ms": wall,
        "gpu_ms": tot,
        "ttft_ms": [r.ttft_s * 1e3 for r in reqs],
        "steps": len(steps),
        "rows": sum(s.num_tokens for s in steps),
        "replay_rows": sum(s.replay_rows for s in steps),
        "per_step": [{"tokens": s.num_tokens, "replay_rows": s.replay_rows, **{k: round(v, 4) for k, v in s.times_ms.items()}}
                     for s in steps],
    }


def flop_share(cfg: StackConfig) -> float:
    """Share of a long prefill's matmul FLOPs spent in the replay layers (untrimmed)."""
    src = cfg.flops_per_token(0, cfg.window + cfg.top_k) * cfg.n_source
    rep = cfg.flops_per_token(cfg.n_layers - 1, cfg.window) * (cfg.n_layers - cfg.n_source)
    return rep / (src + rep)


def median(xs):
    return float(np.median(np.asarray(xs, dtype=np.float64)))


def recover(eng):
    """After an out-of-memory error: drop the point's requests and cached blocks."""
    eng.waiting.clear()
    for r in list(eng.running):
        eng._finish(r)
    eng.reset_prefix_cache()
    torch.cuda.empty_cache()


def bench_trim(eng, cfg, points, reps, rng, results, deadline):
    out = []
    for isl, b in points:
        point = {"isl": isl, "batch": b}
        if time.perf_counter() > deadline:
            point["skipped"] = "time budget (--time-budget) spent"
            log(f"  ISL {isl} batch {b}: skipped ({point['skipped']})")
            out.append(point)
            continue
        try:
            arms = {}
            for mode in ("off", "trim"):
                eng.decoder_trim = mode
                runs = []
                for rep in range(reps):
                    eng.reset_prefix_cache()
                    runs.append(run_batch(eng, prompts(rng, b, isl, cfg.vocab), f"{mode}-{isl}-{b}-{rep}"))
                arms[mode] = runs
        except torch.cuda.OutOfMemoryError as e:  # drop the size, say so
            point["skipped"] = f"out of memory: {str(e).splitlines()[0][:200]}"
            log(f"  ISL {isl} batch {b}: skipped ({point['skipped']})")
            recover(eng)
            out.append(point)
            continue
        for mode, runs in arms.items():
            point[mode] = {
                "replay_ms": median([r["gpu_ms"]["replay_layers"] for r in runs]),
                "prefill_ms": median([r["gpu_ms"]["step"] for r in runs]),
                "wall_ms": median([r["wall_ms"] for r in runs]),
                "ttft_ms": median([max(r["ttft_ms"]) for r in runs]),
                "rows": runs[0]["rows"], "replay_rows": runs[0]["replay_rows"], "steps": runs[0]["steps"],
                "runs": runs,
            }
        off, on = point["off"], point["trim"]
        point["replay_saving"] = 1 - on["replay_ms"] / off["replay_ms"]
        point["prefill_saving"] = 1 - on["prefill_ms"] / off["prefill_ms"]
        point["ttft_saving"] = 1 - on["ttft_ms"] / off["ttft_ms"]
        point["ideal_replay_saving"] = 1 - on["replay_rows"] / off["replay_rows"]
        point["ideal_prefill_saving"] = point["ideal_replay_saving"] * results["replay_flop_share"]
        point["tok_per_s_off"] = b * isl / off["wall_ms"] * 1e3
        point["tok_per_s_trim"] = b * isl / on["wall_ms"] * 1e3
        log(f"  ISL {isl:>6} x{b}: replay layers {off['replay_ms']:9.1f} -> {on['replay_ms']:8.1f} ms "
            f"({point['replay_saving']:+.1%} saved, ideal {point['ideal_replay_saving']:.1%}); prefill "
            f"{off['prefill_ms']:9.1f} -> {on['prefill_ms']:9.1f} ms ({point['prefill_saving']:.1%}, ideal "
            f"{point['ideal_prefill_saving']:.1%})")
        out.append(point)
    return out


def bench_hit(eng, cfg, isls, reps, rng, deadline):
    out = []
    for isl in isls:
        point = {"isl": isl}
        if time.perf_counter() > deadline:
            point["skipped"] = "time budget (--time-budget) spent"
            log(f"  ISL {isl}: skipped ({point['skipped']})")
            out.append(point)
            continue
        try:
            for mode in ("off", "trim"):
                eng.decoder_trim = mode
                cold, hit, replayed = [], [], []
                for rep in range(reps):
                    eng.reset_prefix_cache()
                    (p,) = prompts(rng, 1, isl, cfg.vocab)
                    c = run_batch(eng, [p], f"cold-{mode}-{isl}-{rep}")  # cold; fills the prefix cache
                    h = run_batch(eng, [p], f"hit-{mode}-{isl}-{rep}")  # the same prompt again: a full hit
                    cold.append(c["ttft_ms"][0])
                    hit.append(h["ttft_ms"][0])
                    replayed.append(h["rows"])
                point[mode] = {"cold_ttft_ms": median(cold), "hit_ttft_ms": median(hit), "hit_rows": replayed[0],
                               "cold_runs": cold, "hit_runs": hit}
                point[mode]["speedup"] = point[mode]["cold_ttft_ms"] / point[mode]["hit_ttft_ms"]
        except torch.cuda.OutOfMemoryError as e:
            point["skipped"] = f"out of memory: {str(e).splitlines()[0][:200]}"
            log(f"  ISL {isl}: skipped ({point['skipped']})")
            recover(eng)
            out.append(point)
            continue
        t = point["trim"]
        log(f"  ISL {isl:>6}: cold TTFT {t['cold_ttft_ms']:9.1f} ms, after a full-prompt hit {t['hit_ttft_ms']:7.1f} ms "
            f"({t['hit_rows']} rows recomputed, {t['speedup']:.1f}x)")
        out.append(point)
    return out


def sanity(stack, backend, cfg, rng, chunk):
    """One validated hit with instrumented reads at a small ISL on this device and config."""
    isl = 4 * cfg.window + cfg.block_size + 3
    p = rng.integers(0, cfg.vocab, isl).tolist()
    eng = Engine(stack, backend=backend, max_batched_tokens=chunk, decoder_trim="trim", max_tokens=4 * isl,
                 trim_threshold=0)  # the sanity check trims its small steps too
    eng.submit("warm", p)
    eng.run()
    rec = ReadRecorder(eng)
    r = eng.submit("hit", p, max_new_tokens=3)
    eng.run()
    return {"isl": isl, "hit": r.admission.hit, "replay_start": r.replay_start, "violations": rec.violations[:10],
            "calls": len(rec.records),
            "min_window_pos_minus_R": min(x.min_window_pos_minus_start for x in rec.records
                                          if x.min_window_pos_minus_start is not None)}


def table(results):
    lines = ["", "Decoder trim (cold prefills; replay layers = layers after the cut; device time, medians; "
                 "ideal = rows removed x FLOP share)",
             f"{'ISL':>7} {'batch':>5} | {'replay off':>10} {'on':>9} {'saved':>7} {'ideal':>7} | "
             f"{'prefill off':>11} {'on':>9} {'saved':>7} {'ideal':>7} | {'upstream TP4 TTFT':>17}"]
    for p in sorted(results["trim"], key=lambda p: (p["batch"], p["isl"])):
        if "skipped" in p:
            lines.append(f"{p['isl']:>7} {p['batch']:>5} | skipped: {p['skipped']}")
            continue
        up = UPSTREAM["TP4"].get(p["isl"])
        ups = f"{1 - up[0] / up[1]:+.0%} saved" if up else "-"
        lines.append(f"{p['isl']:>7} {p['batch']:>5} | {p['off']['replay_ms']:>8.1f}ms {p['trim']['replay_ms']:>7.1f}ms "
                     f"{p['replay_saving']:>7.1%} {p['ideal_replay_saving']:>7.1%} | {p['off']['prefill_ms']:>9.1f}ms "
                     f"{p['trim']['prefill_ms']:>7.1f}ms {p['prefill_saving']:>7.1%} {p['ideal_prefill_saving']:>7.1%} | "
                     f"{ups:>17}")
    lines += ["", "Prefix-hit replay (one request; TTFT = wall time to its first token)",
              f"{'ISL':>7} | {'cold (trim on)':>14} {'hit':>9} {'speedup':>8} {'rows':>6} | {'cold (trim off)':>15} {'hit':>9}"]
    for p in results["hit"]:
        if "skipped" in p:
            lines.append(f"{p['isl']:>7} | skipped: {p['skipped']}")
            continue
        t, o = p["trim"], p["off"]
        lines.append(f"{p['isl']:>7} | {t['cold_ttft_ms']:>12.1f}ms {t['hit_ttft_ms']:>7.1f}ms {t['speedup']:>7.1f}x "
                     f"{t['hit_rows']:>6} | {o['cold_ttft_ms']:>13.1f}ms {o['hit_ttft_ms']:>7.1f}ms")
    if results.get("drift"):
        d = results["drift"]["summary"]
        lines += ["", f"Drift of the final hidden state vs the cold, untrimmed run ({results['drift']['trials']} random "
                      f"prompts, {results['config']['dtype']}; relative L2)",
                  f"{'comparison':<34} {'mean':>10} {'max':>10}"]
        names = {"hit_off": "prefix hit (encoder replay)", "cold_trim": "decoder trim (cold)",
                 "hit_trim": "prefix hit + decoder trim", "hit_off_decode": "  decode steps after a hit",
                 "cold_trim_decode": "  decode steps, trim", "hit_trim_decode": "  decode steps, hit + trim",
                 "trim_vs_clamp": "trim vs same clamp untrimmed", "noise_floor": "noise floor (other chunking)"}
        for k, v in d.items():
            lines.append(f"{names.get(k, k):<34} {v['mean']:>10.2e} {v['max']:>10.2e}")
    return "\n".join(lines)


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log(f"no PNG ({e}); redraw elsewhere with --plot-from")
        return False
    fig, ax = plt.subplots(figsize=(11, 5))
    batches = sorted({p["batch"] for p in results["trim"] if "skipped" not in p})
    for b in batches:
        pts = sorted((p for p in results["trim"] if p["batch"] == b and "skipped" not in p), key=lambda p: p["isl"])
        x = [p["isl"] for p in pts]
        ax.plot(x, [100 * p["prefill_saving"] for p in pts], "o-", label=f"prefill time saved, batch {b}")
        ax.plot(x, [100 * p["replay_saving"] for p in pts], "s--", alpha=0.7, label=f"replay-layer time saved, batch {b}")
    pts = sorted((p for p in results["trim"] if p["batch"] == batches[0] and "skipped" not in p),
                 key=lambda p: p["isl"]) if batches else []
    if pts:
        ax.plot([p["isl"] for p in pts], [100 * p["ideal_replay_saving"] for p in pts], "k--", lw=0.8,
                label="ideal replay-layer saving (rows removed)")
        ax.plot([p["isl"] for p in pts], [100 * p["ideal_prefill_saving"] for p in pts], "k:",
                label=f"ideal prefill saving (x replay FLOP share {results['replay_flop_share']:.0%})")
    for name, marker in (("TP4", "^"), ("DEP4", "v")):
        up = UPSTREAM[name]
        ax.plot(list(up), [100 * (1 - a / b) for a, b in up.values()], marker, color="gray", alpha=0.8,
                label=f"upstream {name} TTFT saving (GB200, V4.1-Flash)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("input sequence length (tokens)")
    ax.set_ylabel("saving with decoder trim (%)")
    c = results["config"]
    ax.set_title(f"Decoder-side SWA replay: {c['n_layers']} layers ({c['n_layers'] - c['n_source']} replay), "
                 f"{c['n_heads']} heads, latent {c['d_latent']}, W {c['window']}\n{results['device']}", fontsize=9)
    ax.axhline(0, color="k", lw=0.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"wrote {path}")
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=False, help="output folder (raw JSON, PNG)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda:0 if available, else cpu)")
    ap.add_argument("--config", choices=("h200", "small"), default=None, help="stack size (default: h200 on GPU)")
    ap.add_argument("--isl", default=None, help="comma-separated ISLs (default 1K,4K,16K,64K,128K on GPU)")
    ap.add_argument("--batch", default="1,4", help="batch sizes (requests submitted together)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-batched-tokens", type=int, default=None, help="chunked-prefill budget (default 16384)")
    ap.add_argument("--hit-isl", default=None, help="ISLs of the prefix-hit TTFT test (default: --isl)")
    ap.add_argument("--drift", type=int, default=None, help="random prompts for the drift measure (default 8 GPU, 24 CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trim-threshold", type=int, default=EAGER_TRIM_THRESHOLD,
                    help="steps under this many tokens keep every row (default: the example engine's, "
                         f"{EAGER_TRIM_THRESHOLD}: past the steps vLLM runs in CUDA graphs; 0 trims every step)")
    ap.add_argument("--time-budget", type=float, default=300.0,
                    help="seconds after start past which remaining timing points are skipped (and listed)")
    ap.add_argument("--plot-from", default=None, help="redraw the PNG from a results JSON and exit")
    ap.add_argument("--prefer", default=None, metavar="OP=VARIANT[,OP=VARIANT]",
                    help="run these ops through the named variants (select()'s prefer), e.g. sparse_mla=triton")
    args = ap.parse_args(argv)
    prefer = None
    if args.prefer:
        pairs = [p.partition("=") for p in args.prefer.split(",")]
        if any(not op or not eq or not name for op, eq, name in pairs):
            ap.error(f"--prefer {args.prefer!r}: expected OP=VARIANT[,OP=VARIANT]")
        prefer = {op.strip(): name.strip() for op, _, name in pairs}

    if args.plot_from:
        res = json.loads(pathlib.Path(args.plot_from).read_text())
        plot(res, pathlib.Path(args.plot_from).with_suffix(".png"))
        print(table(res))
        return 0
    if not args.out:
        ap.error("--out is required")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device or ("cuda:0" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    cfg_name = args.config or ("h200" if gpu else "small")
    cfg = StackConfig.h200() if cfg_name == "h200" else StackConfig.small()
    if not gpu:
        torch.set_num_threads(1)  # small CPU shapes: extra threads only contend
    default_isl = "1024,4096,16384,65536,131072" if cfg_name == "h200" else "256,512,1024"
    isls = [int(s) for s in (args.isl or default_isl).split(",")]
    hit_isls = [int(s) for s in (args.hit_isl or ",".join(map(str, isls))).split(",")]
    batches = [int(s) for s in args.batch.split(",")]
    chunk = args.max_batched_tokens or (16384 if cfg_name == "h200" else 512)
    n_drift = args.drift if args.drift is not None else (8 if gpu else 24)
    rng = np.random.default_rng(args.seed)

    t0 = time.perf_counter()
    backend = sb.select(device, prefer=prefer)
    results = {
        **machine(device), "prefer": prefer, "config_name": cfg_name, "config": cfg.as_dict(),
        "variants": {k: list(v) for k, v in backend.variants.items()},
        "max_batched_tokens": chunk, "trim_threshold": args.trim_threshold, "isl": isls, "batch": batches, "reps": args.reps,
        "replay_layers": list(sb.replay_layer_ids(cfg.n_layers, range(cfg.n_source))),
        "upstream": {k: {str(i): v for i, v in t.items()} for k, t in UPSTREAM.items()},
    }
    results["replay_flop_share"] = flop_share(cfg)
    log(f"device {results['device']}, torch {torch.__version__}, config {cfg_name}: {cfg}")
    log(f"sparse_mla variant: {backend.variants['sparse_mla']}; replay layers {results['replay_layers']}; "
        f"replay-layer FLOP share {results['replay_flop_share']:.1%}")

    stack = Stack(cfg, device)
    log("sanity (validation on, instrumented reads) ...")
    results["sanity"] = sanity(stack, backend, cfg, rng, chunk=min(chunk, 3 * cfg.window))
    log(f"  {results['sanity']}")
    if results["sanity"]["violations"]:
        log("SANITY FAILED: reads outside the clamp contract; timings below are still recorded")

    if n_drift:  # validated, before the timed part (cheap: prompts of a few K tokens)
        log(f"drift over {n_drift} random prompts ...")
        lo, hi = (2 * cfg.window + 1, 8 * cfg.window) if not gpu else (1024, 4096)
        trials = [drift_trial(stack, rng, min_len=lo, max_len=hi, max_batched_tokens=min(chunk, 4096) if gpu else 256,
                              backend=backend) for _ in range(n_drift)]
        results["drift"] = {"trials": n_drift, "prompt_lens": [lo, hi], "summary": summarize(trials), "raw": trials}
    sb.set_validation(False)  # value checks synchronise with the device: off on the timed path
    cap = max(isls + hit_isls) * max(batches + [2]) + 4 * chunk
    eng = Engine(stack, backend=backend, max_batched_tokens=chunk, decoder_trim="trim", max_tokens=cap,
                 max_reqs=max(batches) + 8, poison=False, timing=True, trim_threshold=args.trim_threshold)
    log("warm-up ...")
    for mode in ("off", "trim"):  # compile kernels for every shape class before timing
        eng.decoder_trim = mode
        run_batch(eng, prompts(rng, 2, min(isls[0], 2 * chunk) + cfg.window + 1, cfg.vocab), f"warm-{mode}")
        run_batch(eng, prompts(rng, 1, min(max(isls), chunk + 7), cfg.vocab), f"warm2-{mode}")
    # most telling first, so a spent --time-budget drops the big batches, not the single requests
    deadline = t0 + args.time_budget
    log("decoder trim, one request ...")
    results["trim"] = bench_trim(eng, cfg, [(i, 1) for i in isls if 1 in batches], args.reps, rng, results, deadline)
    log("prefix-hit replay ...")
    results["hit"] = bench_hit(eng, cfg, hit_isls, args.reps, rng, deadline)
    log("decoder trim, batches ...")
    results["trim"] += bench_trim(eng, cfg, [(i, b) for b in batches if b != 1 for i in isls], args.reps, rng, results,
                                  deadline)
    del eng
    if gpu:
        torch.cuda.empty_cache()
    sb.set_validation(True)
    results["elapsed_s"] = time.perf_counter() - t0
    if gpu:
        results["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    write_json(out / "bench_e2e.json", results)
    print(table(results))
    plot(results, out / "bench_e2e.png")
    log(f"elapsed {results['elapsed_s']:.0f} s; wrote {out / 'bench_e2e.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
