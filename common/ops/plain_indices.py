"""``plain_indices`` (SPEC §2.6): the pack's own layout, compact top-k then window."""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, MAX_POSITION, MAX_WINDOW, PAD
from ..validation import INT32_MAX, check_int, check_out, check_range, check_tensor, fail
from ._checks import check_index_rows
from ._quick import pair_out
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep, random_topk
from .swa_indices_and_lens import case_window, step_window

NAME = "plain_indices"


def validate(swa_indices, swa_lens, topk_slots=None, topk_lens=None, *, topk_offset=0, window_offset=0, out=None) -> None:
    check_tensor(NAME, "swa_indices", swa_indices, dtypes=INDEX_DTYPE, ndim=2)
    check_index_rows(NAME, "swa_indices", swa_indices)
    dev = swa_indices.device
    T, SW = swa_indices.shape
    check_tensor(NAME, "swa_lens", swa_lens, dtypes=INDEX_DTYPE, shape=(T,), device=dev)
    if (topk_slots is None) != (topk_lens is None):
        fail(NAME, "topk_lens", topk_lens, "given together with topk_slots (both or neither)")
    K = 0
    if topk_slots is not None:
        check_tensor(NAME, "topk_slots", topk_slots, dtypes=INDEX_DTYPE, ndim=2, device=dev)
        check_index_rows(NAME, "topk_slots", topk_slots)
        if topk_slots.shape[0] != T:
            fail(NAME, "topk_slots", topk_slots, f"{T} rows (one per token, as swa_indices)")
        check_tensor(NAME, "topk_lens", topk_lens, dtypes=INDEX_DTYPE, shape=(T,), device=dev)
        K = topk_slots.shape[1]
    check_int(NAME, "topk_offset", topk_offset, min_value=0)
    check_int(NAME, "window_offset", window_offset, min_value=0)
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 2:
            fail(NAME, "out", out, "a tuple (indices, lens)")
        check_out(NAME, "out[0]", out[0], shape=(T, K + SW), dtype=INDEX_DTYPE, device=dev)
        check_out(NAME, "out[1]", out[1], shape=(T,), dtype=INDEX_DTYPE, device=dev)
    check_range(NAME, "swa_lens", swa_lens, low=0, high=SW + 1)
    if topk_lens is not None:
        check_range(NAME, "topk_lens", topk_lens, low=0, high=K + 1)
    # an offset added to an int32 slot must not wrap into a legitimate-looking index
    for name, values, offset in (("swa_indices", swa_indices, window_offset), ("topk_slots", topk_slots, topk_offset)):
        if values is not None:
            check_range(NAME, name, values, low=0, high=INT32_MAX - offset + 1, allow_pad=True)


_TENSOR = torch.Tensor
_STRIDED = torch.strided


def quick_check(swa_indices, swa_lens, topk_slots=None, topk_lens=None, *, topk_offset=0, window_offset=0,
                out=None) -> tuple | None:
    """``validate``'s host checks and ``check_writes`` for plain tensors (``OpSpec.quick_check``;
    the index rows may be slices of wider buffers), written out, each tensor's facts read once;
    answered as the facts the launch takes, ``(device, T, SW, K, window strides, top-k strides)``
    (``K`` and its strides 0 without top-k), or None."""
    a, n = swa_indices, swa_lens
    if a.__class__ is not _TENSOR or n.__class__ is not _TENSOR or (topk_slots is None) != (topk_lens is None):
        return None
    if a.dtype is not INDEX_DTYPE or n.dtype is not INDEX_DTYPE or a.ndim != 2 or n.ndim != 1:
        return None
    dev = a.device
    if n.device != dev or a.layout is not _STRIDED or not n.is_contiguous() or a.is_neg() or n.is_neg():
        return None
    (T, SW), (a0, a1) = a.shape, a.stride()
    if (n.numel() != T or T > MAX_POSITION or SW > MAX_WINDOW or (T < 2 and n.stride(0) > INT32_MAX)
            or a0 > INT32_MAX or a1 > INT32_MAX or not (T == 0 or SW == 0 or ((a1 == 1 or SW == 1) and (a0 >= SW or T == 1)))):
        return None
    if not (topk_offset.__class__ is int and window_offset.__class__ is int and 0 <= topk_offset <= INT32_MAX
            and 0 <= window_offset <= INT32_MAX):
        return None
    if topk_slots is None:
        if out is None or pair_out(out, dev, (T, SW), T, a, n):
            return dev, T, SW, 0, a0, a1, 0, 0
        return None
    k, m = topk_slots, topk_lens
    if (k.__class__ is not _TENSOR or m.__class__ is not _TENSOR or k.dtype is not INDEX_DTYPE
            or m.dtype is not INDEX_DTYPE or k.ndim != 2 or m.ndim != 1 or k.device != dev or m.device != dev
            or k.layout is not _STRIDED or not m.is_contiguous() or k.is_neg() or m.is_neg()):
        return None
    (Tk, K), (k0, k1) = k.shape, k.stride()
    if (Tk != T or K > MAX_WINDOW or m.numel() != T or (T < 2 and m.stride(0) > INT32_MAX) or k0 > INT32_MAX
            or k1 > INT32_MAX or not (T == 0 or K == 0 or ((k1 == 1 or K == 1) and (k0 >= K or T == 1)))):
        return None
    if out is None or pair_out(out, dev, (T, K + SW), T, a, n, k, m):
        return dev, T, SW, K, a0, a1, k0, k1
    return None


