"""``compressed_slot_mapping`` (SPEC §2.3) in Triton: one lane per token.

A validated call with ``ratio > 1`` runs ``compressed_slot_mapping_checked``: every program first
tests every value the validator tests (``query_start_loc`` from 0, non-decreasing, at most T;
``seq_lens`` at least the query length and in ``[0, MAX_POSITION]``; every token slot PAD or at
least 0; every block-table entry a request's positions read a block id whose slots fit in int32),
stores nothing when one fails and leaves the verdict in the call's word (``_verdict.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.ops.compressed_slot_mapping import quick_check
from ..common.types import MAX_POSITION, SLOT_DTYPE
from ..common.validation import INT32_MAX
from ._device import CHECK, PAD, batch_chunk_bad, find_request, table_bad, verdict
from ._launch import Kernel, contiguous, jit
from ._verdict import open_verdict

BLOCK = 512
#: the checked kernel's tile of the block table (requests x columns)
CHECK_B, CHECK_C = 64, 64
#: the most tokens, and block-table entries (requests x columns), the checked kernel takes: every
#: program reads them all
CHECKED_MAX, CHECKED_TABLE_MAX = 32768, 65536


@triton.jit
def _map(tok_ptr, qsl_ptr, seq_ptr, bt_ptr, bt_s0, bt_s1, n_cols, out_ptr, B, T, n_steps, bs_c, ratio, null_block,
         BLOCK: tl.constexpr):
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


@jit
def _compressed_slot_mapping(tok_ptr, qsl_ptr, seq_ptr, bt_ptr, bt_s0, bt_s1, n_cols, out_ptr, B, T, n_steps,
                             bs_c, ratio, null_block, BLOCK: tl.constexpr):
    _map(tok_ptr, qsl_ptr, seq_ptr, bt_ptr, bt_s0, bt_s1, n_cols, out_ptr, B, T, n_steps, bs_c, ratio, null_block,
         BLOCK)


@triton.jit
def _values_bad(tok_ptr, qsl_ptr, seq_ptr, B, T, max_p, CHECK: tl.constexpr):
    """``_device.batch_bad``'s checks of the batch and every token slot PAD or at least 0, in one loop:
    a step's loads of both issued together, one memory round trip a step where two loops took one each
    (the first program's checks are what the host waits for)."""
    k = tl.arange(0, CHECK)
    bad = tl.zeros([CHECK], tl.int32)
    for s in range(0, tl.maximum(B + 1, T), CHECK):
        slot = tl.load(tok_ptr + s + k, mask=s + k < T, other=0)
        bad |= (batch_chunk_bad(qsl_ptr, seq_ptr, seq_ptr, B, T, max_p, s + k, True, True, False)
                | (slot < PAD).to(tl.int32))
    return tl.max(bad, axis=0)


@jit
def _compressed_slot_mapping_checked(tok_ptr, qsl_ptr, seq_ptr, bt_ptr, bt_s0, bt_s1, n_cols, out_ptr, flag_ptr, B, T,
                                     n_steps, bs_c, ratio, null_block, block_size, top, max_p, BLOCK: tl.constexpr,
                                     CHECK: tl.constexpr, CHECK_B: tl.constexpr, CHECK_C: tl.constexpr):
    bad = (_values_bad(tok_ptr, qsl_ptr, seq_ptr, B, T, max_p, CHECK)
           | table_bad(bt_ptr, bt_s0, bt_s1, n_cols, seq_ptr, B, block_size, top, 0, 1, CHECK_B, CHECK_C))
    verdict(flag_ptr, bad)
    if bad == 0:
        _map(tok_ptr, qsl_ptr, seq_ptr, bt_ptr, bt_s0, bt_s1, n_cols, out_ptr, B, T, n_steps, bs_c, ratio, null_block,
             BLOCK)


_K = Kernel(_compressed_slot_mapping)
_K_CHECKED = Kernel(_compressed_slot_mapping_checked)
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


def compressed_slot_mapping_checked(home, token_slots, query_start_loc, seq_lens, block_table, block_size, ratio, *,
                                    null_block=0, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(out, Verdict)``, or None for a call it does not take (ratio 1, a copy; no token; past
    :data:`CHECKED_MAX` tokens or :data:`CHECKED_TABLE_MAX` table entries)."""
    try:
        facts = quick_check(token_slots, query_start_loc, seq_lens, block_table, block_size, ratio,
                            null_block=null_block, out=out)
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    if facts is None:
        return None
    dev, T, B, bt_s0, bt_s1, n_cols = facts
    if (ratio == 1 or T == 0 or T + B > CHECKED_MAX or B * n_cols > CHECKED_TABLE_MAX
            or (home is not None and dev != home)):
        return None
    if out is None:
        out = torch.empty(T, dtype=SLOT_DTYPE, device=dev)
    bs_c = block_size // ratio
    verdict = open_verdict(dev)
    # every tensor but the block table is contiguous (no contiguous() call)
    _K_CHECKED(_KEY, ((T + BLOCK - 1) // BLOCK, 1, 1),
               token_slots, query_start_loc, seq_lens, block_table, bt_s0, bt_s1, n_cols, out, verdict.word, B, T,
               B.bit_length(), bs_c, ratio, -1 if null_block is None else null_block, block_size,
               (INT32_MAX - bs_c + 1) // bs_c, MAX_POSITION, BLOCK, CHECK, CHECK_B, CHECK_C)
    return out, verdict
