"""``pad_replayed_slots`` (SPEC §2.2) in Triton: one lane per token, in place.

Each lane finds its request by binary search over ``query_start_loc`` and writes PAD into
the cacheable groups' rows only where the token replays; nothing else is stored, so the
window groups and the columns past ``query_start_loc[B]`` are never touched.
"""

from __future__ import annotations

import torch
import triton.language as tl

from ._device import PAD, find_request
from ._launch import Kernel, contiguous, jit

BLOCK = 512


@jit
def _pad_replayed_slots(slot_ptr, s_g, s_t, groups_ptr, n_groups, qsl_ptr, pos_ptr, rs_ptr, B, T, Wr, n_steps,
                        BLOCK: tl.constexpr):
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


_K = Kernel(_pad_replayed_slots)
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
