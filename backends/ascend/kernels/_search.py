"""The request of a token, found on the device: a fixed-length branch-free binary search."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def request_of(qsl_ptr, t, B, STEPS: tl.constexpr):
    """Index ``b`` of the first request whose end ``query_start_loc[b + 1]`` is ``> t``
    (``B`` when ``t`` lies past the batch). ``STEPS >= bit_length(B) + 1`` iterations."""
    lo = t * 0
    hi = lo + B
    for _ in tl.static_range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        end = tl.load(qsl_ptr + 1 + mid, mask=active, other=0)
        right = active & (end <= t)
        left = active & (end > t)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(left, mid, hi)
    return lo
