"""``gather_rows`` / ``scatter_rows`` (SPEC §3.3) in Triton: wide row copies.

Rows of any trailing shape and dtype are moved as machine words: the widest of 8/4/2/1
bytes that divides the row's byte size and both base addresses, so a 7168-wide bf16 row
is 1792 int64 words and each thread issues 16-byte accesses. The row length in words is
a constexpr (a model has one or two hidden sizes), the base pointers are specialised on
16-byte alignment, and every offset is computed in int64. A program copies an
``R_TILE x BLOCK_C`` tile: a few rows x 256 words (2 KiB) for wide rows, many rows for
narrow ones, so each thread keeps several independent 16-byte loads in flight.

``scatter_rows`` zero-fills the output (``Tensor.zero_``: a memset at full bandwidth) and
then scatters ``y``'s rows; trimmed rows stay zero.

A validated call runs ``gather_rows_checked`` / ``scatter_rows_checked``: checker programs in
front of the copy's (the scatter's: of its zero fill, a Triton fill in place of torch's memset) test
every row id and the others start once they pass (``range_check.py``); the scatter's copy behind
the fill reads the verdict word (``GATED``). Nothing is written on a ``FAIL``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..common.ops.rows import TRITON_DTYPES, as_row_bytes, quick_gather, quick_scatter
from ._device import FAIL
from ._launch import Kernel, contiguous, jit, next_pow2
from .range_check import CHECK, GATE, checkers, flat_bad, flat_tiles, open_checked, passed, settle

TILE = 1024  # words per program (R_TILE * BLOCK_C)
MAX_BLOCK_C = 256  # 2 KiB of int64 words per row segment
_WORDS = {8: tl.int64, 4: tl.int32, 2: tl.int16, 1: tl.int8}
# dtypes handed to Triton as they are; any other (complex, ...) goes as a uint8 view of the
# same memory (the kernel only uses the base address: it moves words)
_NATIVE = TRITON_DTYPES | {torch.bool}


@triton.jit
def _copy_tile(src_ptr, dst_ptr, idx_ptr, n, rt, ct, ROW: tl.constexpr, WORD: tl.constexpr, SCATTER: tl.constexpr,
               R_TILE: tl.constexpr, BLOCK_C: tl.constexpr):
    """Tile ``(rt, ct)``: rows ``rt * R_TILE + [0, R_TILE)``, words ``ct * BLOCK_C + [0, BLOCK_C)``."""
    r = rt * R_TILE + tl.arange(0, R_TILE)
    c = ct * BLOCK_C + tl.arange(0, BLOCK_C)
    rm = r < n
    picked = tl.load(idx_ptr + r, mask=rm, other=0).to(tl.int64)
    mine = r.to(tl.int64)
    if SCATTER:  # dst[idx[r]] = src[r]
        src_row, dst_row = mine, picked
    else:  # dst[r] = src[idx[r]]
        src_row, dst_row = picked, mine
    src = src_ptr.to(tl.pointer_type(WORD), bitcast=True)
    dst = dst_ptr.to(tl.pointer_type(WORD), bitcast=True)
    if ROW % BLOCK_C == 0:
        mask = rm[:, None]
    else:
        mask = rm[:, None] & (c[None, :] < ROW)
    v = tl.load(src + src_row[:, None] * ROW + c[None, :], mask=mask)
    tl.store(dst + dst_row[:, None] * ROW + c[None, :], v, mask=mask)


@jit(align=("src_ptr", "dst_ptr"))
def _copy_rows(src_ptr, dst_ptr, idx_ptr, flag_ptr, count_ptr, n, ROW: tl.constexpr, WORD: tl.constexpr,
               SCATTER: tl.constexpr, R_TILE: tl.constexpr, BLOCK_C: tl.constexpr, GATED: tl.constexpr,
               HAS_COUNT: tl.constexpr):
    if GATED:  # a validated scatter behind its checked fill: nothing on a FAIL
        if tl.load(flag_ptr) == FAIL:
            return
    if HAS_COUNT:  # a scatter of the first count rows; clamped, so that any value stays inside the tensors
        n = tl.minimum(tl.maximum(tl.load(count_ptr).to(tl.int64), 0), n)
    _copy_tile(src_ptr, dst_ptr, idx_ptr, n, tl.program_id(0), tl.program_id(1), ROW, WORD, SCATTER, R_TILE, BLOCK_C)


@jit(align=("src_ptr", "dst_ptr"))
def _copy_rows_checked(src_ptr, dst_ptr, idx_ptr, flag_ptr, scratch_ptr, n, high, c_tiles, P, epoch,
                       ROW: tl.constexpr, WORD: tl.constexpr, R_TILE: tl.constexpr, BLOCK_C: tl.constexpr,
                       CHECK: tl.constexpr, GATE: tl.constexpr, NAP: tl.constexpr):
    """A validated gather: ``P`` checker programs test every row id (``range_check.py``), the
    others copy tile ``pid - P`` once they pass."""
    pid = tl.program_id(0)
    if pid < P:
        settle(flat_bad(idx_ptr, n, 0, high, pid, P, CHECK), P, flag_ptr, scratch_ptr, epoch, GATE)
    elif passed(scratch_ptr, epoch, GATE, NAP):
        w = pid - P
        _copy_tile(src_ptr, dst_ptr, idx_ptr, n, w // c_tiles, w % c_tiles, ROW, WORD, False, R_TILE, BLOCK_C)


@jit(align=("dst_ptr",))
def _fill_zero_checked(dst_ptr, idx_ptr, flag_ptr, scratch_ptr, count_ptr, n_idx, high, n, P, epoch,
                       WORD: tl.constexpr, BLOCK: tl.constexpr, CHECK: tl.constexpr, GATE: tl.constexpr,
                       NAP: tl.constexpr, HAS_COUNT: tl.constexpr):
    """A validated scatter's zero fill: ``P`` checker programs test every row id (checker 0 also
    the count: in ``[0, n_idx]``), the others fill ``BLOCK`` words each once they pass (the copy
    behind it reads the verdict word)."""
    pid = tl.program_id(0)
    if pid < P:
        bad = flat_bad(idx_ptr, n_idx, 0, high, pid, P, CHECK)
        if HAS_COUNT:
            c = tl.load(count_ptr).to(tl.int64)
            bad |= ((pid == 0) & ((c < 0) | (c > n_idx))).to(tl.int32)
        settle(bad, P, flag_ptr, scratch_ptr, epoch, GATE)
    elif passed(scratch_ptr, epoch, GATE, NAP):
        i = (pid - P).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        dst = dst_ptr.to(tl.pointer_type(WORD), bitcast=True)
        tl.store(dst + i, tl.zeros([BLOCK], WORD), mask=i < n)


_K = Kernel(_copy_rows)
_K_CHECKED = Kernel(_copy_rows_checked)
_ZERO = Kernel(_fill_zero_checked)
FILL_BLOCK = 2048


def _plan(src: torch.Tensor, dst: torch.Tensor):
    """(word bytes, row length in words, R_TILE, BLOCK_C) for rows of ``src``/``dst``."""
    row_bytes = math.prod(src.shape[1:]) * src.element_size()
    a, b = src.data_ptr(), dst.data_ptr()
    word = 8
    while word > 1 and (row_bytes % word or a % word or b % word):
        word //= 2
    row = row_bytes // word
    block_c = min(MAX_BLOCK_C, next_pow2(row))
    return word, row, max(1, TILE // block_c), block_c


def _launch(src, dst, idx, n, scatter: bool, flag=None, count=None) -> None:
    word, row, r_tile, block_c = _plan(src, dst)
    if row == 0 or n == 0:
        return
    if src.dtype not in _NATIVE:
        src, dst = as_row_bytes(src, src.shape[0]), as_row_bytes(dst, dst.shape[0])
    gated = flag is not None
    has_count = count is not None
    key = (src.dtype, row, word, scatter, src.data_ptr() % 16 == 0, dst.data_ptr() % 16 == 0,
           count.dtype if has_count else None, gated)
    grid = ((n + r_tile - 1) // r_tile, (row + block_c - 1) // block_c, 1)
    _K(key, grid, src, dst, idx, flag if gated else idx, count if has_count else idx, n, row, _WORDS[word], scatter,
       r_tile, block_c, gated, has_count)


def _values(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a lazy conjugate / negative bit applied in memory (the kernel moves bytes)."""
    return t.resolve_conj().resolve_neg()


