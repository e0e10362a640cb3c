"""``plain_indices`` (SPEC §2.6, the pack's own layout) in Triton: top-k then window.

A validated call runs ``plain_indices_checked``: checker programs in front of the kernel's own
test every value the validator tests (the lengths in ``[0, width]``, every index PAD or in ``[0,
INT32_MAX - offset]``) and the others compute their tile, then write it once they pass
(``range_check.py``): nothing written on a ``FAIL``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.ops.plain_indices import quick_check
from ..common.types import INDEX_DTYPE
from ._device import INT32_MAX, PAD
from ._launch import Kernel, contiguous, jit
from .range_check import (BLOCK_C, BLOCK_R, CHECK, GATE, flat_bad, flat_tiles, groups, open_checked, passed,
                          rows_bad, settle, tiles_of)

BLOCK_T = 16
BLOCK_W = 128


@triton.jit
def _plain_tile(swa_ptr, sw_s0, sw_s1, sl_ptr, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K, topk_offset,
                window_offset, tt, jt, scratch_ptr, epoch, HAS_TOPK: tl.constexpr, BLOCK_T: tl.constexpr,
                BLOCK_W: tl.constexpr, GATED: tl.constexpr, GATE: tl.constexpr, NAP: tl.constexpr):
    """Tile ``(tt, jt)``: tokens ``tt * BLOCK_T + [0, BLOCK_T)``, columns ``jt * BLOCK_W + [0, BLOCK_W)``.
    ``GATED`` (a validated call's worker): the tile is computed, then stored only once the checkers
    passed it (``range_check.passed``). Computing first is sound here as nowhere else: every address
    the tile reads is inside its tensors whatever the values (the lengths only mask, the window
    column is clamped), so the wait overlaps the tile's loads."""
    t = tt * BLOCK_T + tl.arange(0, BLOCK_T)
    j = jt * BLOCK_W + tl.arange(0, BLOCK_W)
    m = t < T
    sl = tl.load(sl_ptr + t, mask=m, other=0).to(tl.int64)
    if HAS_TOPK:
        tlen = tl.load(tl_ptr + t, mask=m, other=0).to(tl.int64)
    else:
        tlen = tl.zeros([BLOCK_T], tl.int64)
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
    ok = True
    if GATED:
        ok = passed(scratch_ptr, epoch, GATE, NAP)
    if ok:
        if jt == 0:
            tl.store(lens_ptr + t, (tlen + sl).to(tl.int32), mask=m)
        tl.store(idx_ptr + t64 * width + jj, out, mask=mm & (jj < width))


@jit
def _plain_indices(swa_ptr, sw_s0, sw_s1, sl_ptr, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr,
                   T, SW, K, topk_offset, window_offset,
                   HAS_TOPK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    _plain_tile(swa_ptr, sw_s0, sw_s1, sl_ptr, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K,
                topk_offset, window_offset, tl.program_id(0), tl.program_id(1), lens_ptr, 0, HAS_TOPK, BLOCK_T, BLOCK_W,
                False, 0, 0)


@jit
def _plain_indices_checked(swa_ptr, sw_s0, sw_s1, sl_ptr, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, flag_ptr,
                           scratch_ptr, T, SW, K, topk_offset, window_offset, w_tiles, P, P_SL, P_SW, P_TL, epoch,
                           HAS_TOPK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
                           CHECK: tl.constexpr, CHECK_R: tl.constexpr, CHECK_C: tl.constexpr,
                           GATE: tl.constexpr, NAP: tl.constexpr):
    """A validated call: ``P`` checker programs test what the validator tests (the lengths in
    ``[0, width]``, every index PAD or in ``[0, INT32_MAX - offset]``), the others compute tile
    ``pid - P`` and write it once they pass (``range_check.py``). Each tensor has checkers of its
    own (``range_check.groups``: ``P_SL`` for the window lengths, then ``P_SW`` for the window rows,
    ``P_TL`` for the top-k lengths, the rest for the top-k rows), so a checker waits for one
    memory round trip where the call fits one tile a checker, not one per tensor: the host waits
    for the last checker."""
    pid = tl.program_id(0)
    if pid < P:
        bad = pid * 0
        if pid < P_SL:
            bad = flat_bad(sl_ptr, T, 0, SW, pid, P_SL, CHECK)
        elif pid < P_SL + P_SW:
            bad = rows_bad(swa_ptr, T, SW, sw_s0, sw_s1, -1, INT32_MAX - window_offset, pid - P_SL, P_SW, CHECK_R,
                           CHECK_C)
        elif HAS_TOPK:
            q = pid - P_SL - P_SW
            if q < P_TL:
                bad = flat_bad(tl_ptr, T, 0, K, q, P_TL, CHECK)
            else:
                bad = rows_bad(topk_ptr, T, K, tk_s0, tk_s1, -1, INT32_MAX - topk_offset, q - P_TL,
                               P - P_SL - P_SW - P_TL, CHECK_R, CHECK_C)
        settle(bad, P, flag_ptr, scratch_ptr, epoch, GATE)
    else:
        w = pid - P
        _plain_tile(swa_ptr, sw_s0, sw_s1, sl_ptr, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K,
                    topk_offset, window_offset, w // w_tiles, w % w_tiles, scratch_ptr, epoch, HAS_TOPK, BLOCK_T,
                    BLOCK_W, True, GATE, NAP)


_K = Kernel(_plain_indices)
_K_CHECKED = Kernel(_plain_indices_checked)


def _launch(swa_indices, swa_lens, topk_slots, topk_lens, topk_offset, window_offset, out, checked, dev, T, SW, K,
            sw_s0, sw_s1, tk_s0, tk_s1):
    has_topk = topk_slots is not None
    width = K + SW
    if out is None:
        out = (torch.empty(T, width, dtype=INDEX_DTYPE, device=dev), torch.empty(T, dtype=INDEX_DTYPE, device=dev))
    if T == 0:
        return out
    t_tiles, w_tiles = (T + BLOCK_T - 1) // BLOCK_T, max(1, (width + BLOCK_W - 1) // BLOCK_W)
    sizes = (T, SW, K, topk_offset, window_offset)
    if checked is None:
        _K((has_topk,), (t_tiles, w_tiles, 1), swa_indices, sw_s0, sw_s1, contiguous(swa_lens), topk_slots, tk_s0,
           tk_s1, contiguous(topk_lens) if has_topk else None, out[0], out[1], *sizes, has_topk, BLOCK_T, BLOCK_W)
        return out
    verdict, scratch, epoch, nap = checked
    # each tensor's tiles its own checkers (the quick check passed: the lengths are contiguous)
    tiles = flat_tiles(T)
    if has_topk:
        shares = groups((tiles, tiles_of(T, SW, sw_s0, sw_s1), tiles, tiles_of(T, K, tk_s0, tk_s1)))
    else:
        shares = groups((tiles, tiles_of(T, SW, sw_s0, sw_s1), 0, 0))
    P = sum(shares)
    _K_CHECKED((has_topk, nap), (P + t_tiles * w_tiles, 1, 1), swa_indices, sw_s0, sw_s1, swa_lens, topk_slots, tk_s0,
               tk_s1, topk_lens, out[0], out[1], verdict.word, scratch, *sizes, w_tiles, P, shares[0], shares[1],
               shares[2], epoch, has_topk, BLOCK_T, BLOCK_W, CHECK, BLOCK_R, BLOCK_C, GATE, nap)
    return out


def plain_indices(swa_indices, swa_lens, topk_slots=None, topk_lens=None, *, topk_offset=0, window_offset=0,
                  out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, K + SWA_W], lens = topk_len + swa_len)``: per token the first
    ``topk_len`` top-k slots (+ ``topk_offset``; PAD kept), then the first ``swa_len``
    window slots (+ ``window_offset``; PAD kept), PAD after. One launch."""
    (T, SW), (sw_s0, sw_s1) = swa_indices.shape, swa_indices.stride()
    if topk_slots is not None:
        (_, K), (tk_s0, tk_s1) = topk_slots.shape, topk_slots.stride()
    else:
        K = tk_s0 = tk_s1 = 0
    return _launch(swa_indices, swa_lens, topk_slots, topk_lens, topk_offset, window_offset, out, None,
                   swa_indices.device, T, SW, K, sw_s0, sw_s1, tk_s0, tk_s1)


def plain_indices_checked(home, swa_indices, swa_lens, topk_slots=None, topk_lens=None, *, topk_offset=0,
                          window_offset=0, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(out, Verdict)`` from one launch whose checker programs test every value the validator tests
    and whose other programs write once they pass (nothing on a ``FAIL``), or None for a call it
    does not take (no token)."""
    try:
        facts = quick_check(swa_indices, swa_lens, topk_slots, topk_lens, topk_offset=topk_offset,
                            window_offset=window_offset, out=out)
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    if facts is None or facts[1] == 0 or (home is not None and facts[0] != home):
        return None
    checked = open_checked(facts[0])
    return _launch(swa_indices, swa_lens, topk_slots, topk_lens, topk_offset, window_offset, out, checked,
                   *facts), checked[0]
