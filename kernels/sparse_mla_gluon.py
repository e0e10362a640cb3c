"""Gluon (Hopper) forward kernel for ``sparse_mla`` (SPEC §2.7), plain index layout:
variant ``gluon``.

Same op, arguments and results as the reference and the ``triton`` variant
(:mod:`.sparse_mla`): ``out[t, h] = sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink[h]))``
over the valid ``j`` (``j < lens[t]`` and ``indices[t, j] != PAD``), ``lse`` natural log
without the sink, zeros and ``lse = -inf`` for a token with nothing valid. On sm90 dispatch
tries the persistent warp-specialised kernel (``gluon_ws``, :mod:`.sparse_mla_gluon_ws`)
first, this one next, then the ``triton`` kernel; this module also holds the scope check and
the launcher both Gluon kernels share.

Why Gluon: the ``tl`` kernel's throughput on sm90 is capped by Triton's pipeliner, which
issues tile i+1's cp.async gather only after tile i's math (Triton 3.6; bench/README.md,
"What was tried and measured", tl kernel). Here shared
memory, cp.async groups, waits, barriers and wgmma are explicit, so the gather of the next
tile runs under the current tile's math:

* one program per (token, 64-head block), 8 warps = two warpgroups, one program per SM;
* Q ``[64, D]`` (64 KB at D 512) gathered once into shared memory; ``NBUF`` KV tile
  buffers ``[BN, D]``;
* ``S = Q K^T``: wgmma layout with warps ``[4, 2]`` -> each warpgroup computes half of S's
  columns (FlashMLA's split); the row max is exchanged across the two warpgroups (the
  compiler goes through shared memory), row sums are kept per thread (``l_acc``) and
  reduced once at the end;
* ``acc [64, d_v]`` fp32 in registers (each warpgroup owns half of ``d_v``: 128 registers
  a thread at d_v 512); ``acc += P V`` with P as the register operand and V = the same KV
  tile;
* iteration i: wait for tile i's cp.async group, fence, CTA barrier; now the buffer of tile
  i-1 is free in both warpgroups: issue the gather of tile ``i + NBUF - 1`` into it at once
  (row offsets from an index tile loaded one iteration earlier), then S, softmax, P V;
* after the last tile, O goes to global memory through the free KV buffer 0 (16-byte stores,
  a warp writing 512 contiguous bytes of a row), as in ``gluon_ws``.

PAD rows and rows past ``lens`` are masked cp.async (zero fill, no memory traffic) and
``-inf`` scores. Scope: the variant declares CUDA sm90 and bf16/fp16; :func:`input_check`
adds ``D_qk = d_v = 512``, ``H >= 64`` (the last head block is masked) and enough programs
to fill the SMs (decode keeps the ``triton`` variant's split-K). Needs a Triton with the
Gluon Hopper API (3.6: ``async_copy_global_to_shared``, 3.9: ``async_load``). Imported only
when the variant runs (Gluon does not run in Triton's interpreter).
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper as _hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _async_copy

from ..common.device import cuda_index
from ..common.types import HEAD_BLOCK, head_block_items
from ..common.errors import KernelUnavailable
from ._launch import cdiv, launch_meta

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
    HAS_SINK: gl.constexpr, num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 8, "two warpgroups")
    gl.static_assert(BLOCK_H == 64, "one wgmma M block of heads")
    gl.static_assert(NBUF >= 2, "at least two KV buffers")
    gl.static_assert(DV == D, "V is the whole K tile")
    gl.static_assert(BN == BLOCK_H, "O [BLOCK_H, DV] leaves through a [BN, D] KV buffer")
    dtype: gl.constexpr = Q.dtype.element_ty

    # layouts ------------------------------------------------------------------------
    # gathers: 16-byte cp.async per thread, a warp covers 256 contiguous columns of a row
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, ld_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, ld_layout)
    # S [64, BN]: warpgroup w computes columns [w*BN/2, (w+1)*BN/2) (the row max and P are
    # exchanged across the warpgroups through shared memory); computing all of S in both
    # warpgroups instead measured slower (1/3 more Q K^T shared-memory reads; bench/README.md,
    # "One-item Gluon kernel")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BN // 2, 16])
    # acc [64, DV]: warpgroup w owns columns [w*DV/2, (w+1)*DV/2)
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, DV // 2, 16])
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_col: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D], dtype)
    kv_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, D], q_sl)
    kv_smem = gl.allocate_shared_memory(dtype, [NBUF, BN, D], kv_sl)

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

    for i in range(n_tiles):
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
        # MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S and the MEMBAR waits for them (every 32-row
        # config stalled on sm90); Triton 3.6's own pipeliner feeds wgmma from cp.async with
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
        p, l_acc, acc = _softmax_rescale(s, m_i, m_new, l_acc, acc, o_row)
        m_i = m_new
        # P V synchronous: an accumulator left in flight across the loop's back edge makes
        # ptxas serialise every wgmma of the kernel (C7515: the loop's entry defines the
        # accumulator registers with plain moves), offline ptxas 3.6 / 3.9
        # P as the register A operand: both warpgroups need all of P's columns, the layout
        # conversion exchanges the halves through shared memory with plain stores/loads and a
        # barrier (P through an NVMMA shared buffer needs the proxy fence, whose MEMBAR waits
        # for the gathers in flight)
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
    # O leaves through KV buffer 0, so that a thread writes 16 bytes and a warp 512 contiguous
    # bytes of a row, instead of the accumulator layout's 4 bytes a thread and 16 a row: faster
    # than the direct store in every one of bench_flashmla's cells, timed in the same rounds
    # (bench/experiments/exp_gluon_store_ab.py, bench/results/h200/exp_gluon_store_ab.json;
    # bench/README.md, "The one-item kernel's output store"). The buffers are free once every
    # warp is past its last P V and the masked look-ahead gather has landed (waited above); the
    # barrier makes that true for all warps before the first write
    _barrier()
    o_smem = kv_smem.index(0)
    o_smem.store(o)
    _barrier()
    offs_ho = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_layout)  # made here: nothing live across the loop
    CW: gl.constexpr = 256  # columns a pass: 512 contiguous bytes of a row a warp
    offs_cw = gl.arange(0, CW, layout=col_layout)
    o_rows = gl.expand_dims(OUT + t * stride_ot + offs_ho.to(gl.int64) * stride_oh, 1)
    o_mask = gl.expand_dims(offs_ho < H, 1) & gl.expand_dims(offs_cw >= 0, 0)
    for c in gl.static_range(DV // CW):
        gl.store(o_rows + gl.expand_dims(c * CW + offs_cw, 0), o_smem.slice(c * CW, CW, dim=1).load(ld_layout),
                 mask=o_mask)


# ---------------------------------------------------------------------------------------
# scope and launch (shared with the warp-specialised kernel of sparse_mla_gluon_ws.py)
# ---------------------------------------------------------------------------------------

BLOCK_H = HEAD_BLOCK
HEAD_DIM = 512
BN = 64  # KV rows per tile; each warpgroup computes half of S's columns
NBUF = 2  # KV tile buffers: the gather of tile i+1 runs under tile i's math
DTYPES = (torch.bfloat16, torch.float16)


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


@functools.lru_cache(maxsize=None)
def num_sms(index: int) -> int:
    """SM count of CUDA device ``index``, read once per process (the scope check runs on every call)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def input_check(q, kv, indices, lens, sm_scale, d_v, *, sink=None) -> list[str]:
    """Per-call reasons the Gluon kernels do not take this call (the variants' ``input_check``):
    shapes and strides only, no device work, graph-safe. The device (CUDA sm90), the dtypes
    and Triton's Gluon API are the variants' declarations and probes."""
    why = []
    T, H, D = q.shape
    if kv.dtype != q.dtype:
        why.append(f"kv dtype {kv.dtype} differs from q's {q.dtype}")
    if D != HEAD_DIM or d_v != HEAD_DIM:
        why.append(f"needs D_qk = d_v = {HEAD_DIM}, got D_qk={D}, d_v={d_v}")
    if H < BLOCK_H:
        why.append(f"needs H >= {BLOCK_H} (one 64-head wgmma block), got H={H}")
    if q.stride(2) != 1 or kv.stride(1) != 1 or indices.stride(1) != 1:
        why.append("needs unit inner strides of q, kv and indices")
    if q.is_cuda and not why:
        programs, sms = head_block_items(T, H), num_sms(cuda_index(q))
        if programs < sms:
            why.append(f"{programs} (token, 64-head) programs < {sms} SMs: decode-sized (the triton variant's "
                       "split-K fills the GPU)")
    return why