def gather_rows(x, rows, *, out=None) -> torch.Tensor:
    """``out[i] = x[rows[i]]`` for any trailing shape and dtype. One launch."""
    n = rows.shape[0]
    if out is None:
        out = torch.empty((n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    if n and x.shape[0]:
        _launch(contiguous(_values(x)), out, contiguous(rows), n, False)
    return out


def scatter_rows(y, rows, num_rows, *, count=None, out=None) -> torch.Tensor:
    """``out = zeros(num_rows, ...)``; ``out[rows[i]] = y[i]`` for ``i < count`` (every ``i``
    without one: the reference's semantics). A memset plus one launch (which reads ``count`` on
    the device)."""
    if out is None:
        out = torch.zeros((num_rows, *y.shape[1:]), dtype=y.dtype, device=y.device)
    else:
        out.zero_()
    n = rows.shape[0]
    if n and num_rows:
        _launch(contiguous(_values(y)), out, contiguous(rows), n, True, count=count)
    return out


def gather_rows_checked(home, x, rows, *, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(out, Verdict)`` from one launch whose checker programs test every row id and whose other
    programs copy once they pass (nothing on a ``FAIL``); None for a call it does not take (no
    row, no row of x, or rows of no bytes)."""
    try:
        if not quick_gather(x, rows, out=out):
            return None
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    n = rows.shape[0]
    dev = x.device
    if n == 0 or x.shape[0] == 0 or (home is not None and dev != home):
        return None
    if out is None:
        out = torch.empty((n, *x.shape[1:]), dtype=x.dtype, device=dev)
    src, idx = contiguous(_values(x)), contiguous(rows)
    word, row, r_tile, block_c = _plan(src, out)
    if row == 0:
        return None
    dst = out
    if src.dtype not in _NATIVE:
        src, dst = as_row_bytes(src, src.shape[0]), as_row_bytes(dst, dst.shape[0])
    verdict, scratch, epoch, nap = open_checked(idx.device)
    P = checkers(flat_tiles(n))
    c_tiles = (row + block_c - 1) // block_c
    key = (src.dtype, row, word, src.data_ptr() % 16 == 0, dst.data_ptr() % 16 == 0, nap)
    _K_CHECKED(key, (P + (n + r_tile - 1) // r_tile * c_tiles, 1, 1), src, dst, idx, verdict.word, scratch, n,
               x.shape[0] - 1, c_tiles, P, epoch, row, _WORDS[word], r_tile, block_c, CHECK, GATE, nap)
    return out, verdict


def scatter_rows_checked(home, y, rows, num_rows, *, count=None, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(out, Verdict)``: the zero fill's launch has checker programs that test every row id and
    the count (its other programs fill once they pass), the copy behind it reads the verdict word
    (nothing written on a ``FAIL``); None for a call it does not take (no row, or an output of no
    bytes)."""
    try:
        if not quick_scatter(y, rows, num_rows, count=count, out=out):
            return None
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    n = rows.shape[0]
    dev = y.device
    if n == 0 or (home is not None and dev != home):
        return None
    if out is None:
        out = torch.empty((num_rows, *y.shape[1:]), dtype=y.dtype, device=dev)
    word, row, _, _ = _plan(out, out)
    words = num_rows * row
    if not words:
        return None
    idx = contiguous(rows)
    dst = out if out.dtype in _NATIVE else as_row_bytes(out, out.shape[0])
    verdict, scratch, epoch, nap = open_checked(idx.device)
    P = checkers(flat_tiles(n))
    has_count = count is not None
    # (a count past 2**31 is a 64-bit argument: a key of its own)
    key = (dst.dtype, word, dst.data_ptr() % 16 == 0, words >= 2**31, nap, count.dtype if has_count else None)
    _ZERO(key, (P + (words + FILL_BLOCK - 1) // FILL_BLOCK, 1, 1), dst, idx, verdict.word, scratch,
          count if has_count else idx, n, num_rows - 1, words, P, epoch, _WORDS[word], FILL_BLOCK, CHECK, GATE, nap,
          has_count)
    _launch(contiguous(_values(y)), out, idx, n, True, verdict.word, count)
    return out, verdict
