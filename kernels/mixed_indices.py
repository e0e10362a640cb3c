"""``mixed_indices`` (SPEC §2.6, FlashInfer-style fixed-width layout) in Triton.

A validated call runs ``mixed_indices_checked``: every program first tests every value the
validator tests (``topk_lens`` in ``[0, K]``), stores nothing when one fails and leaves the verdict
in the call's word (``_verdict.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.ops.mixed_indices import mixed_width
from ..common.types import INDEX_DTYPE
from ._device import CHECK, PAD, range_bad, verdict
from ._launch import Kernel, contiguous, jit
from ._verdict import open_verdict

BLOCK_T = 16
BLOCK_W = 128
#: the most tokens the checked kernel takes: each of its programs reads every top-k length
CHECKED_MAX = 8192


@triton.jit
def _mix(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K, width,
         BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = t < T
    tlen = tl.load(tl_ptr + t, mask=m, other=0)
    if tl.program_id(1) == 0:
        tl.store(lens_ptr + t, tlen + SW, mask=m)
    t64 = t.to(tl.int64)[:, None]
    jj = j[None, :]
    mm = m[:, None]
    win = tl.load(swa_ptr + t64 * sw_s0 + jj.to(tl.int64) * sw_s1, mask=mm & (jj < SW), other=PAD)
    k = jj - SW
    in_topk = mm & (k >= 0) & (k < tlen[:, None]) & (k < K)
    tk = tl.load(topk_ptr + t64 * tk_s0 + k.to(tl.int64) * tk_s1, mask=in_topk, other=PAD)
    out = tl.where(jj < SW, win, tk)
    tl.store(idx_ptr + t64 * width + jj, out, mask=mm & (jj < width))


@jit
def _mixed_indices(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K, width,
                   BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    _mix(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K, width, BLOCK_T, BLOCK_W)


@jit
def _mixed_indices_checked(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, flag_ptr, T, SW,
                           K, width, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, CHECK: tl.constexpr):
    bad = range_bad(tl_ptr, T, 0, K, CHECK)
    verdict(flag_ptr, bad)
    if bad == 0:
        _mix(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K, width, BLOCK_T,
             BLOCK_W)


_K = Kernel(_mixed_indices)
_K_CHECKED = Kernel(_mixed_indices_checked)
_KEY = ()


def _launch(swa_indices, topk_slots, topk_lens, out, verdict=None) -> tuple[torch.Tensor, torch.Tensor]:
    T, SW = swa_indices.shape
    K = topk_slots.shape[1]
    width = mixed_width(SW, K)
    dev = swa_indices.device
    if out is None:
        out = (torch.empty(T, width, dtype=INDEX_DTYPE, device=dev), torch.empty(T, dtype=INDEX_DTYPE, device=dev))
    if T == 0:
        return out
    grid = ((T + BLOCK_T - 1) // BLOCK_T, max(1, (width + BLOCK_W - 1) // BLOCK_W), 1)
    head = (swa_indices, swa_indices.stride(0), swa_indices.stride(1), topk_slots, topk_slots.stride(0),
            topk_slots.stride(1), contiguous(topk_lens), out[0], out[1])
    if verdict is None:
        _K(_KEY, grid, *head, T, SW, K, width, BLOCK_T, BLOCK_W)
    else:
        _K_CHECKED(_KEY, grid, *head, verdict.word, T, SW, K, width, BLOCK_T, BLOCK_W, CHECK)
    return out


def mixed_indices(swa_indices, topk_slots, topk_lens, *, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, SWA_W + round_up(K, 4)], lens = SWA_W + topk_lens)``: the window
    part is ``swa_indices`` as built, the top-k part ``topk_slots[t, :topk_len]`` then PAD.
    One launch."""
    return _launch(swa_indices, topk_slots, topk_lens, out)


def mixed_indices_checked(swa_indices, topk_slots, topk_lens, *, out=None):
    """The validated form (``Variant.self_checked``) of a call whose host checks passed:
    ``(out, Verdict)``, or None for a call it does not take (no token; past :data:`CHECKED_MAX`)."""
    T = swa_indices.shape[0]
    if T == 0 or T > CHECKED_MAX:
        return None
    verdict = open_verdict(swa_indices.device)
    return _launch(swa_indices, topk_slots, topk_lens, out, verdict), verdict
