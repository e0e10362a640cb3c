#!/usr/bin/env python
"""How long a validated call waits for the verdict of its checker programs (``kernels/range_check.py``)
as the call grows: ``plain_indices`` over T tokens of 128-wide window rows and a one-wide top-k
(``bench_validation.py``'s layout; the workers compute their tile, then wait), ``gather_rows``
of n rows of 7168 bf16 (the workers wait, then copy), and ``mixed_indices`` and
``indices_to_csr`` over T tokens of 640 indices (128 window and 512 top-k: the checkers read every
index, the workers copy or count them; beside ``mixed_indices``, ``torch_check``: torch's own min of both
index tensors brought to the host, the floor of a check that answers before it returns)::

    . bench/gpu_env.sh && python3 bench/experiments/exp_checker_wait.py --out $OUT
    python bench/experiments/exp_checker_wait.py --out /tmp/cw --smoke        # CPU wiring, tiny sizes

Per size, host µs (median of ``--reps`` rounds, the device idle before each call; ``lib.timing``):
``form`` the checked form's launch alone, ``form_wait`` with the wait for its verdict, ``wait`` their
difference, and ``plain`` the unvalidated kernel's launch; with the checker and worker programs of
the launch. Each size once per ``--naps`` value (``range_check.NAP_NS``: the workers' sleep between
reads of the gate, ns; 0 spins), in that order, and once per ``--max-checkers`` value (``range_check.MAX_CHECKERS``:
the cap on a launch's checker programs, past which each takes several tiles) within each.

Writes ``exp_checker_wait.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lib import smoke  # noqa: E402

smoke.use_interpreter()  # before anything imports Triton

import torch  # noqa: E402

from lib import results, timing as tm  # noqa: E402
from swa_backends.kernels import indices_to_csr as kc, mixed_indices as km, plain_indices as kp  # noqa: E402
from swa_backends.kernels import range_check, rows as kr  # noqa: E402

OPS = ("plain_indices", "gather_rows", "mixed_indices", "indices_to_csr")


def _same(plain, form, what: str) -> None:
    """The checked form's results (its verdict PASS) are the plain kernel's: nothing is timed otherwise."""
    want, (got, verdict) = plain(), form()
    assert not verdict.failed(), f"{what}: the checked form refused a valid call"
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    assert all(torch.equal(w, g) for w, g in zip(want, got, strict=True)), f"{what}: the checked form's result differs"


def _row(plain, form, reps: int, torch_check=None) -> dict:
    def wait():
        done = form()
        assert not done[1].failed()

    def unwaited():
        # a verdict not waited for, marked read: the timing waits for the device before the next
        # call, whose open_verdict need not (an attribute write inside the timing)
        form()[1].unread = False

    calls = {"plain": lambda: plain, "form": lambda: unwaited, "form_wait": lambda: wait}
    if torch_check is not None:
        calls["torch_check"] = lambda: torch_check
    t = tm.one_call_us(calls, reps)
    row = {name: v["host"] for name, v in t.items()}
    row["wait"] = row["form_wait"] - row["form"]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--naps", default="0,32,128,512", help="comma-separated NAP_NS values (ns)")
    p.add_argument("--max-checkers", default=str(range_check.MAX_CHECKERS),
                   help="comma-separated range_check.MAX_CHECKERS values (the cap on checker programs); with "
                        "more than one, a row's key is '<nap>/<cap>'")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (checks the script)")
    a = p.parse_args(argv)
    ops = a.ops.split(",")
    if not ops or not set(ops) <= set(OPS):
        raise ValueError(f"--ops={a.ops!r}: expected comma-separated names of {OPS}")
    naps = [int(v) for v in a.naps.split(",")]
    caps = [int(v) for v in a.max_checkers.split(",")]
    if not caps or min(caps) < 1 or max(caps) > 2**14:
        # (the count word holds the checkers below range_check.FAILED, their failures above it)
        raise ValueError(f"--max-checkers={a.max_checkers!r}: expected comma-separated counts in [1, 16384]")
    gpu = torch.cuda.is_available() and not a.smoke
    tm.set_smoke(not gpu)
    dev = torch.device("cuda") if gpu else torch.device("cpu")
    reps = a.reps if gpu else 1
    res = {"meta": results.machine(dev), "reps": reps, "naps": naps, "max_checkers": caps, **{op: {} for op in ops}}
    x = torch.randn(70000 if gpu else 50, 7168 if gpu else 8, device=dev).to(torch.bfloat16)
    tiles = range_check.rows_tiles
    runs = [(nap, cap) for nap in naps for cap in caps]
    for nap, cap in runs:
        range_check.NAP_NS, range_check.MAX_CHECKERS = nap, cap
        key = str(nap) if len(caps) == 1 else f"{nap}/{cap}"
        for T in ((1024, 2048, 4096, 6400, 16384, 65536) if gpu else (40,)) if "plain_indices" in ops else ():
            swa = torch.randint(-1, 1000, (T, 128), dtype=torch.int32, device=dev)
            lens = torch.randint(0, 129, (T,), dtype=torch.int32, device=dev)
            topk = torch.randint(-1, 1000, (T, 1), dtype=torch.int32, device=dev)
            tlens = torch.randint(0, 2, (T,), dtype=torch.int32, device=dev)
            args = (swa, lens, topk, tlens)
            _same(lambda: kp.plain_indices(*args), lambda: kp.plain_indices_checked(None, *args),
                  f"plain_indices T {T}")
            row = _row(lambda: kp.plain_indices(*args), lambda: kp.plain_indices_checked(None, *args), reps)
            t = range_check.flat_tiles(T)
            row["checkers"] = sum(range_check.groups((t, tiles(swa), t, tiles(topk))))
            res["plain_indices"].setdefault(key, {})[T] = row
            print(f"nap {key:>4} plain_indices T {T:>6}  " + "  ".join(f"{k} {v:7.2f}" for k, v in row.items()),
                  flush=True)
        for n in ((4, 1024, 4096, 16384, 65536) if gpu else (4, 40)) if "gather_rows" in ops else ():
            rows = torch.randint(0, x.shape[0], (n,), device=dev)
            _same(lambda: kr.gather_rows(x, rows), lambda: kr.gather_rows_checked(None, x, rows), f"gather_rows n {n}")
            row = _row(lambda: kr.gather_rows(x, rows), lambda: kr.gather_rows_checked(None, x, rows), reps)
            row["checkers"] = range_check.checkers(range_check.flat_tiles(n))
            res["gather_rows"].setdefault(key, {})[n] = row
            print(f"nap {key:>4} gather_rows n {n:>6}  " + "  ".join(f"{k} {v:7.2f}" for k, v in row.items()),
                  flush=True)
        for T in (64, 1024, 4096, 8192, 16384) if gpu else (40,):
            swa = torch.randint(-1, 1000, (T, 128), dtype=torch.int32, device=dev)
            topk = torch.randint(-1, 1000, (T, 512), dtype=torch.int32, device=dev)
            tlens = torch.randint(0, 513, (T,), dtype=torch.int32, device=dev)
            indices = torch.cat([swa, topk], 1)
            lens = tlens + 128
            t = range_check.flat_tiles(T)
            calls = {"mixed_indices": (km.mixed_indices, km.mixed_indices_checked, (swa, topk, tlens),
                                       (t, tiles(swa), tiles(topk))),
                     "indices_to_csr": (kc.indices_to_csr, kc.indices_to_csr_checked, (indices, lens),
                                        (t, tiles(indices)))}
            for op, (plain, form, args, shares) in calls.items():
                if op not in ops:
                    continue
                _same(lambda: plain(*args), lambda: form(None, *args), f"{op} T {T}")  # (compiled, too)
                # the floor of any check that answers before it returns: torch reads the same index
                # values (a min of each index tensor) and brings the answer to the host
                check = lambda: bool((torch.minimum(swa.min(), topk.min()) < -1).item())  # noqa: E731
                row = _row(lambda: plain(*args), lambda: form(None, *args), reps,
                           check if op == "mixed_indices" else None)
                row["checkers"] = sum(range_check.groups(shares))
                row["ratio"] = row["form_wait"] / row["plain"]
                res[op].setdefault(key, {})[T] = row
                print(f"nap {key:>4} {op} T {T:>6}  " + "  ".join(f"{k} {v:7.2f}" for k, v in row.items()), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    results.write_json(a.out / "exp_checker_wait.json", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
