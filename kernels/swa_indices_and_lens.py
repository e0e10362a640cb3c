"""``swa_indices_and_lens`` (SPEC §2.4) in Triton: a [tokens x columns] tile per program.

Each program finds its ``BLOCK_T`` tokens' requests by binary search over
``query_start_loc`` (one round trip to warm the array, then cache hits), applies the clamp
``lo(p) = max(p - W + 1, 0, R)`` once per token, splits ``lo`` into a block-table column
and an offset once per token, and then writes each token's row of ``BLOCK_W`` columns:
column ``j`` is block-table column ``col(lo) + (off(lo) + j) // block_size`` (shifts and
masks for a power-of-two block size, the common case; an integer division otherwise),
looked up through the block table (a row's lanes hit the same few entries: cache
broadcasts), and one contiguous store per row. 32-bit arithmetic throughout (positions
and slots are int32); 64-bit only for the row offsets. Columns at or past ``lens`` (and
invalid tokens' rows) are PAD. Every output element is written exactly once (poisoned
``out=`` buffers come back fully defined).

A validated call whose token count is known on the host (``num_tokens`` or ``valid``) runs
``swa_indices_and_lens_checked``: every program first tests every value the validator tests
(``query_start_loc`` from 0, non-decreasing, at most T unless ``token_offset``; ``seq_lens`` at
least the query length, it and ``replay_start`` in ``[0, MAX_POSITION]``; every block-table entry a
request's positions read a block id whose slots fit in int32), stores nothing when one fails and
leaves the verdict in the call's word (``_verdict.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.ops.swa_indices_and_lens import quick_check
from ..common.ops._batch import resolve_num_tokens
from ..common.types import INDEX_DTYPE, MAX_POSITION
from ..common.validation import INT32_MAX
from ._device import CHECK, PAD, batch_bad, block_split, find_request, pow2_shift, table_bad, verdict
from ._launch import Kernel, contiguous, jit
from ._verdict import open_verdict

BLOCK_T = 16
BLOCK_W = 128
#: the checked kernel's tile of the block table (requests x columns)
CHECK_B, CHECK_C = 64, 64
#: the most tokens, and block-table entries (requests x columns), the checked kernel takes: every
#: program reads every request's values and table entries
CHECKED_MAX, CHECKED_TABLE_MAX = 16384, 65536


@triton.jit
def _rows(qsl_ptr, seq_ptr, rs_ptr, bt_ptr, bt_s0, bt_s1, n_cols, valid_ptr, idx_ptr, idx_s0, lens_ptr,
          B, T, t_off, width, n_steps, block_size, bs_shift, W,
          HAS_VALID: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # output row; batch token t + t_off
    j = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = t < T
    # t + t_off saturated at INT32_MAX (t_off <= INT32_MAX): a row past INT32_MAX is past
    # query_start_loc[B] (int32) like the saturated one, where t + t_off would wrap negative
    ta = tl.minimum(t, 2147483647 - t_off) + t_off
    req = find_request(qsl_ptr, B, ta, n_steps)
    ok = m & (req < B)
    if HAS_VALID:
        ok = ok & (tl.load(valid_ptr + t, mask=m, other=0) != 0)
    seq = tl.load(seq_ptr + req, mask=ok, other=0)
    start = tl.load(qsl_ptr + req, mask=ok, other=0)
    end = tl.load(qsl_ptr + req + 1, mask=ok, other=0)
    R = tl.load(rs_ptr + req, mask=ok, other=0)
    R = tl.where(R <= seq - (end - start), R, 0)  # a stale replay start (above the first position) clamps nothing
    pos = seq - (end - ta)
    lo = tl.maximum(tl.maximum(pos - (W - 1), 0), R)  # the clamp contract
    lens = tl.where(ok, pos - lo + 1, 0)
    if tl.program_id(1) == 0:
        tl.store(lens_ptr + t, lens, mask=m)
    lo_col, lo_off = block_split(lo, block_size, bs_shift)
    live = (j[None, :] < lens[:, None]) & ok[:, None]
    nb, within = block_split(lo_off[:, None] + j[None, :], block_size, bs_shift)
    col = tl.minimum(lo_col[:, None] + nb, n_cols - 1)  # -1 only for an empty table: block 0, as the reference
    row = req.to(tl.int64) * bt_s0
    block = tl.load(bt_ptr + row[:, None] + col.to(tl.int64) * bt_s1, mask=live & (col >= 0), other=0)
    out = tl.where(live, block * block_size + within, PAD)
    tl.store(idx_ptr + t.to(tl.int64)[:, None] * idx_s0 + j[None, :], out, mask=m[:, None] & (j[None, :] < width))


@jit
def _swa_indices_and_lens(qsl_ptr, seq_ptr, rs_ptr, bt_ptr, bt_s0, bt_s1, n_cols, valid_ptr, idx_ptr, idx_s0, lens_ptr,
                          B, T, t_off, width, n_steps, block_size, bs_shift, W,
                          HAS_VALID: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    _rows(qsl_ptr, seq_ptr, rs_ptr, bt_ptr, bt_s0, bt_s1, n_cols, valid_ptr, idx_ptr, idx_s0, lens_ptr, B, T, t_off,
          width, n_steps, block_size, bs_shift, W, HAS_VALID, BLOCK_T, BLOCK_W)


@jit
def _swa_indices_and_lens_checked(qsl_ptr, seq_ptr, rs_ptr, bt_ptr, bt_s0, bt_s1, n_cols, valid_ptr, idx_ptr, idx_s0,
                                  lens_ptr, flag_ptr, B, T, t_off, width, n_steps, block_size, bs_shift, W, qsl_max,
                                  top, max_p, HAS_VALID: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
                                  CHECK: tl.constexpr, CHECK_B: tl.constexpr, CHECK_C: tl.constexpr):
    bad = (batch_bad(qsl_ptr, seq_ptr, rs_ptr, B, qsl_max, max_p, True, True, True, CHECK)
           | table_bad(bt_ptr, bt_s0, bt_s1, n_cols, seq_ptr, B, block_size, top, 0, 1, CHECK_B, CHECK_C))
    verdict(flag_ptr, bad)
    if bad == 0:
        _rows(qsl_ptr, seq_ptr, rs_ptr, bt_ptr, bt_s0, bt_s1, n_cols, valid_ptr, idx_ptr, idx_s0, lens_ptr, B, T, t_off,
              width, n_steps, block_size, bs_shift, W, HAS_VALID, BLOCK_T, BLOCK_W)


_K = Kernel(_swa_indices_and_lens)
_K_CHECKED = Kernel(_swa_indices_and_lens_checked)


def swa_indices_and_lens(query_start_loc, seq_lens, block_table, block_size, W, replay_start, *,
                         index_width=None, valid=None, num_tokens=None, token_offset=None,
                         out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, index_width], lens int32 [T])``.

    Token at position ``p``: ``lens = p - lo(p) + 1`` with ``lo(p) = max(p - W + 1, 0, R)``
    (a stale ``R``, above the request's first position, counts as 0),
    ``indices[t, j] = slot(lo(p) + j)`` for ``j < lens`` through the block table, PAD after.
    Invalid tokens (past ``query_start_loc[B]`` or ``valid[t]`` False): ``lens = 0``, row
    all PAD. T is ``num_tokens``, else ``len(valid)``, else ``query_start_loc[-1]`` (a
    host read: pass ``num_tokens`` on a hot path or inside a graph). Row ``t`` is batch token
    ``token_offset + t``. One launch.
    """
    return _launch(query_start_loc, seq_lens, block_table, block_size, W, replay_start, index_width, valid,
                   resolve_num_tokens(query_start_loc, num_tokens, valid, token_offset or 0), token_offset, out,
                   query_start_loc.device, query_start_loc.shape[0] - 1, block_table.stride(0), block_table.stride(1),
                   block_table.shape[1])


