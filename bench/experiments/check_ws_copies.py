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
unwritten one shows. First each copy makes one call per width under a watch (``--hang-seconds``):
a copy whose barriers deadlock ends the run there, named in the JSON, exit 3, instead of taking
the whole GPU command's time. Writes ``check_ws_copies.json`` under ``--out`` (one row per copy,
call and width: the mismatch or null, the output's relative error) and ``passed_variants.txt``
(``--variant LABEL=FILE`` for each copy that passed every check: ``bench_flashmla.py``'s
arguments); prints a line per copy; exit 1 when any check fails, 2 on a machine without a CUDA
GPU. A ``.diff`` the kernel has moved away from is refused, naming its hunk, before the GPU is
asked for.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

from lib import patch, results  # noqa: E402
from lib.results import log  # noqa: E402
from lib.sparse_mla import REF, check, load_module_copy  # noqa: E402

from swa_backends.testing.conformance import MOVING_MAX_PATTERNS, sparse_mla_moving_max_case  # noqa: E402

KERNEL = Path(__file__).resolve().parents[2] / "kernels" / "sparse_mla_gluon_ws.py"
PROBE = ("grow", 128, 640, 600, True)  # several items per program: the hand-over from one item to the next
HANG_SECONDS = 60.0
CALLS = [(pattern, H, K, T, sink) for pattern in MOVING_MAX_PATTERNS for H in (64, 128) for K in (200, 640, 1152)
         for T in (96, 600) for sink in (False, True)]


def poisoned(fn):
    """``fn()`` with every floating ``torch.empty`` it allocates filled with NaN."""
    real = torch.empty

    def empty(*a, **k):
        t = real(*a, **k)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = empty
    try:
        return fn()
    finally:
        torch.empty = real


def check_copies(mods: dict, calls=CALLS, dev="cuda") -> dict:
    """``{label: rows}``, one row per call and gather width: ``mismatch`` (None: it matched) and
    ``rel`` (the output's relative error); the reference computed once per call. ``mods``: modules
    with the kernel module's ``sparse_mla`` and ``wide_gathers``."""
    rows = {label: [] for label in mods}
    saved = {label: mod.wide_gathers for label, mod in mods.items()}
    try:
        for pattern, H, K, T, sink in calls:
            args, kw = sparse_mla_moving_max_case(pattern, dev, T=T, H=H, K=K, sink=sink, seed=H + K + T)
            want = REF(*args, **kw)
            for label, mod in mods.items():
                for wide in (False, True):
                    mod.wide_gathers = lambda kv, w=wide: w
                    got = poisoned(lambda: mod.sparse_mla(*args, **kw))
                    if torch.device(dev).type == "cuda":
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
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + seconds
    while not done.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hang-seconds", type=float, default=HANG_SECONDS,
                   help="a copy whose first calls take longer than this on the GPU is taken for deadlocked")
    p.add_argument("copies", nargs="+", type=Path, metavar="FILE",
                   help="a copy of kernels/sparse_mla_gluon_ws.py, or a .diff of it")
    args = p.parse_args(argv)
    labels = {}
    for f in args.copies:
        if not f.is_file() or f.stem in labels or not f.stem.isidentifier() or f.stem == "kernel":
            raise ValueError(f"copies: {str(f)!r}; expected an existing file whose name (less its suffix) is an "
                             f"identifier other than 'kernel', not given before")
        if f.suffix == ".diff":
            patch.patched(f)  # refused now, naming its hunk, when the kernel has moved on
        labels[f.stem] = f
    if not torch.cuda.is_available():
        log("check_ws_copies: needs a CUDA GPU")
        return 2
    from swa_backends.kernels import sparse_mla_gluon_ws

    args.out.mkdir(parents=True, exist_ok=True)
    mods = {"kernel": sparse_mla_gluon_ws}
    mods.update({label: load_module_copy(f"_check_{label}", f) for label, f in labels.items()})
    result = {**results.machine(torch.device("cuda")), "command": results.command_line(),
              "kernel_sha": results.file_sha(KERNEL), "copies": {k: str(v) for k, v in labels.items()}}
    # first one call per copy and width, watched: a deadlocked copy ends the run here, named, with what
    # is known written (the process must exit: its context holds a kernel that never ends)
    pattern, H, K, T, sink = PROBE
    args_, kw = sparse_mla_moving_max_case(pattern, "cuda", T=T, H=H, K=K, sink=sink)
    for label, mod in mods.items():
        saved = mod.wide_gathers
        for wide in (False, True):
            mod.wide_gathers = lambda kv, w=wide: w
            if not finishes(lambda: mod.sparse_mla(*args_, **kw), args.hang_seconds):
                result["hung"] = {"copy": label, "wide": wide, "call": PROBE}
                results.write_json(args.out / "check_ws_copies.json", result)
                log(f"check_ws_copies: {label} (wide={wide}) did not finish in {args.hang_seconds} s: deadlocked")
                os._exit(3)
        mod.wide_gathers = saved
    failed = 0
    result["rows"] = check_copies(mods)
    passed = []
    for label, rows in result["rows"].items():
        bad = [r for r in rows if r["mismatch"]]
        failed += len(bad)
        if not bad and label in labels:
            passed.append(f"--variant {label}={labels[label]}")
        log(f"{label}: {len(rows) - len(bad)}/{len(rows)} checks passed, worst relative error "
            f"{max(r['rel'] for r in rows):.2e}" + "".join(f"\n  MISS {r}" for r in bad[:10]))
    results.write_json(args.out / "check_ws_copies.json", result)
    # the copies that passed, as bench_flashmla.py's arguments: $(cat $OUT/passed_variants.txt)
    (args.out / "passed_variants.txt").write_text(" ".join(passed) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
