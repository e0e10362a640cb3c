"""Device helpers shared by the pack's Triton kernels (imported after ``interpreter.setup``)."""

import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from . import _verdict

#: common.types.PAD inside kernels (compiled Triton reads only constexpr globals)
PAD = tl.constexpr(-1)
#: common.validation.INT32_MAX inside kernels
INT32_MAX = tl.constexpr(2**31 - 1)
#: what a self-checking kernel's program 0 leaves in its verdict word (``_verdict.Verdict``)
PASS = tl.constexpr(_verdict.PASS)
FAIL = tl.constexpr(_verdict.FAIL)
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


@triton.jit
def find_kept_request(qsl_ptr, drop_ptr, B, t, n_steps):
    """:func:`find_request` over the decoder sub-batch's boundaries ``query_start_loc[i] -
    dropped_before[i]`` (nondecreasing: a request drops at most its own rows), which the
    launch computes rather than reads: the sub-batch request of each sub-batch row ``t``."""
    lo = tl.zeros_like(t)
    hi = lo + B
    for _ in range(n_steps):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(qsl_ptr + 1 + mid, mask=active, other=0) - tl.load(drop_ptr + 1 + mid, mask=active, other=0)
        right = v <= t
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (~right), mid, hi)
    return lo


@triton.jit
def block_split(x, block_size, shift):
    """``(x // block_size, x % block_size)`` for ``x >= 0`` (int32): shifts and a mask when
    ``shift >= 0`` (``block_size == 1 << shift``, see :func:`pow2_shift`), else an integer
    division. Per-element 64-bit divisions by a runtime divisor cost tens of instructions
    each; this is a few."""
    if shift >= 0:
        q = x >> shift
        r = x - (q << shift)
    else:
        q = x // block_size
        r = x - q * block_size
    return q, r


def pow2_shift(block_size: int) -> int:
    """``log2(block_size)`` when it is a power of two, else -1 (host side of :func:`block_split`)."""
    return block_size.bit_length() - 1 if block_size & (block_size - 1) == 0 else -1


@triton.jit
def write_graph_padding(pid, n_progs, qsl_ptr, drop_ptr, B, T, pos_ptr, rows_ptr, opos_ptr, oslot_ptr, os_g, G, n_pad,
                        BLOCK: tl.constexpr, GB: tl.constexpr):
    """Graph padding of the decoder sub-batch, program ``pid`` of ``n_progs``: rows from the
    device's kept count ``query_start_loc[B] - dropped_before[B]`` (the host's count unless the
    device resized decodes) to ``n_pad``, a block of ``BLOCK`` rows at a time: row 0, its
    position, every slot PAD (``gather_replay_batch`` and the fused prepare; ``os_g``: the
    output slot mappings' row stride)."""
    r = tl.arange(0, BLOCK)
    g = tl.arange(0, GB)
    n_dev = tl.maximum(tl.load(qsl_ptr + B) - tl.load(drop_ptr + B), 0)
    p0 = tl.load(pos_ptr + r * 0, mask=r * 0 < T, other=0)  # positions[0] (none in an empty batch)
    for o0 in range(n_dev + pid * BLOCK, n_pad, n_progs * BLOCK):
        o = o0 + r
        m = o < n_pad
        tl.store(rows_ptr + o, tl.zeros([BLOCK], tl.int64), mask=m)
        tl.store(opos_ptr + o, p0, mask=m)
        for g0 in range(0, G, GB):
            gg = g0 + g
            gm = (gg[:, None] < G) & m[None, :]
            tl.store(oslot_ptr + gg[:, None].to(tl.int64) * os_g + o[None, :], tl.full([GB, BLOCK], PAD, tl.int64),
                     mask=gm)


# --- the value checks of a self-checking kernel (``Variant.self_checked``): each returns 1 when a
# value fails, else 0; every program runs them over whole arrays, so each knows the call's verdict

#: entries a check tests per step of its loop (wide: the first program's verdict is what the host
#: waits for, and its loops are that program's longest part); a host-side int for the launches
CHECK = 2048


@triton.jit
def range_bad(ptr, n, low, high, CHECK: tl.constexpr):
    """Some ``ptr[0:n]`` outside ``[low, high]`` (``high`` inclusive)."""
    k = tl.arange(0, CHECK)
    bad = tl.zeros([CHECK], tl.int32)
    for s in range(0, n, CHECK):
        v = tl.load(ptr + s + k, mask=s + k < n, other=low)
        bad |= ((v < low) | (v > high)).to(tl.int32)
    return tl.max(bad, axis=0)


@triton.jit
def batch_chunk_bad(qsl_ptr, seq_ptr, rs_ptr, B, num_tokens, high, j, FROM_ZERO: tl.constexpr, HAS_SEQ: tl.constexpr,
                    HAS_RS: tl.constexpr):
    """:func:`batch_bad`'s test of entries ``j`` (a vector): 1 per lane that fails, else 0."""
    m = j <= B
    r = m & (j > 0)  # request j - 1
    v = tl.load(qsl_ptr + j, mask=m, other=0)
    prev = tl.load(qsl_ptr + j - 1, mask=r, other=0)
    if HAS_SEQ:
        seq = tl.load(seq_ptr + j - 1, mask=r, other=0)
    if HAS_RS:
        rs = tl.load(rs_ptr + j - 1, mask=r, other=0)
    first = (v != 0) if FROM_ZERO else (v < 0)
    wrong = ((j == 0) & first) | (r & (v < prev)) | ((num_tokens >= 0) & (v > num_tokens))
    if HAS_SEQ:
        wrong |= r & ((seq < v.to(tl.int64) - prev) | (seq < 0) | (seq > high))
    if HAS_RS:
        wrong |= r & ((rs < 0) | (rs > high))
    return (m & wrong).to(tl.int32)


