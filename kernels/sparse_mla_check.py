"""``sparse_mla``'s value checks as one device pass, for a validated call that must not wait.

A validated call reads its value checks on the host before it launches (``common/validation.py``):
the read waits for the device's queue, and the kernel is launched only after it, onto an idle
device. Here instead the checks of ``sparse_mla``'s values -- ``lens`` in ``[0, K]``, every
entry of ``indices`` in ``[0, num_rows)`` or PAD (-1), ``sink`` free of NaN and +inf -- run as
one kernel that sets a flag; the attention kernel is launched right behind it, *gated* (it reads
the flag first and computes nothing when it is set), and an event behind the check, so the host
waits for the check alone, while the attention kernel already sits in the queue. A flag that is
set makes dispatch run the host checks, which raise the same ``ValueError`` as ever; the gated
kernel wrote nothing and read no index.

The flag is the verdict word of ``_verdict.py``: on an NVIDIA GPU pinned host memory, which the
check writes and the gated kernel reads through the device's mapping of it, and the host reads
after the event, so the check and the attention kernel are the only work a validated call adds to
the stream (a flag in device memory needed a fill before the check and a copy to the host between
the two kernels, each one more operation the stream runs in turn).

The conditions are exactly the validator's value checks (``common/ops/sparse_mla.py``:
``validate``); the shape, dtype and device checks stay on the host, before anything launches.
Not under CUDA-graph capture (validation reads no values there).
"""

from __future__ import annotations

import torch
import triton.language as tl

from ..common.ops import _records
from ..common.ops._records import ROWS
from ._launch import Kernel, jit
from ._verdict import Gate, close_word, open_word

#: one tile of ``indices`` per program, over a 2-D grid (token tiles x column tiles): every load is
#: independent of every other, so the pass runs at memory bandwidth rather than at one load latency
#: per column tile (a program per token tile looping over the columns left fewer programs than SMs
#: at T 4K)
BLOCK_T, BLOCK_K, BLOCK_H = 16, 256, 128
#: a contiguous ``indices`` (what serving passes) is read as one flat run instead, BLOCK entries a
#: program: its strides are runtime ints the compiler cannot see as 1 (``_launch.jit``), so the tiled
#: kernel loads one 4-byte entry at a time through 64-bit index arithmetic; the flat one, its base's
#: 16-byte alignment in the launch key and every program but the last unmasked, loads 16 bytes a
#: thread. Only while the run's length fits an i32 argument
BLOCK = BLOCK_T * BLOCK_K
FLAT_MAX = 2**31 - 1 - BLOCK


@jit
def _bad_sink(sink_ptr, H, s_h, BLOCK_H: tl.constexpr):
    """1 when a sink is NaN or +inf (-inf: a head without sink), else 0."""
    bad = 0
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H).to(tl.int64)
        s = tl.load(sink_ptr + hs * s_h, mask=hs < H, other=0.0)
        bad = tl.maximum(bad, tl.max(((s != s) | (s == float("inf"))).to(tl.int32), axis=0))
    return bad


@jit
def _sparse_mla_check(idx_ptr, lens_ptr, sink_ptr, flag_ptr, T, K, H, s_it, s_ik, s_l, s_h, num_rows,
                      HAS_SINK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    pid = tl.program_id(0)
    kb = tl.program_id(1)
    rows = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_t = rows < T
    cols = kb.to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K).to(tl.int64)
    m = in_t[:, None] & (cols < K)[None, :]
    idx = tl.load(idx_ptr + rows[:, None] * s_it + cols[None, :] * s_ik, mask=m, other=0)
    bad = tl.max(tl.max(((idx < -1) | (idx >= num_rows)).to(tl.int32), axis=1), axis=0)
    if kb == 0:
        lens = tl.load(lens_ptr + rows * s_l, mask=in_t, other=0)
        bad = tl.maximum(bad, tl.max(((lens < 0) | (lens > K)).to(tl.int32), axis=0))
        if HAS_SINK:
            if pid == 0:
                bad = tl.maximum(bad, _bad_sink(sink_ptr, H, s_h, BLOCK_H))
    if bad > 0:
        tl.store(flag_ptr, 1)  # every program that finds one stores the same value


@jit(align=("idx_ptr",))
def _sparse_mla_check_flat(idx_ptr, lens_ptr, sink_ptr, flag_ptr, N, T, K, H, s_l, s_h, num_rows,
                           HAS_SINK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_H: tl.constexpr):
    # program p: entries [p * BLOCK, p * BLOCK + BLOCK) of the flat indices, and the same span of lens
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * BLOCK
    offs = tl.arange(0, BLOCK)
    if start + BLOCK <= N:
        idx = tl.load(idx_ptr + start + offs)
    else:  # the last program's part of a block
        idx = tl.load(idx_ptr + start + offs, mask=offs < N - start, other=0)
    bad = tl.max(((idx < -1) | (idx >= num_rows)).to(tl.int32), axis=0)
    if start < T:
        rows = start + offs
        lens = tl.load(lens_ptr + rows * s_l, mask=rows < T, other=0)
        bad = tl.maximum(bad, tl.max(((lens < 0) | (lens > K)).to(tl.int32), axis=0))
    if HAS_SINK:
        if pid == 0:
            bad = tl.maximum(bad, _bad_sink(sink_ptr, H, s_h, BLOCK_H))
    if bad > 0:
        tl.store(flag_ptr, 1)  # every program that finds one stores the same value


_K = Kernel(_sparse_mla_check)
_K_FLAT = Kernel(_sparse_mla_check_flat)


def flat(indices: torch.Tensor) -> bool:
    """Whether ``gate`` reads ``indices`` as one flat run (contiguous, and short enough)."""
    return indices.is_contiguous() and indices.numel() <= FLAT_MAX


def gate(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format=ROWS, fp8=None, return_lse=True) -> Gate:
    """Launch the value checks of this (shape-validated) ``sparse_mla`` call into this thread's
    flag for the current stream (a fresh one on the CPU) and record an event behind them; the op's
    signature (``OpSpec.gate``)."""
    T, K = indices.shape
    H = q.shape[1]
    num_rows = kv.shape[0] if kv_format == ROWS else _records.num_slots(kv)
    flag, slot = open_word(indices.device)
    has_sink = sink is not None
    if T > 0 or has_sink:  # no token: program 0 still checks the sink (the validator does)
        s = sink if has_sink else lens
        if flat(indices):
            N = T * K
            grid = (max(1, (N + BLOCK - 1) // BLOCK, (T + BLOCK - 1) // BLOCK), 1, 1)  # every entry, every length
            _K_FLAT((has_sink, indices.data_ptr() % 16 == 0), grid, indices, lens, s, flag, N, T, K, H, lens.stride(0),
                    s.stride(0), num_rows, has_sink, BLOCK, BLOCK_H)
        else:
            _K((has_sink,), (max(1, (T + BLOCK_T - 1) // BLOCK_T), max(1, (K + BLOCK_K - 1) // BLOCK_K), 1), indices,
               lens, s, flag, T, K, H,
               indices.stride(0), indices.stride(1), lens.stride(0), s.stride(0), num_rows,
               has_sink, BLOCK_T, BLOCK_K, BLOCK_H)
    return close_word(flag, slot)
