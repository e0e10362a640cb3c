#!/usr/bin/env python
"""Where a validated call to a self-checking kernel (``Variant.self_checked``) spends its host time,
per op that has one, at ``bench_validation.py``'s serving-sized step::

    . bench/gpu_env.sh && python3 bench/experiments/exp_self_checked.py --out $OUT
    python bench/experiments/exp_self_checked.py --out /tmp/sc --smoke        # CPU wiring, one round

Host µs per call, median of ``--reps`` rounds with the device idle before each call, every
measurement once a round (``lib.timing.one_call_us``; fresh arguments made outside the timing):

* ``off``: the call through the backend, validation off; ``on``: validated (the self-checked path),
  the thread's switch set before the timing (``sb.set_validation``), as a caller sets it once;
  ``on_default``: validated as it comes, the thread's switch never set (the environment's default);
* ``plain``: the plain kernel's implementation called directly (no dispatch);
* ``form``: the self-checked form called directly (the op's quick checks, which it runs first, included),
  without waiting for its verdict; ``form_wait``: with the wait (``Verdict.failed``);
* ``quick``: the op's quick host checks alone; ``capture``: the graph-capture query dispatch asks
  (``dispatch.capture_query``); ``enabled``: ``value_checks_enabled()`` alone (validation's own
  query); ``verdict_open``: ``open_verdict`` alone;
* ``wait``: ``form_wait - form``: from the launch's return to the verdict seen.

Before an op is timed, the call validated and not, the plain kernel and the self-checked form (waited for)
are each compared with the op's torch reference on the same arguments; an op with a wrong path is not timed
(``wrong``: what differed) and the run exits 1. Writes ``exp_self_checked.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lib import smoke  # noqa: E402

smoke.use_interpreter()  # before anything imports Triton

import torch  # noqa: E402

import swa_backends as sb  # noqa: E402
from lib import results, timing as tm  # noqa: E402
from lib.steps import validation_cases  # noqa: E402
from swa_backends.common.ops import OPS  # noqa: E402
from swa_backends.common.registry import load_attr  # noqa: E402
from swa_backends.common import validation  # noqa: E402
from swa_backends.common.validation import value_checks_enabled  # noqa: E402
from swa_backends.dispatch import capture_query, home_device  # noqa: E402
from swa_backends.kernels import METADATA_KERNELS, SELF_CHECKED  # noqa: E402
from swa_backends.kernels._verdict import open_verdict  # noqa: E402
from swa_backends.testing.conformance import mismatch  # noqa: E402


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


def _unwaited(v):
    """A verdict this timing never waits for, marked read (``lib.timing`` waits for the device before
    the next call: no kernel of this one can still write the word), so that the next call's
    ``open_verdict`` does not wait for the device itself (an attribute write inside the timing)."""
    verdict = v[1] if isinstance(v, tuple) else v
    if verdict is not None:
        verdict.unread = False
    return v


def per_op(dev, reps: int, gpu: bool) -> dict:
    """Every op with a self-checked form at ``bench_validation.py``'s step (``--smoke``: the case
    generator's small steps, in the interpreter): its row of host µs, or ``declined``."""
    be = sb.select(str(dev)) if gpu else sb.select("cpu", prefer="triton")
    capturing = capture_query(be.device)
    previous = sb.validation_enabled()
    out = {}
    for op, args, kwargs in validation_cases(dev, smoke=not gpu):
        if op not in SELF_CHECKED:
            continue
        spec = OPS[op]
        fn = getattr(be, op)
        plain = load_attr(f"swa_backends.kernels.{METADATA_KERNELS[op][0]}")
        form = load_attr(f"swa_backends.kernels.{SELF_CHECKED[op]}")
        home = home_device(be.device)  # as dispatch calls the form

        def fresh(body, switch=None):
            def make():
                a, kw = tuple(_clone(x) for x in args), {n: _clone(x) for n, x in kwargs.items()}
                if switch == "default":  # the thread's switch as a thread that never set it has it
                    validation._state.__dict__.pop("enabled", None)
                elif switch is not None:  # the thread's switch, set outside the timing as a caller sets it once
                    sb.set_validation(switch)
                return lambda: body(a, kw)
            return make

        def validated(a, kw, on):
            with sb.validation(on):
                return fn(*a, **kw)

        def form_wait(a, kw):
            done = form(home, *a, **kw)
            assert done is not None and not done[1].failed(), f"{op}: the form refused the step"
            return done[0]

        a0, kw0 = fresh(lambda a, kw: (a, kw))()()
        if _unwaited(form(home, *a0, **kw0)) is None:  # (a step it does not take: ratio 1, ...)
            out[op] = {"declined": True}
            print(f"{op:<22} declined the step (the validator runs)", flush=True)
            continue
        for on in (True, False):  # warm both paths
            fresh(lambda a, kw: validated(a, kw, on))()()
        form_wait(*fresh(lambda a, kw: (a, kw))()())
        want = fresh(lambda a, kw: spec.reference(*a, **kw))()()
        wrong = {name: why for name, why in (
            (name, mismatch(op, fresh(body)()(), want)) for name, body in (
                ("off", lambda a, kw: validated(a, kw, False)), ("on", lambda a, kw: validated(a, kw, True)),
                ("plain", lambda a, kw: plain(*a, **kw)), ("form", form_wait))) if why is not None}
        if wrong:  # a path whose result differs from the reference's is not timed
            out[op] = {"wrong": wrong}
            print(f"{op:<22} WRONG, not timed: {wrong}", flush=True)
            continue
        t = tm.one_call_us({
            "off": fresh(lambda a, kw: fn(*a, **kw), False),
            "on": fresh(lambda a, kw: fn(*a, **kw), True),
            "on_default": fresh(lambda a, kw: fn(*a, **kw), "default"),
            "plain": fresh(lambda a, kw: plain(*a, **kw)),
            "form": fresh(lambda a, kw: _unwaited(form(home, *a, **kw))),
            "form_wait": fresh(form_wait),
            "quick": fresh(lambda a, kw: spec.quick_check(*a, **kw)),
            "capture": fresh(lambda a, kw: capturing()),
            "enabled": fresh(lambda a, kw: value_checks_enabled()),
            "verdict_open": fresh(lambda a, kw: _unwaited(open_verdict(dev))),
        }, reps)
        sb.set_validation(previous)
        row = {name: v["host"] for name, v in t.items()}
        row["wait"] = row["form_wait"] - row["form"]
        row["ratio"] = row["on"] / row["off"]
        out[op] = row
        print(f"{op:<22} " + "  ".join(f"{k} {v:6.2f}" for k, v in row.items()), flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--smoke", action="store_true", help="one round on the CPU (checks the script)")
    a = p.parse_args(argv)
    gpu = torch.cuda.is_available() and not a.smoke
    tm.set_smoke(not gpu)
    dev = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    res = {"meta": results.machine(dev), "reps": a.reps if gpu else 1,
           "ops": per_op(dev, a.reps if gpu else 1, gpu)}
    a.out.mkdir(parents=True, exist_ok=True)
    results.write_json(a.out / "exp_self_checked.json", res)
    return 1 if any("wrong" in row for row in res["ops"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
