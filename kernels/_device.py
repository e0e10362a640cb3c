"""Device helpers shared by the pack's Triton kernels (imported after ``interpreter.setup``)."""

import triton
import triton.language as tl


@triton.jit
def find_request(qsl_ptr, B, t, n_steps):
    """``searchsorted(query_start_loc[1:B+1], t, right=True)`` per lane: the request each
    token ``t`` belongs to (``B`` for tokens at or past ``query_start_loc[B]``).
    ``n_steps = B.bit_length()`` halvings of ``[0, B]``; every lane loads only inside
    ``qsl_ptr[1 .. B]``."""
    lo = tl.zeros_like(t)
    hi = lo + B
    for _ in range(n_steps):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(qsl_ptr + 1 + mid, mask=active, other=0)
        right = v <= t
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (~right), mid, hi)
    return lo