def _launch(query_start_loc, seq_lens, block_table, block_size, W, replay_start, index_width, valid, T, token_offset,
            out, dev, B, bt_s0, bt_s1, n_cols, verdict=None):
    off = token_offset or 0
    width = W if index_width is None else index_width
    if out is None:
        out = (torch.empty(T, width, dtype=INDEX_DTYPE, device=dev), torch.empty(T, dtype=INDEX_DTYPE, device=dev))
    indices, lens = out
    if T == 0:
        return out
    has_valid = valid is not None
    grid = ((T + BLOCK_T - 1) // BLOCK_T, max(1, (width + BLOCK_W - 1) // BLOCK_W), 1)
    tail = (B, T, off, width, B.bit_length(), block_size, pow2_shift(block_size), W)
    if verdict is None:
        _K((has_valid,), grid, contiguous(query_start_loc), contiguous(seq_lens), contiguous(replay_start), block_table,
           bt_s0, bt_s1, n_cols, contiguous(valid) if has_valid else None, indices, indices.stride(0), lens, *tail,
           has_valid, BLOCK_T, BLOCK_W)
    else:
        # the quick check passed: the 1-D tensors are contiguous. query_start_loc ends at most at T,
        # unless the rows are a window of the batch's tokens
        _K_CHECKED((has_valid,), grid, query_start_loc, seq_lens, replay_start, block_table, bt_s0, bt_s1, n_cols,
                   valid, indices, indices.stride(0), lens, verdict.word, *tail, T if token_offset is None else -1,
                   (INT32_MAX - block_size + 1) // block_size, MAX_POSITION, has_valid, BLOCK_T, BLOCK_W, CHECK,
                   CHECK_B, CHECK_C)
    return out
    B = query_start_loc.shape[0] - 1
    has_valid = valid is not None
    grid = ((T + BLOCK_T - 1) // BLOCK_T, max(1, (width + BLOCK_W - 1) // BLOCK_W), 1)
    head = (contiguous(query_start_loc), contiguous(seq_lens), contiguous(replay_start), block_table,
            block_table.stride(0), block_table.stride(1), block_table.shape[1], contiguous(valid) if has_valid else None,
            indices, indices.stride(0), lens)
    tail = (B, T, off, width, B.bit_length(), block_size, pow2_shift(block_size), W)
    if verdict is None:
        _K((has_valid,), grid, *head, *tail, has_valid, BLOCK_T, BLOCK_W)
    else:
        # query_start_loc ends at most at T, unless the rows are a window of the batch's tokens
        _K_CHECKED((has_valid,), grid, *head, verdict.word, *tail, T if token_offset is None else -1,
                   (INT32_MAX - block_size + 1) // block_size, MAX_POSITION, has_valid, BLOCK_T, BLOCK_W, CHECK,
                   CHECK_B, CHECK_C)
    return out


def swa_indices_and_lens_checked(home, query_start_loc, seq_lens, block_table, block_size, W, replay_start, *,
                                 index_width=None, valid=None, num_tokens=None, token_offset=None, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(out, Verdict)``, or None for a call it does not take (T read off ``query_start_loc``: neither
    ``num_tokens`` nor ``valid``; no token; past :data:`CHECKED_MAX` tokens or
    :data:`CHECKED_TABLE_MAX` table entries)."""
    try:
        facts = quick_check(query_start_loc, seq_lens, block_table, block_size, W, replay_start,
                            index_width=index_width, valid=valid, num_tokens=num_tokens, token_offset=token_offset,
                            out=out)
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    if facts is None or (num_tokens is None and valid is None):
        return None
    dev, B, bt_s0, bt_s1, n_cols = facts
    T = num_tokens if num_tokens is not None else valid.shape[0]
    if T == 0 or T + B > CHECKED_MAX or B * n_cols > CHECKED_TABLE_MAX or (home is not None and dev != home):
        return None
    verdict = open_verdict(dev)
    out = _launch(query_start_loc, seq_lens, block_table, block_size, W, replay_start, index_width, valid, T,
                  token_offset, out, dev, B, bt_s0, bt_s1, n_cols, verdict)
    return out, verdict
