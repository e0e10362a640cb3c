"""Device helpers shared by the pack's Triton kernels (imported after ``interpreter.setup``)."""

import triton
import triton.language as tl

#: common.types.PAD inside kernels (compiled Triton reads only constexpr globals)
PAD = tl.constexpr(-1)
#: entries of a per-request array one program touches up front (see ``warm``)
WARM = tl.constexpr(1024)


@triton.jit
def warm(ptr, n):
    """Load ``ptr[0 : min(n, WARM)]`` in one round of independent loads and return
    ``min(0, min(values))`` (<= 0), a value the caller folds into a bound so the compiler
    keeps the loads. Why: a binary search is a chain of dependent loads; with the array in
    L1 after this one round trip, the chain costs cache hits instead of one memory round
    trip per step (do_bench flushes L2 before every call)."""
    k = tl.arange(0, WARM)
    v = tl.load(ptr + k, mask=k < n, other=0)
    return tl.minimum(tl.min(v, axis=0), 0)


@triton.jit
def find_request(qsl_ptr, B, t, n_steps):
    """``searchsorted(query_start_loc[1:B+1], t, right=True)`` per lane: the request each
    token ``t`` belongs to (``B`` for tokens at or past ``query_start_loc[B]``).
    ``n_steps = B.bit_length()`` halvings of ``[0, B]``; every lane loads only inside
    ``qsl_ptr[1 .. B]``."""
    lo = tl.zeros_like(t)
    hi = tl.maximum(lo + B, warm(qsl_ptr, B + 1))  # == B (B >= 0, warm <= 0)
    for _ in range(n_steps):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(qsl_ptr + 1 + mid, mask=active, other=0)
        right = v <= t
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (~right), mid, hi)
    return lo
