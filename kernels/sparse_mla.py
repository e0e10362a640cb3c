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
  rule has both warpgroups compute the whole S (see ``_tile``).
* The loop stops at the token's length, so tiles past ``lens`` cost nothing; PAD rows
  inside the length are masked loads (no memory traffic) and ``-inf`` scores.
  ``SKIP_EMPTY`` additionally branches around tiles that hold no valid index at all.
* Decode (few tokens): ``splits`` programs share one token's index list; each writes an
  fp32 partial (normalised output and base-2 lse) and a small combine kernel merges them
  and adds the sink, so 1..256 tokens still fill the GPU's SMs.

The clamp never enters: it lives in ``indices``/``lens`` built by the pack's index builders.
Launch configs come from :data:`TUNED` (keyed by shape, filled from H200 sweeps of
``bench/bench_sparse_mla.py``); ``SWA_SPARSE_MLA_CONFIG`` overrides them for sweeps.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# Fixed when this module is imported (kernels.interpreter.setup runs first). Triton 3.9's
# interpreter multiplies bf16 dot operands as raw integers, so interpreted runs feed tl.dot
# fp32 copies (P still rounded to the input dtype first, as on the GPU).
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
LN2 = 0.6931471805599453


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
def _softmax_step(s, valid, m_i, qk_scale):
    """Online-softmax step of one tile: (new running max, rescale of the old sums, P)."""
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.reduce(s, 1, _max_fn))
    # a row with nothing valid yet keeps m = -inf: shift by 0 so exp2 gives 0, not NaN
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, tl.exp2(m_i - m_shift), tl.exp2(s - m_shift[:, None])


@triton.jit
def _tile(KV, q, idx, valid, offs_d, offs_v, v_ok, D, stride_kv, qk_scale, m_i, l_i, acc,
          SAME_TILE: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, DOT_F32: tl.constexpr,
          SPLIT_S: tl.constexpr):
    """One KV tile: gather its rows once, S = Q K^T, online softmax, acc += P V."""
    rows = tl.where(valid, idx, 0).to(tl.int64) * stride_kv
    if EVEN_D:
        k = tl.load(KV + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
    else:
        k = tl.load(KV + rows[:, None] + offs_d[None, :], mask=valid[:, None] & (offs_d[None, :] < D), other=0.0)
    if DOT_F32:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    else:
        s = tl.dot(q, tl.trans(k))
    if SPLIT_S:
        # Triton gives a dot whose result feeds another dot (S -> P -> P V) all warps along
        # M; with 64 heads and 8 warps both warpgroups then compute the whole S (1.5x the
        # MMA work of the tile). Producing P inside a branch (always taken: qk_scale > 0 is
        # validated) hides the P V dot from that heuristic, so S is split along N across
        # the warpgroups and P is exchanged through shared memory (FlashMLA's layout).
        if qk_scale > 0.0:
            m_new, alpha, p = _softmax_step(s, valid, m_i, qk_scale)
        else:
            m_new, alpha, p = _softmax_step(s, valid, m_i, -qk_scale)
    else:
        m_new, alpha, p = _softmax_step(s, valid, m_i, qk_scale)
    l_i = l_i * alpha + tl.reduce(p, 1, _sum_fn)
    if SAME_TILE:
        v = k  # V = the first d_v columns of the K tile, already gathered
    else:
        if EVEN_DV:
            v = tl.load(KV + rows[:, None] + offs_v[None, :], mask=valid[:, None], other=0.0)
        else:
            v = tl.load(KV + rows[:, None] + offs_v[None, :], mask=valid[:, None] & v_ok[None, :], other=0.0)
    if DOT_F32:
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32))  # P rounded as on the GPU
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


