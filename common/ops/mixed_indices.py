"""``mixed_indices`` (SPEC §2.6): FlashInfer-style fixed-width window + top-k rows."""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, MAX_POSITION, MAX_WINDOW, PAD
from ..validation import INT32_MAX, check_out, check_range, check_tensor, fail
from ._checks import check_index_rows
from ._quick import pair_out
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep, random_topk
from .swa_indices_and_lens import case_window, step_window

NAME = "mixed_indices"
TOPK_MULTIPLE = 4  # FlashInfer's DSv4 decode reads the top-k part in groups of 4


def mixed_width(swa_width: int, top_k: int) -> int:
    return swa_width + -(-top_k // TOPK_MULTIPLE) * TOPK_MULTIPLE


def validate(swa_indices, topk_slots, topk_lens, *, out=None) -> None:
    check_tensor(NAME, "swa_indices", swa_indices, dtypes=INDEX_DTYPE, ndim=2)
    check_index_rows(NAME, "swa_indices", swa_indices)
    dev = swa_indices.device
    T, SW = swa_indices.shape
    check_tensor(NAME, "topk_slots", topk_slots, dtypes=INDEX_DTYPE, ndim=2, device=dev)
    check_index_rows(NAME, "topk_slots", topk_slots)
    if topk_slots.shape[0] != T:
        fail(NAME, "topk_slots", topk_slots, f"{T} rows (one per token, as swa_indices)")
    check_tensor(NAME, "topk_lens", topk_lens, dtypes=INDEX_DTYPE, shape=(T,), device=dev)
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 2:
            fail(NAME, "out", out, "a tuple (indices, lens)")
        check_out(NAME, "out[0]", out[0], shape=(T, mixed_width(SW, topk_slots.shape[1])), dtype=INDEX_DTYPE, device=dev)
        check_out(NAME, "out[1]", out[1], shape=(T,), dtype=INDEX_DTYPE, device=dev)
    check_range(NAME, "topk_lens", topk_lens, low=0, high=topk_slots.shape[1] + 1)
    # every entry, past a token's top-k length too (SPEC §5): the op copies the slots as they are,
    # so a value below PAD would reach the consumer as an index
    check_range(NAME, "swa_indices", swa_indices, low=0, high=INT32_MAX + 1, allow_pad=True)
    check_range(NAME, "topk_slots", topk_slots, low=0, high=INT32_MAX + 1, allow_pad=True)


_TENSOR = torch.Tensor
_STRIDED = torch.strided


def quick_check(swa_indices, topk_slots, topk_lens, *, out=None) -> tuple | None:
    """``validate``'s host checks and ``check_writes`` for plain tensors (``OpSpec.quick_check``;
    the index rows may be slices of wider buffers), written out, each tensor's facts read once;
    answered as the facts the launch takes, ``(device, T, SW, K, swa strides, top-k strides)``, or
    None."""
    a, k, n = swa_indices, topk_slots, topk_lens
    if a.__class__ is not _TENSOR or k.__class__ is not _TENSOR or n.__class__ is not _TENSOR:
        return None
    if (a.dtype is not INDEX_DTYPE or k.dtype is not INDEX_DTYPE or n.dtype is not INDEX_DTYPE or a.ndim != 2
            or k.ndim != 2 or n.ndim != 1):
        return None
    dev = a.device
    if (k.device != dev or n.device != dev or a.layout is not _STRIDED or k.layout is not _STRIDED
            or not n.is_contiguous() or a.is_neg() or k.is_neg() or n.is_neg()):
        return None
    (T, SW), (a0, a1) = a.shape, a.stride()
    (Tk, K), (k0, k1) = k.shape, k.stride()
    if (Tk != T or n.numel() != T or T > MAX_POSITION or SW > MAX_WINDOW or K > MAX_WINDOW or (T < 2 and n.stride(0) > INT32_MAX)
            or a0 > INT32_MAX or a1 > INT32_MAX or k0 > INT32_MAX or k1 > INT32_MAX):
        return None
    # rows contiguous and apart (a slice of a wider buffer), as _quick.rows
    if not (T == 0 or ((SW == 0 or ((a1 == 1 or SW == 1) and (a0 >= SW or T == 1)))
                       and (K == 0 or ((k1 == 1 or K == 1) and (k0 >= K or T == 1))))):
        return None
    if out is None or pair_out(out, dev, (T, mixed_width(SW, K)), T, a, k, n):
        return dev, T, SW, K, a0, a1, k0, k1
    return None


def reference(swa_indices, topk_slots, topk_lens, *, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, SWA_W + round_up(K, 4)], lens = SWA_W + topk_lens)``.

    The window part is ``swa_indices`` as built (clamped rows carry PAD holes at their end;
    decode rows are unclamped anyway); the top-k part holds ``topk_slots[t, :topk_len]``
    then PAD. Consumers skip PAD inside the active length.
    """
    T, SW = swa_indices.shape
    width = mixed_width(SW, topk_slots.shape[1])
    j = torch.arange(width - SW, device=swa_indices.device)
    tk = torch.nn.functional.pad(topk_slots, (0, width - SW - topk_slots.shape[1]), value=PAD)
    tk = torch.where(j[None, :] < topk_lens[:, None], tk, PAD)
    indices = torch.cat([swa_indices, tk.to(INDEX_DTYPE)], dim=1)
    lens = (topk_lens + SW).to(INDEX_DTYPE)
    if out is None:
        return indices, lens
    out[0].copy_(indices)
    out[1].copy_(lens)
    return out


RESULTS = Results(("indices", "lens"), lambda a: {
    "indices": ((a["swa_indices"].shape[0], mixed_width(a["swa_indices"].shape[1], a["topk_slots"].shape[1])),
                INDEX_DTYPE),
    "lens": ((a["swa_indices"].shape[0],), INDEX_DTYPE)})


def case(d: CaseDraw) -> Call:
    swa, _ = case_window(d)
    topk, topk_lens = random_topk(d)
    T, K = topk.shape
    kw = {"out": (d.out((T, mixed_width(d.batch.W, K)), INDEX_DTYPE), d.out((T,), INDEX_DTYPE))} if d.poison else {}
    return (swa, topk, topk_lens), kw


def warmup(s: WarmupStep):
    swa, _ = step_window(s)
    topk, topk_lens = s.topk
    yield (swa, topk, topk_lens), {}


OP = OpSpec(NAME, reference, validate, RESULTS, short="mixed", case=case, warmup=warmup, quick_check=quick_check)
