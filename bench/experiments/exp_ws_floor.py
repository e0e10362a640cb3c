"""The floor of ``gluon_ws``'s design per cell of ``bench_flashmla.py``'s grid: the kernel timed
beside copies of itself with a part taken out, and beside FlashMLA, in the same rounds::

    . bench/gpu_env.sh && PYTHONPATH=.flashmla:$PYTHONPATH python3 bench/experiments/exp_ws_floor.py --out $OUT

``--extra LABEL=FILE`` (repeatable) times one more copy of the kernel's module beside them, unchecked like
the copies: a candidate of another design (a ``.diff`` of ``bench/experiments/candidates/``, or its file), or such a
file with a part taken out by hand.

The copies are made from ``kernels/sparse_mla_gluon_ws.py`` as it is (``variant_source``); their
outputs are meaningless and not checked (FlashMLA's and ``gluon_ws``'s are, per cell on its first tokens,
against the fp32 reference before anything of the cell is timed: a cell where either is wrong is recorded
with the reason, not timed, and the run exits 1):

* ``no_gather``: the producer loads Q but gathers no KV row (the tiles keep whatever shared memory
  held; its cp.async arrivals still complete the ready barriers at once): the consumers' math,
  their hand-overs and the epilogue -- the kernel's time if gathers cost nothing;
* ``no_math``: each consumer waits for the KV halves it would free and frees them at once, with no
  Q K^T, softmax or P V; Q, the gathers, the row-sum exchange and the epilogue stay -- the kernel's
  time if the math cost nothing;
* ``neither``: both taken out: what is left per item (Q, the barriers, the epilogue's stores);
* ``mma_only``: no gathers, and each consumer's pair is its tensor-core work alone: Q K^T over its
  tile, then its two P V (its own S as P from registers, the other P slot read as it stands), with
  no softmax and no hand-over between the consumers (each still waits for the halves it reads and
  frees the halves it frees in the kernel, so the producer's barriers run as before) -- the
  ceiling of this data flow (Q and the KV halves read by wgmma from shared memory, 64-row tiles);
* ``mma_softmax``: ``mma_only`` plus each consumer's own online softmax over its tile (the valid
  mask, row max, exp2, row sums, one rescale of its accumulator), still no hand-over: what the
  softmax's own work costs, apart from the consumers' coupling.
* ``mma_gather``, ``mma_softmax_gather``: the two above with the producer's gathers kept: the data
  flow's ceiling as it runs, its tensor-core reads of shared memory beside the gathers' writes there
  and their DRAM / L2 traffic (``mma_only`` and ``no_math`` each leave one of the two out, and a
  schedule that overlapped them perfectly is all that their slower one bounds); and the kernel
  without its hand-overs.

A schedule of this design (these gathers, this chain of math per pair) is no faster than either
part alone, so ``floor`` = the slower of ``no_gather`` and ``no_math``; ``goal`` = 1.10 x FlashMLA
(issue 38). Per cell: TFLOP/s of every path (2*T*H*K*(D_qk + d_v) / time, also for the copies),
``ws/flashmla``, ``floor/flashmla``, ``overlap`` (floor time / gluon_ws time: 1.0 is a perfect
overlap of the two parts), ``ceiling/flashmla`` (``mma_only``), ``chain`` (``mma_only`` time /
``no_gather`` time: how close the kernel's math chain comes to its data flow's ceiling) and
``softmax_cost`` (``mma_softmax`` time / ``mma_only`` time), ``data_flow/flashmla`` (``mma_gather``:
the ceiling with the gathers running) and ``no_handover/flashmla`` (``mma_softmax_gather``). Times are the median of ``--reps``
interleaved rounds (``lib.timing.interleaved_ms``, as ``bench_flashmla.py``), every path once per
round after a GPU sleep. Writes ``exp_ws_floor.json`` under ``--out``; prints a line per cell and the geometric means.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

from lib import results, timing as tm  # noqa: E402
from lib.results import log  # noqa: E402
from lib.sparse_mla import (CELLS, DV, D, check, load_module_copy, make_inputs, parse_cells, parse_copies,  # noqa: E402
                            tflops)

KERNEL = Path(__file__).resolve().parents[2] / "kernels" / "sparse_mla_gluon_ws.py"
GOAL = 1.10
# name: (drop the producer's KV gathers, the consumers' pair loop replaced by LOOPS[...] or kept: None)
COPIES = {"no_gather": (True, None), "no_math": (False, "no_math"), "neither": (True, "no_math"),
          "mma_only": (True, "mma"), "mma_softmax": (True, "mma_softmax"),
          "mma_gather": (False, "mma"), "mma_softmax_gather": (False, "mma_softmax")}

# the producer's four KV gathers of a pair (Q's two gathers read q_smem and stay)
_GATHER = re.compile(r"^[ \t]+_gather_half\(KV, kv_smem\.index\(\d\),[^\n]*\n", re.M)
# the consumer's pair loop in _consume_item, up to the row-sum exchange after it
_PAIR_LOOP = re.compile(r"(?P<indent>[ \t]+)for j in range\(n_pairs\):\n.*?(?=^[ \t]+# row sums)", re.M | re.S)
# each consumer frees the halves it frees in the kernel (0: A lo, B lo; 1: B hi, A hi), each after
# waiting for that half alone: a half is refilled only once freed, so no wait sees a phase twice.
# Q is released at the item's last pair, as in the kernel.
_NO_MATH_LOOP = """\
for j in range(n_pairs):
    ph = (done + j) & 1
    if j == n_pairs - 1:
        _barrier()
        mbarrier.arrive(bars.index(_QFREE), count=1)
    if W == 0:
        mbarrier.wait(bars.index(_READY + 0), ph)
        _barrier()
        mbarrier.arrive(bars.index(_FREE + 0), count=1)
        mbarrier.wait(bars.index(_READY + 2), ph)
        _barrier()
        mbarrier.arrive(bars.index(_FREE + 2), count=1)
    else:
        mbarrier.wait(bars.index(_READY + 3), ph)
        _barrier()
        mbarrier.arrive(bars.index(_FREE + 3), count=1)
        mbarrier.wait(bars.index(_READY + 1), ph)
        _barrier()
        mbarrier.arrive(bars.index(_FREE + 1), count=1)

