"""Where the validated default ``sparse_mla`` call's time goes, per cell of ``bench_flashmla.py``'s
grid (issue 38: the validated call at >= 0.97x the unvalidated one in every cell)::

    . bench/gpu_env.sh && python3 bench/experiments/exp_validated_cost.py --out $OUT [--check LABEL=FILE ...]

A validated call picked for the gated ``gluon_ws`` (``kernels/sparse_mla_check.py``) runs its host
checks, launches the device check (and an event behind it), launches the gated kernel behind it and
waits for the check's verdict. Timed per cell in interleaved rounds
(``lib.timing.interleaved_ms``), each path once per round, every call of the cell on the same inputs:

* ``unvalidated``: ``select(device).sparse_mla`` with validation off (the hot path);
* ``gated``: the gated kernel alone, its flag a zero made once: what the gated build costs;
* ``check+gated``: ``gate()`` then the gated kernel, no wait: the validated call's device work;
* ``LABEL+gated`` per ``--check LABEL=FILE`` (a copy of ``kernels/sparse_mla_check.py``, edited or
  not): the same with that check, to compare a change of the check in the same rounds;
* ``validated``: the same default call with validation on, as it comes.

These rounds run after a GPU sleep of four times the slowest path's host work, measured first
(``host_us``: one call on an idle device, until it returns; ``lib.timing.host_lead``), so
that no host work shows. Then ``unvalidated`` and ``validated`` again, twice: after
``bench_flashmla.py``'s fixed sleep (``lib.timing.LEAD_CYCLES``, about 0.5 ms; ``*_lead05``), and as
a loop of ``--calls`` calls back to back between two events (``*_loop``, ms per call: a host that
works while the device does, as a caller timing a loop sees it).

Per cell: ``ms`` per path, and ``speed`` (unvalidated ms / validated ms) under each of the three
timings; ``split`` in µs: ``gated build`` (gated - unvalidated), ``device check`` (check+gated -
gated), ``host and wait`` (validated - check+gated). Writes ``exp_validated_cost.json`` under
``--out``; prints a line per cell and the minimum and geometric mean of each speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

import swa_backends as sb  # noqa: E402
from lib import results, timing as tm  # noqa: E402
from lib.results import log  # noqa: E402
from lib.sparse_mla import CELLS, DV, D, check, load_module_copy, make_inputs, parse_cells, parse_copies  # noqa: E402

GOAL = 0.97
TIMINGS = ("lead", "lead05", "loop")


def parse_checks(items: list[str]) -> dict[str, Path]:
    """``--check LABEL=FILE`` items -> ``{label: file}``; ValueError naming the item otherwise."""
    return parse_copies("--check", items, "an existing copy of kernels/sparse_mla_check.py")


def speeds(ms: dict) -> dict:
    """unvalidated / validated time under each timing present in ``ms``."""
    out = {}
    for t in TIMINGS:
        suffix = "" if t == "lead" else f"_{t}"
        if f"validated{suffix}" in ms:
            out[t] = ms[f"unvalidated{suffix}"] / ms[f"validated{suffix}"]
    return out


def split_us(ms: dict) -> dict:
    """The validated call's extra time, µs, in three parts (paths timed in the same rounds)."""
    return {"gated build": (ms["gated"] - ms["unvalidated"]) * 1e3,
            "device check": (ms["check+gated"] - ms["gated"]) * 1e3,
            "host and wait": (ms["validated"] - ms["check+gated"]) * 1e3}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=9, help="interleaved rounds per cell and timing")
    p.add_argument("--calls", type=int, default=8, help="calls per round of the loop timing")
    p.add_argument("--check", action="append", default=[], metavar="LABEL=FILE",
                   help="also time this copy of kernels/sparse_mla_check.py ahead of the gated kernel")
    p.add_argument("--cells", type=parse_cells, default=None, metavar="H:K:T:ROWS,...",
                   help="these cells instead of the grid")
    args = p.parse_args(argv)
    if args.calls < 2:
        raise ValueError(f"--calls {args.calls}; expected at least 2 (a loop)")
    files = parse_checks(args.check)
    if not torch.cuda.is_available():
        raise SystemExit("exp_validated_cost: needs a CUDA GPU")
    from swa_backends.kernels import sparse_mla_check, sparse_mla_gluon_ws

    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda", torch.cuda.current_device())
    checks = {"check": sparse_mla_check,
              **{label: load_module_copy(f"_exp_check_{label}", f) for label, f in files.items()}}
    backend = sb.select(str(dev))
    sb.set_validation(False)  # the hot path; the validated path turns it on for its own calls
    scale = D ** -0.5
    zero = torch.zeros(1, dtype=torch.int32, device=dev)

    def paths(q, kv, idx, lens, sink):
        def validated():
            with sb.validation(True):
                return backend.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink)

        fns = {"unvalidated": lambda: backend.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink),
               "gated": lambda: sparse_mla_gluon_ws.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink, gate=zero)}
        for label, mod in checks.items():
            fns[f"{label}+gated"] = lambda m=mod: sparse_mla_gluon_ws.sparse_mla(
                q, kv, idx, lens, scale, DV, sink=sink, gate=m.gate(q, kv, idx, lens, scale, DV, sink=sink).flag)
        fns["validated"] = validated
        return fns

    result = {**results.machine(dev), "goal": GOAL, "reps": args.reps, "calls": args.calls,
              "command": results.command_line(), "checks": {k: str(v) for k, v in files.items()}, "cells": []}
    failed = False
    kvs = {}
    for H, K, T, S in args.cells or CELLS:
        kv = kvs.setdefault(S, torch.randn(S, D, device=dev).to(torch.bfloat16))
        q, idx, lens, sink = make_inputs(T, H, K, D, kv=kv, seed=H * K + T)
        fns = paths(q, kv, idx, lens, sink)
        row = {"H": H, "K": K, "T": T, "S": S, "errors": {}}
        with sb.validation(True):
            row["variant"] = backend.variant_for("sparse_mla", q, kv, idx, lens, scale, DV, sink=sink)
        for name, fn in list(fns.items()):  # every path right (on its first tokens) before it is timed
            why, _ = check(fn(), q, kv, idx, lens, scale, DV, sink, n=8)
            if why:
                row["errors"][name] = why
                del fns[name]
        if {"unvalidated", "gated", "check+gated", "validated"} - set(fns):
            failed = True
            result["cells"].append(row)
            log(f"H {H:>3} K {K:>4} T {T:>5} S {S:>7}: wrong paths, not timed: {row['errors']}")
            continue
        torch.cuda.synchronize()
        pair = {n: fns[n] for n in ("unvalidated", "validated")}
        row["host_us"], lead = tm.host_lead(fns, args.reps)
        row["lead_cycles"] = lead
        ms = tm.interleaved_ms(fns, args.reps, lead_cycles=lead)
        ms.update({f"{n}_lead05": v for n, v in tm.interleaved_ms(pair, args.reps).items()})
        ms.update({f"{n}_loop": v for n, v in
                   tm.interleaved_ms(pair, args.reps, lead_cycles=lead, calls=args.calls).items()})
        row["ms"], row["speed"], row["split_us"] = ms, speeds(ms), split_us(ms)
        result["cells"].append(row)
        log(f"H {H:>3} K {K:>4} T {T:>5} S {S:>7} ({row['variant']}): speed "
            + " ".join(f"{t} {v:.3f}" for t, v in row["speed"].items()) + "; us: "
            + ", ".join(f"{k} {v:+.1f}" for k, v in row["split_us"].items())
            + f"; host us unvalidated {row['host_us']['unvalidated']:.0f}, validated "
            f"{row['host_us']['validated']:.0f}")
        results.write_json(args.out / "exp_validated_cost.json", result)
    timed = [r for r in result["cells"] if "speed" in r]
    for t in TIMINGS:
        vals = [r["speed"][t] for r in timed if t in r["speed"]]
        if vals:
            result[f"speed {t}"] = {"min": min(vals), "gm": results.gmean(vals),
                                    "cells below goal": sum(v < GOAL for v in vals)}
            log(f"speed {t}: min {min(vals):.3f}, geometric mean {result[f'speed {t}']['gm']:.3f}, "
                f"{result[f'speed {t}']['cells below goal']} of {len(vals)} cells below {GOAL}")
    results.write_json(args.out / "exp_validated_cost.json", result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
