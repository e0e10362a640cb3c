"""``plain_indices`` (SPEC §2.6): the pack's own layout, compact top-k then window."""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, MAX_WINDOW, PAD
from ..validation import INT32_MAX, check_int, check_out, check_range, check_tensor, fail
from ._checks import check_index_rows
from ._quick import length, pair_out, shape2
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


_INDEX = (INDEX_DTYPE,)


def quick_check(swa_indices, swa_lens, topk_slots=None, topk_lens=None, *, topk_offset=0, window_offset=0,
                out=None) -> bool:
    """``validate``'s host checks and ``check_writes`` for plain tensors (``OpSpec.quick_check``;
    the index rows may be slices of wider buffers)."""
    size = shape2(swa_indices, _INDEX)
    if size is None:
        return False
    dev = swa_indices.device
    T, SW = size
    if SW > MAX_WINDOW or length(swa_lens, INDEX_DTYPE, dev) != T or (topk_slots is None) != (topk_lens is None):
        return False
    if not (topk_offset.__class__ is int and window_offset.__class__ is int and 0 <= topk_offset <= INT32_MAX
            and 0 <= window_offset <= INT32_MAX):
        return False
    if topk_slots is None:
        return out is None or pair_out(out, dev, (T, SW), T, swa_indices, swa_lens)
    size = shape2(topk_slots, _INDEX, dev)
    if size is None or size[0] != T or size[1] > MAX_WINDOW or length(topk_lens, INDEX_DTYPE, dev) != T:
        return False
    return out is None or pair_out(out, dev, (T, size[1] + SW), T, swa_indices, swa_lens, topk_slots, topk_lens)


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
