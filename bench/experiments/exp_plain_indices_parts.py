#!/usr/bin/env python
"""Where a validated ``plain_indices`` call's host time goes, and two changes of its checked kernel
(issue 38: the validated call's host time at most 2x the unvalidated one's)::

    . bench/gpu_env.sh && python3 bench/experiments/exp_plain_indices_parts.py --out $OUT
    python bench/experiments/exp_plain_indices_parts.py --out /tmp/pp --smoke      # CPU wiring, one round

On ``bench_validation.py``'s step (T 6388 tokens of 128-wide window rows and a one-wide top-k), host
µs per call with the device idle before it (``lib.timing.one_call_us``, median of ``--reps``
rounds, every path once per round):

* the op through ``select(device)``: ``off`` (validation off) and ``on`` (validated, as it comes);
* the validated call's parts: ``quick`` (the op's quick check), ``open`` (``range_check.open_checked``),
  ``alloc`` (the two result tensors), ``plain_launch`` / ``checked_launch`` (the kernel's launcher
  with the results given, unvalidated / checked: the checked one with ``open``);
* per copy of ``kernels/plain_indices.py`` (``COPIES``; outputs compared with the pack's first):
  ``<copy>:plain`` (the unvalidated op) and ``<copy>:form_wait`` (the checked form and the wait for
  its verdict). ``base`` is the file as it is; ``wait_first``: a worker waits for the gate before it
  loads its tile (the checkers alone read memory until the verdict); ``wide``: 256-column tiles
  (``BLOCK_W``; one column tile for this step's 129 columns, half the workers); ``wide_wait`` both;
  ``checkers_only``: the checked launch of the checker programs alone, no worker (its output is
  not the op's, not compared: the wait for the checks with nothing else on the device).
  ``settle_before``: the file as it is over ``--range-check-before`` (a copy of
  ``kernels/range_check.py``, e.g. ``git show <rev>:kernels/range_check.py``: the checker programs'
  code before a change, in the same rounds). ``--copies`` picks some. ``--before FILE`` adds
  ``before``: ``FILE`` as it is, a copy of ``kernels/plain_indices.py`` of another revision (``git
  show <rev>:kernels/plain_indices.py``; the GPU machine's copy of the checkout has no history, so
  it travels in an ignored folder named in ``carry``), timed in the same rounds.

Then ``stamps``: copies of ``base`` and ``checkers_only`` whose programs note the device's
``%globaltimer`` (ns) -- a checker as it starts, when its values are tested and when it has settled;
a worker as it starts -- over ``--reps`` calls, each on an idle device, with the host's
``time.perf_counter_ns()`` around the call and the read of its verdict (``host``). Per call
(medians): the checkers' start to their last test (``check``), that to the last settle (``settle``),
the spread of the checkers' starts, one checker's test, and the workers' first and last starts after
the checkers' first. (The device's timer does not run on the host's clock: 3027bdf's run wrote the
two clocks' differences too, ``host_to_start`` and ``settle_to_host``, and they were meaningless.)

Writes ``exp_plain_indices_parts.json``.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lib import smoke  # noqa: E402

smoke.use_interpreter()  # before anything imports Triton

import torch  # noqa: E402

import swa_backends as sb  # noqa: E402
from lib import results, timing as tm  # noqa: E402
from lib.sparse_mla import load_module_copy  # noqa: E402
from lib.steps import validation_cases  # noqa: E402
from swa_backends.common.ops import OPS  # noqa: E402
from swa_backends.kernels import plain_indices as kp  # noqa: E402
from swa_backends.kernels import range_check  # noqa: E402

KERNEL = Path(kp.__file__)
_LATE_WAIT = ("    ok = True\n    if GATED:\n        ok = passed(scratch_ptr, epoch, GATE, NAP)\n    if ok:\n",
              "    if ok:\n")
_EARLY_WAIT = ("    t = tt * BLOCK_T + tl.arange(0, BLOCK_T)\n",
               "    ok = True\n    if GATED:\n        ok = passed(scratch_ptr, epoch, GATE, NAP)\n"
               "    t = tt * BLOCK_T + tl.arange(0, BLOCK_T)\n")
_WIDE = ("BLOCK_W = 128\n", "BLOCK_W = 256\n")
_NO_WORKERS = ("(P + t_tiles * w_tiles, 1, 1)", "(P, 1, 1)")
#: copy name -> the edits made to the kernel file (each found exactly once)
COPIES = {"base": (), "wait_first": (_LATE_WAIT, _EARLY_WAIT), "wide": (_WIDE,),
          "wide_wait": (_WIDE, _LATE_WAIT, _EARLY_WAIT), "checkers_only": (_NO_WORKERS,)}
_BEFORE = ("from .range_check import", "from .range_check_before import")
COPIES["settle_before"] = (_BEFORE,)
#: copies whose output is not the op's
UNCHECKED = {"checkers_only"}
_STAMP_FN = ("BLOCK_W = 128\n", "BLOCK_W = 128\nSTAMPS = {}\n\n\n@triton.jit\ndef _stamp(x):\n"
             "    return tl.inline_asm_elementwise(\"mov.u64 $0, %globaltimer;\", \"=l,r\", [x], dtype=tl.int64,"
             " is_pure=False, pack=1)\n")
_STAMP_EDITS = (
    _STAMP_FN,
    ("def _plain_indices_checked(swa_ptr,", "def _plain_indices_checked(dbg_ptr, swa_ptr,"),
    ("    if pid < P:\n        bad = pid * 0\n", "    if pid < P:\n        tl.store(dbg_ptr + pid * 4, _stamp(pid))\n"
                                                "        bad = pid * 0\n"),
    ("        settle(bad, P, flag_ptr, scratch_ptr, epoch, GATE)\n",
     "        tl.store(dbg_ptr + pid * 4 + 1, _stamp(pid))\n        settle(bad, P, flag_ptr, scratch_ptr, epoch, GATE)\n"
     "        tl.store(dbg_ptr + pid * 4 + 2, _stamp(pid))\n"),
    ("        w = pid - P\n", "        tl.store(dbg_ptr + pid * 4, _stamp(pid))\n        w = pid - P\n"),
    ("    _K_CHECKED((has_topk, nap), (P + t_tiles * w_tiles, 1, 1), swa_indices,",
     "    STAMPS[\"P\"], STAMPS[\"n\"] = P, P + t_tiles * w_tiles\n"
     "    _K_CHECKED((has_topk, nap), (P + t_tiles * w_tiles, 1, 1), STAMPS[\"buf\"], swa_indices,"),
)
#: stamped copies: name -> the edits (the stamps' after the copy's own)
STAMPED = {"base": _STAMP_EDITS, "checkers_only": _STAMP_EDITS + (_NO_WORKERS,),
           "settle_before": _STAMP_EDITS + (_BEFORE,)}


def _checked(m):
    """A copy's self-checked form, called as dispatch calls it on this device's host path (``home``
    None); a copy from before the forms took ``home`` (``--before``) as it was called then."""
    form = m.plain_indices_checked
    if next(iter(inspect.signature(form).parameters)) == "home":
        return functools.partial(form, None)
    return form


def copy_source(text: str, edits) -> str:
    """``text`` with each ``(old, new)`` made; ValueError when ``old`` is not found exactly once."""
    for old, new in edits:
        if text.count(old) != 1:
            raise ValueError(f"copy_source: {old!r} found {text.count(old)} times in {KERNEL.name}; expected once")
        text = text.replace(old, new)
    return text


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def stamps(m, args, kwargs, dev, reps: int) -> dict:
    """Median µs per call of a stamped copy ``m`` (see the module docstring)."""
    m.STAMPS["buf"] = torch.zeros(4 * 16384, dtype=torch.int64, device=dev)
    rows = []
    for _ in range(reps):
        m.STAMPS["buf"].zero_()
        torch.cuda.synchronize()
        h0 = time.perf_counter_ns()
        done = m.plain_indices_checked(None, *args, **kwargs)
        failed = done[1].failed()
        h1 = time.perf_counter_ns()
        assert not failed
        torch.cuda.synchronize()
        P, n = m.STAMPS["P"], m.STAMPS["n"]
        d = m.STAMPS["buf"][: 4 * n].view(n, 4).cpu().double()
        c0, c1, c2 = d[:P, 0].min().item(), d[:P, 1].max().item(), d[:P, 2].max().item()
        row = {"check": c1 - c0, "settle": c2 - c1, "checkers_started": d[:P, 0].max().item() - c0,
               "one_check": (d[:P, 1] - d[:P, 0]).median().item(), "host": h1 - h0}
        if n > P and d[P:n, 0].min().item() > 0:  # (checkers_only launches no worker)
            row["workers_first"] = d[P:, 0].min().item() - c0
            row["workers_last"] = d[P:, 0].max().item() - c0
        rows.append(row)
    return {k: statistics.median(r[k] for r in rows) / 1e3 for k in rows[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--copies", default="base,wait_first,wide,wide_wait,checkers_only",
                   help="comma-separated names of COPIES")
    p.add_argument("--range-check-before", type=Path, help="a copy of kernels/range_check.py (settle_before)")
    p.add_argument("--before", type=Path, help="a copy of kernels/plain_indices.py of another revision (before)")
    p.add_argument("--smoke", action="store_true", help="one round on the CPU (checks the script)")
    a = p.parse_args(argv)
    gpu = torch.cuda.is_available() and not a.smoke
    tm.set_smoke(not gpu)
    dev = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    args, kwargs = next((x, k) for op, x, k in validation_cases(dev, smoke=not gpu) if op == "plain_indices")
    be = sb.select(str(dev) if gpu else "cpu", prefer=None if gpu else "triton")

    text = KERNEL.read_text()
    folder = Path(tempfile.mkdtemp(prefix="plain_copies_"))
    mods = {}
    names = a.copies.split(",")
    if "base" not in names or not set(names) <= set(COPIES):
        raise ValueError(f"--copies={a.copies!r}: expected names of {sorted(COPIES)}, base among them")
    if ("settle_before" in names) != (a.range_check_before is not None):
        raise ValueError("--range-check-before: expected exactly when --copies names settle_before")
    if a.range_check_before is not None:
        load_module_copy("range_check_before", a.range_check_before)
    for name in names:
        edits = COPIES[name]
        path = folder / f"plain_indices_{name}.py"
        path.write_text(copy_source(text, edits))
        mods[name] = load_module_copy(f"plain_indices_{name}", path)
    if a.before is not None:
        mods["before"] = load_module_copy("plain_indices_before", a.before)
    want = kp.plain_indices(*args, **kwargs)
    for name, m in mods.items():
        out, verdict = _checked(m)(*args, **kwargs)
        assert not verdict.failed(), f"{name}: the checked form failed a valid call"
        if name in UNCHECKED:
            continue
        for got in (m.plain_indices(*args, **kwargs), out):
            assert all(torch.equal(g, w) for g, w in zip(got, want)), f"{name}: not the pack's result"

    quick = OPS["plain_indices"].quick_check
    T, W = want[0].shape
    given = (torch.empty_like(want[0]), torch.empty_like(want[1]))
    topk_offset, window_offset = kwargs.get("topk_offset", 0), kwargs.get("window_offset", 0)
    launch_args = (*args, topk_offset, window_offset, given)
    facts = quick(*args, **kwargs)  # (the sizes and strides the launch takes, as the form reads them)

    def opened():
        v = range_check.open_checked(dev)
        v[0].unread = False
        return v

    def waited(form):
        def go():
            assert not form(*args, **kwargs)[1].failed()
        return go

    def through(on):
        def go():
            with sb.validation(on):
                be.plain_indices(*args, **kwargs)
        return go

    prepares = {
        "off": lambda: through(False), "on": lambda: through(True),
        "quick": lambda: (lambda: quick(*args, **kwargs)),
        "open": lambda: opened,
        "alloc": lambda: (lambda: (torch.empty(T, W, dtype=torch.int32, device=dev),
                                   torch.empty(T, dtype=torch.int32, device=dev))),
        "plain_launch": lambda: (lambda: kp._launch(*launch_args, None, *facts)),
        "checked_launch": lambda: (lambda: kp._launch(*launch_args, opened(), *facts)),
    }
    for name, m in mods.items():
        prepares[f"{name}:plain"] = (lambda m=m: (lambda: m.plain_indices(*args, **kwargs)))
        prepares[f"{name}:form_wait"] = (lambda m=m: waited(_checked(m)))
    times = tm.one_call_us(prepares, a.reps if gpu else 1)
    res = {"meta": results.machine(dev), "reps": a.reps, "T": T, "width": W, "nap_ns": range_check.NAP_NS,
           "host_us": {k: v["host"] for k, v in times.items()}, "wall_us": {k: v["wall"] for k, v in times.items()}}
    h = res["host_us"]
    res["ratio_on_off"] = h["on"] / h["off"]
    res["copies"] = {n: {"plain": h[f"{n}:plain"], "form_wait": h[f"{n}:form_wait"],
                         "form_wait/base_plain": h[f"{n}:form_wait"] / h["base:plain"]} for n in mods}
    for k, v in times.items():
        print(f"{k:>22}  host {v['host']:8.2f}  wall {v['wall']:8.2f}", flush=True)
    print(f"on / off {res['ratio_on_off']:.3f}")
    if gpu:
        res["stamps"] = {}
        for name, edits in STAMPED.items():
            if name not in names:
                continue
            path = _write(folder / f"plain_indices_stamped_{name}.py", copy_source(text, edits))
            res["stamps"][name] = stamps(load_module_copy(f"plain_indices_stamped_{name}", path), args, kwargs, dev,
                                         a.reps)
        for name, st in res["stamps"].items():
            print(f"stamps {name:>14}  " + "  ".join(f"{k} {v:8.2f}" for k, v in st.items()), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    results.write_json(a.out / "exp_plain_indices_parts.json", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
