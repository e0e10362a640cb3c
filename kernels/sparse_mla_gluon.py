"""Gluon (Hopper) forward kernel for ``sparse_mla`` (SPEC §2.7), plain index layout.

Same op, arguments and results as :mod:`.sparse_mla` (the Triton ``tl`` kernel) and the
reference: ``out[t, h] = sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink[h]))`` over the
valid ``j`` (``j < lens[t]`` and ``indices[t, j] != PAD``), ``lse`` natural log without
the sink, zeros and ``lse = -inf`` for a token with nothing valid.

The default is the persistent warp-specialised kernel of :mod:`.sparse_mla_gluon_ws`
(:func:`default_for`); the kernel here (config ``n64b2l0``) is its fallback where that one
cannot be built. This module holds the configs, the scope rules and the launcher for both.

Why Gluon: the ``tl`` kernel tops out at ~240 TFLOP/s on the H200 because Triton's
pipeliner issues tile i+1's cp.async gather only after tile i's math
(``bench/notes_sparse_mla.md``). Here shared memory, cp.async groups, waits, barriers and
wgmma are explicit, so the gather runs ``NBUF - 1`` tiles ahead of the math:

* one program per (token, 64-head block), 8 warps = two warpgroups, one program per SM;
* Q ``[64, D]`` (64 KB at D 512) gathered once into shared memory; ``NBUF`` KV tile
  buffers ``[BN, D]``; P ``[64, BN]``;
* ``S = Q K^T``: wgmma layout with warps ``[4, 2]`` -> each warpgroup computes half of S's
  columns (FlashMLA's split); the row max is exchanged across the two warpgroups (the
  compiler goes through shared memory), row sums are kept per thread (``l_acc``) and
  reduced once at the end;
* ``acc [64, d_v]`` fp32 in registers (each warpgroup owns half of ``d_v``: 128 registers
  a thread at d_v 512); ``acc += P V`` with P from shared memory and V = the same KV tile;
* iteration i: retire P V(i-1) (wgmma wait), wait for tile i's cp.async group, fence,
  CTA barrier; now the buffer of tile i-1 is free in both warpgroups: issue the gather of
  tile ``i + NBUF - 1`` into it at once (row offsets from an index tile loaded one
  iteration earlier), then S, softmax, P to shared memory, barrier, P V(i) left in flight.

PAD rows and rows past ``lens`` are masked cp.async (zero fill, no memory traffic) and
``-inf`` scores. Scope (anything else keeps the ``tl`` kernel, see :func:`unsupported`):
CUDA sm90, bf16/fp16, ``D_qk = d_v = 512``, ``H >= 64`` (the last head block is masked),
enough programs to fill the SMs (decode keeps the ``tl`` kernel's split-K), a Triton with
the Gluon Hopper API (3.6: ``async_copy_global_to_shared``, 3.9: ``async_load``).

Never imported by ``import swa_backends``; imported lazily by :mod:`.sparse_mla`'s
launcher on a CUDA device (never under the interpreter: Gluon does not interpret).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper as _hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _async_copy

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# cp.async global -> shared: Triton 3.6 names it async_copy_global_to_shared, 3.9 async_load
# (the old name raises there). Both take (smem, pointer, mask).
_cp_async = getattr(_async_copy, "async_load", None) or _async_copy.async_copy_global_to_shared
_commit_group = _async_copy.commit_group
_wait_group = _async_copy.wait_group
_fence_async_shared = _hopper.fence_async_shared
_wgmma = _hopper.warpgroup_mma
_wgmma_wait = _hopper.warpgroup_mma_wait
# CTA barrier (bar.sync): 3.6 gl.thread_barrier, 3.9 gl.barrier
_barrier = getattr(gl, "thread_barrier", None) or getattr(gl, "barrier", None)


# ---------------------------------------------------------------------------------------
# kernel
# ---------------------------------------------------------------------------------------


@gluon.jit
def _issue_gather(KV, kv_buf, idx, stride_kv, offs_d):
    """cp.async of the KV rows ``idx`` (``-1``: masked, zero-filled, no traffic) into
    ``kv_buf [BN, D]``; row offsets in int64."""
    valid = idx >= 0
    rows = gl.where(valid, idx, 0).to(gl.int64) * stride_kv
    ptrs = KV + (gl.expand_dims(rows, 1) + gl.expand_dims(offs_d, 0))
    mask = gl.expand_dims(valid, 1) & gl.expand_dims(offs_d >= 0, 0)
    _cp_async(kv_buf, ptrs, mask=mask)


@gluon.jit
def _load_idx(idx_row, tile, length, BN: gl.constexpr, layout: gl.constexpr):
    """Index tile ``tile`` (``BN`` entries, ``-1`` past ``length``) in ``layout``."""
    cols = tile * BN + gl.arange(0, BN, layout=layout)
    return gl.load(idx_row + cols, mask=cols < length, other=-1)


@gluon.jit
def _softmax_rescale(s, m_i, m_new, l_acc, acc, o_row: gl.constexpr):
    """Online-softmax step of one scaled, masked, base-2 score tile ``s`` whose running max
    moves from ``m_i`` to ``m_new``: ``(P, l_acc, acc)`` with the row sums and the accumulator
    rescaled to the new max. A row with nothing valid yet keeps m = -inf: it is shifted by 0,
    so exp2 gives 0, not NaN."""
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_shift)
    p = gl.exp2(s - gl.expand_dims(m_shift, 1))
    l_acc = l_acc * gl.expand_dims(alpha, 1) + p
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row), 1)
    return p, l_acc, acc


@gluon.jit(do_not_specialize=["NUM_HB"])
def _sparse_mla_gluon_fwd(
    Q, KV, IDX, LENS, SINK, OUT, LSE,
    H, NUM_HB,
    stride_qt, stride_qh, stride_kv, stride_it, stride_ot, stride_oh, stride_lt,
    qk_scale,
    BLOCK_H: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr, D: gl.constexpr, DV: gl.constexpr,
    HAS_SINK: gl.constexpr, LAZY: gl.constexpr, P_SMEM: gl.constexpr, SPLIT_S: gl.constexpr,
    PIPE: gl.constexpr, num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 8, "two warpgroups")
    gl.static_assert(BLOCK_H == 64, "one wgmma M block of heads")
    gl.static_assert(NBUF >= 2, "at least two KV buffers")
    gl.static_assert(DV == D, "V is the whole K tile")
    gl.static_assert(not PIPE or (NBUF >= 3 and LAZY == 0 and not P_SMEM), "PIPE: >= 3 buffers, eager rescale, P in registers")
    dtype: gl.constexpr = Q.dtype.element_ty

    # layouts ------------------------------------------------------------------------
    # gathers: 16-byte cp.async per thread, a warp covers 256 contiguous columns of a row
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, ld_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, ld_layout)
    # S [64, BN]: with SPLIT_S warpgroup w computes columns [w*BN/2, (w+1)*BN/2) (the row
    # max and P are then exchanged across the warpgroups through shared memory); without,
    # the layout's second warpgroup column is a replica: both compute all of S (1/3 more
    # Q K^T shared-memory reads), and softmax and P stay in registers (no barrier)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BN // 2 if SPLIT_S else BN, 16])
    # acc [64, DV]: warpgroup w owns columns [w*DV/2, (w+1)*DV/2)
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, DV // 2, 16])
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_col: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    o_col: gl.constexpr = gl.SliceLayout(0, o_layout)
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D], dtype)
    kv_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BN], dtype)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, D], q_sl)
    kv_smem = gl.allocate_shared_memory(dtype, [NBUF, BN, D], kv_sl)
    if P_SMEM:
        p_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BN], p_sl)

    # program -> (token, head block), head block fastest: a token's programs run side by
    # side and the second reads the rows from L2
    pid = gl.program_id(0)
    hb = pid % NUM_HB
    t = (pid // NUM_HB).to(gl.int64)
    length = gl.load(LENS + t)
    n_tiles = gl.cdiv(length, BN)
    idx_row = IDX + t * stride_it
    offs_d = gl.arange(0, D, layout=col_layout)

    # Q: one cp.async group (heads past H zero-filled)
    offs_hq = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_layout)
    q_ptrs = Q + t * stride_qt + gl.expand_dims(offs_hq.to(gl.int64) * stride_qh, 1) + gl.expand_dims(offs_d, 0)
    _cp_async(q_smem, q_ptrs, mask=gl.expand_dims(offs_hq < H, 1) & gl.expand_dims(offs_d >= 0, 0))
    _commit_group()
    # prologue: tiles 0 .. NBUF-2 in flight (empty tiles are fully masked: no traffic, but
    # always one group per tile so the wait counts stay fixed)
    for j in gl.static_range(NBUF - 1):
        _issue_gather(KV, kv_smem.index(j), _load_idx(idx_row, j, length, BN, row_layout), stride_kv, offs_d)
        _commit_group()
    idx_next = _load_idx(idx_row, NBUF - 1, length, BN, row_layout)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=s_row)
    l_acc = gl.zeros([BLOCK_H, BN], gl.float32, layout=s_layout)
    acc = gl.zeros([BLOCK_H, DV], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_H, BN], gl.float32, layout=s_layout)

    if PIPE:
        # Q K^T(i+1) runs on the tensor cores while this warpgroup does softmax(i) (FlashAttention-3's
        # intra-warpgroup overlap); one tile fewer in flight (tile i's buffer is busy until P V(i)).
        # Tile 0's S first:
        _wait_group(NBUF - 2)
        _barrier()
        s_cur = _wgmma(q_smem, kv_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_cur = _wgmma_wait(0, deps=(s_cur,))
        valid_s = _load_idx(idx_row, 0, length, BN, s_col) >= 0
        s_cur = gl.where(gl.expand_dims(valid_s, 0), s_cur * qk_scale, float("-inf"))
        for i in range(n_tiles):
            valid_s = _load_idx(idx_row, i + 1, length, BN, s_col) >= 0
            # committed: tiles up to i+NBUF-2; tile i+1 must have landed
            _wait_group(NBUF - 3)
            _barrier()  # tile i+1 visible; both warpgroups past P V(i-1): tile i-1's buffer is free
            _issue_gather(KV, kv_smem.index((i + NBUF - 1) % NBUF), idx_next, stride_kv, offs_d)
            _commit_group()
            idx_next = _load_idx(idx_row, i + NBUF, length, BN, row_layout)
            # S(i+1), also past the last tile (a fully masked gather: zeros, never used)
            s_next = _wgmma(q_smem, kv_smem.index((i + 1) % NBUF).permute((1, 0)), s_zero, use_acc=False,
                            is_async=True)
            m_new = gl.maximum(m_i, gl.max(s_cur, axis=1))
            p, l_acc, acc = _softmax_rescale(s_cur, m_i, m_new, l_acc, acc, o_row)
            m_i = m_new
            p_op = gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
            acc = _wgmma(p_op, kv_smem.index(i % NBUF), acc, is_async=True)
            s_next, acc = _wgmma_wait(0, deps=(s_next, acc))
            s_cur = gl.where(gl.expand_dims(valid_s, 0), s_next * qk_scale, float("-inf"))
    for i in range(0 if PIPE else n_tiles):
        buf = i % NBUF
        # tile i's index entries in S's column layout (L1/L2-hot: read for the gather)
        valid_s = _load_idx(idx_row, i, length, BN, s_col) >= 0
        # wait for tile i's rows (this thread's copies), make them visible to wgmma, then
        # the CTA barrier: tile i is in shared memory, and both warpgroups are past P V(i-1)
        # (synchronous), so tile i-1's buffer is free
        _wait_group(NBUF - 2)
        if NBUF == 2:
            # nothing else in flight: the proxy fence (cp.async writes -> wgmma reads) is free
            _fence_async_shared()
        # With gathers still in flight the fence is left out: fence.proxy.async compiles to
        # MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S and the MEMBAR waits for them (H200: every
        # 32-row config stalled); Triton 3.6's own pipeliner feeds wgmma from cp.async with
        # wait + barrier only, as here (Triton 3.9 inserts the fence itself).
        _barrier()
        # gather tile i + NBUF - 1 into the buffer tile i-1 used
        _issue_gather(KV, kv_smem.index((i + NBUF - 1) % NBUF), idx_next, stride_kv, offs_d)
        _commit_group()
        idx_next = _load_idx(idx_row, i + NBUF, length, BN, row_layout)

        kv_buf = kv_smem.index(buf)
        s = _wgmma(q_smem, kv_buf.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = _wgmma_wait(0, deps=(s,))
        s = gl.where(gl.expand_dims(valid_s, 0), s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        if LAZY > 0:
            # keep the old reference max while no row's max grew by more than LAZY (log2
            # units: P <= 2^LAZY, exact in fp32 / bf16 range); then acc needs no rescale.
            # One CTA-wide decision so the branch is uniform.
            grow = gl.max(gl.where(m_new > m_i + LAZY, 1, 0), axis=0)
            if grow > 0:
                m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = gl.exp2(m_i - m_shift)
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row), 1)
                l_acc = l_acc * gl.expand_dims(alpha, 1)
                m_i = m_new
            m_shift = gl.where(m_i == float("-inf"), 0.0, m_i)
            p = gl.exp2(s - gl.expand_dims(m_shift, 1))
            l_acc = l_acc + p
        else:
            p, l_acc, acc = _softmax_rescale(s, m_i, m_new, l_acc, acc, o_row)
            m_i = m_new
        # P V synchronous: an accumulator left in flight across the loop's back edge makes
        # ptxas serialise every wgmma of the kernel (C7515: the loop's entry defines the
        # accumulator registers with plain moves), offline ptxas 3.6 / 3.9
        if P_SMEM:
            # P through an NVMMA shared buffer (A operand from shared memory): needs the proxy
            # fence, whose MEMBAR waits for the gathers in flight
            p_smem.store(p.to(dtype))
            _fence_async_shared()
            _barrier()
            acc = _wgmma(p_smem, kv_buf, acc, is_async=True)
        else:
            # P as the register A operand: both warpgroups need all of P's columns, the
            # layout conversion exchanges the halves through shared memory with plain
            # stores/loads and a barrier (no proxy fence)
            p_op = gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
            acc = _wgmma(p_op, kv_buf, acc, is_async=True)
        acc = _wgmma_wait(0, deps=(acc,))

    _wait_group(0)  # the look-ahead past the last tile (masked, nothing read)

    l_i = gl.sum(l_acc, axis=1)
    has = l_i > 0.0
    m_shift = gl.where(m_i == float("-inf"), 0.0, m_i)
    offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=s_row)
    h_ok = offs_h < H
    if HAS_SINK:
        # the sink joins the denominator only, in the m-shifted base-2 frame; an empty row
        # stays 0 / 1 = 0 even when exp(sink) underflows
        sink2 = gl.load(SINK + offs_h, mask=h_ok, other=0.0) * 1.4426950408889634
        denom = gl.where(has, l_i + gl.exp2(sink2 - m_shift), 1.0)
    else:
        denom = gl.where(has, l_i, 1.0)
    lse = gl.where(has, (m_i + gl.log2(gl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    gl.store(LSE + t * stride_lt + offs_h, lse, mask=h_ok)

    inv = gl.convert_layout(1.0 / denom, o_row)
    o = (acc * gl.expand_dims(inv, 1)).to(dtype)
    offs_ho = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=o_row)
    offs_v = gl.arange(0, DV, layout=o_col)
    o_ptrs = OUT + t * stride_ot + gl.expand_dims(offs_ho.to(gl.int64) * stride_oh, 1) + gl.expand_dims(offs_v, 0)
    gl.store(o_ptrs, o, mask=gl.expand_dims(offs_ho < H, 1) & gl.expand_dims(offs_v >= 0, 0))


# ---------------------------------------------------------------------------------------
# configuration, scope, launch
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GluonConfig:
    """``block_n``: KV rows per tile (S's N; each warpgroup computes half); ``nbuf``: KV
    tile buffers in shared memory (``nbuf - 1`` gathers in flight while a tile computes);
    ``lazy``: rescale the accumulator only when a row's max grew by more than this (log2
    units; 0 = every tile, as the tl kernel does). Shared memory: Q 64 KB + nbuf x
    block_n KB + P, at most 227 KB."""

    block_n: int = 64
    nbuf: int = 2
    lazy: int = 0
    p_smem: bool = False
    split_s: bool = True
    pipe: bool = False
    ws: bool = False  # the warp-specialised kernel (kernels/sparse_mla_gluon_ws.py; fields above unused)

    def replace(self, **kw) -> "GluonConfig":
        return dataclasses.replace(self, **kw)

    def short(self) -> str:
        if self.ws:
            return "gluon-ws"
        return (f"gluon-n{self.block_n}b{self.nbuf}" + ("" if self.lazy == 8 else f"l{self.lazy}")
                + ("s" if self.p_smem else "") + ("" if self.split_s else "d") + ("p" if self.pipe else ""))


# H200 (Triton 3.6, T 16K, K 640, lead's runs of aec955c / bf470ee): n64b2l0 (P through shared
# memory) 305 / 318 TFLOP/s at H 64 / 128, the n32 configs 214-246, the tl kernel 236-258.
DEFAULT = GluonConfig(block_n=64, nbuf=2, lazy=0)
# The persistent warp-specialised kernel (kernels/sparse_mla_gluon_ws.py): the shipped default
# (default_for); DEFAULT above where it cannot be built (H200 run 44: 357.8-458.6 TFLOP/s).
WS = GluonConfig(ws=True)
# What bench/bench_sparse_mla.py --gluon measures (and the GPU tests run); each compiles
# offline for sm_90a with Triton 3.6 and 3.9 (tests/test_sparse_mla_gluon_compile.py).
# "s": P through an NVMMA shared buffer (+ fence.proxy.async, whose MEMBAR.ALL.CTA waits for
# the gathers in flight); default: P as the register A operand of P V.
SWEEP: tuple[GluonConfig, ...] = (
    GluonConfig(block_n=64, nbuf=2, lazy=0),                # default (H200 runs 9-16: 300-306 / 306-318)
    GluonConfig(block_n=64, nbuf=2, lazy=0, p_smem=True),   # P through shared memory: within noise of the default
    GluonConfig(block_n=32, nbuf=4, lazy=0),                # 3 tiles in flight: 224-251
    GluonConfig(block_n=64, nbuf=2, lazy=0, split_s=False),  # S in both warpgroups: 276-283
    GluonConfig(block_n=32, nbuf=4, lazy=0, split_s=False, pipe=True),  # Q K^T(i+1) before softmax(i): 237-246
    WS,  # persistent warp-specialised (the default): T 16K / K 640, run 44: 381 / 417 (H 64 / 128)
)
# Measured and dropped from the sweep (bench/results/2026-11-29-h200, runs 8-16): n32b3l0, n32b4 (lazy 8),
# n32b4l0d, n32b3l0dp: each at or below the 32-row configs above.

BLOCK_H = 64
HEAD_DIM = 512
SMEM_LIMIT = 232448  # H100/H200: 227 KB per block (opt-in)
ENV = "SWA_SPARSE_MLA_GLUON"  # "0": never use the Gluon kernel; "n32b4"-style: that config


def shared_bytes(cfg: GluonConfig, D: int = HEAD_DIM, itemsize: int = 2) -> int:
    """Shared memory the kernel allocates explicitly (the compiler adds reduction scratch)."""
    return (BLOCK_H * D + cfg.nbuf * cfg.block_n * D + BLOCK_H * cfg.block_n) * itemsize  # P: buffer or exchange


@functools.lru_cache(maxsize=None)
def api_reason() -> str | None:
    """Why this Triton cannot build the kernel (None: it can)."""
    missing = [n for n, ok in (("warpgroup_mma", hasattr(_hopper, "warpgroup_mma")),
                                ("warpgroup_mma_wait", hasattr(_hopper, "warpgroup_mma_wait")),
                                ("fence_async_shared", hasattr(_hopper, "fence_async_shared")),
                                ("async_copy.commit_group", hasattr(_async_copy, "commit_group")),
                                ("async_copy.wait_group", hasattr(_async_copy, "wait_group")),
                                ("thread_barrier/barrier", _barrier is not None)) if not ok]
    if missing:
        return f"Triton {triton.__version__} gluon lacks {', '.join(missing)}"
    return None


def parse_env(text: str | None) -> GluonConfig | bool:
    """``SWA_SPARSE_MLA_GLUON``: unset/"1"/"auto" -> True (default on where supported),
    "0"/"off" -> False, "n64b2l0" / "gluon-n32b4" -> that config (``l``: lazy threshold,
    8 when absent; then ``s``: P through shared memory; ``d``: S duplicated in both
    warpgroups instead of split)."""
    if text is None or text.strip().lower() in ("", "1", "on", "auto", "true", "yes"):
        return True
    t = text.strip().lower()
    if t in ("0", "off", "false", "no"):
        return False
    if t in ("ws", "gluon-ws"):
        return WS
    m = re.fullmatch(r"(?:gluon-)?n(\d+)b(\d+)(?:l(\d+))?(s?)(d?)(p?)", t)
    if m:
        return GluonConfig(block_n=int(m.group(1)), nbuf=int(m.group(2)),
                           lazy=int(m.group(3)) if m.group(3) is not None else 8, p_smem=bool(m.group(4)),
                           split_s=not m.group(5), pipe=bool(m.group(6)))
    raise ValueError(f"{ENV}={text!r}: expected 0, 1 or a config like n32b4 (block_n 32, 4 buffers) or n32b4l0 "
                     "(no lazy rescale)")


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[tuple[int, int], int]:
    """``(compute capability, SM count)`` of CUDA device ``index``, read once per process
    (:func:`unsupported` runs on every ``sparse_mla`` call)."""
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count


def unsupported(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, d_v: int, *,
                cfg: GluonConfig = DEFAULT, num_sms: int | None = None) -> str | None:
    """Why the Gluon kernel does not take this call (None: it does). Checks the shape,
    dtype and device only: no device work, graph-safe."""
    if q.device.type != "cuda" or getattr(torch.version, "hip", None):
        return f"device {q.device} is not CUDA"
    cap, device_sms = _device_facts(q.device.index if q.device.index is not None else torch.cuda.current_device())
    if cap[0] != 9:
        return f"compute capability {cap[0]}.{cap[1]} is not sm90 (Hopper wgmma)"
    reason = api_reason()
    if reason:
        return reason
    if q.dtype not in (torch.bfloat16, torch.float16) or kv.dtype != q.dtype:
        return f"dtype {q.dtype}/{kv.dtype}: the Gluon kernel takes bf16/fp16"
    T, H, D = q.shape
    if D != HEAD_DIM or d_v != HEAD_DIM:
        return f"D_qk={D}, d_v={d_v}: the Gluon kernel takes D_qk = d_v = {HEAD_DIM}"
    if H < BLOCK_H:
        return f"H={H} < {BLOCK_H}: one 64-head wgmma block would be mostly padding"
    if cfg.ws:
        ws = _ws_module()
        if isinstance(ws, str):
            return ws
    elif (cfg.pipe and (cfg.nbuf < 3 or cfg.lazy or cfg.p_smem)) or cfg.block_n not in (32, 64) or cfg.nbuf < 2 \
            or not 0 <= cfg.lazy <= 16 or shared_bytes(cfg, D) + 4096 > SMEM_LIMIT:
        return f"config {cfg.short()} does not fit (block_n 32/64, nbuf >= 2, {shared_bytes(cfg, D)} B of shared memory)"
    programs = T * triton.cdiv(H, BLOCK_H)
    sms = num_sms if num_sms is not None else device_sms
    if programs < sms:
        return f"{programs} programs < {sms} SMs: decode-sized, the tl kernel's split-K fills the GPU"
    if q.stride(2) != 1 or kv.stride(1) != 1 or indices.stride(1) != 1:
        return "inner strides must be 1"
    return None


def launch(q, kv, indices, lens, sm_scale, d_v, sink, out, lse, *, config: GluonConfig = DEFAULT,
           warmup: bool = False):
    """Run (or with ``warmup`` only compile, returning the compiled kernel) the Gluon kernel
    into ``out``/``lse``. The caller checked :func:`unsupported` (and validated the inputs).
    Both kernels (n64b2l0-style and ws) take the same runtime arguments."""
    T, H, D = q.shape
    num_hb = triton.cdiv(H, BLOCK_H)
    has_sink = sink is not None
    args = (q, kv, indices, lens, sink if has_sink else lse, out, lse,
            H, num_hb,
            q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), out.stride(0), out.stride(1), lse.stride(0),
            float(sm_scale) * LOG2E)
    grid = (T * num_hb,)
    if config.ws:  # persistent: one program per SM, each over every grid-th (token, head block)
        meta = _ws_module().launch_meta(has_sink)
        args = args + (T * num_hb,)
        if q.is_cuda:  # (offline compiles pass CPU tensors: the grid does not matter there)
            sms = _device_facts(q.device.index if q.device.index is not None else torch.cuda.current_device())[1]
            grid = (max(1, min(T * num_hb, sms)),)
    else:
        meta = dict(BLOCK_H=BLOCK_H, BN=config.block_n, NBUF=config.nbuf, D=D, DV=d_v, HAS_SINK=has_sink,
                    LAZY=config.lazy, P_SMEM=config.p_smem, SPLIT_S=config.split_s,
                    PIPE=config.pipe, num_warps=8)
    fn = kernel_for(config)
    if warmup:
        return fn.warmup(*args, grid=grid, **meta)
    fn[grid](*args, **meta)
    return None


@functools.lru_cache(maxsize=None)
def _ws_module():
    """:mod:`.sparse_mla_gluon_ws`, or why this Triton cannot build it (imported on first use)."""
    try:
        from . import sparse_mla_gluon_ws
    except Exception as exc:  # an older Gluon without warp_specialize / mbarrier
        return f"Triton {triton.__version__}: no warp-specialised Gluon ({type(exc).__name__}: {exc})"
    return sparse_mla_gluon_ws.api_reason() or sparse_mla_gluon_ws


def default_for(H: int) -> GluonConfig:
    """The shipped config for ``H`` heads: the warp-specialised persistent kernel (H200 run
    43, T 16K / K 640: 372-379 TFLOP/s at H 64, 363-408 at H 128, against n64b2l0's 276-295);
    n64b2l0 where this Triton cannot build it (and, per call, where its compile fails)."""
    if not isinstance(_ws_module(), str):
        return WS
    return DEFAULT


def kernel_for(cfg: GluonConfig):
    """The JIT function ``launch`` runs for ``cfg`` (offline-compile scripts patch its warmup)."""
    return _ws_module()._sparse_mla_gluon_ws_fwd if cfg.ws else _sparse_mla_gluon_fwd


def config_from_env() -> GluonConfig | None | bool:
    return parse_env(os.environ.get(ENV))
