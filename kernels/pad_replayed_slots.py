"""``pad_replayed_slots`` (SPEC §2.2) in Triton: one lane per token, in place.

Each lane finds its request by binary search over ``query_start_loc`` and writes PAD into
the cacheable groups' rows only where the token replays; nothing else is stored, so the
window groups and the columns past ``query_start_loc[B]`` are never touched.

A validated call runs ``pad_replayed_slots_checked``: every program first tests every value the
validator tests (``query_start_loc`` from 0, non-decreasing, at most T; ``replay_start`` and
``positions`` in ``[0, MAX_POSITION]``; ``cacheable_groups`` in ``[0, G)``) and what
``check_writes`` tests (no row of ``slot_mappings`` shares a byte with an input, by address: the op's
quick check leaves that to it, ``OpSpec.writes_on_device``), all of them, so that each knows the
whole call's verdict before it stores; it stores nothing when one fails and leaves the verdict in
the call's word (``_verdict.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.ops._quick import apart
from ..common.ops.pad_replayed_slots import quick_check
from ..common.types import MAX_POSITION
from ._device import INTERPRETED, PAD, batch_chunk_bad, find_request, run_meets, verdict
from ._launch import Kernel, contiguous, jit
from ._verdict import open_verdict

BLOCK = 512
#: the most entries (tokens, requests, groups and slot rows) the checked kernel takes: every program reads
#: them all, so its work grows with their square; past this a validated call checks on the host
CHECKED_MAX = 32768
#: entries the checked kernel tests per step of its loop: a serving step's tokens (up to 4096) in
#: one step, one memory round trip (what the host waits for), with eight warps to hold them
CHECK_WIDE = 4096
#: slot rows the checked kernel tests for overlap per step (a model's few groups: one step)
ROWS = 16


@triton.jit
def _pad(slot_ptr, s_g, s_t, groups_ptr, n_groups, qsl_ptr, pos_ptr, rs_ptr, B, T, Wr, n_steps, BLOCK: tl.constexpr):
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = t < T
    req = find_request(qsl_ptr, B, t, n_steps)
    ok = m & (req < B)
    R = tl.load(rs_ptr + req, mask=ok, other=0).to(tl.int64)
    p = tl.load(pos_ptr + t, mask=ok, other=0)
    first = tl.load(pos_ptr + tl.load(qsl_ptr + req, mask=ok, other=0), mask=ok, other=0)
    replayed = ok & (R > 0) & (R <= first) & (p >= R) & (p < R + Wr)  # R above the first position: stale
    col = t.to(tl.int64) * s_t
    for k in range(n_groups):
        g = tl.load(groups_ptr + k).to(tl.int64)
        tl.store(slot_ptr + g * s_g + col, tl.full([BLOCK], PAD, tl.int64), mask=replayed)


@jit
def _pad_replayed_slots(slot_ptr, s_g, s_t, groups_ptr, n_groups, qsl_ptr, pos_ptr, rs_ptr, B, T, Wr, n_steps,
                        BLOCK: tl.constexpr):
    _pad(slot_ptr, s_g, s_t, groups_ptr, n_groups, qsl_ptr, pos_ptr, rs_ptr, B, T, Wr, n_steps, BLOCK)


@jit
def _pad_replayed_slots_checked(slot_ptr, s_g, s_t, groups_ptr, n_groups, qsl_ptr, pos_ptr, rs_ptr, flag_ptr, B, T,
                                Wr, n_steps, G, n_cols, max_p, BLOCK: tl.constexpr, CHECK: tl.constexpr,
                                ROWS: tl.constexpr):
    # the batch, the groups and the positions a chunk at a time, their loads together (one memory
    # round trip per chunk: program 0's checks are what the host waits for)
    k = tl.arange(0, CHECK)
    wrong = tl.zeros([CHECK], tl.int32)
    for s in range(0, tl.maximum(tl.maximum(B + 1, n_groups), T), CHECK):
        j = s + k
        grp = tl.load(groups_ptr + j, mask=j < n_groups, other=0)
        p = tl.load(pos_ptr + j, mask=j < T, other=0)
        wrong |= batch_chunk_bad(qsl_ptr, rs_ptr, rs_ptr, B, T, max_p, j, True, False, True)
        wrong |= ((grp < 0) | (grp > G - 1) | (p < 0) | (p > max_p)).to(tl.int32)
    bad = tl.max(wrong, axis=0)
    # check_writes: no slot row (a run of n_cols slots: s_t is 1 or n_cols 1) meets an input; a few
    # rows, arithmetic only
    r = tl.arange(0, ROWS)
    base = slot_ptr.to(tl.int64)
    for s in range(0, G, ROWS):
        j = s + r
        lo = base + j.to(tl.int64) * s_g * 8
        hi = lo + n_cols.to(tl.int64) * 8  # (a slot row may span past 2**31 bytes)
        meets = (run_meets(lo, hi, groups_ptr, n_groups) | run_meets(lo, hi, qsl_ptr, B + 1)
                 | run_meets(lo, hi, pos_ptr, T) | run_meets(lo, hi, rs_ptr, B))
        bad |= tl.max(((j < G) & meets).to(tl.int32), axis=0)
    verdict(flag_ptr, bad)
    if bad == 0:
        _pad(slot_ptr, s_g, s_t, groups_ptr, n_groups, qsl_ptr, pos_ptr, rs_ptr, B, T, Wr, n_steps, BLOCK)


_K = Kernel(_pad_replayed_slots)
_K_CHECKED = Kernel(_pad_replayed_slots_checked, options=lambda key: {"num_warps": 8})
_KEY = ()


def pad_replayed_slots(slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, Wr, *,
                       any_replay=None) -> torch.Tensor:
    """In place: ``slot_mappings[g, t] = PAD`` for ``g`` in ``cacheable_groups`` and every
    token ``t`` of a request with ``R > 0`` and ``R <= positions[t] < R + Wr``, unless ``R``
    is stale (above the request's first position).

    Window (non-cacheable) groups and columns past ``query_start_loc[B]`` are untouched.
    ``any_replay=False`` (host knowledge that every R is 0) returns without any launch.
    Returns ``slot_mappings``. One launch, no host synchronisation.
    """
    T = positions.shape[0]
    n_groups = cacheable_groups.shape[0]
    if any_replay is False or Wr == 0 or T == 0 or n_groups == 0:
        return slot_mappings
    B = query_start_loc.shape[0] - 1
    _K(_KEY, ((T + BLOCK - 1) // BLOCK, 1, 1),
       slot_mappings, slot_mappings.stride(0), slot_mappings.stride(1), contiguous(cacheable_groups), n_groups,
       contiguous(query_start_loc), contiguous(positions), contiguous(replay_start), B, T, Wr, B.bit_length(), BLOCK)
    return slot_mappings


def pad_replayed_slots_checked(home, slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, Wr, *,
                               any_replay=None):
    """The validated form (``Variant.self_checked``): the op's quick host checks (which leave the
    overlap of writes to the kernel), then the checked kernel: ``(slot_mappings, Verdict)``, or None
    for a call it does not take (one the quick checks cannot pass; one that launches nothing, whose
    values the validator still tests; past :data:`CHECKED_MAX` entries; in Triton's interpreter, slot
    rows whose span meets an input's)."""
    try:
        facts = quick_check(slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, Wr, any_replay)
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    if facts is None:
        return None
    dev, T, B, n_groups, G, n_cols, s0, s1 = facts
    if (any_replay is False or Wr == 0 or T == 0 or n_groups == 0 or T + B + n_groups + G > CHECKED_MAX
            or (home is not None and dev != home)):
        return None
    if INTERPRETED and not apart(slot_mappings, cacheable_groups, query_start_loc, positions, replay_start):
        return None  # the interpreter copies each tensor in and out: the validator judges an overlap here
    verdict = open_verdict(dev)
    # every tensor but slot_mappings is contiguous (no contiguous() call)
    _K_CHECKED(_KEY, ((T + BLOCK - 1) // BLOCK, 1, 1),
               slot_mappings, s0, s1, cacheable_groups, n_groups, query_start_loc, positions, replay_start,
               verdict.word, B, T, Wr, B.bit_length(), G, n_cols, MAX_POSITION, BLOCK, CHECK_WIDE, ROWS)
    return slot_mappings, verdict
