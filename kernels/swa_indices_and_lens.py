"""``swa_indices_and_lens`` (SPEC §2.4) in Triton: a [tokens x columns] tile per program.

Each program finds its tokens' requests by binary search over ``query_start_loc``, applies
the clamp ``lo(p) = max(p - W + 1, 0, R)`` and translates ``lo(p) + j`` through the block
table; columns at or past ``lens`` (and invalid tokens' rows) are PAD. Every output
element is written exactly once (poisoned ``out=`` buffers come back fully defined).
"""

from __future__ import annotations

import torch
import triton.language as tl

from ..common.ops._batch import resolve_num_tokens
from ..common.types import INDEX_DTYPE
from ._device import PAD, find_request
from ._launch import Kernel, contiguous, jit

BLOCK_T = 32
BLOCK_W = 128


@jit
def _swa_indices_and_lens(qsl_ptr, seq_ptr, rs_ptr, bt_ptr, bt_s0, bt_s1, n_cols, valid_ptr, idx_ptr, idx_s0, lens_ptr,
                          B, T, width, n_steps, block_size, W,
                          HAS_VALID: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = t < T
    req = find_request(qsl_ptr, B, t, n_steps)
    ok = m & (req < B)
    if HAS_VALID:
        ok = ok & (tl.load(valid_ptr + t, mask=m, other=0) != 0)
    seq = tl.load(seq_ptr + req, mask=ok, other=0).to(tl.int64)
    end = tl.load(qsl_ptr + req + 1, mask=ok, other=0).to(tl.int64)
    R = tl.load(rs_ptr + req, mask=ok, other=0).to(tl.int64)
    pos = seq - end + t
    lo = tl.maximum(tl.maximum(pos - (W - 1), 0), R)  # the clamp contract
    lens = tl.where(ok, pos - lo + 1, 0)
    if tl.program_id(1) == 0:
        tl.store(lens_ptr + t, lens.to(tl.int32), mask=m)
    p = lo[:, None] + j[None, :]
    live = (j[None, :] < lens[:, None]) & ok[:, None]
    col = tl.minimum(tl.maximum(p // block_size, 0), n_cols - 1)
    row = req.to(tl.int64) * bt_s0
    block = tl.load(bt_ptr + row[:, None] + col * bt_s1, mask=live, other=0).to(tl.int64)
    slot = block * block_size + p % block_size
    out = tl.where(live, slot, PAD).to(tl.int32)
    tl.store(idx_ptr + t.to(tl.int64)[:, None] * idx_s0 + j[None, :], out, mask=m[:, None] & (j[None, :] < width))


_K = Kernel(_swa_indices_and_lens)


def swa_indices_and_lens(query_start_loc, seq_lens, block_table, block_size, W, replay_start, *,
                         index_width=None, valid=None, num_tokens=None, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, index_width], lens int32 [T])``.

    Token at position ``p``: ``lens = p - lo(p) + 1`` with ``lo(p) = max(p - W + 1, 0, R)``,
    ``indices[t, j] = slot(lo(p) + j)`` for ``j < lens`` through the block table, PAD after.
    Invalid tokens (past ``query_start_loc[B]`` or ``valid[t]`` False): ``lens = 0``, row
    all PAD. T is ``num_tokens``, else ``len(valid)``, else ``query_start_loc[-1]`` (a
    host read: pass ``num_tokens`` on a hot path or inside a graph). One launch.
    """
    T = resolve_num_tokens(query_start_loc, num_tokens, valid)
    width = W if index_width is None else index_width
    dev = query_start_loc.device
    if out is None:
        out = (torch.empty(T, width, dtype=INDEX_DTYPE, device=dev), torch.empty(T, dtype=INDEX_DTYPE, device=dev))
    indices, lens = out
    if T == 0:
        return out
    B = query_start_loc.shape[0] - 1
    has_valid = valid is not None
    grid = ((T + BLOCK_T - 1) // BLOCK_T, max(1, (width + BLOCK_W - 1) // BLOCK_W), 1)
    _K((has_valid,), grid,
       contiguous(query_start_loc), contiguous(seq_lens), contiguous(replay_start), block_table,
       block_table.stride(0), block_table.stride(1), block_table.shape[1], contiguous(valid) if has_valid else None,
       indices, indices.stride(0), lens, B, T, width, B.bit_length(), block_size, W, has_valid, BLOCK_T, BLOCK_W)
    return out
