"""``mixed_indices`` (SPEC §2.6, FlashInfer-style fixed-width layout) in Triton.

A validated call runs ``mixed_indices_checked``: checker programs in front of the kernel's own
test every value the validator tests (``topk_lens`` in ``[0, K]``, every index of both index
tensors PAD or at least 0) and the others compute their tile, then write it once they pass
(``range_check.py``): nothing written on a ``FAIL``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.ops.mixed_indices import mixed_width, quick_check
from ..common.types import INDEX_DTYPE
from ._device import INT32_MAX, PAD
from ._launch import Kernel, contiguous, jit
from .range_check import (BLOCK_C, BLOCK_R, CHECK, GATE, flat_bad, flat_tiles, groups, open_checked, passed,
                          rows_bad, settle, tiles_of)

BLOCK_T = 16
BLOCK_W = 128


@triton.jit
def _mix(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K, width, tt, jt,
         scratch_ptr, epoch, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, GATED: tl.constexpr, GATE: tl.constexpr,
         NAP: tl.constexpr):
    """Tile ``(tt, jt)``: tokens ``tt * BLOCK_T + [0, BLOCK_T)``, columns ``jt * BLOCK_W + [0, BLOCK_W)``.
    ``GATED`` (a validated call's worker): the tile is computed, then stored only once the checkers
    passed it (``range_check.passed``). Computing first is sound: every address the tile reads is
    inside its tensors whatever the values (the top-k lengths only mask), so the wait overlaps the
    tile's loads."""
    t = tt * BLOCK_T + tl.arange(0, BLOCK_T)
    j = jt * BLOCK_W + tl.arange(0, BLOCK_W)
    m = t < T
    tlen = tl.load(tl_ptr + t, mask=m, other=0)
    if not GATED:  # the plain kernel stores the lengths first, as it always has (a worker: once the checkers pass)
        if jt == 0:
            tl.store(lens_ptr + t, tlen + SW, mask=m)
    t64 = t.to(tl.int64)[:, None]
    jj = j[None, :]
    mm = m[:, None]
    win = tl.load(swa_ptr + t64 * sw_s0 + jj.to(tl.int64) * sw_s1, mask=mm & (jj < SW), other=PAD)
    k = jj - SW
    in_topk = mm & (k >= 0) & (k < tlen[:, None]) & (k < K)
    tk = tl.load(topk_ptr + t64 * tk_s0 + k.to(tl.int64) * tk_s1, mask=in_topk, other=PAD)
    out = tl.where(jj < SW, win, tk)
    if GATED:
        if passed(scratch_ptr, epoch, GATE, NAP):
            if jt == 0:
                tl.store(lens_ptr + t, tlen + SW, mask=m)
            tl.store(idx_ptr + t64 * width + jj, out, mask=mm & (jj < width))
    else:
        tl.store(idx_ptr + t64 * width + jj, out, mask=mm & (jj < width))


@jit
def _mixed_indices(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K, width,
                   BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    _mix(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K, width, tl.program_id(0),
         tl.program_id(1), lens_ptr, 0, BLOCK_T, BLOCK_W, False, 0, 0)


@jit
def _mixed_indices_checked(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, flag_ptr,
                           scratch_ptr, T, SW, K, width, w_tiles, P, P_TL, P_SW, epoch, BLOCK_T: tl.constexpr,
                           BLOCK_W: tl.constexpr, CHECK: tl.constexpr, CHECK_R: tl.constexpr, CHECK_C: tl.constexpr,
                           GATE: tl.constexpr, NAP: tl.constexpr):
    """A validated call: ``P`` checker programs test what the validator tests (the top-k lengths in
    ``[0, K]``, every index PAD or at least 0), the others compute tile ``pid - P`` and write it
    once they pass (``range_check.py``). Each tensor has checkers of its own
    (``range_check.groups``: ``P_TL`` for the top-k lengths, then ``P_SW`` for the window rows, the
    rest for the top-k rows): the index rows are ``T x (SW + K)`` values, which every program
    testing every value (as the lengths alone were) would read once per program."""
    pid = tl.program_id(0)
    if pid < P:
        if pid < P_TL:
            bad = flat_bad(tl_ptr, T, 0, K, pid, P_TL, CHECK)
        elif pid < P_TL + P_SW:
            bad = rows_bad(swa_ptr, T, SW, sw_s0, sw_s1, PAD, INT32_MAX, pid - P_TL, P_SW, CHECK_R, CHECK_C)
        else:
            bad = rows_bad(topk_ptr, T, K, tk_s0, tk_s1, PAD, INT32_MAX, pid - P_TL - P_SW, P - P_TL - P_SW,
                           CHECK_R, CHECK_C)
        settle(bad, P, flag_ptr, scratch_ptr, epoch, GATE)
    else:
        w = pid - P
        _mix(swa_ptr, sw_s0, sw_s1, topk_ptr, tk_s0, tk_s1, tl_ptr, idx_ptr, lens_ptr, T, SW, K, width, w // w_tiles,
             w % w_tiles, scratch_ptr, epoch, BLOCK_T, BLOCK_W, True, GATE, NAP)


_K = Kernel(_mixed_indices)
_K_CHECKED = Kernel(_mixed_indices_checked)
_KEY = ()


def _launch(swa_indices, topk_slots, topk_lens, out, dev, T, SW, K, sw_s0, sw_s1, tk_s0, tk_s1,
            checked=None) -> tuple[torch.Tensor, torch.Tensor]:
    width = mixed_width(SW, K)
    if out is None:
        out = (torch.empty(T, width, dtype=INDEX_DTYPE, device=dev), torch.empty(T, dtype=INDEX_DTYPE, device=dev))
    if T == 0:
        return out
    t_tiles, w_tiles = (T + BLOCK_T - 1) // BLOCK_T, max(1, (width + BLOCK_W - 1) // BLOCK_W)
    if checked is None:
        _K(_KEY, (t_tiles, w_tiles, 1), swa_indices, sw_s0, sw_s1, topk_slots, tk_s0, tk_s1, contiguous(topk_lens),
           out[0], out[1], T, SW, K, width, BLOCK_T, BLOCK_W)
        return out
    verdict, scratch, epoch, nap = checked
    # each tensor's tiles its own checkers (the quick check passed: the lengths are contiguous)
    shares = groups((flat_tiles(T), tiles_of(T, SW, sw_s0, sw_s1), tiles_of(T, K, tk_s0, tk_s1)))
    P = sum(shares)
    _K_CHECKED((nap,), (P + t_tiles * w_tiles, 1, 1), swa_indices, sw_s0, sw_s1, topk_slots, tk_s0, tk_s1, topk_lens,
               out[0], out[1], verdict.word, scratch, T, SW, K, width, w_tiles, P, shares[0], shares[1], epoch,
               BLOCK_T, BLOCK_W, CHECK, BLOCK_R, BLOCK_C, GATE, nap)
    return out


def mixed_indices(swa_indices, topk_slots, topk_lens, *, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, SWA_W + round_up(K, 4)], lens = SWA_W + topk_lens)``: the window
    part is ``swa_indices`` as built, the top-k part ``topk_slots[t, :topk_len]`` then PAD.
    One launch."""
    (T, SW), (sw_s0, sw_s1) = swa_indices.shape, swa_indices.stride()
    (_, K), (tk_s0, tk_s1) = topk_slots.shape, topk_slots.stride()
    return _launch(swa_indices, topk_slots, topk_lens, out, swa_indices.device, T, SW, K, sw_s0, sw_s1, tk_s0, tk_s1)


def mixed_indices_checked(home, swa_indices, topk_slots, topk_lens, *, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(out, Verdict)`` from one launch whose checker programs test every value the validator tests
    and whose other programs write once they pass (nothing on a ``FAIL``), or None for a call it
    does not take (no token)."""
    try:
        facts = quick_check(swa_indices, topk_slots, topk_lens, out=out)
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    if facts is None or facts[1] == 0 or (home is not None and facts[0] != home):
        return None
    checked = open_checked(facts[0])
    return _launch(swa_indices, topk_slots, topk_lens, out, *facts, checked), checked[0]