def launch_args(persistent: bool, q, kv, indices, lens, sm_scale, sink, out, lse, gate=None) -> tuple[tuple, tuple]:
    """``(runtime arguments, grid)`` of a launch of one of the two Gluon kernels (see :func:`launch`)."""
    T, H, D = q.shape
    num_hb = cdiv(H, BLOCK_H)
    args = (q, kv, indices, lens, sink if sink is not None else lse, out, lse,
            H, num_hb,
            q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), out.stride(0), out.stride(1), lse.stride(0),
            float(sm_scale) * LOG2E)
    grid = (T * num_hb,)
    if persistent:  # one program per SM, each over every grid-th (token, head block)
        args = args + (T * num_hb, gate if gate is not None else lens)
        if q.is_cuda:  # offline compiles pass CPU tensors: the grid does not matter there
            grid = (max(1, min(T * num_hb, num_sms(cuda_index(q)))),)
    return args, grid


def launch(kernel, meta: dict, persistent: bool, q, kv, indices, lens, sm_scale, d_v, sink, out, lse,
           *, warmup: bool = False, gate=None):
    """Run (``warmup``: only compile, returning the compiled kernel) one of the two Gluon
    kernels into ``out``/``lse``; both take the same runtime arguments, the persistent one
    also the item count and a gate flag (``gate``; unread unless ``meta["GATED"]``: ``lens``
    stands in). Inputs were validated and passed :func:`input_check`. Launched through
    :func:`~._launch.launch_meta` (a key's later launches skip Triton's per-call binding)."""
    args, grid = launch_args(persistent, q, kv, indices, lens, sm_scale, sink, out, lse, gate)
    if warmup:
        return kernel.warmup(*args, grid=grid, **meta)
    launch_meta(kernel, grid, args, meta)
    return None


