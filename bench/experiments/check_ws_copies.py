"""Copies of ``kernels/sparse_mla_gluon_ws.py`` -- files, or ``.diff`` files such as the candidates
in ``bench/experiments/candidates/`` -- checked against the fp32 reference before anyone times
them, beside the kernel itself::

    . bench/gpu_env.sh && python3 bench/experiments/check_ws_copies.py --out $OUT bench/experiments/candidates/*.diff

The calls are the corners a schedule change breaks first, which ``bench_flashmla.py``'s random
cells rarely reach: every pattern of ``moving_max_case`` (the running max jumping at every tile,
falling, moving by a pair's first or second tile, per row differently; tokens with nothing to
read, PAD runs, short lengths), H 64 and 128, K 200 / 640 / 1152, with and without a sink, and
T 96 and 600 (one item per program, and several: a persistent program's hand-over from one item
to the next), each through both gather widths. Outputs are allocated NaN-poisoned, so an
unwritten one shows. First each copy makes one call per width in a process of its own, watched
(``--hang-seconds``): a copy whose barriers deadlock costs that long and is left out, named,
instead of taking the whole GPU command's time (a kernel that never ends holds its context).
Every later call is watched the same way; one that never finishes stops the run there (exit 3),
with the rows so far and the call named in the JSON. Writes ``check_ws_copies.json`` under
``--out`` (each copy's probe verdict; one row per copy, call and width: the mismatch or null, the
output's relative error) and ``passed_variants.txt``
(``--variant LABEL=FILE`` for each copy that passed every check: ``bench_flashmla.py``'s
arguments); prints a line per copy; exit 1 when a copy fails, 2 on a machine without a CUDA GPU.
A ``.diff`` the kernel has moved away from is refused, naming its hunk, before the GPU is asked
for.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

from lib import patch, results  # noqa: E402
from lib.results import log  # noqa: E402
from lib.sparse_mla import REF, check, load_module_copy  # noqa: E402

from swa_backends.testing.conformance import (MOVING_MAX_PATTERNS, poisoned_allocations,  # noqa: E402
                                            sparse_mla_moving_max_case)

KERNEL = Path(__file__).resolve().parents[2] / "kernels" / "sparse_mla_gluon_ws.py"
PROBE = ("grow", 128, 640, 600, True)  # several items per program: the hand-over from one item to the next
HANG_SECONDS = 60.0
DEADLOCKED = 3  # --probe's exit status when a call never finished
CALLS = [(pattern, H, K, T, sink) for pattern in MOVING_MAX_PATTERNS for H in (64, 128) for K in (200, 640, 1152)
         for T in (96, 600) for sink in (False, True)]


def check_copies(mods: dict, calls=CALLS, dev="cuda", settled=None, rows=None) -> dict:
    """``{label: rows}`` (filled into ``rows`` as it goes, when given), one row per call and gather
    width: ``mismatch`` (None: it matched) and ``rel`` (the output's relative error); the reference
    computed once per call. ``mods``: modules with the kernel module's ``sparse_mla`` and
    ``wide_gathers``. ``settled(label, call, wide)``: waits for each call's GPU work (default: a
    synchronize on CUDA)."""
    rows = {} if rows is None else rows
    rows.update({label: [] for label in mods})
    saved = {label: mod.wide_gathers for label, mod in mods.items()}
    try:
        for pattern, H, K, T, sink in calls:
            args, kw = sparse_mla_moving_max_case(pattern, dev, T=T, H=H, K=K, sink=sink, seed=H + K + T)
            want = REF(*args, **kw)
            for label, mod in mods.items():
                for wide in (False, True):
                    mod.wide_gathers = lambda kv, w=wide: w
                    with poisoned_allocations(ints=False):
                        got = mod.sparse_mla(*args, **kw)
                    if settled is not None:
                        settled(label, (pattern, H, K, T, sink), wide)
                    elif torch.device(dev).type == "cuda":
                        torch.cuda.synchronize()
                    why, rel = check(got, *args, kw.get("sink"), want=want)
                    rows[label].append({"pattern": pattern, "H": H, "K": K, "T": T, "sink": sink, "wide": wide,
                                        "mismatch": why, "rel": rel})
    finally:
        for label, mod in mods.items():
            mod.wide_gathers = saved[label]
    return rows


def finishes(fn, seconds: float) -> bool:
    """Whether the GPU work ``fn`` launches completes within ``seconds`` of its return (compiles
    happen before it returns). Polled, not synchronised: a copy whose barriers deadlock never
    returns from a synchronize, and would take the whole command's time with it."""
    fn()
    return finished(seconds)


