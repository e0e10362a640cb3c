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

A validated call runs ``gather_rows_checked`` / ``scatter_rows_checked``: one pass tests every row
id (``range_check.py``); the copy is launched behind it gated on its word (``GATED``: it copies
nothing on a ``FAIL``), and the scatter's zero fill too (a Triton fill that reads the word, in place
of torch's memset).
"""

from __future__ import annotations

import math

import torch
import triton.language as tl

from ._device import FAIL
from ._launch import Kernel, contiguous, jit, next_pow2
from .range_check import check_ranges

TILE = 1024  # words per program (R_TILE * BLOCK_C)
MAX_BLOCK_C = 256  # 2 KiB of int64 words per row segment
_WORDS = {8: tl.int64, 4: tl.int32, 2: tl.int16, 1: tl.int8}
# dtypes handed to Triton as they are; any other (complex, ...) goes as a uint8 view of the
# same memory (the kernel only uses the base address: it moves words)
_NATIVE = {torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
           torch.int32, torch.int64, torch.bool}


@jit(align=("src_ptr", "dst_ptr"))
def _copy_rows(src_ptr, dst_ptr, idx_ptr, flag_ptr, n, ROW: tl.constexpr, WORD: tl.constexpr, SCATTER: tl.constexpr,
               R_TILE: tl.constexpr, BLOCK_C: tl.constexpr, GATED: tl.constexpr):
    if GATED:  # a validated gather behind its range pass: nothing on a FAIL
        if tl.load(flag_ptr) == FAIL:
            return
    r = tl.program_id(0) * R_TILE + tl.arange(0, R_TILE)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
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


@jit(align=("dst_ptr",))
def _fill_zero(dst_ptr, flag_ptr, n, WORD: tl.constexpr, BLOCK: tl.constexpr):
    """``n`` words of zeros, unless the verdict word says FAIL (a validated scatter's fill)."""
    if tl.load(flag_ptr) == FAIL:
        return
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    dst = dst_ptr.to(tl.pointer_type(WORD), bitcast=True)
    tl.store(dst + i, tl.zeros([BLOCK], WORD), mask=i < n)


_K = Kernel(_copy_rows)
_ZERO = Kernel(_fill_zero)
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


def _launch(src, dst, idx, n, scatter: bool, flag=None) -> None:
    word, row, r_tile, block_c = _plan(src, dst)
    if row == 0 or n == 0:
        return
    if src.dtype not in _NATIVE:
        src, dst = src.view(torch.uint8), dst.view(torch.uint8)
    gated = flag is not None
    key = (src.dtype, row, word, scatter, src.data_ptr() % 16 == 0, dst.data_ptr() % 16 == 0, gated)
    grid = ((n + r_tile - 1) // r_tile, (row + block_c - 1) // block_c, 1)
    _K(key, grid, src, dst, idx, flag if gated else idx, n, row, _WORDS[word], scatter, r_tile, block_c, gated)


def _values(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a lazy conjugate / negative bit applied in memory (the kernel moves bytes)."""
    return t.resolve_conj().resolve_neg()


def _gather(x, rows, out, flag) -> torch.Tensor:
    n = rows.shape[0]
    if out is None:
        out = torch.empty((n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    if n and x.shape[0]:
        _launch(contiguous(_values(x)), out, contiguous(rows), n, False, flag)
    return out


def gather_rows(x, rows, *, out=None) -> torch.Tensor:
    """``out[i] = x[rows[i]]`` for any trailing shape and dtype. One launch."""
    return _gather(x, rows, out, None)


def _scatter(y, rows, num_rows, out, flag) -> torch.Tensor:
    if out is None:
        out = (torch.zeros if flag is None else torch.empty)((num_rows, *y.shape[1:]), dtype=y.dtype, device=y.device)
    elif flag is None:
        out.zero_()
    if flag is not None:  # the fill gated on the verdict too: nothing written on a FAIL
        word, row, _, _ = _plan(out, out)
        words = num_rows * row
        if words:
            dst = out if out.dtype in _NATIVE else out.view(torch.uint8)
            # (a count past 2**31 is a 64-bit argument: a key of its own)
            key = (dst.dtype, word, dst.data_ptr() % 16 == 0, words >= 2**31)
            _ZERO(key, ((words + FILL_BLOCK - 1) // FILL_BLOCK, 1, 1), dst, flag, words, _WORDS[word], FILL_BLOCK)
    n = rows.shape[0]
    if n and num_rows:
        _launch(contiguous(_values(y)), out, contiguous(rows), n, True, flag)
    return out


def scatter_rows(y, rows, num_rows, *, out=None) -> torch.Tensor:
    """``out = zeros(num_rows, ...)``; ``out[rows[i]] = y[i]``. ``rows`` must be unique
    (a repeated row keeps an unspecified one of its values); trimmed rows are zero.
    A memset plus one launch."""
    return _scatter(y, rows, num_rows, out, None)


def gather_rows_checked(x, rows, *, out=None):
    """The validated form (``Variant.self_checked``) of a call whose host checks passed:
    ``(out, Verdict)``, the copy launched right behind the range pass and gated on its word (it
    copies nothing on a ``FAIL``), or None for a call it does not take (no row, or no row of x)."""
    if rows.shape[0] == 0 or x.shape[0] == 0:
        return None
    verdict = check_ranges(rows.device, [(rows, 0, x.shape[0] - 1)], per_stream=True)
    return _gather(x, rows, out, verdict.word), verdict


def scatter_rows_checked(y, rows, num_rows, *, out=None):
    """The validated form (``Variant.self_checked``) of a call whose host checks passed:
    ``(out, Verdict)``, the fill and the copy launched right behind the range pass and gated on
    its word (nothing written on a ``FAIL``), or None for a call it does not take (no row)."""
    if rows.shape[0] == 0:
        return None
    verdict = check_ranges(rows.device, [(rows, 0, num_rows - 1)], per_stream=True)
    return _scatter(y, rows, num_rows, out, verdict.word), verdict