"""

# the tensor-core work of a consumer's pair alone (mma_only, mma_softmax): the kernel's own pair loop up to its
# softmax (the views, the waits for the own tile's halves, the two Q K^T wgmma, the release of Q; for mma_only
# without the valid mask), then _MMA_TAIL. Every half a consumer reads is waited for and every half it frees in
# the kernel is freed after its reads, so no barrier sees a phase twice (the producer refills a half only once
# freed); no hand-over between the consumers: each uses its own S as P and reads the other's P slot as it stands
# (outputs meaningless)
_MMA_TAIL = """\
    p = s
@SOFTMAX@    p_op = gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    if W == 0:
        acc = _wgmma(p_op, kv0, acc, is_async=True)
        mbarrier.wait(bars.index(_READY + 2), ph)
        acc = _wgmma(p1, kv2, acc, is_async=True)
        acc = _wgmma_wait(0, deps=(acc,))
        _barrier()
        mbarrier.arrive(bars.index(_FREE + 0), count=1)
        mbarrier.arrive(bars.index(_FREE + 2), count=1)
    else:
        acc = _wgmma(p_op, kv3, acc, is_async=True)
        mbarrier.wait(bars.index(_READY + 1), ph)
        acc = _wgmma(p0, kv1, acc, is_async=True)
        acc = _wgmma_wait(0, deps=(acc,))
        _barrier()
        mbarrier.arrive(bars.index(_FREE + 3), count=1)
        mbarrier.arrive(bars.index(_FREE + 1), count=1)

"""
# the consumer's own online softmax over its tile (the kernel's, without the other consumer's row max)
_SOFTMAX = """\
    s = gl.where(gl.expand_dims(valid, 0), s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_shift)
    p = gl.exp2(s - gl.expand_dims(m_shift, 1))
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row), 1)
    m_i = m_new
"""
# in the kernel's pair loop: its softmax's first line (where the mma loops leave it) and its valid mask's line
_SOFTMAX_START = re.compile(r"^[ \t]+s = gl\.where\(", re.M)
_VALID_LINE = re.compile(r"^[ \t]+valid = _valid_cols\([^\n]*\n", re.M)
# name: (the kernel's loop head kept, with its valid mask, the rest) or the whole loop (str)
LOOPS = {"no_math": _NO_MATH_LOOP,
         "mma": (False, _MMA_TAIL.replace("@SOFTMAX@", "")),
         "mma_softmax": (True, _MMA_TAIL.replace("@SOFTMAX@", _SOFTMAX))}


def _mma_loop(kernel_loop: str, indent: str, keep_valid: bool, tail: str) -> str:
    """The kernel's pair loop ``kernel_loop`` up to its softmax (less its valid mask unless ``keep_valid``),
    then ``tail`` indented as the loop. ValueError when the kernel's loop has no such places."""
    starts, valids = list(_SOFTMAX_START.finditer(kernel_loop)), list(_VALID_LINE.finditer(kernel_loop))
    if len(starts) != 1 or len(valids) != 1:
        raise ValueError(f"variant_source: found {len(starts)} softmax starts and {len(valids)} valid masks in the "
                         "consumer pair loop; expected 1 and 1")
    head = kernel_loop[:starts[0].start()]
    if not keep_valid:
        head = _VALID_LINE.sub("", head)
    return head + _indented(tail, indent)