def run(name: str, kernel, meta: dict, persistent: bool, q, kv, indices, lens, sm_scale, d_v, sink, built: set,
        *, gate=None):
    """``(out, lse)`` through a Gluon kernel. The first call of a specialisation compiles it
    alone; a compiler failure raises :class:`KernelUnavailable` before anything is launched
    (dispatch then runs the next variant)."""
    T, H, _ = q.shape
    out = torch.empty(T, H, d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    if T == 0 or indices.shape[1] == 0:  # nothing to read anywhere
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    lens = lens.contiguous()
    sink = sink.contiguous() if sink is not None else None
    build(name, kernel, meta, persistent, q, kv, indices, lens, sm_scale, d_v, sink, out, lse, built)
    launch(kernel, meta, persistent, q, kv, indices, lens, sm_scale, d_v, sink, out, lse, gate=gate)
    return out, lse


def build(name: str, kernel, meta: dict, persistent: bool, q, kv, indices, lens, sm_scale, d_v, sink, out, lse,
          built: set) -> None:
    """Compile, without launching, the specialisation of ``kernel`` these arguments and ``meta``
    select, once per process (``built`` remembers it); a compiler failure raises
    :class:`KernelUnavailable`. :func:`run` calls it before a launch, a warm-up hook ahead of
    serving."""
    key = (q.device, q.dtype, tuple(sorted(meta.items())))  # the meta holds every constexpr choice (sink, ...)
    if key in built:
        return
    try:
        launch(kernel, meta, persistent, q, kv, indices, lens, sm_scale, d_v, sink, out, lse, warmup=True)
    except Exception as exc:
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        raise KernelUnavailable(f"{name} ({q.dtype}, sink={sink is not None}) does not compile with Triton "
                                f"{triton.__version__}: {type(exc).__name__}: {lines[-1][:200] if lines else ''}"
                                ) from exc
    built.add(key)


_BUILT: set = set()


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [T, H, d_v] q.dtype, lse [T, H] fp32)`` through the one-item Gluon kernel
    (variant ``gluon``): same signature and semantics as the reference."""
    meta = dict(BLOCK_H=BLOCK_H, BN=BN, NBUF=NBUF, D=HEAD_DIM, DV=HEAD_DIM, HAS_SINK=sink is not None, num_warps=8)
    return run("gluon", _sparse_mla_gluon_fwd, meta, False, q, kv, indices, lens, sm_scale, d_v, sink, _BUILT)
