#!/usr/bin/env python
"""FlashMLA on the GPU, three ways, in one run: vLLM's FlashMLA called directly, the pack's
``flashmla`` variant (its wrapper), and the pack's own kernel (the ``gluon_ws`` variant), with
the torch-native baseline, per cell of H 64 / 128 x K 640 / 1152 x T 4K / 16K x a 1M-row and a
16K-row latent cache (random valid indices, sink on, D_qk = d_v = 512)::

    python bench/fetch_flashmla.py                    # once, here: .flashmla/ (vLLM's FlashMLA)
    . bench/gpu_env.sh && PYTHONPATH=.flashmla:$PYTHONPATH python3 bench/bench_flashmla.py --out $OUT

Kernel experiments: ``--variant LABEL=FILE`` (repeatable) also times a copy of the ws kernel's module
(``git show <rev>:kernels/sparse_mla_gluon_ws.py > FILE``, edited or not; or a ``.diff`` of it, e.g. a
candidate of ``bench/experiments/candidates/``, applied strictly) as path ``ws_LABEL`` in the same rounds,
checked like every path; ``--skip`` leaves paths out; a summary per variant prints last (its ratio to FlashMLA
direct and to ``pack_gluon_ws``, per cell class: min and geometric mean).
``pack_default`` is ``select(device).sparse_mla`` with validation off (the hot path) and
``pack_default_validated`` the same call with validation on, as it comes: what a user who times the
default call measures (its one device read and its host checks land inside the measured time).
``--cells H:K:T:ROWS,...`` times those cells instead of the grid. ``--smoke`` (no GPU) checks the
script's wiring on one tiny cell on the CPU: the torch baseline and the default path (the
reference there) one call each, FlashMLA and ``gluon_ws`` listed with the reasons they cannot run.

TFLOP/s = 2*T*H*K*(D_qk + d_v) / time. The paths of a cell are timed in interleaved rounds
(one call of each path per round, CUDA events around the call after a GPU sleep that keeps the
device behind the host, so host overhead is not counted; the median per path:
``lib.timing.interleaved_ms``), so a slow stretch of
the machine hits every path alike and the ratios compare like with like. The sleep is set per cell to
four times the slowest path's host work (``host_us``: one call on an idle device until it returns;
at least about 0.5 ms; ``lead_cycles``): the validated call's host checks and its wait for the
device check take 0.2-0.7 ms on the H200's host (medians; single calls up to twice that), often
longer than a fixed 0.5 ms sleep, and a sleep shorter than a path's host work counts part of that
work as device time. The default call, unvalidated and
validated, is also timed as a loop of 8 calls a round (``loop_ms``, ms per call: from the second
call on the host works while the device does, as a caller timing a loop sees it). Every path is first
checked against the fp32 torch reference on PAD patterns (holes inside the length, short and
empty rows) and at each cell on its first tokens; a wrong path is recorded, not timed. Writes
``bench_flashmla.json`` and ``bench_flashmla.png`` (TFLOP/s per cell and path) to ``--out``;
the table prints last, with each path's ratio to FlashMLA direct.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from lib import smoke

smoke.use_interpreter()  # before anything imports Triton

import swa_backends as sb  # noqa: E402
from lib import results, timing as tm  # noqa: E402
from lib.results import log  # noqa: E402
from lib.sparse_mla import (CELLS, DV, D, check, load_module_copy, make_inputs, parse_cells, parse_copies,  # noqa: E402
                            tflops, torch_baseline)

#: the correctness check before timing: PAD patterns at these head counts, T tokens, K indices into ROWS rows
CHECK = {"H": (16, 64, 128), "T": 300, "K": 1152, "rows": 8192}
SMOKE_CHECK = {"H": (16,), "T": 20, "K": 64, "rows": 1024}
SMOKE_CELLS = [(16, 64, 8, 1024)]
#: the default call unvalidated and validated: also timed as a loop of LOOP_CALLS calls a round
DEFAULT_PAIR = ("pack_default", "pack_default_validated")
#: calls per round of the host timing back to back (host_loop_us)
HOST_LOOP_CALLS = 10
LOOP_CALLS = 8
#: one call of each path on an idle device, this many times (median): the host work the sleep must outlast
HOST_ROUNDS = 5
#: issue 38: the validated default call at this fraction of the unvalidated one's speed, or better
VALIDATED_GOAL = 0.97
GLUON_INTERPRETED = "TRITON_INTERPRET=1: Gluon kernels do not run in Triton's interpreter"
# a --variant copy may be another language's kernel (bench/experiments/cluster/ launches a cubin): it runs on a GPU only
COPY_INTERPRETED = "TRITON_INTERPRET=1: kernel copies (--variant) run on a GPU only"


def load_variant(label: str, path: Path):
    """``path`` (a copy of ``kernels/sparse_mla_gluon_ws.py``) as ``swa_backends.kernels._bench_variant_<label>``."""
    return load_module_copy(f"_bench_variant_{label}", path)


def paths(dev, variants: dict | None = None):
    """``{name: fn(q, kv, idx, lens, scale, sink) -> (out, lse)}`` and the reasons of those that cannot run;
    ``variants``: ``{label: module}`` timed as ``ws_<label>``."""
    from swa_backends.backends.cuda import flashmla, probes
    from swa_backends.kernels import sparse_mla_gluon_ws

    found, why = {}, {}
    mod, reason = probes.find_flashmla()
    if mod is None:
        why["flashmla_direct"] = why["pack_flashmla"] = reason
    else:
        def direct(q, kv, idx, lens, scale, sink):  # FlashMLA's own convention: lse = +inf for an empty token
            out, _, lse = mod.flash_mla_sparse_fwd(q, kv.unsqueeze(1), idx.unsqueeze(1), scale, DV, attn_sink=sink,
                                                   topk_length=lens)
            return out, lse

        found["flashmla_direct"] = direct
        found["pack_flashmla"] = lambda q, kv, idx, lens, scale, sink: flashmla.sparse_mla(q, kv, idx, lens, scale,
                                                                                           DV, sink=sink)
    interpreted = smoke.interpreted()
    if interpreted:
        why["pack_gluon_ws"] = GLUON_INTERPRETED
    else:
        found["pack_gluon_ws"] = lambda q, kv, idx, lens, scale, sink: sparse_mla_gluon_ws.sparse_mla(
            q, kv, idx, lens, scale, DV, sink=sink)
    for label, vmod in (variants or {}).items():  # not `mod`: direct() above reads FlashMLA's module by that name
        if interpreted:
            why[f"ws_{label}"] = COPY_INTERPRETED
            continue
        found[f"ws_{label}"] = lambda q, kv, idx, lens, scale, sink, m=vmod: m.sparse_mla(q, kv, idx, lens, scale, DV,
                                                                                            sink=sink)
    backend = sb.select(str(dev))
    found["pack_default"] = lambda q, kv, idx, lens, scale, sink: backend.sparse_mla(q, kv, idx, lens, scale, DV,
                                                                                     sink=sink)

    def validated(q, kv, idx, lens, scale, sink):  # the default call as a user times it: validation on
        with sb.validation(True):
            return backend.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink)

    found["pack_default_validated"] = validated
    return found, why, backend


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=9, help="interleaved rounds per cell")
    p.add_argument("--quick", action="store_true", help="the 1M-row cells of T 16K only")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL=FILE",
                   help="also time this copy of kernels/sparse_mla_gluon_ws.py (or a .diff of it) as path ws_LABEL")
    p.add_argument("--skip", default="", help="comma-separated paths not to run (e.g. pack_flashmla,pack_default)")
    p.add_argument("--cells", default="", metavar="H:K:T:ROWS,...",
                   help="these cells instead of the grid (e.g. 128:2048:4096:1048576 for H 128, K 2048, T 4K, 1M rows)")
    p.add_argument("--smoke", action="store_true",
                   help="no GPU: one tiny cell on the CPU, one call per measurement (checks the script; numbers mean "
                        "nothing)")
    args = p.parse_args(argv)
    chosen = parse_cells(args.cells)
    if chosen and args.quick:
        raise ValueError(f"--cells {args.cells!r} with --quick; expected one of the two")
    # every --variant checked once, before anything runs
    files = {label: str(f) for label, f in parse_copies("--variant", args.variant).items()}
    why = smoke.refusal(args.smoke)
    if why:
        log(f"bench_flashmla: {why}")
        return 2
    tm.set_smoke(args.smoke)
    check_at = SMOKE_CHECK if args.smoke else CHECK
    dev = torch.device("cpu") if args.smoke else torch.device("cuda", torch.cuda.current_device())
    args.out.mkdir(parents=True, exist_ok=True)
    variants = {label: load_variant(label, Path(file)) for label, file in files.items()}
    fns, reasons, backend = paths(dev, variants)
    for name in filter(None, args.skip.split(",")):
        if name not in fns:
            raise ValueError(f"--skip: {name!r} is not a path here; expected one of {sorted(fns)}")
        del fns[name]
    scale = D ** -0.5
    def checked(name, got):  # the direct call's empty tokens carry lse = +inf: compared in the pack's convention
        if name == "flashmla_direct":
            return got[0], got[1].masked_fill(got[1] == float("inf"), float("-inf"))
        return got

    result = {"meta": {**results.machine(dev), "cells": "H x K x T x cache rows", "unavailable": reasons,
                       "default_chain": list(backend.variants["sparse_mla"]), "variants": files, "smoke": args.smoke,
                       "method": "paths interleaved per cell, one call each per round after a GPU sleep, CUDA events, "
                                 "median per path (lib/timing.py interleaved_ms); the sleep per cell four times the slowest "
                                 f"path's host work (host_us, lead_cycles); the default pair also as a loop of {LOOP_CALLS} "
                                 f"calls (loop_ms); host µs per call of each unvalidated path, {HOST_LOOP_CALLS} calls back "
                                 f"to back, median of {HOST_ROUNDS} interleaved rounds (host_loop_us)"},
              "checks": {}, "cells": []}
    failed = False
    sb.set_validation(False)  # the hot path; pack_default_validated turns it on for its own calls

    # correctness first, on PAD patterns, at every head count (a wrong path is not timed)
    for H in check_at["H"]:
        kv = torch.randn(check_at["rows"], D, device=dev).to(torch.bfloat16)
        q, idx, lens, sink = make_inputs(check_at["T"], H, check_at["K"], D, kv=kv, pads=True, seed=H, dev=dev)
        for name, fn in fns.items():
            if name == "flashmla_direct" and H not in (64, 128):
                continue  # the direct call takes the head counts its build serves unpadded; the wrapper pads
            try:
                why, rel = check(checked(name, fn(q, kv, idx, lens, scale, sink)), q, kv, idx, lens, scale, DV, sink)
            except Exception as exc:  # recorded, never the end of the run
                why, rel = f"{type(exc).__name__}: {exc}", float("nan")
            result["checks"][f"{name}/H{H}"] = {"ok": why is None, "why": why, "rel_err": rel}
            failed |= why is not None
            log(f"check {name:<16} H {H:>3}: {'ok' if why is None else why} (rel {rel:.2e})")
    bad = {k.split("/")[0] for k, v in result["checks"].items() if not v["ok"]}

    cells = chosen or (SMOKE_CELLS if args.smoke else
                       [c for c in CELLS if not args.quick or (c[2] == 16384 and c[3] == 1 << 20)])
    kvs = {}
    for H, K, T, S in cells:
        kv = kvs.get(S)
        if kv is None:
            kv = kvs[S] = torch.randn(S, D, device=dev).to(torch.bfloat16)
        q, idx, lens, sink = make_inputs(T, H, K, D, kv=kv, seed=H * K + T, dev=dev)
        row = {"H": H, "K": K, "T": T, "S": S, "tflops": {}, "ms": {}, "errors": {}}
        ms = tm.event_ms(lambda: torch_baseline(q, kv, idx, lens, scale, DV, sink), reps=max(2, args.reps // 2))
        row["ms"]["torch"], row["tflops"]["torch"] = ms, tflops(T, H, K, D, DV, ms)
        ready = {}
        for name, fn in fns.items():
            if name in bad:
                continue
            try:
                why, _ = check(checked(name, fn(q, kv, idx, lens, scale, sink)), q, kv, idx, lens, scale, DV, sink, n=8)
                if why:
                    raise AssertionError(why)
                if not args.smoke:
                    fn(q, kv, idx, lens, scale, sink)  # warm
                ready[name] = fn
            except Exception as exc:
                row["errors"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                failed = True
        calls = {n: (lambda f=f: f(q, kv, idx, lens, scale, sink)) for n, f in ready.items()}
        # the sleep ahead of each timed call outlasts every path's host work, measured here: the validated
        # call's host checks and its wait for the device check take longer than the fixed sleep
        row["host_us"], lead = tm.host_lead(calls, HOST_ROUNDS)
        row["lead_cycles"] = lead
        for name, ms in tm.interleaved_ms(calls, args.reps, lead_cycles=lead).items():
            row["ms"][name], row["tflops"][name] = ms, tflops(T, H, K, D, DV, ms)
        if all(n in calls for n in DEFAULT_PAIR):  # the default call in a loop, validated and not
            row["loop_ms"] = tm.interleaved_ms({n: calls[n] for n in DEFAULT_PAIR}, args.reps, lead_cycles=lead,
                                               calls=LOOP_CALLS)
        # the host's own time per call, back to back (a caller's loop with the device behind it); not the
        # validated call's, which waits for its device check, behind the calls queued before it
        row["host_loop_us"] = tm.host_interleaved_us({n: f for n, f in calls.items() if n != DEFAULT_PAIR[1]},
                                                     calls=HOST_LOOP_CALLS, rounds=HOST_ROUNDS)
        if "pack_default" in row["ms"]:
            row["default_variant"] = backend.variant_for("sparse_mla", q, kv, idx, lens, scale, DV, sink=sink)
        result["cells"].append(row)
        log(f"H {H:>3} K {K:>4} T {T:>5} S {S:>7}: " + "  ".join(f"{n} {v:6.1f}" for n, v in row["tflops"].items()))
        results.write_json(args.out / "bench_flashmla.json", result)

    results.write_json(args.out / "bench_flashmla.json", result)
    plot(result, args.out / "bench_flashmla.png")
    print_table(result)
    print_validated(result)
    print_host(result)
    print_variants(result)
    return 1 if failed else 0


def _size(n: int) -> str:
    """4096 -> "4K", 1048576 -> "1M", 300 -> "300"."""
    for unit, shift in (("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # the table is the result; the plot is a picture of it
        log(f"no plot ({exc})")
        return
    names = ["flashmla_direct", "pack_flashmla", "pack_gluon_ws", "torch"]
    cells = result["cells"]
    fig, ax = plt.subplots(figsize=(max(8, len(cells) * 0.9), 4))
    width = 0.2
    for i, n in enumerate(names):
        ax.bar([c + (i - 1.5) * width for c in range(len(cells))], [r["tflops"].get(n, 0) for r in cells], width,
               label=n)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([f"H{r['H']}\nK{r['K']}\nT{_size(r['T'])}\n{_size(r['S'])}"
                        for r in cells], fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"sparse MLA, D 512, {result['meta']['device']} (torch {result['meta']['torch']}, "
                 f"Triton {result['meta']['triton']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(result: dict) -> None:
    print("\n| H / K / T / cache rows | FlashMLA direct | pack flashmla | pack gluon_ws | torch | flashmla / direct "
          "| gluon_ws / direct |")
    print("|---|---|---|---|---|---|---|")
    for r in result["cells"]:
        t = r["tflops"]
        d = t.get("flashmla_direct")
        ratio = lambda n: f"{t[n] / d:.3f}" if d and n in t else "-"  # noqa: E731
        cells = [f"{t[n]:.1f}" if n in t else "-" for n in ("flashmla_direct", "pack_flashmla", "pack_gluon_ws",
                                                            "torch")]
        size = f"{r['H']} / {r['K']} / {_size(r['T'])} / {_size(r['S'])}"
        print(f"| {size} | " + " | ".join(cells) + f" | {ratio('pack_flashmla')} | {ratio('pack_gluon_ws')} |")
    if result["meta"]["unavailable"]:
        print("unavailable:", result["meta"]["unavailable"])


def validated_speeds(result: dict) -> dict:
    """``{"call": [...], "loop": [...]}``: per cell, the unvalidated default call's time over the
    validated one's, one call a round and in a loop (cells that timed both)."""
    got: dict = {"call": [], "loop": []}
    for r in result["cells"]:
        for key, ms in (("call", r["ms"]), ("loop", r.get("loop_ms", {}))):
            if all(n in ms for n in DEFAULT_PAIR):
                got[key].append(ms[DEFAULT_PAIR[0]] / ms[DEFAULT_PAIR[1]])
    return got


