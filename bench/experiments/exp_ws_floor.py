"""The floor of ``gluon_ws``'s design per cell of ``bench_flashmla.py``'s grid: the kernel timed
beside copies of itself with a part taken out, and beside FlashMLA, in the same rounds::

    . bench/gpu_env.sh && PYTHONPATH=.flashmla:$PYTHONPATH python3 bench/experiments/exp_ws_floor.py --out $OUT

The copies are made from ``kernels/sparse_mla_gluon_ws.py`` as it is (``variant_source``); their
outputs are meaningless and not checked:

* ``no_gather``: the producer loads Q but gathers no KV row (the tiles keep whatever shared memory
  held; its cp.async arrivals still complete the ready barriers at once): the consumers' math,
  their hand-overs and the epilogue -- the kernel's time if gathers cost nothing;
* ``no_math``: each consumer waits for the KV halves it would free and frees them at once, with no
  Q K^T, softmax or P V; Q, the gathers, the row-sum exchange and the epilogue stay -- the kernel's
  time if the math cost nothing;
* ``neither``: both taken out: what is left per item (Q, the barriers, the epilogue's stores).

A schedule of this design (these gathers, this chain of math per pair) is no faster than either
part alone, so ``floor`` = the slower of ``no_gather`` and ``no_math``; ``goal`` = 1.10 x FlashMLA
(issue 38). Per cell: TFLOP/s of every path (2*T*H*K*(D_qk + d_v) / time, also for the copies),
``ws/flashmla``, ``floor/flashmla`` and ``overlap`` (floor time / gluon_ws time: 1.0 is a perfect
overlap of the two parts). Times are the median of ``--reps`` interleaved rounds
(``lib.timing.interleaved_ms``, as ``bench_flashmla.py``), every path once per round after a GPU
sleep. Writes ``exp_ws_floor.json`` under ``--out``; prints a line per cell and the geometric means.
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
from lib.sparse_mla import CELLS, DV, D, load_module_copy, make_inputs, parse_cells, tflops  # noqa: E402

KERNEL = Path(__file__).resolve().parents[2] / "kernels" / "sparse_mla_gluon_ws.py"
GOAL = 1.10
COPIES = {"no_gather": (True, False), "no_math": (False, True), "neither": (True, True)}

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


def variant_source(text: str, drop_gathers: bool, drop_math: bool) -> str:
    """``text`` (the ws kernel's module) with the producer's KV gathers and/or the consumers' math
    taken out, as the module docstring says. ValueError when the code they are found by has changed
    (four gathers, one pair loop), so that a copy never silently keeps what it claims to drop."""
    if drop_gathers:
        text, n = _GATHER.subn("", text)
        if n != 4:
            raise ValueError(f"variant_source: found {n} KV gathers in the producer's pair loop; expected 4")
    if drop_math:
        found = list(_PAIR_LOOP.finditer(text))
        if len(found) != 1:
            raise ValueError(f"variant_source: found {len(found)} consumer pair loops; expected 1")
        indent = found[0]["indent"]
        loop = "".join(indent + ln if ln else ln for ln in _NO_MATH_LOOP.splitlines(keepends=True))
        text = text[:found[0].start()] + loop + text[found[0].end():]
    return text


def load_copies(folder: Path) -> dict:
    """``{name: module}``: the copies of ``COPIES``, written to ``folder`` and imported."""
    text = KERNEL.read_text()
    mods = {}
    for name, (gathers, math_) in COPIES.items():
        path = folder / f"ws_{name}.py"
        path.write_text(variant_source(text, gathers, math_))
        mods[name] = load_module_copy(f"_exp_ws_floor_{name}", path)
    return mods


def summarise(row: dict) -> dict:
    """The cell's ratios from its times (``row["ms"]``)."""
    ms = row["ms"]
    floor_ms = max(ms["no_gather"], ms["no_math"])
    fm = ms["flashmla_direct"]
    return {"ws/flashmla": fm / ms["gluon_ws"], "floor/flashmla": fm / floor_ms, "overlap": floor_ms / ms["gluon_ws"],
            "bound_by": "math" if ms["no_gather"] >= ms["no_math"] else "gathers",
            "goal_reachable": fm / floor_ms >= GOAL}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=7, help="interleaved rounds per cell")
    p.add_argument("--cells", type=parse_cells, default=None, metavar="H:K:T:ROWS,...",
                   help="these cells instead of the grid")
    args = p.parse_args(argv)
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
    for name, mod in copies.items():
        fns[name] = lambda q, kv, idx, lens, sink, m=mod: m.sparse_mla(q, kv, idx, lens, scale, DV, sink=sink)
    result = {**results.machine(dev), "goal": GOAL, "reps": args.reps, "command": results.command_line(),
              "kernel_sha": results.file_sha(KERNEL), "cells": []}
    kvs = {}
    for H, K, T, S in args.cells or CELLS:
        kv = kvs.setdefault(S, torch.randn(S, D, device=dev).to(torch.bfloat16))
        q, idx, lens, sink = make_inputs(T, H, K, D, kv=kv, seed=H * K + T)
        for fn in fns.values():
            fn(q, kv, idx, lens, sink)  # compiled and warm
        torch.cuda.synchronize()
        ms = tm.interleaved_ms({n: (lambda f=f: f(q, kv, idx, lens, sink)) for n, f in fns.items()}, args.reps)
        row = {"H": H, "K": K, "T": T, "S": S, "ms": ms,
               "tflops": {n: tflops(T, H, K, D, DV, v) for n, v in ms.items()}}
        row.update(summarise(row))
        result["cells"].append(row)
        tf = row["tflops"]
        log(f"H {H:>3} K {K:>4} T {T:>5} S {S:>7}: " + "  ".join(f"{n} {v:6.1f}" for n, v in tf.items())
            + f"  ws/fmla {row['ws/flashmla']:.3f} floor/fmla {row['floor/flashmla']:.3f} ({row['bound_by']})"
            f" overlap {row['overlap']:.3f}")
    for key in ("ws/flashmla", "floor/flashmla", "overlap"):
        vals = [r[key] for r in result["cells"]]
        result[f"gm {key}"] = results.gmean(vals)
        log(f"geometric mean {key}: {result[f'gm {key}']:.3f}")
    results.write_json(args.out / "exp_ws_floor.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
