"""``swa_indices_and_lens`` for triton-ascend: tokens in a grid-stride loop, one clamped
window row per token (binary search for its request, then ``BLOCK_W`` columns at a time)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ....common.ops._batch import resolve_num_tokens
from ....common.types import INDEX_DTYPE
from ._launch import core_count, search_steps
from ._search import request_of

MAX_BLOCK_W = 256


@triton.jit
def _swa_kernel(qsl_ptr, seq_ptr, r_ptr, table_ptr, table_stride, n_cols, valid_ptr, idx_ptr, lens_ptr,
                T, t_off, B, block_size, W, width,
                HAS_VALID: tl.constexpr, STEPS: tl.constexpr, BLOCK_W: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_W)
    for t_ in range(pid, T, nprog):
        t = pid * 0 + t_  # a tensor in both compiled and interpreted mode; the output row
        # the batch token it describes, saturated at INT32_MAX (t_off <= INT32_MAX): a row past
        # it is past query_start_loc[B] (int32) like the saturated one, where t + t_off wraps
        ta = tl.minimum(t, 2147483647 - t_off) + t_off
        b = request_of(qsl_ptr, ta, B, STEPS)
        ok = b < B
        if HAS_VALID:  # constexpr switch: the caller's extra mask of padded tokens
            ok = ok & (tl.load(valid_ptr + t).to(tl.int1))
        start = tl.load(qsl_ptr + b, mask=ok, other=0)
        end = tl.load(qsl_ptr + b + 1, mask=ok, other=0)
        seq = tl.load(seq_ptr + b, mask=ok, other=0)
        R = tl.load(r_ptr + b, mask=ok, other=0)
        R = tl.where(R <= seq - (end - start), R, 0)  # a stale replay start (above the first position): none
        pos = seq - (end - start) + (ta - start)
        lo = tl.maximum(tl.maximum(pos - W + 1, 0), R)  # the clamp contract
        n = tl.where(ok, pos - lo + 1, 0)
        tl.store(lens_ptr + t, n)
        row = table_ptr + b.to(tl.int64) * table_stride
        out = idx_ptr + t.to(tl.int64) * width
        for j0 in range(0, width, BLOCK_W):
            j = j0 + cols
            live = j < n
            p = (lo + j).to(tl.int64)
            # a table shorter than the positions: its last column, as the reference reads it
            # (-1 only for an empty table: block 0)
            col = tl.minimum(p // block_size, n_cols - 1)
            blk = tl.load(row + col, mask=live & (col >= 0), other=0).to(tl.int64)
            slot = blk * block_size + p % block_size
            tl.store(out + j, tl.where(live, slot, -1).to(tl.int32), mask=j < width)


def swa_indices_and_lens(query_start_loc, seq_lens, block_table, block_size, W, replay_start, *,
                         index_width=None, valid=None, num_tokens=None, token_offset=None, out=None):
    """The reference's ``(indices, lens)``; T as the reference resolves it; row ``t`` is batch
    token ``token_offset + t``."""
    off = token_offset or 0
    T = resolve_num_tokens(query_start_loc, num_tokens, valid, off)
    width = W if index_width is None else index_width
    dev = query_start_loc.device
    if out is None:
        out = (torch.empty((T, width), dtype=INDEX_DTYPE, device=dev), torch.empty((T,), dtype=INDEX_DTYPE, device=dev))
    idx, lens = out
    if T == 0:
        return out
    B = query_start_loc.shape[0] - 1
    table = block_table.contiguous()
    dst_idx = idx if idx.is_contiguous() else torch.empty_like(idx, memory_format=torch.contiguous_format)
    block_w = min(MAX_BLOCK_W, triton.next_power_of_2(max(width, 1)))
    programs = max(1, min(core_count(str(dev)), T))
    qsl = query_start_loc.contiguous()  # the 1-D inputs are read at unit stride
    _swa_kernel[(programs,)](
        qsl, seq_lens.contiguous(), replay_start.contiguous(), table, table.stride(0), table.shape[1],
        valid.contiguous() if valid is not None else qsl, dst_idx, lens,
        T, off, B, block_size, W, width,
        HAS_VALID=valid is not None, STEPS=search_steps(B), BLOCK_W=block_w)
    if dst_idx is not idx:
        idx.copy_(dst_idx)
    return out