# NUM_HB / NUM_DVB only decompose the program id: not specialised, so H 64 and H 128 share
# one compiled kernel.
@triton.jit(do_not_specialize=["NUM_HB", "NUM_DVB"])
def _sparse_mla_fwd(
    Q, KV, IDX, LENS, SINK, OUT, LSE,
    H, D, DV, CHUNK, NUM_HB, NUM_DVB,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_ot, stride_oh, stride_lt, stride_ps, stride_ls,
    qk_scale,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    SAME_TILE: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    HAS_SINK: tl.constexpr, PARTIAL: tl.constexpr, SKIP_EMPTY: tl.constexpr, DOT_F32: tl.constexpr,
    SPLIT_S: tl.constexpr,
):
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
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + offs_n
        idx = tl.load(idx_row + cols, mask=cols < end, other=-1)
        valid = idx >= 0  # PAD (-1) inside the length and everything past it
        if SKIP_EMPTY:
            if tl.reduce(valid.to(tl.int32), 0, _max_fn) > 0:
                m_i, l_i, acc = _tile(KV, q, idx, valid, offs_d, offs_v, v_ok, D, stride_kv, qk_scale,
                                      m_i, l_i, acc, SAME_TILE, EVEN_D, EVEN_DV, DOT_F32, SPLIT_S)
        else:
            m_i, l_i, acc = _tile(KV, q, idx, valid, offs_d, offs_v, v_ok, D, stride_kv, qk_scale,
                                  m_i, l_i, acc, SAME_TILE, EVEN_D, EVEN_DV, DOT_F32, SPLIT_S)

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
        if vb == 0:
            tl.store(LSE + t * stride_lt + offs_h, lse, mask=h_ok)