def _indented(text: str, indent: str) -> str:
    return "".join(indent + ln if ln.strip() else ln for ln in text.splitlines(keepends=True))

def variant_source(text: str, drop_gathers: bool, loop: str | None = None) -> str:
    """``text`` (the ws kernel's module) with the producer's KV gathers and/or the consumers' math
    taken out, as the module docstring says. ValueError when the code they are found by has changed
    (four gathers, one pair loop), so that a copy never silently keeps what it claims to drop. ``loop``:
    the consumers' pair loop replaced by ``LOOPS[loop]``, or for the mma loops its part after the
    softmax's start (None: kept)."""
    if drop_gathers:
        text, n = _GATHER.subn("", text)
        if n != 4:
            raise ValueError(f"variant_source: found {n} KV gathers in the producer's pair loop; expected 4")
    if loop is not None:
        if loop not in LOOPS:
            raise ValueError(f"variant_source: loop is {loop!r}; expected one of {sorted(LOOPS)} or None")
        found = list(_PAIR_LOOP.finditer(text))
        if len(found) != 1:
            raise ValueError(f"variant_source: found {len(found)} consumer pair loops; expected 1")
        indent = found[0]["indent"]
        if isinstance(LOOPS[loop], tuple):
            body = _mma_loop(found[0].group(0), indent, *LOOPS[loop])
        else:
            body = _indented(LOOPS[loop], indent)
        text = text[:found[0].start()] + body + text[found[0].end():]
    return text


def load_copies(folder: Path) -> dict:
    """``{name: module}``: the copies of ``COPIES``, written to ``folder`` and imported."""
    text = KERNEL.read_text()
    mods = {}
    for name, (gathers, loop) in COPIES.items():
        path = folder / f"ws_{name}.py"
        path.write_text(variant_source(text, gathers, loop))
        mods[name] = load_module_copy(f"_exp_ws_floor_{name}", path)
    return mods


#: the paths whose outputs mean something, each checked against the fp32 reference before a cell is timed
CHECKED = ("flashmla_direct", "gluon_ws")


def wrong_paths(fns: dict, q, kv, idx, lens, scale, sink, n: int = 8) -> dict:
    """``{path: why}`` of the paths of :data:`CHECKED` among ``fns`` whose output on the first ``n`` tokens
    differs from the fp32 reference (FlashMLA's own ``(out, max_logits, lse)`` read as ``(out, lse)``, an
    empty token's lse +inf as the pack's -inf); a path that raises is wrong with its exception."""
    out = {}
    for name in CHECKED:
        if name not in fns:
            continue
        try:
            got = fns[name](q, kv, idx, lens, sink)
            if name == "flashmla_direct":
                got = (got[0], got[2].masked_fill(got[2] == float("inf"), float("-inf")))
            why, _ = check(got, q, kv, idx, lens, scale, DV, sink, n=n)
        except Exception as exc:  # noqa: BLE001 - recorded, never the end of the run
            why = f"{type(exc).__name__}: {str(exc)[:300]}"
        if why is not None:
            out[name] = why
    return out