def reference(swa_indices, swa_lens, topk_slots=None, topk_lens=None, *, topk_offset=0, window_offset=0,
              out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, K + SWA_W], lens = topk_len + swa_len)``: per token the first
    ``topk_len`` top-k slots (+ ``topk_offset``; PAD kept), then the first ``swa_len``
    window slots (+ ``window_offset``; PAD kept), PAD after. The offsets place two caches
    in one KV tensor (e.g. compressed rows after the window cache)."""
    T, SW = swa_indices.shape
    dev = swa_indices.device
    if topk_slots is None:
        topk_slots = torch.empty(T, 0, dtype=INDEX_DTYPE, device=dev)
        topk_lens = torch.zeros(T, dtype=INDEX_DTYPE, device=dev)
    K = topk_slots.shape[1]
    width = K + SW
    j = torch.arange(width, device=dev, dtype=torch.int64)[None, :]
    tl = topk_lens.to(torch.int64)[:, None]
    sl = swa_lens.to(torch.int64)[:, None]
    tk = torch.nn.functional.pad(topk_slots.to(torch.int64), (0, width - K), value=PAD)
    tk = torch.where(tk == PAD, PAD, tk + topk_offset)
    w = (j - tl).clamp(0, max(SW - 1, 0))
    win = swa_indices.to(torch.int64).gather(1, w) if SW else torch.full((T, width), PAD, device=dev, dtype=torch.int64)
    win = torch.where(win == PAD, PAD, win + window_offset)
    indices = torch.where(j < tl, tk, torch.where(j < tl + sl, win, PAD)).to(INDEX_DTYPE)
    lens = (tl + sl)[:, 0].to(INDEX_DTYPE)
    if out is None:
        return indices, lens
    out[0].copy_(indices)
    out[1].copy_(lens)
    return out


def _width(a) -> int:
    return a["swa_indices"].shape[1] + (0 if a.get("topk_slots") is None else a["topk_slots"].shape[1])


RESULTS = Results(("indices", "lens"), lambda a: {"indices": ((a["swa_indices"].shape[0], _width(a)), INDEX_DTYPE),
                             "lens": ((a["swa_indices"].shape[0],), INDEX_DTYPE)})


def case(d: CaseDraw) -> Call:
    """Window rows with top-k rows after them (none at times), at random offsets."""
    swa, lens = case_window(d)
    topk, topk_lens = random_topk(d)
    rng = d.rng
    T, K = topk.shape
    kw = {"topk_offset": int(rng.integers(0, 50)), "window_offset": int(rng.integers(0, 50))}
    if d.poison:
        kw["out"] = (d.out((T, K + d.batch.W), INDEX_DTYPE), d.out((T,), INDEX_DTYPE))
    if K == 0 and rng.random() < 0.5:
        return (swa, lens), kw
    return (swa, lens, topk, topk_lens), kw


def warmup(s: WarmupStep):
    """The window alone and with top-k rows."""
    swa, lens = step_window(s)
    topk, topk_lens = s.topk
    yield (swa, lens), {}
    yield (swa, lens, topk, topk_lens), {}


OP = OpSpec(NAME, reference, validate, RESULTS, short="plain",
            scalars={"topk_offset": "int", "window_offset": "int"}, case=case, warmup=warmup, quick_check=quick_check)