def print_validated(result: dict) -> None:
    """The validated default call against the unvalidated one: min, geometric mean, cells below the goal."""
    for key, vals in validated_speeds(result).items():
        if vals:
            gm = results.gmean(vals)
            print(f"validated / unvalidated default call ({key}): min {min(vals):.3f}, gm {gm:.3f}, "
                  f"{sum(v < VALIDATED_GOAL for v in vals)} of {len(vals)} cells below {VALIDATED_GOAL}")


def print_host(result: dict) -> None:
    """Host µs per call back to back of each path against FlashMLA direct's: min / geometric mean / max."""
    rows = [r["host_loop_us"] for r in result["cells"] if r.get("host_loop_us", {}).get("flashmla_direct")]
    for n in sorted({n for h in rows for n in h if n != "flashmla_direct"}):
        rs = [h[n] / h["flashmla_direct"] for h in rows if n in h]
        us = [h[n] for h in rows if n in h]
        print(f"host us per call, back to back, {n}: {min(us):.1f}-{max(us):.1f}; / flashmla_direct min "
              f"{min(rs):.2f} gm {results.gmean(rs):.2f} max {max(rs):.2f}")


def print_variants(result: dict) -> None:
    """Per ``ws_*`` path: its ratio to FlashMLA direct and to ``pack_gluon_ws`` over the 1M-row and the
    16K-row cells (min / geometric mean)."""
    names = sorted({n for r in result["cells"] for n in r["tflops"] if n.startswith("ws_")})
    for n in names:
        parts = []
        for base in ("flashmla_direct", "pack_gluon_ws"):
            for cls, pick in (("1M", lambda r: r["S"] > 1 << 19), ("16K", lambda r: r["S"] <= 1 << 19)):
                rs = [r["tflops"][n] / r["tflops"][base] for r in result["cells"]
                      if pick(r) and n in r["tflops"] and r["tflops"].get(base)]
                if rs:
                    gm = results.gmean(rs)
                    parts.append(f"/{base} {cls} min {min(rs):.3f} gm {gm:.3f}")
        print(f"{n}: " + "; ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
