"""``compressed_slot_mapping`` (SPEC §2.3) in Triton: one lane per token."""

from __future__ import annotations

import torch
import triton.language as tl

from ..common.types import SLOT_DTYPE
from ._device import PAD, find_request
from ._launch import Kernel, contiguous, jit

BLOCK = 512


@jit
def _compressed_slot_mapping(tok_ptr, qsl_ptr, seq_ptr, bt_ptr, bt_s0, bt_s1, n_cols, out_ptr, B, T, n_steps,
                             bs_c, ratio, null_block, BLOCK: tl.constexpr):
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = t < T
    req = find_request(qsl_ptr, B, t, n_steps)
    ok = m & (req < B)
    seq = tl.load(seq_ptr + req, mask=ok, other=0).to(tl.int64)
    end = tl.load(qsl_ptr + req + 1, mask=ok, other=0).to(tl.int64)
    pos = seq - end + t  # seq_len - q + offset in the request
    cp = pos // ratio
    col = tl.minimum(tl.maximum(cp // bs_c, 0), n_cols - 1)  # -1 only for an empty table
    block = tl.load(bt_ptr + req.to(tl.int64) * bt_s0 + col * bt_s1, mask=ok & (col >= 0), other=0).to(tl.int64)
    slot = block * bs_c + cp % bs_c
    tok = tl.load(tok_ptr + t, mask=m, other=PAD)
    writes = ok & ((pos + 1) % ratio == 0) & (tok != PAD) & (block != null_block)  # -1: no null block
    tl.store(out_ptr + t, tl.where(writes, slot, PAD), mask=m)


_K = Kernel(_compressed_slot_mapping)
_KEY = ()


def compressed_slot_mapping(token_slots, query_start_loc, seq_lens, block_table, block_size, ratio, *,
                            null_block=0, out=None) -> torch.Tensor:
    """int64 [T]: token ``t`` at position ``p`` of request ``b`` writes a compressed entry
    only at closing positions ``(p + 1) % ratio == 0`` whose own token slot is not PAD, at
    ``block_table[b, (p // ratio) // bs_c] * bs_c + (p // ratio) % bs_c`` with
    ``bs_c = block_size // ratio``, unless that block is ``null_block`` (the engine's shared
    null block; None: none); everything else is PAD. ``ratio == 1`` copies
    ``token_slots``. One launch (a copy for ratio 1), no host synchronisation.
    """
    T = token_slots.shape[0]
    if out is None:
        out = torch.empty(T, dtype=SLOT_DTYPE, device=token_slots.device)
    if ratio == 1:
        return out.copy_(token_slots)
    if T == 0:
        return out
    B = query_start_loc.shape[0] - 1
    _K(_KEY, ((T + BLOCK - 1) // BLOCK, 1, 1),
       contiguous(token_slots), contiguous(query_start_loc), contiguous(seq_lens), block_table,
       block_table.stride(0), block_table.stride(1), block_table.shape[1], out, B, T, B.bit_length(),
       block_size // ratio, ratio, -1 if null_block is None else null_block, BLOCK)
    return out
