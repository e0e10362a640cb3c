"""Huge-stride cases: every Triton kernel of the pack on legal views whose elements lie more
than 2**31 elements apart, against the reference.

A kernel that multiplies an int32 index by a stride wraps past 2**31 and reads or writes
elsewhere (under the interpreter: a SIGSEGV; on a GPU: a fault or silent corruption). Each
case takes a small valid call and *spreads* one tensor argument: the same values, in a view
over a fresh storage whose elements along one dimension lie ``SPAN`` elements apart end to
end (:func:`spread`). Only the storage's address space is reserved (``torch.empty``: on a CPU
the OS commits the pages written, a few per element), so a case touches little memory; on a
GPU the storage is real (at most 16 GiB a case, freed after it). A dimension of at least 3
elements gets a stride below 2**31 (Triton passes it as an i32: only the product overflows,
and the kernels must compute it in int64); a dimension of 2 gets a stride of 2**31, which
validation refuses (SPEC §0 Limits: the kernels take sizes and strides as 32-bit
arguments), before anything is written.

``python tests/kernels/huge_strides.py [--device DEV] [--start N] [NAME ...]`` runs the
cases (all, or the named ones) from the N-th on, printing one JSON line per finished case
(``outcome`` ok / wrong / error / unrefused, seconds, the process's peak RSS) and ``{"done": true}`` at
the end, so a parent that sees the process die knows which case crashed it
(tests/kernels/test_huge_strides.py). ``sanitize_kernels.py`` runs them on the GPU under
compute-sanitizer.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

import swa_backends as sb
from swa_backends.common.ops import OPS, plan_replay_batch
from swa_backends.common.types import INDEX_DTYPE, MAX_POSITION, PAD, SLOT_DTYPE
from swa_backends.testing.conformance import mismatch, random_batch

SPAN = 2**31  # elements from a spread dimension's first element to its last
INT32_MAX = 2**31 - 1
MAX_BYTES = 16 * 2**30 + 2**20  # address space one spread view may reserve
ALIGN = 16  # a spread stride is a multiple of this many elements: rows stay 16-byte aligned


def spread(t: torch.Tensor, dim: int, span: int = SPAN) -> torch.Tensor:
    """A view with ``t``'s values whose elements along ``dim`` lie ``ceil(span / (n - 1))``
    apart, rounded up to :data:`ALIGN` (``n = t.shape[dim] >= 2``: the last one at least
    ``span`` elements after the first; a case makes it one the kernel reads or writes), the
    other dimensions compact inside one step."""
    n = t.shape[dim]
    assert n >= 2, f"dimension {dim} of {tuple(t.shape)} has fewer than 2 elements"
    gap = -(-span // (n - 1))
    gap = -(-gap // ALIGN) * ALIGN
    strides = [0] * t.dim()
    inner = 1
    for d in reversed(range(t.dim())):
        if d != dim:
            strides[d] = inner
            inner *= t.shape[d]
    assert inner <= gap
    strides[dim] = gap
    size = (n - 1) * gap + inner
    assert size * t.element_size() <= MAX_BYTES, f"{size * t.element_size()} bytes reserved"
    storage = torch.empty(size, dtype=t.dtype, device=t.device)
    view = storage.as_strided(t.shape, strides)
    view.copy_(t)
    return view


#: tensors of more elements are large read-only sources (``gather_rows``' far rows): the
#: reference reads them in place instead of a copy that would commit all their memory
COPY_LIMIT = 2**24


def compact(obj, device="cpu"):
    """A contiguous copy of every tensor in ``obj`` (the reference's inputs)."""
    if isinstance(obj, torch.Tensor):
        if obj.numel() > COPY_LIMIT and obj.device == torch.device(device):
            return obj
        return obj.detach().to(device).contiguous().clone()
    if isinstance(obj, tuple):
        return tuple(compact(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: compact(v, device) for k, v in obj.items()}
    return obj


def _batch(need: Callable, **kw):
    """The first ``random_batch`` of seeds 0, 1, ... that satisfies ``need`` (deterministic)."""
    for seed in range(2000):
        b = random_batch(np.random.default_rng(seed), **kw)
        if need(b):
            return b
    raise AssertionError("no batch satisfies the case's needs")


def _replaying(b) -> bool:
    return bool((b.R > 0).any())


def _last_replayed(b) -> int:
    """The last token ``pad_replayed_slots`` pads (``R > 0``, ``R <= p < R + Wr``)."""
    R = np.repeat(b.R, b.q)
    p = b.positions
    hit = np.flatnonzero((R > 0) & (p >= R) & (p < R + b.Wr))
    return int(hit.max()) if hit.size else -1


def _last_column(b) -> int:
    """The last block-table column a request's positions read."""
    return int(((b.seq - 1) // b.block_size).max())


def _read_columns(b, block_table: torch.Tensor) -> torch.Tensor:
    """The block table cut after the last column a position reads (a column spread then puts
    that column 2**31 elements in)."""
    return block_table[:, : _last_column(b) + 1]


# ---------------------------------------------------------------------------------------
# cases: name -> builder(device) -> Call
# ---------------------------------------------------------------------------------------


@dataclass
class Call:
    """One call of a case. ``fn`` None: the op of the pack's Backend with the Triton variant
    preferred (validated first); else that kernel, called after the op's validator unless
    ``validate`` is False. ``refused``: the validator must refuse the call with a ValueError
    naming that argument, before anything is written (a size past MAX_POSITION, a stride
    past INT32_MAX: SPEC §0 Limits)."""

    op: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    fn: Callable | None = None
    validate: bool = True
    refused: str | None = None


CASES: dict[str, Callable[[torch.device], Call]] = {}
#: cases whose memory a CPU would commit (the output is written whole)
GPU_ONLY: set[str] = set()


def case(name: str, *, gpu_only: bool = False):
    def deco(fn):
        CASES[name] = fn
        if gpu_only:
            GPU_ONLY.add(name)
        return fn
    return deco


def _ascend(module: str, attr: str):
    import importlib

    return getattr(importlib.import_module(f"swa_backends.backends.ascend.kernels.{module}"), attr)


def _portable(module: str, attr: str):
    import importlib

    return getattr(importlib.import_module(f"swa_backends.kernels.{module}"), attr)


def spread_case(name: str, op: str, build: Callable, *spreads: tuple[int, int], **call) -> None:
    """Register a case: ``build(dev) -> (args, kwargs)``, then argument ``i`` spread along
    ``dim`` for each ``(i, dim)`` of ``spreads``; ``call``: more :class:`Call` fields."""

    def make(dev):
        args, kw = build(dev)
        args = list(args)
        for i, dim in spreads:
            args[i] = spread(args[i], dim)
        return Call(op, tuple(args), kw, **call)

    CASES[name] = make


@case("batch_replay_start/R_per_request")
def _(dev):
    R_all = spread(torch.tensor([5, 0, 7, 11, 3, 9], dtype=INDEX_DTYPE, device=dev), 0)
    idx = spread(torch.tensor([3, 1, 0, 5], dtype=INDEX_DTYPE, device=dev), 0)
    pre = torch.tensor([True, False, True, True], device=dev)
    return Call("batch_replay_start", (R_all, idx, pre))


@case("batch_replay_start/idx_mapping_past_MAX_POSITION_rows")
def _(dev):
    # an expanded idx_mapping: a batch of 2**30 + 1 rows, no memory
    R_all = torch.tensor([5, 7], dtype=INDEX_DTYPE, device=dev)
    idx = torch.ones(1, dtype=INDEX_DTYPE, device=dev).expand(MAX_POSITION + 1)
    pre = torch.ones(1, dtype=torch.bool, device=dev).expand(MAX_POSITION + 1)
    return Call("batch_replay_start", (R_all, idx, pre), refused="idx_mapping")


def _pad_args(dev, G: int = 3) -> tuple:
    """A replaying step whose last token is padded (a column spread puts it 2**31 elements
    in), groups 0 and G - 1 cacheable."""
    b = _batch(lambda b: _last_replayed(b) == b.T - 1 >= 2, num_groups=G, max_padded=0)
    t = b.tensors(dev)
    cacheable = torch.tensor([0, G - 1], dtype=INDEX_DTYPE, device=dev)
    return [t["slot_mappings"], cacheable, t["query_start_loc"], t["positions"][: b.T], t["replay_start"], b.Wr], {}


spread_case("pad_replayed_slots/slot_rows", "pad_replayed_slots", _pad_args, (0, 0))
spread_case("pad_replayed_slots/slot_columns", "pad_replayed_slots", _pad_args, (0, 1))
spread_case("pad_replayed_slots/slot_row_stride_2_31", "pad_replayed_slots", lambda dev: _pad_args(dev, 2), (0, 0),
            refused="slot_mappings")


def _prepare_args(dev, *, plan: bool = True, read_columns: bool = False) -> tuple:
    """A replaying, trimming step over 3 slot groups: group 0 cacheable, group 2 the window
    group (``valid_group``, some tokens without a slot), decode and prefill rows apart,
    gather lengths (``read_columns``: the block table cut after the last column read)."""
    b = _batch(lambda b: _replaying(b) and bool((b.prefilling & (b.q > b.W)).any()) and b.T >= 4
               and _last_column(b) >= 2 and b.B >= 3, num_groups=3, long_prefill=True, max_padded=0, W=8,
               max_q=24)
    t = b.tensors(dev)
    slots = t["slot_mappings"]
    slots[2, 1::3] = PAD
    table = _read_columns(b, t["block_table"]) if read_columns else t["block_table"]
    args = [torch.tensor(b.R, dtype=INDEX_DTYPE, device=dev), torch.arange(b.B, dtype=INDEX_DTYPE, device=dev),
            t["is_prefilling"], t["query_start_loc"], t["seq_lens"], t["positions"], slots,
            torch.tensor([0], dtype=INDEX_DTYPE, device=dev), table, b.block_size, b.W, b.Wr]
    kw = {"index_width": b.W + 1, "prefill_from": b.T // 2, "gather_lens_from": 1, "valid_group": 2}
    if plan:
        kw["plan"] = plan_replay_batch(b.qsl, b.prefilling, np.zeros(b.B, bool), b.W, trim_threshold=0)
    return args, kw


# slot rows: the window group's row (valid_group, read before padding) 2**31 elements in
spread_case("prepare_replay_step/slot_rows", "prepare_replay_step", _prepare_args, (6, 0))
spread_case("prepare_replay_step/slot_rows_no_plan", "prepare_replay_step",
            lambda dev: _prepare_args(dev, plan=False), (6, 0))
spread_case("prepare_replay_step/slot_columns", "prepare_replay_step", _prepare_args, (6, 1))
spread_case("prepare_replay_step/block_table_rows", "prepare_replay_step", _prepare_args, (8, 0))
spread_case("prepare_replay_step/block_table_columns", "prepare_replay_step",
            lambda dev: _prepare_args(dev, read_columns=True), (8, 1))


@case("prepare_replay_step/out_rows")
def _(dev):
    from swa_backends.common.ops.prepare_replay_step import allocate_out

    args, kw = _prepare_args(dev)
    out = allocate_out(args[1].shape[0], args[5].shape[0], kw["index_width"], dev, kw["plan"], 3,
                       prefill_from=kw["prefill_from"], gather_lens_from=kw["gather_lens_from"])
    # a persistent buffer whose rows lie far apart (a slice of a wider one)
    out["replay_batch"]["slot_mappings"] = spread(out["replay_batch"]["slot_mappings"].fill_(-7), 0)
    return Call("prepare_replay_step", tuple(args), {**kw, "out": out})


def _gather_args(dev) -> tuple:
    """The trimming step of :func:`_prepare_args` (its replay starts per batch row)."""
    a, kw = _prepare_args(dev)
    return [kw["plan"], a[3], a[4], a[0], a[5], a[6], a[10]], {}


spread_case("gather_replay_batch/slot_rows", "gather_replay_batch", _gather_args, (5, 0))
# every request keeps its last row: the last column is read
spread_case("gather_replay_batch/slot_columns", "gather_replay_batch", _gather_args, (5, 1))


def _gather_out(dev, G: int) -> Call:
    from swa_backends.common.ops.gather_replay_batch import allocate_out

    a, _ = _gather_args(dev)
    out = allocate_out(a[0], 3, dev)
    out["slot_mappings"] = spread(out["slot_mappings"][:G].fill_(-7), 0)
    a[5] = a[5][:G]
    return Call("gather_replay_batch", tuple(a), {"out": out})


case("gather_replay_batch/out_rows")(lambda dev: _gather_out(dev, 3))


@case("gather_replay_batch/out_row_stride_2_31")
def _(dev):
    c = _gather_out(dev, 2)
    c.refused = "out['slot_mappings']"
    return c


def _swa_args(dev, *, read_columns: bool = False) -> tuple:
    b = _batch(lambda b: _replaying(b) and b.B >= 3 and _last_column(b) >= 2)
    t = b.tensors(dev)
    table = _read_columns(b, t["block_table"]) if read_columns else t["block_table"]
    return [t["query_start_loc"], t["seq_lens"], table, b.block_size, b.W, t["replay_start"]], \
        {"index_width": b.W + 2, "num_tokens": b.T + b.num_padded}


spread_case("swa_indices_and_lens/block_table_rows", "swa_indices_and_lens", _swa_args, (2, 0))
spread_case("swa_indices_and_lens/block_table_columns", "swa_indices_and_lens",
            lambda dev: _swa_args(dev, read_columns=True), (2, 1))


@case("swa_indices_and_lens/block_table_row_stride_2_31")
def _(dev):
    b = _batch(lambda b: b.B == 2)
    t = b.tensors(dev)
    return Call("swa_indices_and_lens", (t["query_start_loc"], t["seq_lens"], spread(t["block_table"], 0),
                                         b.block_size, b.W, t["replay_start"]), refused="block_table")


@case("swa_indices_and_lens/block_table_past_MAX_POSITION_columns")
def _(dev):
    # an expanded block table: 2**30 + 1 columns of one block each, no memory
    b = _batch(lambda b: b.B >= 1)
    t = b.tensors(dev)
    table = t["block_table"][:, :1].expand(b.B, MAX_POSITION + 1)
    return Call("swa_indices_and_lens", (t["query_start_loc"], t["seq_lens"], table, b.block_size, b.W,
                                         t["replay_start"]), refused="block_table")


@case("swa_indices_and_lens/num_tokens_past_MAX_POSITION")
def _(dev):
    a, kw = _swa_args(dev)
    return Call("swa_indices_and_lens", tuple(a), {**kw, "num_tokens": MAX_POSITION + 1}, refused="num_tokens")


@case("swa_indices_and_lens/query_start_loc_past_MAX_POSITION")
def _(dev):
    # no num_tokens: the rows are query_start_loc[-1] = 2**30 + 2 tokens (two requests each
    # within MAX_POSITION), refused before any output is allocated
    i32 = dict(dtype=INDEX_DTYPE, device=dev)
    qsl = torch.tensor([0, MAX_POSITION, MAX_POSITION + 2], **i32)
    return Call("swa_indices_and_lens", (qsl, torch.tensor([MAX_POSITION, 2], **i32), torch.zeros(2, 1, **i32), 16, 8,
                                         torch.zeros(2, **i32)), refused="query_start_loc")


def _far_token_offset(dev, fn) -> Call:
    # rows of batch tokens INT32_MAX - 20 ... INT32_MAX + 19, all past the batch: lens 0,
    # rows PAD. The kernel is called directly: whether validation accepts the offset is the
    # validator's business; the kernel must not wrap either way
    a, kw = _swa_args(dev)
    return Call("swa_indices_and_lens", tuple(a), {**kw, "num_tokens": 40, "token_offset": INT32_MAX - 20}, fn=fn,
                validate=False)


case("swa_indices_and_lens/token_offset")(
    lambda dev: _far_token_offset(dev, _portable("swa_indices_and_lens", "swa_indices_and_lens")))


@case("compressed_slot_mapping/block_table_columns")
def _(dev):
    b = _batch(lambda b: b.block_size >= 4 and b.T >= 3 and _last_column(b) >= 2)
    t = b.tensors(dev)
    tok = spread(t["slot_mappings"][0, : b.T].clone(), 0)
    return Call("compressed_slot_mapping", (tok, t["query_start_loc"], t["seq_lens"],
                                            spread(_read_columns(b, t["block_table"]), 1), b.block_size, 4))


@case("prefill_gather_lens/inputs")
def _(dev):
    b = _batch(lambda b: _replaying(b) and b.B >= 3)
    t = b.tensors(dev)
    return Call("prefill_gather_lens", (spread(t["query_start_loc"], 0), spread(t["seq_lens"], 0),
                                        spread(t["replay_start"], 0), b.W))


def _indices(dev, T: int, K: int, seed: int, high: int = 5000) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    idx = torch.tensor(rng.integers(0, high, size=(T, K)), dtype=INDEX_DTYPE, device=dev)
    idx[torch.tensor(rng.random((T, K)) < 0.3, device=dev)] = PAD
    return idx


@case("indices_to_csr/columns")
def _(dev):
    lens = torch.tensor([5, 0, 3, 5, 1, 4], dtype=INDEX_DTYPE, device=dev)
    return Call("indices_to_csr", (spread(_indices(dev, 6, 5, 1), 1), lens))


@case("indices_to_csr/rows")
def _(dev):
    lens = torch.tensor([7, 2, 0, 6, 7], dtype=INDEX_DTYPE, device=dev)
    return Call("indices_to_csr", (spread(_indices(dev, 5, 7, 2), 0), lens))


@case("indices_to_csr/column_stride_2_31")
def _(dev):
    lens = torch.tensor([2, 1, 0], dtype=INDEX_DTYPE, device=dev)
    return Call("indices_to_csr", (spread(_indices(dev, 3, 2, 3), 1), lens), refused="indices")


def _layout_args(dev, T: int = 5, SW: int = 6, K: int = 4) -> tuple:
    """Window rows, their lengths, top-k rows, their lengths; rows 0, 1 and the last read
    every column."""
    rng = np.random.default_rng(3)
    swa = _indices(dev, T, SW, 4)
    sl = torch.tensor(rng.integers(0, SW + 1, size=T), dtype=INDEX_DTYPE, device=dev)
    topk = _indices(dev, T, K, 5)
    tl = torch.tensor(rng.integers(0, K + 1, size=T), dtype=INDEX_DTYPE, device=dev)
    sl[0], tl[1], sl[1], tl[T - 1], sl[T - 1] = SW, K, SW, K, SW
    return swa, sl, topk, tl


def _plain_args(dev) -> tuple:
    return _layout_args(dev), {"topk_offset": 3, "window_offset": 11}


def _mixed_args(dev) -> tuple:
    swa, _, topk, tl = _layout_args(dev)
    return (swa, topk, tl), {}


spread_case("plain_indices/window_columns", "plain_indices", _plain_args, (0, 1))
spread_case("plain_indices/topk_columns", "plain_indices", _plain_args, (2, 1))
spread_case("plain_indices/rows", "plain_indices", _plain_args, (0, 0), (2, 0))
spread_case("mixed_indices/window_columns", "mixed_indices", _mixed_args, (0, 1))
spread_case("mixed_indices/topk_columns", "mixed_indices", _mixed_args, (1, 1))
spread_case("mixed_indices/rows", "mixed_indices", _mixed_args, (0, 0), (1, 0))


@case("plain_indices/window_past_MAX_WINDOW_columns")
def _(dev):
    from swa_backends.common.types import MAX_WINDOW

    swa, sl, topk, tl = _layout_args(dev)
    wide = swa[:, :1].expand(swa.shape[0], MAX_WINDOW + 1)  # an index width past SPEC's limit, no memory
    return Call("plain_indices", (wide, sl, topk, tl), refused="swa_indices")


def _combined_args(dev) -> tuple:
    """Ratio 2, top_k 6: the longest request's last tokens read every top-k column."""
    b = _batch(lambda b: b.B >= 2 and b.T >= 3 and int(b.seq.max()) >= 16)
    t = b.tensors(dev)
    gl = OPS["prefill_gather_lens"].reference(t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W)
    N, top_k = 40, 6
    M = N + int(gl.max()) + 2
    rng = np.random.default_rng(6)
    topk = torch.tensor(rng.integers(-1, N + 4, size=(b.T, top_k)), dtype=INDEX_DTYPE, device=dev)
    return [topk, t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W, 2, top_k, M, N], {}


spread_case("combined_indices/topk_columns", "combined_indices", _combined_args, (0, 1))
spread_case("combined_indices/topk_rows", "combined_indices", _combined_args, (0, 0))


def _far_rows_source(dev, n_rows: int, width: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [n_rows, width]`` (reserved, not filled) whose rows ``rows``, near its end and
    start, hold random values; no other row is read."""
    x = torch.empty(n_rows, width, dtype=dtype, device=dev)
    rows = torch.tensor([n_rows - 1, 3, n_rows - 7, 0, n_rows - 2], dtype=SLOT_DTYPE, device=dev)
    g = torch.Generator().manual_seed(8)
    x[rows] = torch.randint(-100, 100, (rows.shape[0], width), generator=g).to(dtype).to(dev)
    return x, rows


@case("gather_rows/far_rows")
def _(dev):
    # rows of one byte move as 1-byte words: row 2**31 + 63 is word 2**31 + 63 of the source
    return Call("gather_rows", _far_rows_source(dev, SPAN + 64, 1, torch.int8))


@case("gather_rows/past_MAX_POSITION_rows")
def _(dev):
    x = torch.arange(6, dtype=torch.int8, device=dev).reshape(3, 2)
    rows = torch.ones(1, dtype=SLOT_DTYPE, device=dev).expand(MAX_POSITION + 1)  # picks of row 1, no memory
    return Call("gather_rows", (x, rows), refused="rows")


@case("gather_rows/spread_rows")
def _(dev):
    x = torch.arange(15, dtype=torch.float32, device=dev).reshape(5, 3)
    return Call("gather_rows", (spread(x, 0), torch.tensor([4, 0, 2], dtype=SLOT_DTYPE, device=dev)))


@case("scatter_rows/far_rows", gpu_only=True)
def _(dev):
    # 3-byte rows move as 1-byte words: the last row starts past word 2**31 of the output,
    # which is zero-filled whole (2 GiB, and as much for the reference: a GPU-only case)
    n_rows = SPAN // 3 + 8
    y = torch.randint(-100, 100, (4, 3), dtype=torch.int8, device=dev)
    rows = torch.tensor([n_rows - 1, 5, n_rows - 3, 0], dtype=SLOT_DTYPE, device=dev)
    return Call("scatter_rows", (y, rows, n_rows))


def _mla_args(dev) -> tuple:
    from swa_backends.testing.conformance import sparse_mla_case

    (q, kv, idx, lens, scale, d_v), kw = sparse_mla_case(np.random.default_rng(9), dev, T=3, H=3, D=32, d_v=32,
                                                         K=9, S=5, dtype=torch.bfloat16)
    idx[:, 0] = kv.shape[0] - 1  # the last row is read, by every token
    lens[0] = lens[-1] = idx.shape[1]  # the first and last index rows are read whole
    return [q, kv, idx, lens, scale, d_v], kw


spread_case("sparse_mla/kv_rows", "sparse_mla", _mla_args, (1, 0))
spread_case("sparse_mla/q_heads_and_index_rows", "sparse_mla", _mla_args, (0, 1), (2, 0))
spread_case("sparse_mla/q_tokens", "sparse_mla", _mla_args, (0, 0))


@case("sparse_mla/record_pages")
def _(dev):
    from swa_backends.testing.conformance import sparse_mla_record_case

    # pages 2**31 / 4 bytes apart: the last page starts 2**31 bytes into the cache
    (q, kv, idx, lens, scale, d_v), kw = sparse_mla_record_case(
        np.random.default_rng(10), dev, kv_format="v41_mxfp8", T=2, H=2, K=8, block_size=4, num_blocks=5)
    idx[:, 0] = kv.shape[0] * kv.shape[1] - 1
    lens[:] = idx.shape[1]
    return Call("sparse_mla", (q, spread(kv.contiguous(), 0), idx, lens, scale, d_v), kw)


spread_case("ascend/pad_replayed_slots/slot_columns", "pad_replayed_slots", _pad_args, (0, 1),
            fn=_ascend("pad_slots", "pad_replayed_slots"))


@case("ascend/pad_replayed_slots/spread_inputs")
def _(dev):
    a, _ = _pad_args(dev)
    a[1] = torch.tensor([2, 0, 1], dtype=INDEX_DTYPE, device=dev)  # 3 entries: a stride below 2**31
    return Call("pad_replayed_slots", (spread(a[0], 0), *(spread(x, 0) for x in a[1:5]), a[5]),
                fn=_ascend("pad_slots", "pad_replayed_slots"))


case("ascend/swa_indices_and_lens/token_offset")(
    lambda dev: _far_token_offset(dev, _ascend("swa_indices", "swa_indices_and_lens")))


spread_case("ascend/swa_indices_and_lens/spread_inputs", "swa_indices_and_lens",
            lambda dev: _swa_args(dev, read_columns=True), (0, 0), (1, 0), (2, 1), (5, 0),
            fn=_ascend("swa_indices", "swa_indices_and_lens"))


@case("ascend/gather_rows/far_rows")
def _(dev):
    return Call("gather_rows", _far_rows_source(dev, SPAN + 64, 1, torch.int8), fn=_ascend("rows", "gather_rows"))


# ---------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------


def run_case(name: str, device: str) -> tuple[str, str]:
    """Run one case on ``device``: ``(outcome, detail)``, outcome "ok" when the result
    equals the reference's (computed on compact CPU copies made before the call) or, for a
    refused case, the validator raised a ValueError naming the argument and left every
    tensor argument as it was; "wrong" or "unrefused" otherwise."""
    c = CASES[name](torch.device(device))
    if c.refused is not None:
        # the arguments a call could write (the huge ones are read-only views)
        before = [t.detach().cpu().clone() for t in _tensors((c.args, c.kwargs)) if t.numel() <= COPY_LIMIT]
        try:
            getattr(_backend(device), c.op)(*c.args, **c.kwargs)
        except ValueError as exc:
            if f"{c.op}: {c.refused}=" not in str(exc):
                return "unrefused", f"the ValueError names another argument: {exc}"
            after = [t.detach().cpu() for t in _tensors((c.args, c.kwargs)) if t.numel() <= COPY_LIMIT]
            if any(not torch.equal(x, y) for x, y in zip(after, before)):
                return "wrong", f"an argument changed before the refusal ({exc})"
            return "ok", str(exc)
        return "unrefused", "no ValueError"
    before = compact((c.args, c.kwargs))
    fn = c.fn if c.fn is not None else getattr(_backend(device), c.op)
    if c.fn is not None and c.validate:
        OPS[c.op].validate(*c.args, **c.kwargs)  # a legal input, as the Backend would check it
    got = fn(*c.args, **c.kwargs)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    why = mismatch(c.op, got, OPS[c.op].reference(*before[0], **before[1]))
    return ("ok", "") if why is None else ("wrong", why)


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


_BACKENDS: dict = {}


def _backend(device: str):
    if device not in _BACKENDS:
        _BACKENDS[device] = sb.select(device, prefer="triton")
    return _BACKENDS[device]


def names(device: str) -> list[str]:
    """The cases that run on ``device`` (GPU-only ones left out on a CPU)."""
    cpu = torch.device(device).type == "cpu"
    return [n for n in CASES if not (cpu and n in GPU_ONLY)]


def main(argv: list[str]) -> int:
    device, start = "cpu", 0
    if "--device" in argv:
        i = argv.index("--device")
        device = argv[i + 1]
        del argv[i: i + 2]
    if "--start" in argv:
        i = argv.index("--start")
        start = int(argv[i + 1])
        del argv[i: i + 2]
    if os.environ.get("TRITON_INTERPRET") == "1":
        from swa_backends.testing.interpreter import scalar_index_compat

        scalar_index_compat()
    torch.set_num_threads(1)
    todo = argv or names(device)
    for i in range(start, len(todo)):
        t0 = time.time()
        try:
            outcome, why = run_case(todo[i], device)
        except Exception as exc:
            outcome, why = "error", f"{type(exc).__name__}: {str(exc)[:500]}"
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
        print(json.dumps({"i": i, "case": todo[i], "outcome": outcome, "detail": why,
                          "seconds": round(time.time() - t0, 2), "peak_rss_mib": round(rss)}), flush=True)
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps({"done": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
