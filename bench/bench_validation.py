#!/usr/bin/env python
"""What validation costs: every device op called as it comes (validated, the default) against the
same call with validation off, on one device::

    . bench/gpu_env.sh && python3 bench/bench_validation.py --out $OUT      # GPU: the grid and every op
    python bench/bench_validation.py --out /tmp/val --smoke                  # CPU: small shapes, one round

The goals it measures (issue 38): at every cell of the sparse-MLA grid (T 4K / 16K x H 64 / 128 x
K 640 / 1152 x a 1M-row and a 16K-row bf16 cache, ``D_qk = d_v = 512``, sink on) the validated call
is at least 0.97x the unvalidated one; for the metadata ops the validated call's host time is at
most 2x the unvalidated one's.

* **sparse MLA**, per cell, ``speed = unvalidated time / validated time`` two ways, both through
  ``swa_backends.select(device).sparse_mla``: ``device``, CUDA events around one call after a GPU
  sleep that keeps the device behind the host (four times the slower call's host work, measured per
  cell: so the time is the device's, and a validated call's read, which makes the device wait for
  the host, is inside it), median of interleaved rounds; and
  ``loop``, back-to-back calls timed on the host over a round (what a user who times the op as it
  comes sees: the host may run ahead of the device only without the read).
* **every other op** at a serving-sized step (B up to 64 requests, T a few thousand tokens, from
  ``testing.conformance``; ``--smoke``: the generator's small steps), ``host = validated host time /
  unvalidated host time``: wall clock from the call to its return with the device idle before it
  (median of rounds), the thread's switch set before the timing, and the same with the device's work
  included; beside them ``bare``, the op of a backend selected with ``checked=False`` (the variant
  itself), and the validated call's ratio to it.
* **reads**: device->host reads a validated call makes beyond the unvalidated one
  (``testing.host_reads``: the validation's one read, and any other value read through torch),
  for every op once.

Every validated result is first compared with the unvalidated one (they must be equal). Writes
``bench_validation.json`` to ``--out`` and prints the tables. Timing methods: ``lib/timing.py``
(``interleaved_ms``, ``host_interleaved_us``, ``one_call_us``); ``--smoke`` makes each one call.
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
from lib.sparse_mla import CELLS, DV, D, make_inputs, parse_cells  # noqa: E402 (the grid)
from lib.steps import validation_cases  # noqa: E402
from swa_backends.testing.conformance import mismatch  # noqa: E402
from swa_backends.testing.host_reads import count_host_reads  # noqa: E402

SMOKE_CELLS = [(16, 64, 48, 1 << 10)]


def _call(fn, args, kwargs, validated: bool):
    with sb.validation(validated):
        return fn(*args, **kwargs)


def _fresh(args, kwargs):
    """The arguments with every tensor cloned (ops that write in place get the same input each call)."""
    def copy(v):
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, tuple):
            return tuple(copy(x) for x in v)
        if isinstance(v, dict):
            return {k: copy(x) for k, x in v.items()}
        return v

    return copy(args), copy(kwargs)


def host_times(fn, bare, args, kwargs, rounds: int) -> dict:
    """Median microseconds per call, alternating (``lib.timing.one_call_us``, fresh arguments made
    outside the timing): ``on`` the call validated, ``off`` the same call with the thread's switch
    off, each switch set before the timing as a caller sets it once (``sb.set_validation``; a
    ``with sb.validation(...)`` block around each call would add its own host time to both), and
    ``bare`` the op of a backend selected with ``checked=False`` (no validation, no dispatch: the
    variant itself); ``host`` from the call to its return with the device idle before it, ``wall``
    until the device is done."""
    def prepare(on, f):
        def make():
            a, kw = _fresh(args, kwargs)
            sb.set_validation(on)
            return lambda: f(*a, **kw)
        return make

    previous = sb.validation_enabled()
    try:
        t = tm.one_call_us({"on": prepare(True, fn), "off": prepare(False, fn), "bare": prepare(True, bare)}, rounds)
    finally:
        sb.set_validation(previous)
    return {f"{kind}_{key}": t[key][kind] for key in ("on", "off", "bare") for kind in ("host", "wall")}


def reads_per_call(fn, args, kwargs) -> tuple[int, list[str]]:
    """Device->host reads a validated call makes beyond the same call unvalidated (an op may read
    on its own, e.g. ``swa_indices_and_lens`` without ``num_tokens``), and what they were."""
    counts = {}
    for on in (True, False):
        a, kw = _fresh(args, kwargs)
        with count_host_reads() as n:
            _call(fn, a, kw, on)
        counts[on] = n
    return counts[True].reads - counts[False].reads, counts[True].what


def metadata_ops(be, bare_be, dev, smoke: bool, rounds: int) -> list[dict]:
    rows = []
    for op, args, kwargs in validation_cases(dev, smoke):
        fn, bare = getattr(be, op), getattr(bare_be, op)
        got = _call(fn, *_fresh(args, kwargs), True)
        want = _call(fn, *_fresh(args, kwargs), False)
        a, kw = _fresh(args, kwargs)
        why = mismatch(op, got, want) or mismatch(op, bare(*a, **kw), want)
        reads, what = reads_per_call(fn, args, kwargs)
        _call(fn, *_fresh(args, kwargs), True)  # warm both paths
        # (bare_be's first call made its op the variant itself: fetched again)
        t = host_times(fn, getattr(bare_be, op), args, kwargs, rounds)
        row = {"op": op, "variant": be.variant_for(op, *args, **kwargs), "same_result": why is None, "why": why,
               "reads": reads, "read_what": what, **{f"{k}_us": v for k, v in t.items()},
               "host_ratio": t["host_on"] / t["host_off"], "wall_ratio": t["wall_on"] / t["wall_off"],
               "host_ratio_bare": t["host_on"] / t["host_bare"]}
        rows.append(row)
        log(f"{op:<24} {row['variant']:<10} host {t['host_on']:8.1f} / {t['host_off']:8.1f} us = "
            f"{row['host_ratio']:5.2f}x   wall {row['wall_ratio']:5.2f}x   bare {t['host_bare']:8.1f} us: "
            f"{row['host_ratio_bare']:5.2f}x   reads {reads}")
    return rows


def looped(calls: dict, rounds: int, per_round: int) -> dict:
    """Median milliseconds per call of ``per_round`` back-to-back calls timed on the host until the
    device is done, callables in interleaved rounds (``lib.timing.host_interleaved_us``)."""
    us = tm.host_interleaved_us(calls, calls=per_round, rounds=rounds, until_done=True)
    return {n: v / 1e3 for n, v in us.items()}


def sparse_mla_cells(be, dev, cells, rounds: int, per_round: int) -> list[dict]:
    rows = []
    kvs: dict = {}
    scale = D ** -0.5
    for H, K, T, S in cells:
        kv = kvs.get(S)
        if kv is None:
            kv = kvs[S] = torch.randn(S, D, device=dev).to(torch.bfloat16)
        q, idx, lens, sink = make_inputs(T, H, K, D, kv=kv, seed=H * K + T, dev=str(dev))
        args, kwargs = (q, kv, idx, lens, scale, DV), {"sink": sink}
        calls = {"validated": lambda: _call(be.sparse_mla, args, kwargs, True),
                 "unvalidated": lambda: _call(be.sparse_mla, args, kwargs, False)}
        got, want = calls["validated"](), calls["unvalidated"]()
        why = mismatch("sparse_mla", got, want)
        reads, what = reads_per_call(be.sparse_mla, args, kwargs)
        loop = looped(calls, rounds, per_round)
        row = {"H": H, "K": K, "T": T, "S": S, "variant": be.variant_for("sparse_mla", *args, **kwargs),
               "same_result": why is None, "why": why, "reads": reads, "read_what": what,
               "loop_ms": loop, "loop_speed": loop["unvalidated"] / loop["validated"]}
        if dev.type == "cuda":  # after a sleep longer than either call's host work (bench_flashmla's method)
            ev = tm.interleaved_ms(calls, rounds, lead_cycles=tm.host_lead(calls)[1])
            row["device_ms"], row["device_speed"] = ev, ev["unvalidated"] / ev["validated"]
        rows.append(row)
        log(f"sparse_mla H {H:>3} K {K:>4} T {T:>5} S {S:>7} ({row['variant']}): loop {row['loop_speed']:.3f}x"
            + (f", device {row['device_speed']:.3f}x" if "device_speed" in row else "") + f", reads {reads}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smoke", action="store_true", help="CPU plumbing: small shapes, one round")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 21, 1 with --smoke)")
    p.add_argument("--per-round", type=int, default=10, help="back-to-back sparse-MLA calls per loop round")
    p.add_argument("--cells", default="", metavar="H:K:T:ROWS,...", help="sparse-MLA cells instead of the grid")
    p.add_argument("--skip-ops", action="store_true", help="only the sparse-MLA cells")
    p.add_argument("--skip-grid", action="store_true", help="only the metadata ops")
    args = p.parse_args(argv)
    cells = parse_cells(args.cells) or (SMOKE_CELLS if args.smoke else CELLS)
    if torch.cuda.is_available() and not args.smoke:
        dev = torch.device("cuda", torch.cuda.current_device())
    elif args.smoke:
        dev = torch.device("cpu")
    else:
        log("bench_validation: needs a CUDA GPU (or --smoke)")
        return 2
    rounds = args.rounds or (1 if args.smoke else 21)
    per_round = 1 if args.smoke else args.per_round
    tm.set_smoke(args.smoke)
    path = results.out_file(args.out, "bench_validation.json")
    be = sb.select(dev)
    result = {"meta": {**results.machine(dev), "smoke": args.smoke, "rounds": rounds, "per_round": per_round},
              "ops": [], "sparse_mla": []}
    if not args.skip_ops:
        result["ops"] = metadata_ops(be, sb.select(dev, checked=False), dev, args.smoke, rounds)
    if not args.skip_grid:
        result["sparse_mla"] = sparse_mla_cells(be, dev, cells, rounds, per_round)
    results.write_json(path, result)
    print_tables(result)
    bad = [r for r in (*result["ops"], *result["sparse_mla"]) if not r["same_result"] or r["reads"] > 1]
    for r in bad:
        log(f"FAILED {r.get('op', 'sparse_mla')}: same result {r['same_result']} ({r['why']}), reads {r['reads']} "
            f"{r['read_what']}")
    return 1 if bad else 0


def print_tables(result: dict) -> None:
    if result["ops"]:
        log("\n| op | variant | validated host us | unvalidated host us | host ratio (goal <= 2) | with device | "
            "checked=False host us | ratio to it | reads |")
        log("|---|---|---|---|---|---|---|---|---|")
        for r in result["ops"]:
            log(f"| {r['op']} | {r['variant']} | {r['host_on_us']:.1f} | {r['host_off_us']:.1f} | "
                f"{r['host_ratio']:.2f} | {r['wall_ratio']:.2f} | {r['host_bare_us']:.1f} | {r['host_ratio_bare']:.2f} | "
                f"{r['reads']} |")
    if not result["sparse_mla"]:
        return
    log("\n| H | K | T | rows | variant | loop speed (goal >= 0.97) | device speed | reads |")
    log("|---|---|---|---|---|---|---|---|")
    for r in result["sparse_mla"]:
        device = f"{r['device_speed']:.3f}" if "device_speed" in r else "-"
        log(f"| {r['H']} | {r['K']} | {r['T']} | {r['S']} | {r['variant']} | {r['loop_speed']:.3f} | {device} | "
            f"{r['reads']} |")


if __name__ == "__main__":
    sys.exit(main())