def finished(seconds: float) -> bool:
    """Whether the GPU work queued so far completes within ``seconds`` (polled)."""
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + seconds
    while not done.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def probe(path: Path, seconds: float) -> int:
    """``--probe``: the copy in ``path`` makes :data:`PROBE`'s call once per gather width, watched;
    0 when both finish, :data:`DEADLOCKED` (by ``os._exit``: the context holds a kernel that never
    ends) when one does not."""
    mod = load_module_copy(f"_probe_{path.stem}", path)
    pattern, H, K, T, sink = PROBE
    args, kw = sparse_mla_moving_max_case(pattern, "cuda", T=T, H=H, K=K, sink=sink)
    for wide in (False, True):
        mod.wide_gathers = lambda kv, w=wide: w
        if not finishes(lambda: mod.sparse_mla(*args, **kw), seconds):
            stop_deadlocked(f"{path.stem} (wide={wide}) did not finish in {seconds} s: deadlocked")
    return 0


def stop_deadlocked(why: str) -> None:
    """Say ``why`` and exit :data:`DEADLOCKED` at once: with a kernel that never ends in its
    context, the process cannot synchronise, free or exit normally."""
    log(f"check_ws_copies: {why}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(DEADLOCKED)


def probe_apart(path: Path, seconds: float) -> str:
    """``ok``, ``deadlocked`` or why it failed: :func:`probe` of ``path`` in a process of its own,
    so that a deadlocked copy costs ``seconds`` and leaves this process's GPU context alone."""
    run = subprocess.run([sys.executable, __file__, "--probe", str(path), "--hang-seconds", str(seconds)],
                         capture_output=True, text=True)
    if run.returncode == 0:
        return "ok"
    if run.returncode == DEADLOCKED:
        return "deadlocked"
    tail = (run.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
    return f"failed (exit {run.returncode}): {tail}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--hang-seconds", type=float, default=HANG_SECONDS,
                   help="a copy whose first calls take longer than this on the GPU is taken for deadlocked")
    p.add_argument("--probe", type=Path, metavar="FILE", help=argparse.SUPPRESS)  # probe_apart's child
    p.add_argument("copies", nargs="*", type=Path, metavar="FILE",
                   help="a copy of kernels/sparse_mla_gluon_ws.py, or a .diff of it")
    args = p.parse_args(argv)
    if args.probe is not None:
        return probe(args.probe, args.hang_seconds)
    if args.out is None or not args.copies:
        raise ValueError(f"--out {args.out} and copies {[str(c) for c in args.copies]}; expected --out DIR and at "
                         f"least one FILE")
    labels = {}
    for f in args.copies:
        if (not f.is_file() or f.suffix not in (".py", ".diff") or f.stem in labels or not f.stem.isidentifier()
                or f.stem == "kernel"):
            raise ValueError(f"copies: {str(f)!r}; expected an existing .py or .diff file whose name (less its "
                             f"suffix) is an identifier other than 'kernel', not given before")
        if f.suffix == ".diff":
            patch.patched(f)  # refused now, naming its hunk, when the kernel has moved on
        labels[f.stem] = f
    if not torch.cuda.is_available():
        log("check_ws_copies: needs a CUDA GPU")
        return 2
    from swa_backends.kernels import sparse_mla_gluon_ws

    args.out.mkdir(parents=True, exist_ok=True)
    result = {**results.machine(torch.device("cuda")), "command": results.command_line(),
              "kernel_sha": results.file_sha(KERNEL), "copies": {k: str(v) for k, v in labels.items()},
              "probe": {label: probe_apart(f, args.hang_seconds) for label, f in labels.items()}}
    for label, verdict in result["probe"].items():
        if verdict != "ok":
            log(f"{label}: {verdict}; not checked")
    mods = {"kernel": sparse_mla_gluon_ws}
    mods.update({label: load_module_copy(f"_check_{label}", f) for label, f in labels.items()
                 if result["probe"][label] == "ok"})
    result["rows"] = {}

    def settled(label, call, wide):  # a copy that passed its probe may still deadlock on another call
        if not finished(args.hang_seconds):
            result["hung"] = {"copy": label, "call": call, "wide": wide}
            results.write_json(args.out / "check_ws_copies.json", result)  # the rows so far
            stop_deadlocked(f"{label} (wide={wide}) did not finish {call} in {args.hang_seconds} s: deadlocked; "
                            f"stopped, the rows so far written")

    check_copies(mods, settled=settled, rows=result["rows"])
    passed = []
    for label, rows in result["rows"].items():
        bad = [r for r in rows if r["mismatch"]]
        if not bad and label in labels:
            passed.append(f"--variant {label}={labels[label]}")
        log(f"{label}: {len(rows) - len(bad)}/{len(rows)} checks passed, worst relative error "
            f"{max(r['rel'] for r in rows):.2e}" + "".join(f"\n  MISS {r}" for r in bad[:10]))
    results.write_json(args.out / "check_ws_copies.json", result)
    # the copies that passed every check, as bench_flashmla.py's arguments: $(cat $OUT/passed_variants.txt)
    (args.out / "passed_variants.txt").write_text(" ".join(passed) + "\n")
    return 0 if len(passed) == len(labels) else 1


if __name__ == "__main__":
    sys.exit(main())
