"""``combined_indices`` (SPEC §2.6, FlashMLA-style prefill layout) in Triton.

A [tokens x columns] tile per program: the first ``topk_len`` columns are the request's
slab base plus the top-k entry when it lies in ``[0, N)`` (anything else, -1 included,
stays PAD: never ``b*M - 1``), then ``swa_len`` window columns from the clamped ``lo(p)``
relative to the chunk's gather start, PAD after.

A validated call runs ``combined_indices_checked``: every program first tests every value the
validator tests (``query_start_loc`` from 0, non-decreasing, at most T; ``seq_lens`` at least the
query length, it and ``replay_start`` in ``[0, MAX_POSITION]``; every request's gather length
within its slab past ``window_offset``), stores nothing when one fails and leaves the verdict in
the call's word (``_verdict.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.ops.combined_indices import combined_width, quick_check
from ..common.types import INDEX_DTYPE, MAX_POSITION
from ._device import CHECK, PAD, batch_bad, find_request, slab_bad, verdict
from ._launch import Kernel, contiguous, jit
from ._verdict import open_verdict

BLOCK_T = 16
BLOCK_W = 128
#: the most tokens the checked kernel takes (every program reads every request's values)
CHECKED_MAX = 16384


@triton.jit
def _rows(topk_ptr, tk_s0, tk_s1, qsl_ptr, seq_ptr, rs_ptr, valid_ptr, idx_ptr, lens_ptr, B, T, width, n_steps, W,
          ratio, top_k, M, N, HAS_VALID: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = t < T
    req = find_request(qsl_ptr, B, t, n_steps)
    ok = m & (req < B)
    if HAS_VALID:
        ok = ok & (tl.load(valid_ptr + t, mask=m, other=0) != 0)
    start = tl.load(qsl_ptr + req, mask=ok, other=0).to(tl.int64)
    end = tl.load(qsl_ptr + req + 1, mask=ok, other=0).to(tl.int64)
    seq = tl.load(seq_ptr + req, mask=ok, other=0).to(tl.int64)
    R = tl.load(rs_ptr + req, mask=ok, other=0).to(tl.int64)
    q = end - start
    R = tl.where(R <= seq - q, R, 0)  # a stale replay start (above the first position) replays nothing
    pos = seq - end + t
    lo = tl.maximum(tl.maximum(pos - (W - 1), 0), R)  # the clamp contract
    swa_len = tl.where(ok, pos - lo + 1, 0)
    gather_len = q + tl.minimum(tl.maximum(seq - q - R, 0), W - 1)  # prefill_gather_lens
    gather_start = seq - gather_len
    topk_len = tl.where(ok, tl.minimum((pos + 1) // ratio, top_k), 0)  # ratio 0: top_k passed as 0
    if tl.program_id(1) == 0:
        tl.store(lens_ptr + t, (topk_len + swa_len).to(tl.int32), mask=m)
    base = req.to(tl.int64) * M
    jj = j[None, :]
    in_topk = jj < topk_len[:, None]
    tk = tl.load(topk_ptr + t.to(tl.int64)[:, None] * tk_s0 + jj.to(tl.int64) * tk_s1, mask=in_topk,
                 other=PAD).to(tl.int64)
    topk_part = tl.where((tk >= 0) & (tk < N), base[:, None] + tk, PAD)
    w = jj - topk_len[:, None]
    win_part = tl.where((w >= 0) & (w < swa_len[:, None]), base[:, None] + N + (lo - gather_start)[:, None] + w, PAD)
    out = tl.where(in_topk, topk_part, win_part).to(tl.int32)
    tl.store(idx_ptr + t.to(tl.int64)[:, None] * width + jj, out, mask=m[:, None] & (jj < width))


@jit
def _combined_indices(topk_ptr, tk_s0, tk_s1, qsl_ptr, seq_ptr, rs_ptr, valid_ptr, idx_ptr, lens_ptr,
                      B, T, width, n_steps, W, ratio, top_k, M, N,
                      HAS_VALID: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    _rows(topk_ptr, tk_s0, tk_s1, qsl_ptr, seq_ptr, rs_ptr, valid_ptr, idx_ptr, lens_ptr, B, T, width, n_steps, W,
          ratio, top_k, M, N, HAS_VALID, BLOCK_T, BLOCK_W)


@jit
def _combined_indices_checked(topk_ptr, tk_s0, tk_s1, qsl_ptr, seq_ptr, rs_ptr, valid_ptr, idx_ptr, lens_ptr, flag_ptr,
                              B, T, width, n_steps, W, ratio, top_k, M, N, max_p,
                              HAS_VALID: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
                              CHECK: tl.constexpr):
    bad = (batch_bad(qsl_ptr, seq_ptr, rs_ptr, B, T, max_p, True, True, True, CHECK)
           | slab_bad(qsl_ptr, seq_ptr, rs_ptr, B, W, M - N, CHECK))
    verdict(flag_ptr, bad)
    if bad == 0:
        _rows(topk_ptr, tk_s0, tk_s1, qsl_ptr, seq_ptr, rs_ptr, valid_ptr, idx_ptr, lens_ptr, B, T, width, n_steps,
              W, ratio, top_k, M, N, HAS_VALID, BLOCK_T, BLOCK_W)


_K = Kernel(_combined_indices)
_K_CHECKED = Kernel(_combined_indices_checked)


def combined_indices(topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride,
                     window_offset, *, valid=None, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, round_up(top_k + W, 128)], lens int32 [T])``.

    Token ``t`` of request ``b`` at position ``p``: first ``topk_len = min((p+1)//ratio,
    top_k)`` entries (``ratio == 0``: none) are ``b*M + topk_indices[t, j]`` when that value
    lies in ``[0, N)`` and PAD otherwise; then ``swa_len(p)`` window entries
    ``b*M + N + (lo(p) - gather_start) + j``; PAD after. ``lens = topk_len + swa_len``;
    invalid tokens get ``lens = 0`` and PAD. One launch.
    """
    return _launch(topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride,
                   window_offset, valid, out, topk_indices.device, topk_indices.shape[0], query_start_loc.shape[0] - 1,
                   topk_indices.stride(0), topk_indices.stride(1))


