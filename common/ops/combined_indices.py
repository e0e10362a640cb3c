"""``combined_indices`` (SPEC §2.6): FlashMLA-style top-k + window rows into a workspace.

Each request ``b`` owns a workspace slab of stride ``slab_stride`` (M): compressed KV in
columns ``[0, window_offset)`` (N), gathered window KV from column N, starting at the
chunk's ``gather_start = seq_len - gather_len`` (see ``prefill_gather_lens``).
"""

from __future__ import annotations

import numpy as np
import torch

from ..types import INDEX_DTYPE, MAX_POSITION, MAX_WINDOW, PAD, swa_lo
from ..validation import INT32_MAX, check_int, check_out, check_tensor, defer, fail, value_checks_enabled
from ._batch import live_replay_start, token_view
from ._checks import check_batch, check_extents, check_slab_fits, check_window
from ._quick import pair_out, plain
from .prefill_gather_lens import reference as _gather_lens
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep

NAME = "combined_indices"
WIDTH_MULTIPLE = 128  # FlashMLA's SM100 sparse kernels need topk % 128 == 0 (FlashMLA's interface)


def combined_width(top_k: int, W: int) -> int:
    return -(-(top_k + W) // WIDTH_MULTIPLE) * WIDTH_MULTIPLE


def validate(topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride, window_offset,
             *, valid=None, out=None) -> None:
    check_tensor(NAME, "topk_indices", topk_indices, dtypes=INDEX_DTYPE, ndim=2)
    check_extents(NAME, "topk_indices", topk_indices)
    dev = topk_indices.device
    T = topk_indices.shape[0]
    check_window(NAME, "W", W)
    check_int(NAME, "ratio", ratio, min_value=0)
    check_int(NAME, "top_k", top_k, min_value=0, max_value=MAX_WINDOW, why="MAX_WINDOW")
    check_int(NAME, "window_offset", window_offset, min_value=0)
    check_int(NAME, "slab_stride", slab_stride, min_value=window_offset + 1)
    if ratio > 0 and topk_indices.shape[1] < top_k:
        fail(NAME, "topk_indices", topk_indices, f"at least top_k={top_k} columns")
    check_tensor(NAME, "query_start_loc", query_start_loc, device=dev)
    B = check_batch(NAME, query_start_loc, seq_lens, replay_start, num_tokens=T)
    if B * slab_stride >= 2**31:
        fail(NAME, "slab_stride", slab_stride, f"B * slab_stride < 2**31 (int32 indices; B={B})")
    if valid is not None:
        check_tensor(NAME, "valid", valid, dtypes=torch.bool, shape=(T,), device=dev)
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 2:
            fail(NAME, "out", out, "a tuple (indices, lens)")
        check_out(NAME, "out[0]", out[0], shape=(T, combined_width(top_k, W)), dtype=INDEX_DTYPE, device=dev)
        check_out(NAME, "out[1]", out[1], shape=(T,), dtype=INDEX_DTYPE, device=dev)
    if value_checks_enabled() and B > 0:
        def test(qsl, seq, R):  # prefill_gather_lens on the host copies (a stale R counts as 0)
            q = np.diff(qsl.astype(np.int64))
            prefix, R = seq.astype(np.int64) - q, R.astype(np.int64)
            lens = q + np.clip(prefix - np.where(R <= prefix, R, 0), 0, W - 1)
            check_slab_fits(NAME, slab_stride, window_offset, lens.max())

        defer(NAME, (("query_start_loc", query_start_loc), ("seq_lens", seq_lens), ("replay_start", replay_start)),
              test)


_BOOL = (torch.bool,)
_TENSOR = torch.Tensor
_STRIDED = torch.strided


def quick_check(topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride, window_offset,
                *, valid=None, out=None) -> tuple | None:
    """``validate``'s host checks and ``check_writes`` for plain tensors (``OpSpec.quick_check``;
    ``topk_indices`` may be a slice of a wider buffer), written out, each tensor's facts read once;
    answered as the facts the launch takes, ``(device, T, B, topk stride0, topk stride1)``, or
    None."""
    k, q, s, r = topk_indices, query_start_loc, seq_lens, replay_start
    if k.__class__ is not _TENSOR or q.__class__ is not _TENSOR or s.__class__ is not _TENSOR or r.__class__ is not _TENSOR:
        return None
    if (k.dtype is not INDEX_DTYPE or q.dtype is not INDEX_DTYPE or s.dtype is not INDEX_DTYPE
            or r.dtype is not INDEX_DTYPE or k.ndim != 2 or q.ndim != 1 or s.ndim != 1 or r.ndim != 1):
        return None
    dev = k.device
    if q.device != dev or s.device != dev or r.device != dev:
        return None
    if (k.layout is not _STRIDED or not q.is_contiguous() or not s.is_contiguous() or not r.is_contiguous()
            or k.is_neg() or q.is_neg() or s.is_neg() or r.is_neg()):
        return None
    if not (W.__class__ is int and ratio.__class__ is int and top_k.__class__ is int and slab_stride.__class__ is int
            and window_offset.__class__ is int) or not (
            1 <= W <= MAX_WINDOW and 0 <= ratio <= INT32_MAX and 0 <= top_k <= MAX_WINDOW
            and 0 <= window_offset <= INT32_MAX and window_offset + 1 <= slab_stride <= INT32_MAX):
        return None
    (T, K), (k0, k1) = k.shape, k.stride()
    if not (T <= MAX_POSITION and K <= MAX_POSITION and k0 <= INT32_MAX and k1 <= INT32_MAX
            and (T == 0 or K == 0 or ((k1 == 1 or K == 1) and (k0 >= K or T == 1)))):
        return None
    if ratio > 0 and K < top_k:
        return None
    B = q.numel() - 1
    if B < 0 or B >= MAX_POSITION or s.numel() != B or r.numel() != B or B * slab_stride >= 2**31:
        return None
    # a tensor of one element may carry any stride (the kernels never read it): the validator
    # bounds it all the same
    if (B < 1 and q.stride(0) > INT32_MAX) or (B < 2 and (s.stride(0) > INT32_MAX or r.stride(0) > INT32_MAX)):
        return None
    if valid is not None and (not plain(valid, _BOOL, 1, dev) or valid.shape[0] != T):
        return None
    if out is not None:
        inputs = (k, q, s, r) + ((valid,) if valid is not None else ())
        if not pair_out(out, dev, (T, combined_width(top_k, W)), T, *inputs):
            return None
    return dev, T, B, k0, k1


def reference(topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride, window_offset,
              *, valid=None, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, round_up(top_k + W, 128)], lens int32 [T])``.

    Token ``t`` of request ``b`` at position ``p``: first ``topk_len = min((p+1)//ratio,
    top_k)`` entries (``ratio == 0``: none) are ``b*M + topk_indices[t, j]`` when that value
    lies in ``[0, N)`` and PAD otherwise (never ``b*M - 1``, which would alias the previous
    slab); then ``swa_len(p)`` window entries ``b*M + N + (lo(p) - gather_start) + j``;
    PAD after. ``lens = topk_len + swa_len``; invalid tokens get ``lens = 0`` and PAD.
    """
    T = topk_indices.shape[0]
    dev = topk_indices.device
    M, N = slab_stride, window_offset
    width = combined_width(top_k, W)
    view = token_view(query_start_loc, seq_lens, T, valid=valid)
    b = view.req
    R = view.take(live_replay_start(query_start_loc, seq_lens, replay_start))
    lo = swa_lo(view.pos, W, R)
    swa_len = view.pos - lo + 1
    gather_start = seq_lens.to(torch.int64) - _gather_lens(query_start_loc, seq_lens, replay_start, W).to(torch.int64)
    if ratio > 0:
        topk_len = torch.clamp(torch.div(view.pos + 1, ratio, rounding_mode="floor"), max=top_k)
    else:
        topk_len = torch.zeros_like(view.pos)
    topk_len = torch.where(view.valid, topk_len, 0)
    swa_len = torch.where(view.valid, swa_len, 0)
    j = torch.arange(width, device=dev, dtype=torch.int64)[None, :]
    base = (b * M)[:, None]
    # top-k part: columns [0, topk_len)
    tk = topk_indices[:, :top_k].to(torch.int64) if ratio > 0 else topk_indices[:, :0].to(torch.int64)
    tk = torch.nn.functional.pad(tk, (0, width - tk.shape[1]), value=PAD)
    in_slab = (tk >= 0) & (tk < N)
    topk_part = torch.where((j < topk_len[:, None]) & in_slab, base + tk, PAD)
    # window part: columns [topk_len, topk_len + swa_len)
    w = j - topk_len[:, None]
    win_col = N + (lo - view.take(gather_start))[:, None] + w
    win_part = torch.where((w >= 0) & (w < swa_len[:, None]), base + win_col, PAD)
    indices = torch.where(j < topk_len[:, None], topk_part, win_part).to(INDEX_DTYPE)
    lens = (topk_len + swa_len).to(INDEX_DTYPE)
    if out is None:
        return indices, lens
    out[0].copy_(indices)
    out[1].copy_(lens)
    return out


RESULTS = Results(("indices", "lens"), lambda a: {
    "indices": ((a["topk_indices"].shape[0], combined_width(a["top_k"], a["W"])), INDEX_DTYPE),
    "lens": ((a["topk_indices"].shape[0],), INDEX_DTYPE)})


def case(d: CaseDraw) -> Call:
    """Random top-k (PAD and out-of-slab entries among them, wider than ``top_k`` at times), ratios
    0 / 4 / 128, a slab just wide enough for the longest gather, a valid mask at times."""
    b, t, rng, dev = d.batch, d.tensors, d.rng, d.device
    T = b.T
    ratio = int(rng.choice([0, 4, 128]))
    top_k = int(rng.choice([0, 4, 16, 64]))
    N = int(rng.integers(1, 80))
    gl = _gather_lens(t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W)
    M = N + max(1, int(gl.max()) if b.B else 0) + int(rng.integers(0, 5))
    topk = torch.tensor(rng.integers(-1, N + 6, size=(T, top_k + int(rng.integers(0, 3)))), dtype=INDEX_DTYPE,
                        device=dev)
    kw = {}
    if rng.random() < 0.3:
        kw["valid"] = torch.tensor(rng.random(T) < 0.8, device=dev)
    if d.poison:
        w = combined_width(top_k, b.W)
        kw["out"] = (d.out((T, w), INDEX_DTYPE), d.out((T,), INDEX_DTYPE))
    return (topk, t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W, ratio, top_k, M, N), kw


def warmup(s: WarmupStep):
    """Every compression ratio, with and without a valid mask."""
    topk, _ = s.topk
    slab = 64 + int(s.gather_lens.max()) + 1
    for valid in (None, s.valid[: s.T]):
        for ratio in s.compress_ratios:
            yield (topk, s.qsl, s.seq, s.R, s.W, ratio, s.top_k, slab, 64), {"valid": valid}


OP = OpSpec(NAME, reference, validate, RESULTS, short="combined",
            scalars={"W": "int", "ratio": "int", "top_k": "int", "slab_stride": "int", "window_offset": "int"},
            case=case, warmup=warmup, quick_check=quick_check)
