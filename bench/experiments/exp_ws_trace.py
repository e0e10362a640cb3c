"""Where ``gluon_ws``'s time goes inside a program: a copy of the kernel that reads its SM's clock at
the marks of each partition's work and stores the readings, per cell of a few of
``bench_flashmla.py``'s cells::

    . bench/gpu_env.sh && python3 bench/experiments/exp_ws_trace.py --out $OUT

The copy (``trace_source``) is the kernel's module with a ``_stamp`` call at each mark of ``MARKS``
(found by its line of the kernel, so that a changed kernel is refused, not traced wrongly) and a
``traced()`` entry. A stamp is ``%clock`` (the SM's 32-bit cycle counter) stored by the partition's
threads into a trace buffer that travels as the sink pointer: the copy runs without a sink (its
epilogue reads no sink) and stores at most ``PROGRAMS`` programs x ``ITEMS`` items x ``PAIRS`` pairs.
Stamps are ordinary instructions in the partitions' streams: the compiler keeps them in order with the
barrier waits and stores around them but may move arithmetic across them, so a phase's cycles are
good to tens of cycles; the copy is also timed beside the kernel (``overhead``).

Marks, per item of a consumer (``W`` 0, 1): ``start``, ``q_ready`` (Q landed), then per pair
``tile_in`` (its tile's first half landed), ``s_done`` (its Q K^T waited for), ``pv_issue`` (its first
P V issued: the softmax over), ``max_in`` (the other consumer's row max read: consumer 1 waits for it
before its softmax), ``p_in`` (the other consumer's P landed), ``pair_end``; after the pairs
``pairs_done``, ``sums_in`` (the other consumer's row sums), ``stored`` (O written). Per item of the
producer: ``start``, ``q_free`` (both consumers past the last Q K^T of the item before), ``q_issued``,
then per pair and half ``free<h>`` (the half free to refill) and ``issued<h>`` (its gathers issued).

``summarise`` turns the readings into median cycles per phase over the traced programs, items (the
first left out: compiles and cold caches) and pairs (the first and the last of an item apart from
the ones between). Writes ``exp_ws_trace.json`` (the phases per cell and the raw readings) under
``--out``; prints the phases per cell. ``--kernel FILE`` traces a copy of the kernel's module instead
(a variant's file, e.g. one ``bench_flashmla.py --variant`` times), with the same marks.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

from lib import results, timing as tm  # noqa: E402
from lib.results import log  # noqa: E402
from lib.sparse_mla import DV, D, load_module_copy, make_inputs, parse_cells, tflops  # noqa: E402

KERNEL = Path(__file__).resolve().parents[2] / "kernels" / "sparse_mla_gluon_ws.py"
PROGRAMS, ITEMS, PAIRS = 4, 8, 10  # what a trace holds: programs (SMs), items of each, pairs of each item
PARTS = ("consumer0", "consumer1", "producer")
# the cells traced by default: both head counts over both caches at K 640, T 16K
CELLS = [(64, 640, 16384, 1 << 20), (64, 640, 16384, 16384), (128, 640, 16384, 1 << 20), (128, 640, 16384, 16384)]

# (function, mark, the kernel's line it is placed at (stripped), "before" / "after", how many times that line is
# there, per pair); the slots follow from the order: per-item marks first, then per pair. A mark placed at two
# lines (one in each consumer's branch) takes one slot.
MARKS = [
    ("_consume_item", "start", "mbarrier.wait(bars.index(_QBAR), k & 1)", "before", 1, False),
    ("_consume_item", "q_ready", "mbarrier.wait(bars.index(_QBAR), k & 1)", "after", 1, False),
    ("_consume_item", "pairs_done", "# row sums: each consumer's own, added once; the slots alternate between items (an item",
     "before", 1, False),
    ("_consume_item", "sums_in", "mbarrier.wait(bars.index(_LBAR + 1 - W), k & 1)", "after", 1, False),
    ("_consume_item", "stored", "_store_chunk(c3, slot, row_ptrs, cols + 192, mask, st)", "after", 1, False),
    ("_consume_item", "tile_in", "mbarrier.wait(bars.index(_READY + OWN + FIRST), ph)", "after", 1, True),
    ("_consume_item", "s_done", "s = _wgmma_wait(0, deps=(s,))", "after", 1, True),
    ("_consume_item", "pv_issue", "acc = _wgmma(p_op, kv0, acc, is_async=True)", "before", 1, True),
    ("_consume_item", "pv_issue", "acc = _wgmma(p_op, kv3, acc, is_async=True)", "before", 1, True),
    ("_consume_item", "max_in", "mbarrier.wait(bars.index(_MBAR + 1), ph)", "after", 1, True),
    ("_consume_item", "max_in", "mbarrier.wait(bars.index(_MBAR + 0), ph)", "after", 1, True),
    ("_consume_item", "p_in", "mbarrier.wait(bars.index(_SBAR + 1), ph)", "after", 1, True),
    ("_consume_item", "p_in", "mbarrier.wait(bars.index(_SBAR + 0), ph)", "after", 1, True),
    ("_consume_item", "pair_end", "m_i = m_b", "after", 2, True),
    ("_produce_item", "start", "HI: gl.constexpr = HALF - LO", "after", 1, False),
    ("_produce_item", "q_free", "mbarrier.wait(bars.index(_QFREE), (k & 1) ^ 1)", "after", 1, False),
    ("_produce_item", "q_issued", "_cp_arrive(bars.index(_QBAR), increment_count=False)", "after", 1, False),
] + [("_produce_item", f"{what}{h}", line.format(h=h), "after", 1, True)
     for h in (0, 3, 1, 2)
     for what, line in (("free", "mbarrier.wait(bars.index(_FREE + {h}), ph ^ 1)"),
                        ("issued", "_cp_arrive(bars.index(_READY + {h}), increment_count=False)"))]


def slots(function: str) -> tuple[list[str], list[str]]:
    """``(per-item marks, per-pair marks)`` of ``function`` in slot order."""
    item, pair = [], []
    for fn, name, _line, _where, _n, per_pair in MARKS:
        if fn == function:
            names = pair if per_pair else item
            if name not in names:
                names.append(name)
    return item, pair


def _layout() -> dict:
    """``{function: (per-item marks, per-pair marks, slots a trace item holds)}``; one slot count for every part."""
    out = {fn: slots(fn) for fn in ("_consume_item", "_produce_item")}
    width = max(len(i) + PAIRS * len(p) for i, p in out.values())
    return {fn: (i, p, width) for fn, (i, p) in out.items()}


_STAMP = '''

TRACE_PROGRAMS = gl.constexpr({programs})
TRACE_ITEMS = gl.constexpr({items})
TRACE_SLOTS = gl.constexpr({width})


@gluon.jit
def _stamp(TRACE, part, k, slot):
    """The SM's clock into ``TRACE[program, part, item k, slot]`` (float32 bits), for the traced
    programs and items."""
    t = gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r,r", [k], dtype=gl.int32, is_pure=False, pack=1)
    pid = gl.program_id(0)
    ok = (pid < TRACE_PROGRAMS) & (k < TRACE_ITEMS) & (slot < TRACE_SLOTS)
    at = ((pid * 3 + part) * TRACE_ITEMS + k) * TRACE_SLOTS + slot
    gl.store(TRACE + at, t.to(gl.float32, bitcast=True), mask=ok)

'''

_ENTRY = '''

def traced(q, kv, indices, lens, sm_scale, d_v, trace):
    """``(out, lse)`` without a sink, the stamps into ``trace`` (float32, PROGRAMS x 3 x ITEMS x SLOTS)."""
    return _shared.run("gluon_ws_trace", _sparse_mla_gluon_ws_fwd, _meta(False, wide_gathers(kv)), True, q, kv,
                       indices, lens, sm_scale, d_v, trace, _BUILT)
'''


def _function_span(text: str, name: str) -> tuple[int, int]:
    """Start and end offsets of top-level function ``name`` (its decorator line included)."""
    m = re.search(rf"^@gluon\.jit\ndef {name}\(", text, re.M)
    if m is None:
        raise ValueError(f"trace_source: found no function {name}; expected one")
    nxt = re.compile(r"^(@|def |class |[A-Za-z_#])", re.M).search(text, m.end())
    return m.start(), (nxt.start() if nxt else len(text))


def trace_source(text: str) -> str:
    """``text`` (the ws kernel's module) with the stamps of ``MARKS`` and the ``traced`` entry.
    ValueError when a mark's line is not there as often as ``MARKS`` says."""
    layout = _layout()
    for function, (item, pair, width) in layout.items():
        start, end = _function_span(text, function)
        body = text[start:end]
        part = "W" if function == "_consume_item" else "2"
        for fn, name, line, where, count, per_pair in MARKS:
            if fn != function:
                continue
            pattern = re.compile(rf"^(?P<indent>[ \t]+){re.escape(line)}[ \t]*\n", re.M)
            found = list(pattern.finditer(body))
            if len(found) != count:
                raise ValueError(f"trace_source: found {len(found)} lines {line!r} in {function}; expected {count}")
            slot = f"{len(item)} + j * {len(pair)} + {pair.index(name)}" if per_pair else str(item.index(name))
            for m in reversed(found):
                stamp = f"{m['indent']}_stamp(SINK, {part}, k, {slot})  # {name}\n"
                at = m.start() if where == "before" else m.end()
                body = body[:at] + stamp + body[at:]
        text = text[:start] + body + text[end:]
    width = max(w for _i, _p, w in layout.values())
    head, sep, rest = text.partition("\n\n@gluon.jit\ndef _pairs(")
    if not sep:
        raise ValueError("trace_source: found no _pairs function to place the stamp before; expected one")
    text = head + _STAMP.format(programs=PROGRAMS, items=ITEMS, width=width) + sep[2:] + rest
    # the stamps need SINK in _produce_item, which the kernel does not pass there
    for old, new in (("def _produce_item(Q, KV, IDX, H,", "def _produce_item(Q, KV, IDX, SINK, H,"),
                     ("_produce_item(Q, KV, IDX, H, t,", "_produce_item(Q, KV, IDX, SINK, H, t,")):
        n = text.count(old)
        if n != (1 if old.startswith("def") else 2):
            raise ValueError(f"trace_source: found {n} of {old!r}; expected {1 if old.startswith('def') else 2}")
        text = text.replace(old, new)
    return text + _ENTRY


def readings(trace: torch.Tensor) -> np.ndarray:
    """The trace buffer as int64 cycles ``[PROGRAMS, 3, ITEMS, SLOTS]``, each program's readings
    counted from its first (the 32-bit clock unwrapped), -1 where nothing was stored."""
    signed = trace.view(torch.int32).cpu().numpy().astype(np.int64)
    stored = signed != -1
    clock = signed & 0xFFFFFFFF
    out = np.full(signed.shape, -1, dtype=np.int64)
    for p in range(signed.shape[0]):
        got = clock[p][stored[p]]
        if got.size:  # a program's readings span far less than half the clock's period: a wrap shows as a gap
            first = got.min() if got.max() - got.min() < 2**31 else got[got >= 2**31].min()
            out[p][stored[p]] = (got - first) % 2**32
    return out


def summarise(cycles: np.ndarray, n_pairs: int) -> dict:
    """Median cycles per phase (see the module docstring) over programs, items after the first and
    pairs, from ``readings``' array; pairs split into ``first``, ``middle`` and ``last`` of an item."""
    layout = _layout()
    ci, cp, _ = layout["_consume_item"]
    pi, pp, _ = layout["_produce_item"]
    traced_pairs = min(n_pairs, PAIRS)

    def at(part, k, slot):
        return cycles[:, part, k, slot]

    def pair_slot(item_marks, pair_marks, j, name):
        return len(item_marks) + j * len(pair_marks) + pair_marks.index(name)

    phases: dict = {}

    def add(key, values):
        phases.setdefault(key, []).extend(v for v in values if v >= 0)

    for k in range(1, ITEMS):
        for w in (0, 1):
            c = f"consumer{w}"
            s = {n: at(w, k, ci.index(n)) for n in ci}
            add(f"{c}/q_wait", s["q_ready"] - s["start"])
            add(f"{c}/epilogue", s["stored"] - s["pairs_done"])
            add(f"{c}/sums_wait", s["sums_in"] - s["pairs_done"])
            if k + 1 < ITEMS:
                add(f"{c}/item", at(w, k + 1, ci.index("start")) - s["start"])
            prev_end = s["q_ready"]
            for j in range(traced_pairs):
                where = "first" if j == 0 else "last" if j == n_pairs - 1 else "middle"
                p = {n: at(w, k, pair_slot(ci, cp, j, n)) for n in cp}
                add(f"{c}/{where}/tile_wait", p["tile_in"] - prev_end)
                add(f"{c}/{where}/qk", p["s_done"] - p["tile_in"])
                if w == 0:
                    add(f"{c}/{where}/softmax", p["pv_issue"] - p["s_done"])
                    add(f"{c}/{where}/max_wait", p["max_in"] - p["pv_issue"])
                    add(f"{c}/{where}/p_wait", p["p_in"] - p["max_in"])
                else:
                    add(f"{c}/{where}/max_wait", p["max_in"] - p["s_done"])
                    add(f"{c}/{where}/softmax", p["pv_issue"] - p["max_in"])
                    add(f"{c}/{where}/p_wait", p["p_in"] - p["pv_issue"])
                add(f"{c}/{where}/pv_tail", p["pair_end"] - p["p_in"])
                add(f"{c}/{where}/pair", p["pair_end"] - prev_end)
                prev_end = p["pair_end"]
        s = {n: at(2, k, pi.index(n)) for n in pi}
        add("producer/q_free_wait", s["q_free"] - s["start"])
        add("producer/q_issue", s["q_issued"] - s["q_free"])
        prev = s["q_issued"]
        for j in range(traced_pairs):
            p = {n: at(2, k, pair_slot(pi, pp, j, n)) for n in pp}
            for h in (0, 3, 1, 2):
                add(f"producer/free_wait{h}", p[f"free{h}"] - prev)
                add(f"producer/issue{h}", p[f"issued{h}"] - p[f"free{h}"])
                prev = p[f"issued{h}"]
    return {key: {"median": float(np.median(v)), "n": len(v)} for key, v in sorted(phases.items()) if v}


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it (no machine's path in a kept result)."""
    root = KERNEL.parents[1]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return path.name


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=5, help="interleaved rounds of the overhead timing per cell")
    p.add_argument("--cells", type=parse_cells, default=None, metavar="H:K:T:ROWS,...",
                   help="these cells instead of the four default ones")
    p.add_argument("--kernel", type=Path, default=KERNEL,
                   help="a copy of kernels/sparse_mla_gluon_ws.py to trace instead (e.g. a variant's file); the "
                        "overhead is timed against the kernel as it is")
    args = p.parse_args(argv)
    if not args.kernel.is_file():
        raise ValueError(f"--kernel: {str(args.kernel)!r} is not a file; expected a copy of {KERNEL.name}")
    source = trace_source(args.kernel.read_text())  # refused here, before the GPU, if its marks are not there
    if not torch.cuda.is_available():
        raise SystemExit("exp_ws_trace: needs a CUDA GPU")
    from swa_backends.kernels import sparse_mla_gluon_ws

    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    scale = 1.0 / D ** 0.5
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ws_trace.py"
        path.write_text(source)
        mod = load_module_copy("_exp_ws_trace", path)
    width = max(w for _i, _p, w in _layout().values())
    result = {**results.machine(dev), "reps": args.reps, "command": results.command_line(),
              "kernel_sha": results.file_sha(KERNEL), "traced": _shown(args.kernel),
              "traced_sha": results.file_sha(args.kernel), "programs": PROGRAMS, "items": ITEMS, "pairs": PAIRS,
              "layout": {fn: {"item": i, "pair": pr} for fn, (i, pr, _w) in _layout().items()}, "cells": []}
    kvs = {}
    for H, K, T, S in args.cells or CELLS:
        kv = kvs.setdefault(S, torch.randn(S, D, device=dev).to(torch.bfloat16))
        q, idx, lens, _sink = make_inputs(T, H, K, D, kv=kv, seed=H * K + T)
        lens = torch.full_like(lens, K)  # every item the same length: its pairs line up across items
        trace = torch.empty(PROGRAMS * 3 * ITEMS * width, dtype=torch.float32, device=dev)
        fns = {"gluon_ws": lambda: sparse_mla_gluon_ws.sparse_mla(q, kv, idx, lens, scale, DV),
               "traced": lambda: mod.traced(q, kv, idx, lens, scale, DV, trace)}
        for fn in fns.values():
            fn()  # compiled and warm
        torch.cuda.synchronize()
        ms = tm.interleaved_ms(fns, args.reps)
        trace.view(torch.int32).fill_(-1)
        mod.traced(q, kv, idx, lens, scale, DV, trace)
        torch.cuda.synchronize()
        cycles = readings(trace.view(PROGRAMS, 3, ITEMS, width))
        n_pairs = -(-K // 128)
        row = {"H": H, "K": K, "T": T, "S": S, "ms": ms,
               "tflops": {n: tflops(T, H, K, D, DV, v) for n, v in ms.items()},
               "overhead": ms["traced"] / ms["gluon_ws"], "phases": summarise(cycles, n_pairs),
               "cycles": cycles.tolist()}
        result["cells"].append(row)
        log(f"H {H:>3} K {K:>4} T {T:>5} S {S:>7}: gluon_ws {row['tflops']['gluon_ws']:.1f} TFLOP/s, traced copy "
            f"{row['overhead']:.3f}x its time")
        for key, v in row["phases"].items():
            log(f"  {key:<32} {v['median']:8.0f} cycles (n {v['n']})")
    results.write_json(args.out / "exp_ws_trace.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