def _launch(topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride, window_offset, valid,
            out, dev, T, B, tk_s0, tk_s1, verdict=None):
    width = combined_width(top_k, W)
    if out is None:
        out = (torch.empty(T, width, dtype=INDEX_DTYPE, device=dev), torch.empty(T, dtype=INDEX_DTYPE, device=dev))
    if T == 0:
        return out
    has_valid = valid is not None
    grid = ((T + BLOCK_T - 1) // BLOCK_T, (width + BLOCK_W - 1) // BLOCK_W, 1)
    tail = (B, T, width, B.bit_length(), W, max(ratio, 1), top_k if ratio > 0 else 0, slab_stride, window_offset)
    if verdict is None:
        _K((has_valid,), grid, topk_indices, tk_s0, tk_s1, contiguous(query_start_loc), contiguous(seq_lens),
           contiguous(replay_start), contiguous(valid) if has_valid else None, out[0], out[1], *tail, has_valid,
           BLOCK_T, BLOCK_W)
    else:  # (the quick check passed: the 1-D tensors are contiguous)
        _K_CHECKED((has_valid,), grid, topk_indices, tk_s0, tk_s1, query_start_loc, seq_lens, replay_start, valid,
                   out[0], out[1], verdict.word, *tail, MAX_POSITION, has_valid, BLOCK_T, BLOCK_W, CHECK)
    return out


def combined_indices_checked(home, topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride,
                             window_offset, *, valid=None, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(out, Verdict)``, or None for a call it does not take (no token; past :data:`CHECKED_MAX`
    tokens and requests)."""
    try:
        facts = quick_check(topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride,
                            window_offset, valid=valid, out=out)
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    if (facts is None or facts[1] == 0 or facts[1] + facts[2] + 1 > CHECKED_MAX
            or (home is not None and facts[0] != home)):
        return None
    verdict = open_verdict(facts[0])
    return _launch(topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride, window_offset,
                   valid, out, *facts, verdict), verdict
