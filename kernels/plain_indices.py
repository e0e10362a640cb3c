"""``plain_indices`` (SPEC §2.6, the pack's own layout) in Triton: top-k then window.

A validated call runs ``plain_indices_checked``: one pass tests every value the validator tests
(``range_check.py``: the lengths in ``[0, width]``, every index PAD or in ``[0, INT32_MAX -
offset]``) and the kernel is launched right behind it, gated on its word (``GATED``: it writes
nothing on a ``FAIL``).
"""

from __future__ import annotations

import torch
import triton.language as tl

from ..common.types import INDEX_DTYPE
from ..common.validation import INT32_MAX
from ._device import FAIL, PAD
from ._launch import Kernel, contiguous, jit
from .range_check import check_ranges

BLOCK_T = 16
BLOCK_W = 128


@jit
def _plain_indices(swa_ptr, sw_s0, sw_s1, sl_ptr, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, flag_ptr,
                   T, SW, K, topk_offset, window_offset,
                   HAS_TOPK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, GATED: tl.constexpr):
    if GATED:  # a validated call behind its range pass: nothing on a FAIL
        if tl.load(flag_ptr) == FAIL:
            return
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = t < T
    sl = tl.load(sl_ptr + t, mask=m, other=0).to(tl.int64)
    if HAS_TOPK:
        tlen = tl.load(tl_ptr + t, mask=m, other=0).to(tl.int64)
    else:
        tlen = tl.zeros([BLOCK_T], tl.int64)
    if tl.program_id(1) == 0:
        tl.store(lens_ptr + t, (tlen + sl).to(tl.int32), mask=m)
    t64 = t.to(tl.int64)[:, None]
    jj = j[None, :]
    mm = m[:, None]
    width = K + SW
    in_topk = jj < tlen[:, None]
    if HAS_TOPK:
        tk = tl.load(topk_ptr + t64 * tk_s0 + jj.to(tl.int64) * tk_s1, mask=mm & in_topk & (jj < K),
                     other=PAD).to(tl.int64)
        tk = tl.where(tk == PAD, PAD, tk + topk_offset)
    else:
        tk = tl.full([BLOCK_T, BLOCK_W], PAD, tl.int64)
    w = tl.minimum(tl.maximum(jj - tlen[:, None], 0), tl.maximum(SW - 1, 0))
    in_win = (~in_topk) & (jj < tlen[:, None] + sl[:, None])
    win = tl.load(swa_ptr + t64 * sw_s0 + w * sw_s1, mask=mm & in_win & (w < SW), other=PAD).to(tl.int64)
    win = tl.where(win == PAD, PAD, win + window_offset)
    out = tl.where(in_topk, tk, tl.where(in_win, win, PAD)).to(tl.int32)
    tl.store(idx_ptr + t64 * width + jj, out, mask=mm & (jj < width))


_K = Kernel(_plain_indices)


def _launch(swa_indices, swa_lens, topk_slots, topk_lens, topk_offset, window_offset, out, flag):
    T, SW = swa_indices.shape
    has_topk = topk_slots is not None
    K = topk_slots.shape[1] if has_topk else 0
    width = K + SW
    dev = swa_indices.device
    if out is None:
        out = (torch.empty(T, width, dtype=INDEX_DTYPE, device=dev), torch.empty(T, dtype=INDEX_DTYPE, device=dev))
    if T == 0:
        return out
    gated = flag is not None
    grid = ((T + BLOCK_T - 1) // BLOCK_T, max(1, (width + BLOCK_W - 1) // BLOCK_W), 1)
    _K((has_topk, gated), grid, swa_indices, swa_indices.stride(0), swa_indices.stride(1), contiguous(swa_lens),
       topk_slots, topk_slots.stride(0) if has_topk else 0, topk_slots.stride(1) if has_topk else 0,
       contiguous(topk_lens) if has_topk else None, out[0], out[1], flag if gated else out[1], T, SW, K, topk_offset,
       window_offset, has_topk, BLOCK_T, BLOCK_W, gated)
    return out


def plain_indices(swa_indices, swa_lens, topk_slots=None, topk_lens=None, *, topk_offset=0, window_offset=0,
                  out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, K + SWA_W], lens = topk_len + swa_len)``: per token the first
    ``topk_len`` top-k slots (+ ``topk_offset``; PAD kept), then the first ``swa_len``
    window slots (+ ``window_offset``; PAD kept), PAD after. One launch."""
    return _launch(swa_indices, swa_lens, topk_slots, topk_lens, topk_offset, window_offset, out, None)


def plain_indices_checked(swa_indices, swa_lens, topk_slots=None, topk_lens=None, *, topk_offset=0, window_offset=0,
                          out=None):
    """The validated form (``Variant.self_checked``) of a call whose host checks passed:
    ``(out, Verdict)``, the kernel launched right behind the range pass and gated on its word (it
    writes nothing on a ``FAIL``), or None for a call it does not take (no token)."""
    T, SW = swa_indices.shape
    if T == 0:
        return None
    items = [(swa_lens, 0, SW), (swa_indices, -1, INT32_MAX - window_offset)]
    if topk_slots is not None:
        items += [(topk_lens, 0, topk_slots.shape[1]), (topk_slots, -1, INT32_MAX - topk_offset)]
    verdict = check_ranges(swa_indices.device, items, per_stream=True)
    return _launch(swa_indices, swa_lens, topk_slots, topk_lens, topk_offset, window_offset, out,
                   verdict.word), verdict
