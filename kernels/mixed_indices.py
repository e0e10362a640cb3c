"""``mixed_indices`` (SPEC §2.6, FlashInfer-style fixed-width layout) in Triton."""

from __future__ import annotations

import torch
import triton.language as tl

from ..common.ops.mixed_indices import mixed_width
from ..common.types import INDEX_DTYPE
from ._device import PAD
from ._launch import Kernel, contiguous, jit

BLOCK_T = 16
BLOCK_W = 128


@jit
def _mixed_indices(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K, width,
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


_K = Kernel(_mixed_indices)
_KEY = ()


def mixed_indices(swa_indices, topk_slots, topk_lens, *, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, SWA_W + round_up(K, 4)], lens = SWA_W + topk_lens)``: the window
    part is ``swa_indices`` as built, the top-k part ``topk_slots[t, :topk_len]`` then PAD.
    One launch."""
    T, SW = swa_indices.shape
    K = topk_slots.shape[1]
    width = mixed_width(SW, K)
    dev = swa_indices.device
    if out is None:
        out = (torch.empty(T, width, dtype=INDEX_DTYPE, device=dev), torch.empty(T, dtype=INDEX_DTYPE, device=dev))
    if T == 0:
        return out
    grid = ((T + BLOCK_T - 1) // BLOCK_T, max(1, (width + BLOCK_W - 1) // BLOCK_W), 1)
    _K(_KEY, grid, swa_indices, swa_indices.stride(0), swa_indices.stride(1), topk_slots, topk_slots.stride(0),
       topk_slots.stride(1), contiguous(topk_lens), out[0], out[1], T, SW, K, width, BLOCK_T, BLOCK_W)
    return out