@triton.jit
def _sparse_mla_combine(
    O_PART, LSE_PART, SINK, OUT, LSE,
    H, DV, SPLITS,
    stride_ps, stride_pt, stride_ph, stride_lps, stride_lpt,
    stride_ot, stride_oh, stride_lt,
    BLOCK_H: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_SINK: tl.constexpr,
):
    """Merge the splits of one (token, head block): weights 2^(lse2_s - max)."""
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < H
    offs_v = tl.arange(0, BLOCK_DV)
    mask = h_ok[:, None] & (offs_v[None, :] < DV)

    # pointers advance split by split (64-bit pointer arithmetic, no int32 products)
    lse_ptrs = LSE_PART + t * stride_lpt + offs_h
    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    for _ in range(0, SPLITS):
        m = tl.maximum(m, tl.load(lse_ptrs, mask=h_ok, other=float("-inf")))
        lse_ptrs += stride_lps
    m_shift = tl.where(m == float("-inf"), 0.0, m)
    lse_ptrs = LSE_PART + t * stride_lpt + offs_h
    o_ptrs = O_PART + t * stride_pt + offs_h[:, None].to(tl.int64) * stride_ph + offs_v[None, :]
    total = tl.full([BLOCK_H], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_H, BLOCK_DV], 0.0, dtype=tl.float32)
    for _ in range(0, SPLITS):
        w = tl.exp2(tl.load(lse_ptrs, mask=h_ok, other=float("-inf")) - m_shift)
        total += w
        acc += w[:, None] * tl.load(o_ptrs, mask=mask, other=0.0)
        lse_ptrs += stride_lps
        o_ptrs += stride_ps
    has = total > 0.0
    if HAS_SINK:
        sink2 = tl.load(SINK + offs_h, mask=h_ok, other=0.0) * 1.4426950408889634
        denom = tl.where(has, total + tl.exp2(sink2 - m_shift), 1.0)
    else:
        denom = tl.where(has, total, 1.0)
    out = acc / denom[:, None]
    lse = tl.where(has, (m + tl.log2(tl.where(has, total, 1.0))) * 0.6931471805599453, float("-inf"))
    tl.store(OUT + t * stride_ot + offs_h[:, None].to(tl.int64) * stride_oh + offs_v[None, :],
             out.to(OUT.dtype.element_ty), mask=mask)
    tl.store(LSE + t * stride_lt + offs_h, lse, mask=h_ok)


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
    ``split_s``: split S across warpgroups instead of computing it in each (see _tile).
    """

    block_h: int = 64
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    dv_split: int = 1
    splits: int | None = None
    skip_empty: bool = False
    split_s: bool = False

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
        return s


# Launch configs keyed by (platform, D_qk bucket, heads bucket); the first matching row
# wins. Values for cuda/512 are the design's starting point, chosen from sm_90a builds
# (Triton 3.9, ptxas 13.0) before any H200 run: 64 heads x 64 rows, 8 warps, 2 stages
# (Q 64 KB + 2 x 64 KB KV tiles = 205 KB of shared memory, 128 accumulator registers a
# thread); split_s halves the Q K^T MMA instructions of the loop (68 -> 36 HGMMA) and
# removes the register spills (22 -> 0 local loads a tile). Refine from the H200 sweep.
TUNED: tuple[tuple[str, int, int, Config], ...] = (
    # platform, max D_qk, max heads, config
    ("cuda", 512, 16, Config(block_h=16, block_n=64, num_warps=4, num_stages=2)),
    ("cuda", 512, 32, Config(block_h=32, block_n=64, num_warps=8, num_stages=2)),  # 4 warps spill (sm_90a)
    # H200, Triton 3.6 (2026-11-29, bench/results/): 209-233 TFLOP/s at D 512; split_s configs fail
    # to compile there (TritonGPUPipeline pass), so they stay out of the default.
    ("cuda", 512, 1 << 30, Config(block_h=64, block_n=64, num_warps=8, num_stages=2)),
    # ROCm: gfx942 has 64 KB of LDS per CU, so smaller tiles and one stage (not measured)
    ("rocm", 512, 1 << 30, Config(block_h=32, block_n=32, num_warps=8, num_stages=1)),
    # anything else (small D, the CPU interpreter): modest tiles
    ("*", 1 << 30, 1 << 30, Config(block_h=64, block_n=32, num_warps=4, num_stages=2)),
)

# What bench/bench_sparse_mla.py sweeps on the H200 (and tests/test_sparse_mla_gpu.py
# checks for correctness): tile shapes, pipeline depth, d_v split, all-PAD-tile skipping.
SWEEP: tuple[str, ...] = (
    "block_h=64,block_n=64,num_warps=8,num_stages=2,split_s=1",  # the default
    "block_h=64,block_n=64,num_warps=8,num_stages=2",            # S computed by both warpgroups
    "block_h=64,block_n=64,num_warps=8,num_stages=3,split_s=1",
    "block_h=64,block_n=32,num_warps=8,num_stages=3,split_s=1",
    "block_h=64,block_n=32,num_warps=8,num_stages=3",
    "block_h=64,block_n=32,num_warps=8,num_stages=5,split_s=1",  # 3 KV tiles in flight
    "block_h=64,block_n=16,num_warps=8,num_stages=5,split_s=1",
    "block_h=64,block_n=16,num_warps=8,num_stages=7,split_s=1",  # 4 KV tiles in flight
    "block_h=64,block_n=64,num_warps=8,num_stages=2,split_s=1,skip_empty=1",
    "block_h=64,block_n=32,num_warps=8,num_stages=3,split_s=1,dv_split=2",
    "block_h=128,block_n=16,num_warps=8,num_stages=3,dv_split=2",  # 128 heads share one gather
    "block_h=128,block_n=32,num_warps=8,num_stages=2,dv_split=2",
)

_ENV = "SWA_SPARSE_MLA_CONFIG"
_FIELDS = {f.name: f.type for f in dataclasses.fields(Config)}


def parse_config(text: str, base: Config | None = None) -> Config:
    """``"block_n=32,num_warps=8,splits=1"`` -> :class:`Config` (unnamed fields from ``base``)."""
    cfg = base or Config()
    kw = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in _FIELDS:
            raise ValueError(f"{_ENV}={text!r}: expected comma-separated name=value with names in {sorted(_FIELDS)}")
        value = value.strip()
        if name in ("skip_empty", "split_s"):
            kw[name] = value.lower() in ("1", "true", "yes", "on")
        elif name == "splits" and value.lower() in ("none", "auto", ""):
            kw[name] = None
        else:
            kw[name] = int(value)
    return cfg.replace(**kw)


def _platform(device: torch.device) -> str:
    if device.type == "cuda":
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return device.type


def table_config(platform: str, D: int, H: int) -> Config:
    """The first :data:`TUNED` row for this platform, ``D_qk`` and head count."""
    return next(c for p, dmax, hmax, c in TUNED if p in (platform, "*") and D <= dmax and H <= hmax)


def pick_config(T: int, H: int, D: int, d_v: int, K: int, device: torch.device) -> Config:
    """The table's config for this shape (``SWA_SPARSE_MLA_CONFIG`` overrides fields);
    :func:`resolve` clips it to the shape."""
    cfg = table_config(_platform(device), D, H)
    env = os.environ.get(_ENV)
    if env:
        cfg = parse_config(env, cfg)
    return cfg


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def resolve(cfg: Config, T: int, H: int, D: int, d_v: int, K: int, device: torch.device) -> dict:
    """Concrete launch parameters for one call (no device work: graph-safe)."""
    block_d = max(16, _pow2(D))
    dv_split = max(1, min(cfg.dv_split, _pow2(d_v) // 16))
    block_dv = max(16, _pow2(d_v) // dv_split)
    num_dvb = triton.cdiv(d_v, block_dv)
    block_h = max(16, min(_pow2(cfg.block_h), _pow2(H)))
    num_hb = triton.cdiv(H, block_h)
    block_n = max(16, _pow2(cfg.block_n))
    tiles = triton.cdiv(max(K, 1), block_n)
    programs = T * num_hb * num_dvb
    if cfg.splits is None:
        sms = _num_sms(device)
        # split the index list only when the grid would leave SMs idle, and keep each
        # split at >= 2 tiles so the combine stays cheap next to the gathers
        splits = 1 if programs >= sms else min(triton.cdiv(2 * sms, max(programs, 1)), max(1, tiles // 2))
    else:
        splits = cfg.splits
    splits = max(1, min(splits, tiles))
    chunk = triton.cdiv(tiles, splits) * block_n
    splits = triton.cdiv(max(K, 1), chunk)
    return dict(block_h=block_h, num_hb=num_hb, block_n=block_n, block_d=block_d, block_dv=block_dv,
                num_dvb=num_dvb, splits=splits, chunk=chunk, same_tile=(num_dvb == 1 and block_dv == block_d),
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, skip_empty=cfg.skip_empty,
                split_s=cfg.split_s)


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
# (requested config, shape key) -> the config that launched; filled on first use.
_FITTED: dict = {}


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


def launch(q, kv, indices, lens, sm_scale, d_v, sink=None, *, config: Config | None = None, fit: bool = True):
    """:func:`sparse_mla` with an explicit :class:`Config` (benchmarks and sweeps).

    ``fit``: when the config does not fit the device (shared memory, registers), retry
    with smaller ones (remembered per shape); ``fit=False`` raises instead (sweeps).
    """
    T, H, D = q.shape
    K = indices.shape[1]
    out = _empty(T, H, d_v, dtype=q.dtype, device=q.device)
    lse = _empty(T, H, dtype=torch.float32, device=q.device)
    if T == 0 or H == 0:
        return out, lse
    if K == 0:  # nothing to read anywhere (and no zero-size pointer reaches a launch)
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    if config is None:
        config = pick_config(T, H, D, d_v, K, q.device)
    # the kernel reads q rows, kv rows and index rows with unit inner stride
    if q.stride(2) != 1:
        q = q.contiguous()
    if kv.stride(1) != 1:
        kv = kv.contiguous()
    if indices.stride(1) != 1:
        indices = indices.contiguous()
    lens = lens.contiguous()
    sink = sink.contiguous() if sink is not None else None
    key = (config, q.device, q.dtype, H, D, d_v, sink is not None)
    cfg = _FITTED.get(key, config)
    while True:
        try:
            _run(q, kv, indices, lens, sm_scale, d_v, sink, out, lse, resolve(cfg, T, H, D, d_v, K, q.device))
            break
        except _RESOURCE_ERRORS:
            smaller = _shrink(cfg) if fit else None
            if smaller is None:
                raise
            cfg = smaller
    _FITTED[key] = cfg
    return out, lse


def _run(q, kv, indices, lens, sm_scale, d_v, sink, out, lse, r: dict) -> None:
    T, H, D = q.shape
    has_sink = sink is not None
    sink_arg = sink if has_sink else lse  # never read without HAS_SINK
    grid = (T * r["num_hb"] * r["num_dvb"], r["splits"])
    meta = dict(BLOCK_H=r["block_h"], BLOCK_N=r["block_n"],
                BLOCK_D=r["block_d"], BLOCK_DV=r["block_dv"], SAME_TILE=r["same_tile"], EVEN_D=(D == r["block_d"]),
                EVEN_DV=(d_v % r["block_dv"] == 0), HAS_SINK=has_sink, SKIP_EMPTY=r["skip_empty"], DOT_F32=_INTERPRET,
                SPLIT_S=r["split_s"],
                num_warps=r["num_warps"], num_stages=r["num_stages"])
    qk_scale = float(sm_scale) * LOG2E
    if r["splits"] == 1:
        _sparse_mla_fwd[grid](
            q, kv, indices, lens, sink_arg, out, lse,
            H, D, d_v, r["chunk"], r["num_hb"], r["num_dvb"],
            q.stride(0), q.stride(1), kv.stride(0), indices.stride(0),
            out.stride(0), out.stride(1), lse.stride(0), 0, 0,
            qk_scale, PARTIAL=False, **meta)
        return
    S = r["splits"]
    o_part = _empty(S, T, H, d_v, dtype=torch.float32, device=q.device)
    l_part = _empty(S, T, H, dtype=torch.float32, device=q.device)
    _sparse_mla_fwd[grid](
        q, kv, indices, lens, sink_arg, o_part, l_part,
        H, D, d_v, r["chunk"], r["num_hb"], r["num_dvb"],
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0),
        o_part.stride(1), o_part.stride(2), l_part.stride(1), o_part.stride(0), l_part.stride(0),
        qk_scale, PARTIAL=True, **meta)
    block_hc = max(1, min(_pow2(H), max(1, 8192 // _pow2(d_v))))
    _sparse_mla_combine[(T, triton.cdiv(H, block_hc))](
        o_part, l_part, sink_arg, out, lse,
        H, d_v, S,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), l_part.stride(0), l_part.stride(1),
        out.stride(0), out.stride(1), lse.stride(0),
        BLOCK_H=block_hc, BLOCK_DV=_pow2(d_v), HAS_SINK=has_sink, num_warps=4)


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [T, H, d_v] q.dtype, lse [T, H] fp32)``: the Triton kernel (plain layout).

    Same signature and semantics as the reference; inputs are validated by the op's
    ``validate`` in front of it (``select(...).sparse_mla``). PAD (-1) and ``j >= lens``
    are skipped, PAD inside the active length included; the sink joins the denominator
    only; a token with nothing valid gives zeros and ``lse = -inf``.
    """
    return launch(q, kv, indices, lens, sm_scale, d_v, sink)


