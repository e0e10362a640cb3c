"""Warp-specialised persistent Gluon (Hopper) forward kernel for ``sparse_mla`` (SPEC §2.7):
variant ``gluon_ws``, the first choice on sm90.

Same op, arguments and results as the reference (plain index layout, ``D_qk = d_v = 512``;
scope and launcher shared with :mod:`.sparse_mla_gluon`), plus ``NUM_ITEMS`` (= T x 64-head
blocks). What differs from the one-item kernel is the schedule: three warpgroups that each
run their own code and meet at mbarriers, instead of two warpgroups in lockstep at CTA
barriers; and the program is **persistent**: one per SM (the launcher's grid), each taking
every grid-th item (token, 64-head block).

Measured facts behind the design (the numbers: bench/README.md, "Warp-specialised Gluon
kernel" under "What was tried and measured" and "FlashMLA three ways"):

* Why persistent: one item per program paid a fixed cost per token (Q's load and the first
  tiles' gathers before any math, the epilogue after it; with one program per SM nothing
  overlapped them), which showed as lower throughput at small K than at large K. Here the
  producer loads the next item's Q as soon as both consumers are past the current item's last
  Q K^T (barrier ``QFREE``) and gathers its first tiles as their halves free up, all under the
  current item's tail and epilogue: faster than one item per program at 64 and 128 heads.
* Why O leaves through shared memory: stored from the wgmma accumulator's layout, a warp
  instruction writes 16 bytes of each of 8 rows (4 bytes a thread): 4096 half-filled 32-byte
  sectors per item. Timed against FlashMLA (bench_flashmla's cells), the kernel matched its
  time per pair of tiles but paid a larger fixed cost per item. Staged 64 columns at a time
  through the consumer's P slot (free at the epilogue) and written 16 bytes a thread, 128
  bytes a row, it measured faster than the direct store in every cell, timed in the same
  rounds, most of that cost per item gone.
* Barrier phases run on across items (a count of the pairs and items before); the row sums
  are exchanged in slots that alternate between items (an item without pairs would
  otherwise overwrite a slot the other consumer has yet to read).
* The consumers index their shared-memory views with a zero the compiler cannot prove, per
  pair: their wgmma descriptors are then made per pair instead of hoisted out of the item
  loop, where they stay live through the epilogue and spill (780 B with Triton 3.6, which
  made the kernel slower than one item per program). With the views: no spills (Triton 3.6
  and 3.9).

Per item:

* **producer** (4 warps, few registers): loads Q, then per *pair* of 64-row KV tiles
  ``(2j, 2j+1) = (A, B)`` gathers A into buffer 0 and B into buffer 1 with cp.async (PAD rows
  and rows past ``lens`` zero-filled, no traffic). Every buffer is split into its left and
  right 256 columns (``lo``/``hi``), each with its own *ready* and *free* barrier, so a half
  is refilled as soon as its last reader is done with it. A row's columns are spread over 16
  threads (256 contiguous bytes per warp instruction) when the cache is larger than L2, over 8
  (128 bytes) when it fits (``wide_gathers``; the constexpr ``WIDE`` picks the producer): the
  wide gathers measured faster over a 1M-row cache and slower over a 16K-row one, where the
  rows come from L2.
* with the wide gathers, the two programs of a token (its two 64-head blocks: adjacent items,
  so two SMs at the same time) would gather the same rows in step, the second's requests
  waiting on the first's DRAM misses. So an odd head block's buffers hold D's halves swapped
  (``lo`` = columns 256-511, Q's too; Q K^T sums over all of D, only the output's columns
  follow): each program asks first for the half the other asks for second, a quarter pair
  later, from L2. Timed beside the unswapped kernel in the same rounds (``bench/bench_flashmla.py
  --variant``): faster at H 128 over the 1M-row cache. Over a 16K-row cache (narrow gathers,
  rows from L2) swapping measured slower at H 128: not done there. Also tried at H 128: the odd
  block one or two pairs ahead, wrapping round (slower); a token's blocks on programs half the
  grid apart (no gain).
* **consumer 0** (the default partition) computes ``S_A = Q K_A^T`` (all 64 columns: wgmma
  N = 64) while **consumer 1** computes ``S_B``. Consumer ``w`` owns ``acc[:, 256w : 256w+256]``
  (fp32, registers), so both read both tiles' V, each its own half of the columns.
* consumer 0: softmax against ``m_A = max(m, rowmax S_A)``, publishes ``m_A`` at once,
  ``acc += P_A V_A[:, lo]``; under that wgmma it waits for consumer 1's ``m_B`` and publishes
  ``P_A`` rescaled to ``m_B`` (shared memory); frees A lo, rescales to ``m_B``, waits for
  ``P_B``, ``acc += P_B V_B[:, lo]``, frees B lo.
* consumer 1: waits for ``m_A`` only; softmax against ``m_B = max(m_A, rowmax S_B)``, rescales
  once (to ``m_B``), publishes ``m_B``; ``acc += P_B V_B[:, hi]`` (P from registers) while it
  publishes ``P_B``; then ``acc += P_A V_A[:, hi]`` with consumer 0's rescaled ``P_A``; frees B
  hi, then A hi.
* so a pair rescales an accumulator three times, not four (rescaling a 64 x 64 P costs a
  quarter of a 64 x 256 accumulator), as FlashMLA's sm90 sparse prefill does; the producer
  refills the halves in the order they are freed: A lo, B hi, A hi, B lo.
* measured against the schedule before (consumer 1 rescaled twice: to ``m_A`` for
  ``P_A V_A[:, hi]`` first, then to ``m_B``; halves refilled A lo, A hi, B hi, B lo; registers
  232 / 232 / 40) in the same rounds over bench_flashmla's cells (``bench/bench_flashmla.py
  --variant``): faster over the L2-resident 16K-row cache, slightly slower over the 1M-row
  cache, where a gather's latency is exposed and A hi is freed later in the pair than before
  (the 216 / 216 / 72 registers gave a small part of the gain; the numbers and what else was
  tried: ``bench/README.md``).

The row sums are kept per consumer and added once at the end. Needs a Triton whose Gluon has
``warp_specialize`` and mbarriers (3.6 and 3.9 both do). Imported only when the variant runs.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper as _hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from ..common.device import cuda_index, l2_bytes_of
from . import sparse_mla_gluon as _shared

_cp_async = getattr(_async_copy, "async_load", None) or _async_copy.async_copy_global_to_shared
_cp_arrive = _async_copy.mbarrier_arrive
_fence_async_shared = _hopper.fence_async_shared
_wgmma = _hopper.warpgroup_mma
_wgmma_wait = _hopper.warpgroup_mma_wait
_barrier = getattr(gl, "thread_barrier", None) or getattr(gl, "barrier", None)

BLOCK_H = gl.constexpr(64)
BN = gl.constexpr(64)  # KV rows per tile
HALF = gl.constexpr(256)  # columns per buffer half
# the producer's gathers: 16-byte cp.async per thread, a row's columns over TPR threads; each call
# covers [64 rows, 8 * TPR columns]. Wide (16 threads, 256 contiguous bytes of a row per warp
# instruction) when the cache is larger than L2, narrow (8 threads, 128 bytes) otherwise: see
# wide_gathers()
TPR_NARROW = gl.constexpr(8)
TPR_WIDE = gl.constexpr(16)
PRODUCER_WARPS = gl.constexpr(4)
# registers per thread: consumer 1 and the producer (the default partition, consumer 0,
# gets what is left of MAXNREG x 12 warps: 3 x 168 - 216 - 72 = 216; FlashMLA's split)
WORKER_REGS = (216, 72)
MAXNREG = 168

# barrier slots
_READY = gl.constexpr(0)  # + 2 * buffer + half: 4 (cp.async arrivals of the producer's 128 threads)
_FREE = gl.constexpr(4)  # + 2 * buffer + half: 4 (one arrival: the half's last reader)
_QBAR = gl.constexpr(8)  # Q landed (producer's cp.async arrivals)
_MBAR = gl.constexpr(9)  # + w: consumer w's row max in shared memory
_LBAR = gl.constexpr(11)  # + w: consumer w's row sums in shared memory
_QFREE = gl.constexpr(13)  # both consumers are past their last Q K^T of an item: Q may be refilled
_SBAR = gl.constexpr(14)  # + w: consumer w's P in shared memory (consumer 0's rescaled to m_B)
_NBAR = gl.constexpr(16)


@gluon.jit
def _pairs(length):
    """Pairs of 64-row tiles an item of ``length`` indices takes (every partition counts them
    alike: the barriers' phases run on across items)."""
    return gl.cdiv(gl.cdiv(length, 64), 2)


@gluon.jit
def _valid_cols(idx_row, tile, length, layout: gl.constexpr):
    """Validity of tile ``tile``'s 64 index entries (PAD and past ``length``: False)."""
    cols = tile * 64 + gl.arange(0, 64, layout=layout)
    idx = gl.load(idx_row + cols, mask=cols < length, other=-1)
    return idx >= 0


@gluon.jit
def _pv_then_free(a, v, acc, free_bar):
    """``acc += a @ v`` (waited); then, every warp past it, one arrival on ``free_bar``: the
    half ``v`` is free for the producer."""
    acc = _wgmma(a, v, acc, is_async=True)
    acc = _wgmma_wait(0, deps=(acc,))
    _barrier()
    mbarrier.arrive(free_bar, count=1)
    return acc


@gluon.jit
def _pv_wait_free(acc, free_bar):
    """Wait for every wgmma on ``acc``; then, every warp past it, one arrival on ``free_bar``."""
    acc = _wgmma_wait(0, deps=(acc,))
    _barrier()
    mbarrier.arrive(free_bar, count=1)
    return acc


@gluon.jit
def _publish_max(m, m_slot, bar):
    """Row max ``m`` into shared memory for the other consumer, then one arrival on ``bar``."""
    m_slot.store(m)
    _barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _publish_p(p16, p_slot, bar):
    """``P`` (bf16/fp16) into shared memory for the other consumer's wgmma, then one arrival on
    ``bar``."""
    p_slot.store(p16)
    _fence_async_shared()  # generic stores -> the other consumer's wgmma (async proxy)
    _barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _consume(W: gl.constexpr, Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, NUM_ITEMS,
             stride_it, stride_ot, stride_oh, stride_lt, qk_scale,
             q_smem, kv_smem, p_smem, ml_smem, l_smem, bars, HAS_SINK, SWAPPED):
    """Consumer ``W`` (0: even tiles, buffer 0; 1: odd tiles, buffer 1), over this program's
    items."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, 64, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    done = 0  # pairs of the items before this one: the barriers' phases run on across items
    k = 0  # items done by this program
    for item in range(gl.program_id(0), NUM_ITEMS, gl.num_programs(0)):
        hb = item % NUM_HB
        t = (item // NUM_HB).to(gl.int64)
        length = gl.load(LENS + t)
        _consume_item(W, KV, IDX, SINK, OUT, LSE, H, t, hb, length, stride_it, stride_ot, stride_oh, stride_lt,
                      qk_scale, q_smem, kv_smem, p_smem, ml_smem, l_smem, bars, HAS_SINK, SWAPPED, done, k,
                      s_layout, o_layout)
        done += _pairs(length)
        k += 1


@gluon.jit
def _consume_item(W: gl.constexpr, KV, IDX, SINK, OUT, LSE, H, t, hb, length, stride_it, stride_ot, stride_oh,
                  stride_lt, qk_scale, q_smem, kv_smem, p_smem, ml_smem, l_smem, bars, HAS_SINK, SWAPPED, done, k,
                  s_layout: gl.constexpr, o_layout: gl.constexpr):
    """Consumer ``W``'s share of one item (token ``t``, head block ``hb``): ``done`` pairs and
    ``k`` items came before it in this program."""
    dtype: gl.constexpr = q_smem.dtype
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_col: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    FIRST: gl.constexpr = W  # consumer 0 starts Q K^T with the lo half, consumer 1 with hi
    OWN: gl.constexpr = 2 * W  # this consumer's tile buffer (halves OWN + 0 / OWN + 1)
    idx_row = IDX + t * stride_it
    n_pairs = _pairs(length)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=s_row)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=s_row)
    acc = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_H, 64], gl.float32, layout=s_layout)
    mbarrier.wait(bars.index(_QBAR), k & 1)
    if n_pairs == 0:  # no Q K^T in this item: Q is free at once
        _barrier()
        mbarrier.arrive(bars.index(_QFREE), count=1)

    for j in range(n_pairs):
        ph = (done + j) & 1
        # a zero the compiler cannot prove (pairs never reach 2**30 + length): the shared-memory
        # views below are then made per pair, so their wgmma descriptors are not hoisted out of
        # the item loop, where they spill (Triton 3.6: 780 B)
        z = (done + j) // (length + 1073741824)
        q_first = q_smem.index(FIRST + z)
        q_second = q_smem.index(1 - FIRST + z)
        kv_first = kv_smem.index(OWN + FIRST + z)
        kv_second = kv_smem.index(OWN + 1 - FIRST + z)
        kv0 = kv_smem.index(0 + z)
        kv1 = kv_smem.index(1 + z)
        kv2 = kv_smem.index(2 + z)
        kv3 = kv_smem.index(3 + z)
        p0 = p_smem.index(0 + z)
        p1 = p_smem.index(1 + z)
        # S = Q K^T over this consumer's tile, the half freed first, then the other
        mbarrier.wait(bars.index(_READY + OWN + FIRST), ph)
        _fence_async_shared()  # cp.async (generic proxy) writes -> wgmma (async proxy) reads
        s = _wgmma(q_first, kv_first.permute((1, 0)), s_zero, use_acc=False,
                   is_async=True)
        mbarrier.wait(bars.index(_READY + OWN + 1 - FIRST), ph)
        _fence_async_shared()
        s = _wgmma(q_second, kv_second.permute((1, 0)), s, is_async=True)
        valid = _valid_cols(idx_row, 2 * j + W, length, s_col)  # L2-hot (the producer read it), under the wgmma
        s = _wgmma_wait(0, deps=(s,))
        if j == n_pairs - 1:  # this consumer's last read of Q in the item: the next item's Q may land
            _barrier()
            mbarrier.arrive(bars.index(_QFREE), count=1)
        # the row max over the raw scores, scaled once (qk_scale > 0, and rounding is monotone: the
        # same max as over scaled scores); the scale rides in the exponent's FMA, 32 FMUL a thread
        # fewer per pair
        s = gl.where(gl.expand_dims(valid, 0), s, float("-inf"))
        row_max = gl.max(s, axis=1) * qk_scale
        if W == 0:
            # tile A: softmax against m_A = max(m, rowmax S_A), m_A published at once (consumer 1's
            # softmax needs only it), P_A V_A[:, lo]; under that wgmma, m_B from consumer 1: P_A
            # rescaled to m_B goes to consumer 1 (a 64 x 64 tile, not its 64 x 256 accumulator);
            # then the own accumulator rescaled to m_B and P_B V_B[:, lo]
            m_a = gl.maximum(m_i, row_max)
            m_a_shift = gl.where(m_a == float("-inf"), 0.0, m_a)  # nothing valid yet: shift by 0
            alpha = gl.exp2(m_i - m_a_shift)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_a_shift, 1))
            l_i = l_i * alpha + gl.sum(p, axis=1)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row), 1)
            _publish_max(m_a, ml_smem[0], bars.index(_MBAR + 0))
            p_op = gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
            acc = _wgmma(p_op, kv0, acc, is_async=True)
            mbarrier.wait(bars.index(_MBAR + 1), ph)
            m_b = ml_smem[1].load(s_row)
            sc = gl.exp2(m_a - gl.where(m_b == float("-inf"), 0.0, m_b))  # m_A = -inf: 0 (acc, l, P are 0)
            _publish_p((p * gl.expand_dims(sc, 1)).to(dtype), p0, bars.index(_SBAR + 0))
            acc = _wgmma_wait(0, deps=(acc,))
            _barrier()
            mbarrier.arrive(bars.index(_FREE + 0), count=1)  # A lo: nobody else reads it
            l_i = l_i * sc
            acc = acc * gl.expand_dims(gl.convert_layout(sc, o_row), 1)
            mbarrier.wait(bars.index(_SBAR + 1), ph)
            acc = _pv_then_free(p1, kv2, acc, bars.index(_FREE + 2))  # B lo: freed last
            m_i = m_b
        else:
            # tile B: softmax against m_B = max(m_A, rowmax S_B) (the accumulator rescaled once,
            # to m_B), m_B published at once; P_B V_B[:, hi] while P_B goes to consumer 0, then
            # P_A (rescaled to m_B by consumer 0) V_A[:, hi]
            mbarrier.wait(bars.index(_MBAR + 0), ph)
            m_b = gl.maximum(ml_smem[0].load(s_row), row_max)
            m_b_shift = gl.where(m_b == float("-inf"), 0.0, m_b)
            alpha = gl.exp2(m_i - m_b_shift)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_b_shift, 1))
            l_i = l_i * alpha + gl.sum(p, axis=1)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row), 1)
            _publish_max(m_b, ml_smem[1], bars.index(_MBAR + 1))
            p16 = p.to(dtype)
            p_op = gl.convert_layout(p16, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
            acc = _wgmma(p_op, kv3, acc, is_async=True)
            _publish_p(p16, p1, bars.index(_SBAR + 1))
            mbarrier.wait(bars.index(_SBAR + 0), ph)
            acc = _wgmma(p0, kv1, acc, is_async=True)
            acc = _wgmma_wait(1, deps=(acc,))  # P_B V_B[:, hi] done
            _barrier()
            mbarrier.arrive(bars.index(_FREE + 3), count=1)  # B hi
            acc = _pv_wait_free(acc, bars.index(_FREE + 1))  # A hi
            m_i = m_b

    # row sums: each consumer's own, added once; the slots alternate between items (an item
    # without pairs would otherwise overwrite a slot the other consumer has yet to read)
    slot = 2 * (k & 1)
    l_smem.index(slot + W).store(l_i)
    _barrier()
    mbarrier.arrive(bars.index(_LBAR + W), count=1)
    mbarrier.wait(bars.index(_LBAR + 1 - W), k & 1)
    l_tot = l_i + l_smem.index(slot + 1 - W).load(s_row)

    has = l_tot > 0.0
    m_shift = gl.where(m_i == float("-inf"), 0.0, m_i)
    offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=s_row)
    h_ok = offs_h < H
    # the sink joins the denominator only (m-shifted, base 2); without one the masked load
    # gives -inf and exp2 0 (a constexpr branch here does not survive warp_specialize's
    # argument passing on Triton 3.6: LLVM lowering asserts)
    sink2 = gl.load(SINK + offs_h, mask=h_ok & (HAS_SINK != 0), other=float("-inf")) * 1.4426950408889634
    denom = gl.where(has, l_tot + gl.exp2(sink2 - m_shift), 1.0)
    if W == 0:
        lse = gl.where(has, (m_i + gl.log2(gl.where(has, l_tot, 1.0))) * 0.6931471805599453, float("-inf"))
        gl.store(LSE + t * stride_lt + offs_h, lse, mask=h_ok)
    inv = gl.convert_layout(1.0 / denom, o_row)
    o = (acc * gl.expand_dims(inv, 1)).to(dtype)
    # O leaves through this consumer's P slot, 64 columns at a time, so that a warp writes whole
    # 128-byte row segments (16 bytes a thread) instead of the accumulator layout's 16 bytes per
    # row (4 a thread). The slot is free: the other consumer, its only other reader, is past its
    # last P V (the row-sum exchange above waited for it)
    chunks = gl.permute(gl.reshape(o, [BLOCK_H, 4, 64]), (0, 2, 1))  # [64 heads, 64 columns, chunk]
    even, odd = gl.split(gl.reshape(chunks, [BLOCK_H, 64, 2, 2]))  # chunk = 2 * hi + lo: split on lo
    c0, c2 = gl.split(even)
    c1, c3 = gl.split(odd)
    slot = p_smem.index(W)
    st: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    offs_ho = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, st))
    row_ptrs = gl.expand_dims(OUT + t * stride_ot + offs_ho.to(gl.int64) * stride_oh, 1)
    # this consumer's buffer halves hold columns [256 * own, 256 * own + 256) of D (swapped for odd head
    # blocks where the producer gathers wide: _produce)
    own = W ^ ((hb % 2) * SWAPPED)
    cols = own * HALF + gl.arange(0, 64, layout=gl.SliceLayout(0, st))
    mask = gl.expand_dims(offs_ho < H, 1) & gl.expand_dims(cols >= 0, 0)
    _store_chunk(c0, slot, row_ptrs, cols, mask, st)
    _store_chunk(c1, slot, row_ptrs, cols + 64, mask, st)
    _store_chunk(c2, slot, row_ptrs, cols + 128, mask, st)
    _store_chunk(c3, slot, row_ptrs, cols + 192, mask, st)


@gluon.jit
def _store_chunk(chunk, slot, row_ptrs, cols, mask, st: gl.constexpr):
    """``chunk`` [64, 64] to ``row_ptrs + cols`` (layout ``st``: 16 bytes a thread) through the
    shared ``slot``; the slot is free again when it returns."""
    slot.store(chunk)
    _barrier()
    gl.store(row_ptrs + gl.expand_dims(cols, 0), slot.load(st), mask=mask)
    _barrier()  # every thread's load of the slot done


@gluon.jit
def _gather_half(KV, dst, rows, valid, col0, offs_c, CH: gl.constexpr):
    """cp.async of columns ``[col0, col0 + 256)`` of the KV rows ``rows`` (int64 element
    offsets; ``valid`` False: zero fill, no traffic) into ``dst [64, 256]``, ``CH`` columns
    (``offs_c``) a call."""
    for c in gl.static_range(HALF // CH):
        ptrs = KV + (gl.expand_dims(rows, 1) + gl.expand_dims(col0 + c * CH + offs_c, 0))
        mask = gl.expand_dims(valid, 1) & gl.expand_dims(offs_c >= 0, 0)
        _cp_async(dst.slice(c * CH, CH, dim=1), ptrs, mask=mask)


@gluon.jit
def _produce(Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, NUM_ITEMS,
             stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt, qk_scale,
             q_smem, kv_smem, bars, TPR: gl.constexpr):
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPR, TPR], [PRODUCER_WARPS, 1], [1, 0])
    row_l: gl.constexpr = gl.SliceLayout(1, ld)
    offs_c = gl.arange(0, 8 * TPR, layout=gl.SliceLayout(0, ld))
    done = 0
    k = 0
    for item in range(gl.program_id(0), NUM_ITEMS, gl.num_programs(0)):
        hb = item % NUM_HB
        t = (item // NUM_HB).to(gl.int64)
        length = gl.load(LENS + t)
        # wide gathers (a cache larger than L2): an odd head block's buffers hold D's halves swapped (half
        # 0 = columns 256-511, Q's too). The program of the token's even head block, which runs in step
        # with it on another SM, then gathers the other half of the same rows at the same time, and the
        # half each asks for next was asked for by the other a quarter pair before (an L2 hit, not a wait
        # on the same DRAM miss). Q K^T sums over all of D, so only the output's columns follow the swap
        # (_consume_item). Two bodies with constant column offsets: runtime offsets spilled the producer
        # (Triton 3.6 and 3.9). Narrow gathers (rows from L2) do not swap: that measured slower at H 128
        if TPR == TPR_NARROW or hb % 2 == 0:
            _produce_item(Q, KV, IDX, H, t, hb, length, stride_qt, stride_qh, stride_kv, stride_it, q_smem,
                          kv_smem, bars, done, k, row_l, offs_c, 8 * TPR, 0)
        else:
            _produce_item(Q, KV, IDX, H, t, hb, length, stride_qt, stride_qh, stride_kv, stride_it, q_smem,
                          kv_smem, bars, done, k, row_l, offs_c, 8 * TPR, HALF)
        done += _pairs(length)
        k += 1


@gluon.jit
def _produce_item(Q, KV, IDX, H, t, hb, length, stride_qt, stride_qh, stride_kv, stride_it, q_smem, kv_smem, bars,
                  done, k, row_l: gl.constexpr, offs_c, CH: gl.constexpr, LO: gl.constexpr):
    """The producer's share of one item: its Q once the consumers are past the previous
    item's last Q K^T, then its tiles as their halves free up (the first ones while the
    consumers still finish the previous item). Buffer half 0 ("lo") holds columns
    ``[LO, LO + 256)`` of D, half 1 the others."""
    HI: gl.constexpr = HALF - LO
    # Q [64 heads, 512] as two halves (heads past H zero-filled)
    mbarrier.wait(bars.index(_QFREE), (k & 1) ^ 1)
    offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_l)
    q_rows = t * stride_qt + offs_h.to(gl.int64) * stride_qh
    _gather_half(Q, q_smem.index(0), q_rows, offs_h < H, LO, offs_c, CH)
    _gather_half(Q, q_smem.index(1), q_rows, offs_h < H, HI, offs_c, CH)
    _cp_arrive(bars.index(_QBAR), increment_count=False)

    idx_row = IDX + t * stride_it
    n_pairs = _pairs(length)
    for j in range(n_pairs):
        ph = (done + j) & 1
        cols = 2 * j * 64 + gl.arange(0, 64, layout=row_l)
        idx_a = gl.load(idx_row + cols, mask=cols < length, other=-1)
        idx_b = gl.load(idx_row + cols + 64, mask=cols + 64 < length, other=-1)
        ok_a = idx_a >= 0
        ok_b = idx_b >= 0
        rows_a = gl.where(ok_a, idx_a, 0).to(gl.int64) * stride_kv
        rows_b = gl.where(ok_b, idx_b, 0).to(gl.int64) * stride_kv
        # the halves in the order they are freed: A lo, B hi, A hi, B lo (lo: buffer half 0)
        mbarrier.wait(bars.index(_FREE + 0), ph ^ 1)
        _gather_half(KV, kv_smem.index(0), rows_a, ok_a, LO, offs_c, CH)
        _cp_arrive(bars.index(_READY + 0), increment_count=False)
        mbarrier.wait(bars.index(_FREE + 3), ph ^ 1)
        _gather_half(KV, kv_smem.index(3), rows_b, ok_b, HI, offs_c, CH)
        _cp_arrive(bars.index(_READY + 3), increment_count=False)
        mbarrier.wait(bars.index(_FREE + 1), ph ^ 1)
        _gather_half(KV, kv_smem.index(1), rows_a, ok_a, HI, offs_c, CH)
        _cp_arrive(bars.index(_READY + 1), increment_count=False)
        mbarrier.wait(bars.index(_FREE + 2), ph ^ 1)
        _gather_half(KV, kv_smem.index(2), rows_b, ok_b, LO, offs_c, CH)
        _cp_arrive(bars.index(_READY + 2), increment_count=False)


# Wrappers, not one function given W (or the gather width) through the partition arguments:
# values passed that way stop being constexprs, and _consume's `if W == 0` branches produce
# tensors, which Triton 3.6 cannot lower inside a partition (the sink note in _consume); the
# producer's layout must be a constexpr.
@gluon.jit
def _consumer0(Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, NUM_ITEMS,
               stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt, qk_scale,
               q_smem, kv_smem, p_smem, ml_smem, l_smem, bars, HAS_SINK, SWAPPED):
    _consume(0, Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, NUM_ITEMS, stride_it, stride_ot, stride_oh, stride_lt,
             qk_scale, q_smem, kv_smem, p_smem, ml_smem, l_smem, bars, HAS_SINK, SWAPPED)


@gluon.jit
def _consumer1(Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, NUM_ITEMS,
               stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt, qk_scale,
               q_smem, kv_smem, p_smem, ml_smem, l_smem, bars, HAS_SINK, SWAPPED):
    _consume(1, Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, NUM_ITEMS, stride_it, stride_ot, stride_oh, stride_lt,
             qk_scale, q_smem, kv_smem, p_smem, ml_smem, l_smem, bars, HAS_SINK, SWAPPED)


@gluon.jit
def _producer_narrow(Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, NUM_ITEMS,
                     stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt, qk_scale,
                     q_smem, kv_smem, p_smem, ml_smem, l_smem, bars, HAS_SINK, SWAPPED):
    _produce(Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, NUM_ITEMS, stride_qt, stride_qh, stride_kv, stride_it,
             stride_ot, stride_oh, stride_lt, qk_scale, q_smem, kv_smem, bars, TPR_NARROW)


@gluon.jit
def _producer_wide(Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, NUM_ITEMS,
                   stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt, qk_scale,
                   q_smem, kv_smem, p_smem, ml_smem, l_smem, bars, HAS_SINK, SWAPPED):
    _produce(Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, NUM_ITEMS, stride_qt, stride_qh, stride_kv, stride_it,
             stride_ot, stride_oh, stride_lt, qk_scale, q_smem, kv_smem, bars, TPR_WIDE)


@gluon.jit(do_not_specialize=["NUM_HB", "NUM_ITEMS"])
def _sparse_mla_gluon_ws_fwd(
    Q, KV, IDX, LENS, SINK, OUT, LSE,
    H, NUM_HB,
    stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt,
    qk_scale, NUM_ITEMS, GATE,
    HAS_SINK: gl.constexpr, REGS_1: gl.constexpr, REGS_P: gl.constexpr, WIDE: gl.constexpr,
    GATED: gl.constexpr, num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 4, "the default partition is consumer 0, one warpgroup")
    dtype: gl.constexpr = Q.dtype.element_ty
    half_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, HALF], dtype)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 64], dtype)
    flat_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    q_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_H, HALF], half_sl)  # Q lo / hi
    kv_smem = gl.allocate_shared_memory(dtype, [4, BN, HALF], half_sl)  # 2 * buffer + half
    p_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_H, 64], p_sl)  # P_A, P_B
    # m_A, m_B rows; the row sums l_0, l_1 of even items, then of odd items
    ml_smem = (gl.allocate_shared_memory(gl.float32, [BLOCK_H], flat_sl),
               gl.allocate_shared_memory(gl.float32, [BLOCK_H], flat_sl))
    l_smem = gl.allocate_shared_memory(gl.float32, [4, BLOCK_H], flat_sl)
    bars = gl.allocate_shared_memory(gl.int64, [_NBAR, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(4):
        mbarrier.init(bars.index(_READY + i), count=PRODUCER_WARPS * 32)
        mbarrier.init(bars.index(_FREE + i), count=1)
    mbarrier.init(bars.index(_QBAR), count=PRODUCER_WARPS * 32)
    for i in gl.static_range(2):
        mbarrier.init(bars.index(_MBAR + i), count=1)
        mbarrier.init(bars.index(_SBAR + i), count=1)
        mbarrier.init(bars.index(_LBAR + i), count=1)
    mbarrier.init(bars.index(_QFREE), count=2)

    # GATED: a validated call (kernels/sparse_mla_check.py) launched behind its device check, whose
    # flag GATE is nonzero when a value is out of range: then every program has no item, and the
    # kernel reads no index and writes nothing (the host raises the ValueError). Ungated: GATE unread.
    items = NUM_ITEMS
    if GATED:
        items = NUM_ITEMS * (gl.load(GATE) == 0).to(gl.int32)
    args = (Q, KV, IDX, LENS, SINK, OUT, LSE, H, NUM_HB, items,
            stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt, qk_scale,
            q_smem, kv_smem, p_smem, ml_smem, l_smem, bars, HAS_SINK, WIDE)  # SWAPPED: as the producer
    if WIDE:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_producer_wide, args)], [4, PRODUCER_WARPS],
                           [REGS_1, REGS_P])
    else:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_producer_narrow, args)], [4, PRODUCER_WARPS],
                           [REGS_1, REGS_P])


def api_reason() -> str | None:
    """Why this Triton cannot build the kernel (None: it can)."""
    if not hasattr(gl, "warp_specialize"):
        return f"Triton {triton.__version__} gluon lacks warp_specialize"
    return _shared.api_reason()


_BUILT: set = set()


def wide_gathers(kv: torch.Tensor) -> bool:
    """Whether the producer gathers 256 contiguous bytes of a row per warp instruction (16
    threads a row) instead of 128 (8 threads): when the cache ``kv`` spans more bytes than the
    device's L2, so that its rows come from DRAM. The two widths timed in the same rounds
    (``bench/bench_flashmla.py --variant``; bench/README.md, "FlashMLA three ways", the wide gathers):
    the wide gathers faster over a 1M-row (1 GiB) cache, the narrow ones over a 16K-row
    (16 MiB) one.
    The cache's size stands in for where its rows live: a large cache read in a few places
    would be better served narrow, which the kernel cannot know."""
    return kv.shape[0] * kv.stride(0) * kv.element_size() > l2_bytes_of(kv)


def _meta(has_sink: bool, wide: bool, gated: bool = False) -> dict:
    return dict(HAS_SINK=has_sink, REGS_1=WORKER_REGS[0], REGS_P=WORKER_REGS[1], WIDE=wide, GATED=gated,
                num_warps=4, maxnreg=MAXNREG)


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None, gate=None):
    """``(out [T, H, d_v] q.dtype, lse [T, H] fp32)`` through the persistent warp-specialised
    kernel (variant ``gluon_ws``): same signature and semantics as the reference. ``gate``: an
    int32 flag the device reads (a pinned host word), written by the call's device check before
    this launch (nonzero: compute nothing; see :mod:`swa_backends.kernels.sparse_mla_check`)."""
    return _shared.run("gluon_ws", _sparse_mla_gluon_ws_fwd, _meta(sink is not None, wide_gathers(kv), gate is not None),
                       True, q, kv, indices, lens, sm_scale, d_v, sink, _BUILT, gate=gate)


def warmup(backend, *, num_heads=(64, 128), attn_dtypes=(torch.bfloat16,), attn_sink=(False, True),
           **_other) -> list[str]:
    """``Backend.warmup()`` hook: compile, without launching, both gather widths for the head
    counts, dtypes and sink settings whose prefill-sized calls ``backend`` sends to this kernel
    (none where a variant before it, e.g. vLLM's FlashMLA, takes them). The serving cache is
    larger than L2 (wide gathers) while the warm-up calls of the other hooks use small caches
    (narrow ones), and a serving call must not be the one that compiles. A validating backend
    (``backend.checked``) also gets the gated kernels and the device check they run behind
    (:mod:`swa_backends.kernels.sparse_mla_check`), which its validated calls launch. Unknown
    keyword arguments (other hooks') are ignored. Returns the ops it compiled for."""
    if not backend.device.runnable or "gluon_ws" not in backend.variants.get("sparse_mla", ()):
        return []
    dev = torch.device(backend.device.torch_device)
    D, K = _shared.HEAD_DIM, 256  # the index width's divisibility by 16 is what serving's widths have
    T = _shared.num_sms(cuda_index(torch.empty(0, device=dev))) if dev.type == "cuda" else 1  # prefill-sized
    idx = torch.zeros(T, K, dtype=torch.int32, device=dev)
    lens = torch.full((T,), K, dtype=torch.int32, device=dev)
    ran = []
    for dtype in (d for d in attn_dtypes if d in _shared.DTYPES):
        kv = torch.zeros(64, D, dtype=dtype, device=dev)
        for H in (h for h in num_heads if h >= BLOCK_H):
            q = torch.zeros(T, H, D, dtype=dtype, device=dev)
            out = torch.empty(T, H, D, dtype=dtype, device=dev)
            lse = torch.empty(T, H, dtype=torch.float32, device=dev)
            for sink_on in attn_sink:
                sink = torch.zeros(H, device=dev) if sink_on else None
                if backend.variant_for("sparse_mla", q, kv, idx, lens, 1.0 / D ** 0.5, D, sink=sink) != "gluon_ws":
                    continue  # a variant before it serves these calls: nothing of this kernel would run
                for wide in (False, True):
                    for gated in (False, True) if backend.checked else (False,):
                        _shared.build("gluon_ws", _sparse_mla_gluon_ws_fwd, _meta(sink_on, wide, gated), True, q, kv,
                                      idx, lens, 1.0 / D ** 0.5, D, sink, out, lse, _BUILT)
                if backend.checked:  # both forms of the check: a contiguous index tensor and a strided view
                    from . import sparse_mla_check

                    for ix in (idx, torch.zeros(T, 2 * K, dtype=torch.int32, device=dev)[:, ::2]):
                        sparse_mla_check.gate(q, kv, ix, lens, 1.0 / D ** 0.5, D, sink=sink).failed()
                ran = ["sparse_mla"]
    return ran