@triton.jit
def batch_bad(qsl_ptr, seq_ptr, rs_ptr, B, num_tokens, high, FROM_ZERO: tl.constexpr, HAS_SEQ: tl.constexpr,
              HAS_RS: tl.constexpr, CHECK: tl.constexpr):
    """``_checks.check_batch``'s value checks: ``query_start_loc[0:B+1]`` not from 0
    (``FROM_ZERO``; else from below 0), decreasing somewhere, or past ``num_tokens`` (negative:
    unknown, not tested); some ``seq_lens`` (``HAS_SEQ``) below its request's query length or
    outside ``[0, high]``; some ``replay_start`` (``HAS_RS``) outside ``[0, high]``. Entry ``j``
    of a step and request ``j - 1`` share its loads, all issued together (one memory round trip
    a step: the first program's checks are what the host waits for)."""
    k = tl.arange(0, CHECK)
    bad = tl.zeros([CHECK], tl.int32)
    for s in range(0, B + 1, CHECK):
        bad |= batch_chunk_bad(qsl_ptr, seq_ptr, rs_ptr, B, num_tokens, high, s + k, FROM_ZERO, HAS_SEQ, HAS_RS)
    return tl.max(bad, axis=0)


@triton.jit
def slab_bad(qsl_ptr, seq_ptr, rs_ptr, B, W, room, CHECK: tl.constexpr):
    """Some request's gather length (``prefill_gather_lens``: ``q + min(max(prefix - R, 0), W - 1)``,
    a stale ``R`` counting as 0) longer than ``room`` (``combined_indices``' slab)."""
    k = tl.arange(0, CHECK)
    bad = tl.zeros([CHECK], tl.int32)
    for s in range(0, B, CHECK):
        b = s + k
        m = b < B
        q = tl.load(qsl_ptr + b + 1, mask=m, other=0).to(tl.int64) - tl.load(qsl_ptr + b, mask=m, other=0)
        seq = tl.load(seq_ptr + b, mask=m, other=0).to(tl.int64)
        R = tl.load(rs_ptr + b, mask=m, other=0).to(tl.int64)
        prefix = seq - q
        R = tl.where(R <= prefix, R, 0)
        bad |= (m & (q + tl.minimum(tl.maximum(prefix - R, 0), W - 1) > room)).to(tl.int32)
    return tl.max(bad, axis=0)


@triton.jit
def table_bad(bt_ptr, s0, s1, n_cols, seq_ptr, B, block_size, top, pid, P, CHECK_B: tl.constexpr,
              CHECK_C: tl.constexpr):
    """Some request's positions (below its ``seq_lens``) need more block-table columns than
    ``n_cols``, or read an entry outside ``[0, top]`` (``_checks.check_block_table_covers``), among
    the requests of every ``P``-th chunk of ``CHECK_B`` from chunk ``pid`` (all of them: 0, 1)."""
    bad = tl.zeros([CHECK_B, CHECK_C], tl.int32)
    for b0 in range(pid * CHECK_B, B, P * CHECK_B):
        b = b0 + tl.arange(0, CHECK_B)
        mb = b < B
        seq = tl.load(seq_ptr + b, mask=mb, other=0).to(tl.int64)
        need = tl.where(mb, (seq + block_size - 1) // block_size, 0)
        bad |= (need > n_cols).to(tl.int32)[:, None]
        for c0 in range(0, tl.minimum(tl.max(need, axis=0), n_cols), CHECK_C):
            c = c0 + tl.arange(0, CHECK_C)
            m = (c[None, :] < need[:, None]) & (c[None, :] < n_cols)
            e = tl.load(bt_ptr + b.to(tl.int64)[:, None] * s0 + c.to(tl.int64)[None, :] * s1, mask=m, other=0)
            bad |= (m & ((e < 0) | (e > top))).to(tl.int32)
    return tl.max(tl.max(bad, axis=1), axis=0)


@triton.jit
def run_meets(lo, hi, ptr, n):
    """Lanes whose byte run ``[lo, hi)`` shares a byte with the contiguous ``ptr[0:n]`` (none when
    ``n`` is 0): ``check_writes``' test of a written row against an input, by address."""
    a = ptr.to(tl.int64)
    end = a + n.to(tl.int64) * (ptr.dtype.element_ty.primitive_bitwidth // 8)
    return (n > 0) & (lo < end) & (a < hi)


@triton.jit
def publish(flag_ptr, code):
    """Stores a verdict word the host polls (mapped pinned host memory on CUDA) write-through
    (``st.wt``), so that no cache holds the store back from the host. (On the H200 the waits
    measured the same with a plain store: bench/README.md, 2026-12-04 evening.)"""
    tl.store(flag_ptr, code, cache_modifier=".wt")


@triton.jit
def verdict(flag_ptr, bad):
    """The first program leaves the call's verdict (``PASS``, or ``FAIL`` when ``bad``) in its word,
    written through the cache (:func:`publish`)."""
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        publish(flag_ptr, tl.where(bad > 0, FAIL, PASS))


#: kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` when they were decorated): it copies
#: each tensor argument in and out around a launch and runs no inline assembly. Its kernels are
#: not JITFunctions.
INTERPRETED = not isinstance(verdict, JITFunction)