def warmup(backend, *, num_heads=(64, 128), qk_head_dim: int = 512, v_head_dim: int = 512,
           attn_dtypes=(torch.bfloat16,), attn_sink=(False, True), **_other) -> list[str]:
    """``Backend.warmup()`` hook: compile (by real launches, through ``backend``) every
    specialisation the serving path uses for these head counts, dtypes and sink settings:
    the one-pass kernel (prefill) and the split-K partial kernel + combine (decode). The
    shape of a step (tokens, index width, lengths) never selects another kernel. Unknown
    keyword arguments (other hooks') are ignored. Returns the ops it ran (none on a CPU:
    the interpreter compiles nothing)."""
    from .interpreter import setup

    if (not backend.device.runnable or backend.device.platform == "cpu"
            or "triton" not in backend.variants.get("sparse_mla", ())):
        return []
    setup(backend.device)
    dev = torch.device(backend.device.torch_device)
    D, d_v = qk_head_dim, v_head_dim
    many = _num_sms(dev) if dev.type == "cuda" else 4  # enough programs that nothing splits
    for H in num_heads:
        for dtype in attn_dtypes:
            kv = torch.randn(64, D, device=dev).to(dtype)
            for sink_on in attn_sink:
                sink = torch.zeros(H, device=dev) if sink_on else None
                for T in (1, many):
                    q = torch.randn(T, H, D, device=dev).to(dtype)
                    idx = torch.randint(0, 64, (T, 256), device=dev, dtype=torch.int32)
                    lens = torch.full((T,), 256, device=dev, dtype=torch.int32)
                    backend.sparse_mla(q, kv, idx, lens, 1.0 / math.sqrt(D), d_v,
                                       **({"sink": sink} if sink is not None else {}))
    return ["sparse_mla"]
