"""Portable Triton forward kernel for ``sparse_mla`` (SPEC §2.7), plain index layout.

``out[t, h] = sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink[h]))`` with
``s_j = sm_scale * q[t, h] . kv[indices[t, j]]`` over the valid ``j`` (``j < lens[t]``
and ``indices[t, j] != PAD``), ``v_j = kv[indices[t, j], :d_v]``; ``lse = log(sum_j
exp(s_j))`` (natural log, sink excluded); nothing valid -> zeros and ``lse = -inf``.

Design (why it is shaped like this):

* MQA over one latent cache: every head of a token reads the *same* gathered rows, so the
  heads are the MMA M dimension (``BLOCK_H`` heads per program, 64 = one Hopper
  warpgroup MMA). A program owns (token, head block[, d_v block][, split of the index
  list]) and walks the token's index list in tiles of ``BLOCK_N`` rows.
* Each KV tile is gathered once (row addresses from the index tile, int64 math) and used
  for both ``Q K^T`` (reduction over all of ``D_qk``) and ``P V`` (V = the first ``d_v``
  columns of the same rows). When ``d_v`` and ``D_qk`` round to the same power of two
  (``D_qk = d_v = 512`` in DeepSeek-V4.1) V *is* the K tile: no second load, no second
  shared-memory buffer; otherwise V is a second (cache-hot) load of the same rows.
* Online softmax in fp32, base 2 (``sm_scale * log2 e`` folded into one multiply);
  accumulator ``[BLOCK_H, d_v]`` fp32 in registers (64 x 512 fp32 = 128 KB per program:
  8 warps -> 128 registers a thread). ``DV_SPLIT`` > 1 gives each program a slice of
  ``d_v`` instead (less register pressure, ``Q K^T`` recomputed per slice).
* 8 warps = two warpgroups over 64 heads: ``P V`` splits ``d_v`` between them, and with
  ``SPLIT_S`` so does ``Q K^T`` (each computes half of the tile's columns and they swap P
  through shared memory, as FlashMLA does). Without it Triton's flash-attention layout
  rule has both warpgroups compute the whole S (see ``_attend``).
* Shared memory holds Q (64 KB at 64 heads x 512) and the KV tiles, one program per SM.
  Triton issues a tile's cp.async gather after the previous tile's math, so a gather
  overlaps math only with >= 3 tile buffers (``BLOCK_N`` 32 with 5 or 7 stages); with two
  64-row buffers more stages only load the index tile earlier (offline TTGIR, Triton 3.6).
* The loop stops at the token's length, so tiles past ``lens`` cost nothing; PAD rows
  inside the length are masked loads (no memory traffic) and ``-inf`` scores.
  ``SKIP_EMPTY`` additionally branches around tiles that hold no valid index at all.
* Decode (few tokens): ``splits`` programs share one token's index list (as many as fill
  the SMs in one wave, at most ``MAX_SPLITS``); each writes an fp32 partial (normalised
  output and base-2 lse) and a combine kernel, one program per (token, head, d_v block),
  merges all of a block's splits in one load and adds the sink.
* A config this Triton cannot compile (Triton 3.6 failed a pass on configs 3.9 compiled,
  on the H200) falls back to a known-good one for the shape, with one warning: see
  :func:`launch`.

* On CUDA sm90 dispatch runs the Gluon kernels (variants ``gluon_ws`` and ``gluon``) before
  this one where their scope allows (prefill-sized calls of D 512, H >= 64); this kernel
  (variant ``triton``) serves everything else, decode's split-K included.

* Paged KV records (``kv_format`` ``v4_fp8`` / ``v41_mxfp8`` / ``v41_nvfp4``, vLLM's DeepSeek-V4
  and V4.1 ``k_cache`` views): the constexpr ``KV_FMT`` swaps the row gather for
  ``_gather_records``, which addresses each slot's page with the view's block stride (int64)
  and dequantizes the tile in registers exactly as vLLM's gathers do; the same bf16 tile then
  serves as K and V (D = d_v = 512). ``KV_FMT = 0`` compiles to the same code as before records
  existed (the rows kernel's SASS and AMDGCN are unchanged). The FP8 flavour is per cache
  (``fp8=``): FNUZ converts natively on AMD, through the OCP bits on NVIDIA (``FNUZ_NATIVE``).
  With ``PREFETCH`` (``Config.prefetch``) the loop loads the next tile's record bytes
  (``_load_records``) before it dequantizes the current one (``_dequant_records``). Record
  configs: :data:`RECORDS_TUNED`.
* ``return_lse=False`` drops the lse store (``WRITE_LSE``); split partials keep theirs.

The clamp never enters: it lives in ``indices``/``lens`` built by the pack's index builders.
Launch configs come from :data:`TUNED` (keyed by shape, filled from H200 sweeps of
``bench/bench_sparse_mla.py``, which passes explicit configs to :func:`launch`), and for calls
of a few tokens from :data:`DECODE_TUNED`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
import triton
import triton.language as tl

from ..common.errors import KernelUnavailable
from ..common.ops import _records
from ..common.types import head_block_items
from ._launch import cdiv, launch_meta

LOG2E = 1.4426950408889634
# Fixed when this module is imported, as Triton fixes it when the kernels are decorated. Triton 3.9's
# interpreter multiplies bf16 dot operands as raw integers, so interpreted runs feed tl.dot
# fp32 copies (P still rounded to the input dtype first, as on the GPU).
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# The launcher compiles a config (Triton's warmup, no launch) before its first launch, so a
# compiler failure is told apart from a launch failure; the interpreter compiles nothing.
_COMPILE_FIRST = not _INTERPRET
LN2 = 0.6931471805599453
# Split-K: at most this many splits of one token's index list (one compiled combine kernel
# reads them all in a single masked load), combined in d_v blocks of this width.
MAX_SPLITS = 32
COMBINE_BLOCK_DV = 128


# ---------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------


# tl.max / tl.sum / tl.zeros are @jit helpers of Triton's standard library: decorated when
# triton is first imported, which (through the "triton" probe) can happen before the
# interpreter is switched on, and the interpreter cannot call compiled helpers. The kernels
# therefore reduce with tl.reduce and their own combine functions, and build with tl.full.
@triton.jit
def _max_fn(a, b):
    return tl.maximum(a, b)


@triton.jit
def _sum_fn(a, b):
    return a + b


@triton.jit
def _gather(KV, idx, valid, offs_c, ncols, stride_kv, EVEN: tl.constexpr):
    """Rows ``idx`` of the cache, columns ``offs_c``: ``[BLOCK_N, len(offs_c)]``. Invalid rows
    are masked (no memory traffic) and read as 0; row offsets in int64."""
    rows = tl.where(valid, idx, 0).to(tl.int64) * stride_kv
    if EVEN:
        x = tl.load(KV + rows[:, None] + offs_c[None, :], mask=valid[:, None], other=0.0)
    else:
        x = tl.load(KV + rows[:, None] + offs_c[None, :], mask=valid[:, None] & (offs_c[None, :] < ncols), other=0.0)
    return x


@triton.jit
def _e4m3_to_f32(u8, FP8: tl.constexpr):
    """e4m3 bytes as fp32. ``FP8`` 0: OCP (e4m3fn); 1: FNUZ (e4m3fnuz) converted natively (AMD,
    the interpreter); 2: FNUZ through the OCP conversion (NVIDIA has no FNUZ type). In 2 the
    value is twice the FNUZ one (the caller's scale exponent is one lower), except for the
    bytes the flavours read differently: 0x80 (FNUZ NaN, OCP -0) and +-0x7F (FNUZ +-240, OCP NaN)."""
    if FP8 == 1:
        f = u8.to(tl.float8e4b8, bitcast=True).to(tl.float32)
    else:
        f = u8.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        if FP8 == 2:
            f = tl.where((u8 & 0x7F) == 0x7F, tl.where(u8 == 0x7F, 480.0, -480.0), f)
            f = tl.where(u8 == 0x80, float("nan"), f)
    return f


@triton.jit
def _load_records(KV, idx, valid, stride_blk, BS: tl.constexpr, KV_FMT: tl.constexpr, BLOCK_N: tl.constexpr):
    """The raw bytes of slots ``idx`` of a paged record cache, as :func:`_dequant_records` reads
    them: page ``slot // BS`` at ``stride_blk`` bytes per block (int64), token ``slot % BS`` in
    it. ``KV_FMT`` 1: V4 (584 B: 448 e4m3 + 64 bf16 RoPE, the page's UE8M0 scales after its
    data): (e4m3 bytes [BLOCK_N, 8, 64] (group 7 empty), scale codes [BLOCK_N, 8], RoPE
    [BLOCK_N, 64] bf16); 2: V4.1 MXFP8 (528 B): (bytes [BLOCK_N, 16, 32], codes [BLOCK_N, 16],
    codes again); 3: V4.1 NVFP4 (288 B): (bytes [BLOCK_N, 32, 8] int32, e4m3 scale bytes
    [BLOCK_N, 32], the scales again). Invalid slots are masked (no memory traffic) and read as 0."""
    s = tl.where(valid, idx, 0)
    page = KV + (s // BS).to(tl.int64) * stride_blk
    off = (s % BS).to(tl.int64)
    if KV_FMT == 1:
        j = tl.arange(0, 8)
        col = j[:, None] * 64 + tl.arange(0, 64)[None, :]
        data = page + off * 576
        nope = valid[:, None, None] & (col < 448)[None, :, :]
        u8 = tl.load(data[:, None, None] + col[None, :, :], mask=nope, other=0)
        codes = tl.load((page + BS * 576 + off * 8)[:, None] + j[None, :], mask=valid[:, None] & (j < 7)[None, :],
                        other=0)
        rope_ptr = (data + 448).to(tl.pointer_type(tl.bfloat16))
        rope = tl.load(rope_ptr[:, None] + tl.arange(0, 64)[None, :], mask=valid[:, None], other=0.0)
        return u8, codes, rope
    elif KV_FMT == 2:
        j = tl.arange(0, 16)
        col = j[:, None] * 32 + tl.arange(0, 32)[None, :]
        rec = page + off * 528
        u8 = tl.load(rec[:, None, None] + col[None, :, :], mask=valid[:, None, None], other=0)
        codes = tl.load((rec + 512)[:, None] + j[None, :], mask=valid[:, None], other=0)
        return u8, codes, codes
    else:
        j = tl.arange(0, 32)
        col = j[:, None] * 8 + tl.arange(0, 8)[None, :]
        rec = page + off * 288
        b = tl.load(rec[:, None, None] + col[None, :, :], mask=valid[:, None, None], other=0).to(tl.int32)
        sf = tl.load((rec + 256)[:, None] + j[None, :], mask=valid[:, None], other=0)
        return b, sf, sf


@triton.jit
def _dequant_records(raw, scales, rope, KV_FMT: tl.constexpr, FP8: tl.constexpr, BLOCK_N: tl.constexpr):
    """:func:`_load_records`' bytes dequantized to ``[BLOCK_N, 512]`` bf16 in registers, as vLLM's
    gathers dequantize (``common/ops/_records.py``); masked slots read as 0."""
    # UE8M0 code c scales by 2^(c - 127); FNUZ through OCP bits reads twice the value: one lower
    BIAS: tl.constexpr = 128.0 if FP8 == 2 else 127.0
    if KV_FMT == 1:
        # seven 64-dim groups of e4m3 bytes, each with its scale code, then the RoPE group
        j = tl.arange(0, 8)
        x = _e4m3_to_f32(raw, FP8) * tl.exp2(scales.to(tl.float32) - BIAS)[:, :, None]
        # the RoPE group: 64 bf16 per record, broadcast over the groups and kept in the last
        k = tl.where((j < 7)[None, :, None], x.to(tl.bfloat16), rope[:, None, :])
        return tl.reshape(k, (BLOCK_N, 512))
    elif KV_FMT == 2:
        x = _e4m3_to_f32(raw, FP8) * tl.exp2(scales.to(tl.float32) - BIAS)[:, :, None]
        return tl.reshape(x.to(tl.bfloat16), (BLOCK_N, 512))
    else:
        # NVFP4: element 2i is the low nibble of byte i
        code = tl.interleave(raw & 15, raw >> 4)
        mc = code & 7
        m = (mc & 1).to(tl.float32)
        mag = tl.where(mc < 2, m * 0.5, (1.0 + m * 0.5) * tl.exp2((mc >> 1).to(tl.float32) - 1.0))
        val = tl.where(code >= 8, -mag, mag)
        x = val * scales.to(tl.float8e4nv, bitcast=True).to(tl.float32)[:, :, None]
        return tl.reshape(x.to(tl.bfloat16), (BLOCK_N, 512))


@triton.jit
def _gather_records(KV, idx, valid, stride_blk, BS: tl.constexpr, KV_FMT: tl.constexpr, FP8: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """Slots ``idx`` of a paged record cache, dequantized to ``[BLOCK_N, 512]`` bf16 in registers
    (:func:`_load_records`, then :func:`_dequant_records`)."""
    raw, scales, rope = _load_records(KV, idx, valid, stride_blk, BS, KV_FMT, BLOCK_N)
    return _dequant_records(raw, scales, rope, KV_FMT, FP8, BLOCK_N)


@triton.jit
def _softmax_step(s, m_i):
    """Online-softmax step of one (scaled, masked, base-2) score tile:
    (new running max, rescale of the old sums, P in fp32, row sums of P)."""
    m_new = tl.maximum(m_i, tl.reduce(s, 1, _max_fn))
    # a row with nothing valid yet keeps m = -inf: shift by 0 so exp2 gives 0, not NaN
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_shift[:, None])
    return m_new, tl.exp2(m_i - m_shift), p, tl.reduce(p, 1, _sum_fn)


@triton.jit
def _attend(q, k, v, valid, m_i, l_i, acc, qk_scale, gate, DOT_F32: tl.constexpr, SPLIT_S: tl.constexpr):
    """S = Q K^T of one gathered tile, online softmax, acc += P V (P rounded to V's dtype)."""
    if DOT_F32:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    if SPLIT_S:
        # Triton lays a dot whose result feeds another dot (S -> P -> P V) with all warps
        # along M: with 64 heads and 8 warps both warpgroups then compute the whole S (1.5x
        # the tile's MMA work, 2x its Q K^T shared-memory reads). The softmax inside a branch
        # (always taken: gate >= 0) hides the P V dot from that rule (MLIR's forward slice
        # stops at the branch's yield), so S is split along N across the warpgroups and P
        # goes through shared memory to both (FlashMLA's layout). S itself stays outside
        # the branch: Triton 3.6's pipeliner fails on a dot result used only inside it.
        m_new = m_i
        alpha = tl.full([q.shape[0]], 1.0, tl.float32)
        l_add = tl.full([q.shape[0]], 0.0, tl.float32)
        p = tl.full([q.shape[0], k.shape[0]], 0.0, v.dtype)
        if gate >= 0:
            m_new, alpha, p32, l_add = _softmax_step(s, m_i)
            p = p32.to(v.dtype)
    else:
        m_new, alpha, p32, l_add = _softmax_step(s, m_i)
        p = p32.to(v.dtype)
    l_i = l_i * alpha + l_add
    if DOT_F32:
        pv = tl.dot(p.to(tl.float32), v.to(tl.float32))
    else:
        pv = tl.dot(p, v)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _tile(KV, q, idx, valid, offs_d, offs_v, D, DV, stride_kv, qk_scale, m_i, l_i, acc, gate,
          SAME_TILE: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, DOT_F32: tl.constexpr,
          SPLIT_S: tl.constexpr, KV_FMT: tl.constexpr, FP8: tl.constexpr, BS: tl.constexpr,
          BLOCK_N: tl.constexpr):
    """One KV tile: gather its rows once (V = the same rows' first d_v columns), attend. Record
    formats: the tile is the records dequantized in registers (D = d_v = 512, one tile)."""
    if KV_FMT == 0:
        k = _gather(KV, idx, valid, offs_d, D, stride_kv, EVEN_D)
        if SAME_TILE:
            v = k  # V = the first d_v columns of the K tile, already gathered
        else:
            v = _gather(KV, idx, valid, offs_v, DV, stride_kv, EVEN_DV)
    else:
        k = _gather_records(KV, idx, valid, stride_kv, BS, KV_FMT, FP8, BLOCK_N)
        v = k
    return _attend(q, k, v, valid, m_i, l_i, acc, qk_scale, gate, DOT_F32, SPLIT_S)


# NUM_HB / NUM_DVB only decompose the program id and the split strides (T x H (x d_v)) only
# offset whole partials: not specialised, so H 64 and H 128, and every T, share one kernel.
@triton.jit(do_not_specialize=["NUM_HB", "NUM_DVB", "stride_ps", "stride_ls"])
def _sparse_mla_fwd(
    Q, KV, IDX, LENS, SINK, OUT, LSE,
    H, D, DV, CHUNK, NUM_HB, NUM_DVB,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_ot, stride_oh, stride_lt, stride_ps, stride_ls,
    qk_scale,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    SAME_TILE: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    HAS_SINK: tl.constexpr, PARTIAL: tl.constexpr, SKIP_EMPTY: tl.constexpr, DOT_F32: tl.constexpr,
    SPLIT_S: tl.constexpr, KV_FMT: tl.constexpr = 0, FP8: tl.constexpr = 0, BS: tl.constexpr = 1,
    WRITE_LSE: tl.constexpr = True, PREFETCH: tl.constexpr = False,
):
    # KV_FMT 0: KV rows (stride_kv between rows); 1-3: a paged record cache (stride_kv between
    # blocks, BS records per block, FP8 the flavour: see _gather_records). WRITE_LSE: store lse
    # (one pass only; split partials always carry theirs to the combine).
    # program -> (token, d_v block, head block), head block fastest so the programs that
    # read the same token's rows run side by side (the second one hits L2)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    hb = pid % NUM_HB
    vb = (pid // NUM_HB) % NUM_DVB
    t = (pid // (NUM_HB * NUM_DVB)).to(tl.int64)

    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < H
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = vb * BLOCK_DV + tl.arange(0, BLOCK_DV)
    v_ok = offs_v < DV
    offs_n = tl.arange(0, BLOCK_N)

    q_ptrs = Q + t * stride_qt + offs_h[:, None].to(tl.int64) * stride_qh + offs_d[None, :]
    if EVEN_D:
        q = tl.load(q_ptrs, mask=h_ok[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=h_ok[:, None] & (offs_d[None, :] < D), other=0.0)

    length = tl.load(LENS + t)
    start = split * CHUNK
    end = tl.minimum(length, start + CHUNK)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_H], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_H, BLOCK_DV], 0.0, dtype=tl.float32)

    idx_row = IDX + t * stride_it
    if PREFETCH:
        # records: the next tile's bytes are loaded before this tile is dequantized and
        # attended, so the gather's latency hides under the math: a record tile cannot take
        # the asynchronous copy into shared memory a bf16 tile takes (it is dequantized in
        # registers first), and the stages of Triton 3.6's pipeliner did not overlap them: the
        # prefetch measured faster at 16 heads (at 64 heads V4 / MXFP8 lose registers to it, see
        # RECORDS_TUNED; bench/README.md, "Sparse MLA on paged KV records")
        cols = start + offs_n
        idx = tl.load(idx_row + cols, mask=cols < end, other=-1)
        valid = idx >= 0
        raw, scales, rope = _load_records(KV, idx, valid, stride_kv, BS, KV_FMT, BLOCK_N)
        for n0 in range(start, end, BLOCK_N):
            cols = n0 + BLOCK_N + offs_n
            idx_next = tl.load(idx_row + cols, mask=cols < end, other=-1)
            valid_next = idx_next >= 0
            nxt = _load_records(KV, idx_next, valid_next, stride_kv, BS, KV_FMT, BLOCK_N)
            k = _dequant_records(raw, scales, rope, KV_FMT, FP8, BLOCK_N)
            m_i, l_i, acc = _attend(q, k, k, valid, m_i, l_i, acc, qk_scale, n0, DOT_F32, SPLIT_S)
            valid = valid_next
            raw, scales, rope = nxt
    else:
        for n0 in range(start, end, BLOCK_N):
            cols = n0 + offs_n
            idx = tl.load(idx_row + cols, mask=cols < end, other=-1)
            valid = idx >= 0  # PAD (-1) inside the length and everything past it
            if SKIP_EMPTY:
                if tl.reduce(valid.to(tl.int32), 0, _max_fn) > 0:
                    m_i, l_i, acc = _tile(KV, q, idx, valid, offs_d, offs_v, D, DV, stride_kv, qk_scale,
                                          m_i, l_i, acc, n0, SAME_TILE, EVEN_D, EVEN_DV, DOT_F32, SPLIT_S,
                                          KV_FMT, FP8, BS, BLOCK_N)
            else:
                m_i, l_i, acc = _tile(KV, q, idx, valid, offs_d, offs_v, D, DV, stride_kv, qk_scale,
                                      m_i, l_i, acc, n0, SAME_TILE, EVEN_D, EVEN_DV, DOT_F32, SPLIT_S,
                                      KV_FMT, FP8, BS, BLOCK_N)

    has = l_i > 0.0
    if PARTIAL:
        # fp32 partial of one split: normalised output and base-2 lse (-inf when empty)
        o = acc / tl.where(has, l_i, 1.0)[:, None]
        lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        o_ptrs = OUT + split.to(tl.int64) * stride_ps + t * stride_ot + offs_h[:, None].to(tl.int64) * stride_oh + offs_v[None, :]
        tl.store(o_ptrs, o, mask=h_ok[:, None] & v_ok[None, :])
        if vb == 0:
            tl.store(LSE + split.to(tl.int64) * stride_ls + t * stride_lt + offs_h, lse2, mask=h_ok)
    else:
        m_shift = tl.where(m_i == float("-inf"), 0.0, m_i)
        if HAS_SINK:
            # the sink joins the denominator only: sum_j exp(s_j) + exp(sink), in the m-shifted base-2 frame
            sink2 = tl.load(SINK + offs_h, mask=h_ok, other=0.0) * 1.4426950408889634
            # an empty row stays 0 / 1 = 0 even when exp(sink) underflows (sink = -inf)
            denom = tl.where(has, l_i + tl.exp2(sink2 - m_shift), 1.0)
        else:
            denom = tl.where(has, l_i, 1.0)
        o = acc / denom[:, None]
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        o_ptrs = OUT + t * stride_ot + offs_h[:, None].to(tl.int64) * stride_oh + offs_v[None, :]
        tl.store(o_ptrs, o.to(OUT.dtype.element_ty), mask=h_ok[:, None] & v_ok[None, :])
        if WRITE_LSE:
            if vb == 0:
                tl.store(LSE + t * stride_lt + offs_h, lse, mask=h_ok)


# the split count and the split strides vary with T and K: not specialised (one kernel)
@triton.jit(do_not_specialize=["SPLITS", "stride_ps", "stride_lps"])
def _sparse_mla_combine(
    O_PART, LSE_PART, SINK, OUT, LSE,
    H, DV, SPLITS,
    stride_ps, stride_pt, stride_ph, stride_lps, stride_lpt,
    stride_ot, stride_oh, stride_lt,
    MAX_SPLITS: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_SINK: tl.constexpr, WRITE_LSE: tl.constexpr = True,
):
    """Merge the splits of one (token, head, d_v block): weights 2^(lse2_s - max).

    Every split of the block is read in one masked ``[MAX_SPLITS, BLOCK_DV]`` load (one
    memory round trip, not one per split), and the grid has a program per (token, head,
    d_v block) so a single decode token still spreads over the SMs. ``MAX_SPLITS`` is one
    constant, so any split count reuses one compiled kernel."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, MAX_SPLITS)
    offs_v = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    s_ok = offs_s < SPLITS
    lse2 = tl.load(LSE_PART + offs_s.to(tl.int64) * stride_lps + t * stride_lpt + h, mask=s_ok,
                   other=float("-inf"))
    o = tl.load(O_PART + offs_s[:, None].to(tl.int64) * stride_ps + t * stride_pt + h * stride_ph + offs_v[None, :],
                mask=s_ok[:, None] & (offs_v[None, :] < DV), other=0.0)
    m = tl.reduce(lse2, 0, _max_fn)
    m_shift = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse2 - m_shift)  # 0 for empty and masked splits
    total = tl.reduce(w, 0, _sum_fn)
    acc = tl.reduce(w[:, None] * o, 0, _sum_fn)
    has = total > 0.0
    if HAS_SINK:
        sink2 = tl.load(SINK + h) * 1.4426950408889634
        denom = tl.where(has, total + tl.exp2(sink2 - m_shift), 1.0)
    else:
        denom = tl.where(has, total, 1.0)
    tl.store(OUT + t * stride_ot + h * stride_oh + offs_v, (acc / denom).to(OUT.dtype.element_ty), mask=offs_v < DV)
    if WRITE_LSE:
        if tl.program_id(2) == 0:
            lse = tl.where(has, (m + tl.log2(tl.where(has, total, 1.0))) * 0.6931471805599453, float("-inf"))
            tl.store(LSE + t * stride_lt + h, lse)


# ---------------------------------------------------------------------------------------
# launch configuration
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One launch configuration.

    ``block_h``: heads per program (MMA M; >= 16); ``block_n``: index rows per tile (>= 16);
    ``num_warps``/``num_stages``: Triton launch knobs (stages pipeline the gathers);
    ``dv_split``: programs sharing one token's ``d_v`` (1 = the whole accumulator in one
    program); ``splits``: programs sharing one token's index list (None: chosen from the
    grid size and the SM count, 1 = none); ``skip_empty``: branch around all-PAD tiles;
    ``split_s``: split S across warpgroups instead of computing it in each (see _tile);
    ``prefetch``: record caches only, load the next tile's bytes before dequantizing this one.
    """

    block_h: int = 64
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    dv_split: int = 1
    splits: int | None = None
    skip_empty: bool = False
    split_s: bool = False
    prefetch: bool = False

    def replace(self, **kw) -> "Config":
        return dataclasses.replace(self, **kw)

    def short(self) -> str:
        s = f"h{self.block_h}n{self.block_n}w{self.num_warps}s{self.num_stages}"
        if self.dv_split > 1:
            s += f"v{self.dv_split}"
        if self.splits is not None:
            s += f"k{self.splits}"
        if self.skip_empty:
            s += "e"
        if self.split_s:
            s += "x"
        if self.prefetch:
            s += "p"
        return s


# Launch configs keyed by (platform, D_qk bucket, heads bucket); the first matching row
# wins. cuda/512 rows: 64 heads x 64 rows, 8 warps, 2 stages (Q 64 KB + 2 x 64 KB KV tiles =
# 197 KB of shared memory, one program per SM), chosen by `bench/bench_sparse_mla.py --sweep`,
# which times the alternatives (bench/README.md, "What was tried and measured", tl kernel).
TUNED: tuple[tuple[str, int, int, Config], ...] = (
    # platform, max D_qk, max heads, config
    ("cuda", 512, 16, Config(block_h=16, block_n=64, num_warps=4, num_stages=2)),
    ("cuda", 512, 32, Config(block_h=32, block_n=64, num_warps=8, num_stages=2)),  # 4 warps spill (sm_90a)
    # split_s measured faster than without it (Triton 3.6); 32-row tiles with deeper pipelines
    # slower (the look-ahead did not pay): bench/README.md, "What was tried and measured".
    ("cuda", 512, 1 << 30, Config(block_h=64, block_n=64, num_warps=8, num_stages=2, split_s=True)),
    # ROCm: gfx942 has 64 KB of LDS per CU, so smaller tiles and one stage (not measured)
    ("rocm", 512, 1 << 30, Config(block_h=32, block_n=32, num_warps=8, num_stages=1)),
    # anything else (small D, the CPU interpreter): modest tiles
    ("*", 1 << 30, 1 << 30, Config(block_h=64, block_n=32, num_warps=4, num_stages=2)),
)

# Record caches (D = d_v = 512; each tile dequantized in registers before its MMAs), keyed by
# (platform, max heads, formats). cuda rows: the fastest of a sweep (Triton 3.6, K 640, T 256
# and 4K, all three formats: bench/experiments/sweep_records_configs.py,
# bench/results/h200/sweep_records_configs.json; bench/README.md, "The record-config sweep"),
# checked offline against Triton 3.9's ptxas for sm90 (tests/kernels/test_sparse_mla_records.py
# prints registers and spills).
RECORDS_TUNED: tuple[tuple[str, int, tuple[str, ...] | str, Config], ...] = (
    # 16 heads, NVFP4: 8 warps x 32 records, the next tile prefetched, 1 stage: faster than the
    # same tiles without the prefetch (64 records spill 3 KB under Triton 3.9)
    ("cuda", 32, ("v41_nvfp4",), Config(block_h=16, block_n=32, num_warps=8, num_stages=1, prefetch=True)),
    # 16 heads, V4 / MXFP8: 4 warps x 32 records, prefetched: faster than the same tiles without
    ("cuda", 32, "*", Config(block_h=16, block_n=32, num_warps=4, num_stages=2, prefetch=True)),
    # 64+ heads, NVFP4: 64 x 32 records, S split, prefetched, 1 stage: faster than the row below
    ("cuda", 1 << 30, ("v41_nvfp4",), Config(block_h=64, block_n=32, num_warps=8, num_stages=1, split_s=True,
                                               prefetch=True)),
    # 64 heads x 64 records with S split across the warpgroups (the bf16 rows' config): faster
    # than the 32-record tiles at T 4K and T 256 (spills on 3.9: 0-108 B); for V4 / MXFP8 every
    # prefetched config measured slower than this one (the prefetched bytes take registers)
    ("cuda", 1 << 30, "*", Config(block_h=64, block_n=64, num_warps=8, num_stages=2, split_s=True)),
    # gfx942 (V4, the only record on ROCm; FNUZ converted natively): 32 heads x 16 records, 166
    # VGPRs, 32 KB LDS, no spill (gfx950, OCP: 156 VGPRs); 32 records spill (compiled offline,
    # not timed: no AMD hardware here)
    ("rocm", 1 << 30, "*", Config(block_h=32, block_n=16, num_warps=8, num_stages=1)),
    ("*", 1 << 30, "*", Config(block_h=64, block_n=32, num_warps=4, num_stages=2)),
)


def _platform(device: torch.device) -> str:
    if device.type == "cuda":
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return device.type


# Calls of a few tokens: (platform, heads above, at most this many items = tokens x 64-head
# blocks, KV formats ("rows" or record formats), config); D_qk 512. With so few items split-K
# carries the parallelism, and 32-row tiles give twice the splits of the 64-row table rows (20
# instead of 10 at K 640). Chosen at K 640 in CUDA graphs (bench/experiments/exp_records_decode_tiles.py;
# bench/results/h200/exp_records_decode_tiles.json, exp_records_decode_tiles_rows.json; bench/README.md,
# "Calls of a few tokens"): the 32-record tiles beat V4 / MXFP8's table row up to 4 items and the table
# row is faster from 8 on; for bf16 rows 32-row tiles are faster up to 2 items, level at 4, slower
# beyond. NVFP4's table row already has 32-record tiles (smaller ones and unprefetched ones measured
# slower).
DECODE_TUNED: tuple[tuple[str, int, int, tuple[str, ...], Config], ...] = (
    ("cuda", 32, 4, ("v4_fp8", "v41_mxfp8"), Config(block_h=64, block_n=32, num_warps=8, num_stages=2, split_s=True)),
    ("cuda", 32, 2, ("rows",), Config(block_h=64, block_n=32, num_warps=8, num_stages=2, split_s=True)),
)


def table_config(platform: str, D: int, H: int, kv_format: str = "rows") -> Config:
    """The first :data:`TUNED` row (:data:`RECORDS_TUNED` for a record cache) for this
    platform, ``D_qk`` and head count."""
    if kv_format != "rows":
        return next(c for p, hmax, fmts, c in RECORDS_TUNED
                    if p in (platform, "*") and H <= hmax and (fmts == "*" or kv_format in fmts))
    return next(c for p, dmax, hmax, c in TUNED if p in (platform, "*") and D <= dmax and H <= hmax)


def pick_config(T: int, H: int, D: int, d_v: int, K: int, device: torch.device, kv_format: str = "rows") -> Config:
    """The table's config for this shape (:data:`DECODE_TUNED` first); :func:`resolve` clips it
    to the shape."""
    platform = _platform(device)
    if D <= 512:
        items = head_block_items(T, H)
        for p, hmin, max_items, fmts, c in DECODE_TUNED:
            if p == platform and H > hmin and items <= max_items and kv_format in fmts:
                return c
    return table_config(platform, D, H, kv_format)


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


@dataclass(frozen=True)
class KVSpec:
    """What the kernel reads and writes besides the shapes: ``fmt`` the KV format's constexpr
    (0 rows, 1-3 records: ``_records.FORMATS``), ``fp8`` the e4m3 conversion (see
    ``_e4m3_to_f32``), ``block_size`` records per page, ``write_lse``."""

    fmt: int = 0
    fp8: int = 0
    block_size: int = 1
    write_lse: bool = True


ROWS = KVSpec()
# FNUZ bytes: converted natively where the compiler has the type (AMD), else through the OCP
# conversion (NVIDIA; the interpreter, where tests also run the native one).
FNUZ_NATIVE = {"rocm": True, "cuda": False, "cpu": False}


def kv_spec(kv, kv_format: str, fp8: str | None, return_lse: bool, device: torch.device) -> KVSpec:
    if kv_format == "rows":
        return ROWS if return_lse else KVSpec(write_lse=False)
    fmt = _records.FORMATS[kv_format]
    flavour = _records.flavour(fmt, fp8)
    mode = 0 if flavour == "e4m3fn" else (1 if FNUZ_NATIVE.get(_platform(device), False) else 2)
    return KVSpec(fmt.code, mode, int(kv.shape[1]), bool(return_lse))


@functools.lru_cache(maxsize=4096)
def resolve(cfg: Config, T: int, H: int, D: int, d_v: int, K: int, device: torch.device,
            kvs: KVSpec = ROWS) -> Mapping:
    """Concrete launch parameters for one call (no device work: graph-safe), read-only:
    remembered per argument set, a call's host work being a few dozen Python operations and a
    device query."""
    block_d = max(16, _pow2(D))
    # a record tile is dequantized whole (512 columns): K and V are the same registers
    dv_split = 1 if kvs.fmt else max(1, min(cfg.dv_split, _pow2(d_v) // 16))
    block_dv = max(16, _pow2(d_v) // dv_split)
    num_dvb = cdiv(d_v, block_dv)
    block_h = max(16, min(_pow2(cfg.block_h), _pow2(H)))
    num_hb = cdiv(H, block_h)
    block_n = max(16, _pow2(cfg.block_n))
    tiles = cdiv(max(K, 1), block_n)
    programs = T * num_hb * num_dvb
    if cfg.splits is None:
        # split the index list only when the grid would leave SMs idle, and only as far as
        # one wave: a program holds ~200 KB of shared memory (one per SM), so programs x
        # splits past the SM count run in a second wave, which measured slower than one wave of
        # fewer splits (bench/README.md, "What was tried and measured", Decode)
        sms = _num_sms(device)
        splits = 1 if programs >= sms else max(1, sms // max(programs, 1))
    else:
        splits = cfg.splits
    splits = max(1, min(splits, tiles, MAX_SPLITS))
    chunk = cdiv(tiles, splits) * block_n
    splits = cdiv(max(K, 1), chunk)
    return MappingProxyType(dict(
        block_h=block_h, num_hb=num_hb, block_n=block_n, block_d=block_d, block_dv=block_dv, num_dvb=num_dvb,
        splits=splits, chunk=chunk, same_tile=(num_dvb == 1 and block_dv == block_d), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, skip_empty=cfg.skip_empty, split_s=cfg.split_s, kv_fmt=kvs.fmt, fp8=kvs.fp8,
        bs=kvs.block_size, write_lse=kvs.write_lse, prefetch=cfg.prefetch and bool(kvs.fmt)))


# ---------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------


# Allocation hook: tests replace it with one that fills every buffer with poison, proving
# the kernels write every output element (and read only the partials they wrote).
_empty = torch.empty

# Launch failures that mean "this config does not fit this device" (shared memory,
# registers): the launcher then retries smaller configs, see _shrink.
_RESOURCE_ERRORS = tuple(getattr(triton.runtime.errors, n) for n in ("OutOfResources", "PTXASError")
                         if hasattr(triton.runtime.errors, n))
# (requested config, shape key) -> the config that compiled and launched; filled on first use.
_FITTED: dict = {}
#: specialisation key -> why no config of it compiled (KernelUnavailable for that key only)
_UNBUILDABLE: dict = {}
# Fallback messages already warned about (each once per process).
_WARNED: set = set()


def _shrink(cfg: Config) -> Config | None:
    """The next smaller config: fewer stages, then narrower tiles, then fewer heads."""
    if cfg.num_stages > 2:
        return cfg.replace(num_stages=2)
    if cfg.block_n > 16:
        return cfg.replace(block_n=cfg.block_n // 2)
    if cfg.num_stages > 1:
        return cfg.replace(num_stages=1)
    if cfg.block_h > 16:
        return cfg.replace(block_h=cfg.block_h // 2)
    return None


def _fallbacks(cfg: Config, platform: str, D: int, H: int, kvs: KVSpec = ROWS) -> list[Config]:
    """What to try when ``cfg`` does not compile with this Triton: the table's config for
    the shape, then the same tiles without the optional features (split_s, skip_empty),
    then the plainest small config. Each keeps the requested ``splits``."""
    plain = Config(block_h=cfg.block_h, block_n=cfg.block_n, num_warps=cfg.num_warps,
                   num_stages=min(cfg.num_stages, 2), dv_split=cfg.dv_split)
    out = []
    # the format's own table row (RECORDS_TUNED may name formats)
    fmt = "rows" if not kvs.fmt else next(n for n, f in _records.FORMATS.items() if f.code == kvs.fmt)
    for c in (table_config(platform, D, H, fmt), plain, Config(block_h=64, block_n=32, num_warps=4, num_stages=1)):
        c = c.replace(splits=cfg.splits)
        if c != cfg and c not in out:
            out.append(c)
    return out


def _reason(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1][:200] if lines else ''}"


def launch(q, kv, indices, lens, sm_scale, d_v, sink=None, *, config: Config | None = None, fit: bool = True,
           kv_format: str = "rows", fp8: str | None = None, return_lse: bool = True):
    """:func:`sparse_mla` with an explicit :class:`Config` (benchmarks and sweeps); with
    ``config=None`` the table's.

    ``fit``: when the config does not compile with this Triton (a compiler pass failing on
    it, e.g. Triton 3.6 on configs Triton 3.9 compiles), fall back to a known-good config
    for the shape, warning once with the reason; when it does not fit the device (shared
    memory, registers), retry with smaller ones. Either is remembered per shape, so it
    costs one extra compile per process. ``fit=False`` raises instead (sweeps).
    ``kv_format`` / ``fp8`` / ``return_lse``: as the op (``return_lse=False``: lse is None).
    """
    T, H, D = q.shape
    K = indices.shape[1]
    out = _empty(T, H, d_v, dtype=q.dtype, device=q.device)
    lse = _empty(T, H, dtype=torch.float32, device=q.device) if return_lse else None
    if T == 0 or H == 0:
        return out, lse
    if K == 0:  # nothing to read anywhere (and no zero-size pointer reaches a launch)
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return out, lse
    if config is None:
        config = pick_config(T, H, D, d_v, K, q.device, kv_format)
    kvs = kv_spec(kv, kv_format, fp8, return_lse, q.device)
    # the kernel reads q rows, kv rows and index rows with unit inner stride (a record cache:
    # validated, its pages read in place)
    if q.stride(2) != 1:
        q = q.contiguous()
    if not kvs.fmt and kv.stride(1) != 1:
        kv = kv.contiguous()
    if indices.stride(1) != 1:
        indices = indices.contiguous()
    lens = lens.contiguous()
    sink = sink.contiguous() if sink is not None else None
    args = (q, kv, indices, lens, sm_scale, d_v, sink, out, lse)
    # split-K (partial kernel + combine) and one pass are separate compiles: separate keys
    r = resolve(config, T, H, D, d_v, K, q.device, kvs)
    key = (config, q.device, q.dtype, H, D, d_v, sink is not None, r["splits"] > 1, kvs)
    cfg = _FITTED.get(key)
    if cfg is not None:
        _run(*args, r if cfg == config else resolve(cfg, T, H, D, d_v, K, q.device, kvs))
        return out, lse
    if key in _UNBUILDABLE:  # tried and failed in this process: no second round of compiles
        raise KernelUnavailable(_UNBUILDABLE[key], whole_variant=False)
    try:
        _FITTED[key] = _fit(config, args, fit, kvs)
    except KernelUnavailable as exc:
        _UNBUILDABLE[key] = str(exc)
        raise
    return out, lse


def _fit(config: Config, args: tuple, fit: bool, kvs: KVSpec = ROWS) -> Config:
    """Run ``config`` (first use of a shape key), falling back as :func:`launch` says;
    returns the config that ran."""
    q, indices, d_v = args[0], args[2], args[5]
    T, H, D = q.shape
    K = indices.shape[1]
    queue = [config]
    tried: set = set()
    failures: list[str] = []
    while queue:
        cfg = queue.pop(0)
        if cfg in tried:
            continue
        tried.add(cfg)
        r = resolve(cfg, T, H, D, d_v, K, q.device, kvs)
        if _COMPILE_FIRST:  # compile without launching: an error here is the compiler's
            try:
                _run(*args, r, warmup=True)
            except Exception as exc:
                if not fit:
                    raise
                failures.append(f"{cfg.short()} does not compile with Triton {triton.__version__} ({_reason(exc)})")
                queue = [c for c in _fallbacks(cfg, _platform(q.device), D, H, kvs) if c not in tried] + queue
                continue
        try:
            _run(*args, r)
        except _RESOURCE_ERRORS as exc:
            smaller = _shrink(cfg) if fit else None
            if smaller is None:
                raise
            failures.append(f"{cfg.short()} does not fit the device ({_reason(exc)})")
            queue.insert(0, smaller)
            continue
        if failures:
            what = "" if not kvs.fmt else f", records {kvs}"
            msg = (f"sparse_mla: launch config {config.short()} replaced by {cfg.short()} for H={H}, D_qk={D}, "
                   f"d_v={d_v}, {q.dtype}{what}: " + "; ".join(failures))
            if msg not in _WARNED:
                _WARNED.add(msg)
                warnings.warn(msg, RuntimeWarning, stacklevel=4)
        return cfg
    raise KernelUnavailable(f"no launch config of the tl kernel compiles for H={H}, D_qk={D}, d_v={d_v}, {q.dtype} "
                            f"with Triton {triton.__version__}: " + "; ".join(failures), whole_variant=False)


def _run(q, kv, indices, lens, sm_scale, d_v, sink, out, lse, r: Mapping, warmup: bool = False) -> list:
    """Launch (or with ``warmup``, only compile) the kernels of one resolved config;
    returns what was compiled (warmup: Triton's compiled kernels, forward kernel first)."""
    T, H, D = q.shape
    has_sink = sink is not None
    lse_arg = lse if lse is not None else out  # never written without WRITE_LSE
    sink_arg = sink if has_sink else lse_arg  # never read without HAS_SINK
    grid = (T * r["num_hb"] * r["num_dvb"], r["splits"])
    meta = dict(BLOCK_H=r["block_h"], BLOCK_N=r["block_n"],
                BLOCK_D=r["block_d"], BLOCK_DV=r["block_dv"], SAME_TILE=r["same_tile"], EVEN_D=(D == r["block_d"]),
                EVEN_DV=(d_v % r["block_dv"] == 0), HAS_SINK=has_sink, SKIP_EMPTY=r["skip_empty"], DOT_F32=_INTERPRET,
                SPLIT_S=r["split_s"],
                num_warps=r["num_warps"], num_stages=r["num_stages"])
    if r["kv_fmt"]:  # rows: the kernel's defaults (the compile key of the rows kernel unchanged)
        meta.update(KV_FMT=r["kv_fmt"], FP8=r["fp8"], BS=r["bs"])
        if r["prefetch"]:
            meta.update(PREFETCH=True)
    write_lse = r["write_lse"]
    qk_scale = float(sm_scale) * LOG2E

    compiled = []

    def go(kernel, grid, *a, **kw):
        if warmup:
            compiled.append(kernel.warmup(*a, grid=grid, **kw))
        else:
            launch_meta(kernel, grid, a, kw)

    # rows: the row stride; records: the block stride (bytes from one page to the next)
    stride_kv = kv.stride(0) if not r["kv_fmt"] else _records.block_stride(kv)
    if r["splits"] == 1:
        go(_sparse_mla_fwd, grid,
           q, kv, indices, lens, sink_arg, out, lse_arg,
           H, D, d_v, r["chunk"], r["num_hb"], r["num_dvb"],
           q.stride(0), q.stride(1), stride_kv, indices.stride(0),
           out.stride(0), out.stride(1), lse_arg.stride(0), 0, 0,
           qk_scale, PARTIAL=False, **meta, **({} if write_lse else {"WRITE_LSE": False}))
        return compiled
    S = r["splits"]
    o_part = _empty(S, T, H, d_v, dtype=torch.float32, device=q.device)
    l_part = _empty(S, T, H, dtype=torch.float32, device=q.device)
    go(_sparse_mla_fwd, grid,
       q, kv, indices, lens, sink_arg, o_part, l_part,
       H, D, d_v, r["chunk"], r["num_hb"], r["num_dvb"],
       q.stride(0), q.stride(1), stride_kv, indices.stride(0),
       o_part.stride(1), o_part.stride(2), l_part.stride(1), o_part.stride(0), l_part.stride(0),
       qk_scale, PARTIAL=True, **meta)
    block_dvc = min(_pow2(d_v), COMBINE_BLOCK_DV)
    go(_sparse_mla_combine, (T, H, cdiv(d_v, block_dvc)),
       o_part, l_part, sink_arg, out, lse_arg,
       H, d_v, S,
       o_part.stride(0), o_part.stride(1), o_part.stride(2), l_part.stride(0), l_part.stride(1),
       out.stride(0), out.stride(1), lse_arg.stride(0),
       MAX_SPLITS=MAX_SPLITS, BLOCK_DV=block_dvc, HAS_SINK=has_sink, num_warps=4,
       **({} if write_lse else {"WRITE_LSE": False}))
    return compiled


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None,
               return_lse=True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(out [T, H, d_v] q.dtype, lse [T, H] fp32 or None)``: the Triton kernel (plain layout).

    Same signature and semantics as the reference; inputs are validated by the op's
    ``validate`` in front of it (``select(...).sparse_mla``). PAD (-1) and ``j >= lens``
    are skipped, PAD inside the active length included; the sink joins the denominator
    only; a token with nothing valid gives zeros and ``lse = -inf``. A record cache
    (``kv_format`` not "rows") is read in place, each tile dequantized in registers.
    """
    return launch(q, kv, indices, lens, sm_scale, d_v, sink, kv_format=kv_format, fp8=fp8, return_lse=return_lse)


def warmup(backend, *, num_heads=(64, 128), qk_head_dim: int = 512, v_head_dim: int = 512,
           attn_dtypes=(torch.bfloat16,), attn_sink=(False, True), kv_records=(), **_other) -> list[str]:
    """``Backend.warmup()`` hook: compile (by real launches, through ``backend``) every
    specialisation the serving path uses for these head counts, dtypes and sink settings:
    the one-pass kernel (prefill) and the split-K partial kernel + combine (decode: calls of a
    few tokens with :data:`DECODE_TUNED`'s tiles, larger ones with the table's). The
    shape of a step (tokens, index width, lengths) never selects another kernel.
    ``kv_records``: ``(kv_format, fp8, block_size)`` of the record caches the model reads (e.g.
    ROCm gfx942: ``(("v4_fp8", "e4m3fnuz", 64), ("v4_fp8", "e4m3fn", 16))`` for its SWA and
    compressed caches), each a kernel of its own. Unknown keyword arguments (other hooks') are
    ignored. Returns the ops it ran (none on a CPU: the interpreter compiles nothing)."""
    if (not backend.device.runnable or backend.device.platform == "cpu"
            or "triton" not in backend.variants.get("sparse_mla", ())):
        return []
    dev = torch.device(backend.device.torch_device)
    D, d_v = qk_head_dim, v_head_dim
    many = _num_sms(dev) if dev.type == "cuda" else 4  # enough programs that nothing splits
    caches = [(torch.randn(64, D, device=dev).to(dtype), dtype, {}) for dtype in attn_dtypes]
    for fmt, fp8, bs in kv_records:
        kv = _records.new_cache(max(1, -(-64 // bs)), bs, fmt, device=dev)  # zeros: valid records of 0
        caches.append((kv, torch.bfloat16, {"kv_format": fmt, "fp8": fp8}))
    for H in num_heads:
        for kv, dtype, rec in caches:
            Dq = _records.HEAD_DIM if rec else D
            dv = _records.HEAD_DIM if rec else d_v
            for sink_on in attn_sink:
                sink = torch.zeros(H, device=dev) if sink_on else None
                # decode (split-K: DECODE_TUNED's tiles, then the table row's past its items) and prefill
                for T in (1, 1 + max(r[2] for r in DECODE_TUNED), many):
                    q = torch.randn(T, H, Dq, device=dev).to(dtype)
                    idx = torch.randint(0, 64, (T, 256), device=dev, dtype=torch.int32)
                    lens = torch.full((T,), 256, device=dev, dtype=torch.int32)
                    backend.sparse_mla(q, kv, idx, lens, 1.0 / math.sqrt(Dq), dv,
                                       **({"sink": sink} if sink is not None else {}), **rec)
    return ["sparse_mla"]