def summarise(row: dict) -> dict:
    """The cell's ratios from its times (``row["ms"]``)."""
    ms = row["ms"]
    floor_ms = max(ms["no_gather"], ms["no_math"])
    fm = ms["flashmla_direct"]
    return {"ws/flashmla": fm / ms["gluon_ws"], "floor/flashmla": fm / floor_ms, "overlap": floor_ms / ms["gluon_ws"],
            "bound_by": "math" if ms["no_gather"] >= ms["no_math"] else "gathers",
            "goal_reachable": fm / floor_ms >= GOAL,
            "ceiling/flashmla": fm / ms["mma_only"], "chain": ms["mma_only"] / ms["no_gather"],
            "softmax_cost": ms["mma_softmax"] / ms["mma_only"], "data_flow/flashmla": fm / ms["mma_gather"],
            "no_handover/flashmla": fm / ms["mma_softmax_gather"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=7, help="interleaved rounds per cell")
    p.add_argument("--cells", type=parse_cells, default=None, metavar="H:K:T:ROWS,...",
                   help="these cells instead of the grid")
    p.add_argument("--extra", action="append", default=[], metavar="LABEL=FILE",
                   help="a copy of the kernel's module (a file, or a candidate's .diff) timed beside the others, "
                        "unchecked like the copies (e.g. a candidate of another design with its gathers taken out)")
    args = p.parse_args(argv)
    try:  # the floor's own paths keep their names: summarise reads them
        extras = parse_copies("--extra", args.extra, taken=("flashmla_direct", "gluon_ws", *COPIES))
    except ValueError as exc:
        raise SystemExit(f"exp_ws_floor: {exc}") from None
    if not torch.cuda.is_available():
        raise SystemExit("exp_ws_floor: needs a CUDA GPU")
    from swa_backends.backends.cuda import probes
    from swa_backends.kernels import sparse_mla_gluon_ws

    args.out.mkdir(parents=True, exist_ok=True)
    fmla, why = probes.find_flashmla()
    if fmla is None:
        raise SystemExit(f"exp_ws_floor: FlashMLA is not importable ({why}); run bench/fetch_flashmla.py first")
    dev = torch.device("cuda")
    scale = 1.0 / D ** 0.5
    with tempfile.TemporaryDirectory() as folder:
        copies = load_copies(Path(folder))
    fns = {"flashmla_direct": lambda q, kv, idx, lens, sink: fmla.flash_mla_sparse_fwd(
        q, kv.unsqueeze(1), idx.unsqueeze(1), scale, DV, attn_sink=sink, topk_length=lens),
        "gluon_ws": lambda q, kv, idx, lens, sink: sparse_mla_gluon_ws.sparse_mla(q, kv, idx, lens, scale, DV,
                                                                                  sink=sink)}
    for label, path in extras.items():
        copies[label] = load_module_copy(f"_exp_ws_floor_extra_{label}", path)
    for name, mod in copies.items():
        fns[name] = lambda q, kv, idx, lens, sink, m=mod: m.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink)
    result = {**results.machine(dev), "goal": GOAL, "reps": args.reps, "command": results.command_line(),
              "kernel_sha": results.file_sha(KERNEL), "cells": []}
    kvs = {}
    failed = False
    for H, K, T, S in args.cells or CELLS:
        kv = kvs.setdefault(S, torch.randn(S, D, device=dev).to(torch.bfloat16))
        q, idx, lens, sink = make_inputs(T, H, K, D, kv=kv, seed=H * K + T)
        for fn in fns.values():
            fn(q, kv, idx, lens, sink)  # compiled and warm
        torch.cuda.synchronize()
        wrong = wrong_paths(fns, q, kv, idx, lens, scale, sink)
        if wrong:  # a ratio to a wrong FlashMLA or of a wrong kernel means nothing: the cell is not timed
            failed = True
            result["cells"].append({"H": H, "K": K, "T": T, "S": S, "errors": wrong})
            log(f"H {H:>3} K {K:>4} T {T:>5} S {S:>7}: wrong, not timed: {wrong}")
            continue
        ms = tm.interleaved_ms({n: (lambda f=f: f(q, kv, idx, lens, sink)) for n, f in fns.items()}, args.reps)
        row = {"H": H, "K": K, "T": T, "S": S, "ms": ms,
               "tflops": {n: tflops(T, H, K, D, DV, v) for n, v in ms.items()}}
        row.update(summarise(row))
        result["cells"].append(row)
        tf = row["tflops"]
        log(f"H {H:>3} K {K:>4} T {T:>5} S {S:>7}: " + "  ".join(f"{n} {v:6.1f}" for n, v in tf.items())
            + f"  ws/fmla {row['ws/flashmla']:.3f} floor/fmla {row['floor/flashmla']:.3f} ({row['bound_by']})"
            f" overlap {row['overlap']:.3f} ceiling/fmla {row['ceiling/flashmla']:.3f} chain {row['chain']:.3f}"
            f" data_flow/fmla {row['data_flow/flashmla']:.3f} no_handover/fmla {row['no_handover/flashmla']:.3f}")
    for key in ("ws/flashmla", "floor/flashmla", "overlap", "ceiling/flashmla", "chain", "softmax_cost",
                "data_flow/flashmla", "no_handover/flashmla"):
        vals = [r[key] for r in result["cells"] if key in r]
        if vals:
            result[f"gm {key}"] = results.gmean(vals)
            log(f"geometric mean {key}: {result[f'gm {key}']:.3f}")
    results.write_json(args.out / "exp_ws_floor.json", result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
