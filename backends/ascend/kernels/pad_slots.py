"""``pad_replayed_slots`` for triton-ascend: tokens in a grid-stride loop; a replayed token
writes PAD into each cacheable group's row (in place)."""

from __future__ import annotations

import triton
import triton.language as tl

from ._launch import core_count, search_steps
from ._search import request_of


@triton.jit
def _pad_kernel(slots_ptr, slots_stride, slots_col_stride, groups_ptr, num_groups, qsl_ptr, pos_ptr, r_ptr, T, B, Wr,
                STEPS: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for t_ in range(pid, T, nprog):
        t = pid * 0 + t_  # a tensor in both compiled and interpreted mode
        b = request_of(qsl_ptr, t, B, STEPS)
        ok = b < B
        R = tl.load(r_ptr + b, mask=ok, other=0).to(tl.int64)
        p = tl.load(pos_ptr + t)
        first = tl.load(pos_ptr + tl.load(qsl_ptr + b, mask=ok, other=0), mask=ok, other=0)
        replayed = ok & (R > 0) & (R <= first) & (p >= R) & (p < R + Wr)  # R above the first position: stale
        for gi in range(0, num_groups):
            g = tl.load(groups_ptr + gi).to(tl.int64)
            tl.store(slots_ptr + g * slots_stride + t.to(tl.int64) * slots_col_stride, -1, mask=replayed)  # -1: PAD


def pad_replayed_slots(slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, Wr, *,
                       any_replay=None):
    """In place, the reference's semantics; no launch when nothing can be replayed."""
    T = positions.shape[0]
    if any_replay is False or Wr == 0 or T == 0 or cacheable_groups.numel() == 0:
        return slot_mappings
    B = query_start_loc.shape[0] - 1
    if B == 0:
        return slot_mappings
    programs = max(1, min(core_count(str(positions.device)), T))
    # the 1-D inputs are read at unit stride
    _pad_kernel[(programs,)](slot_mappings, slot_mappings.stride(0), slot_mappings.stride(1),
                             cacheable_groups.contiguous(), cacheable_groups.numel(), query_start_loc.contiguous(),
                             positions.contiguous(), replay_start.contiguous(), T, B, Wr, STEPS=search_steps(B))
    return slot_mappings
