"""``batch_replay_start`` (SPEC §2.1): the per-batch-row replay start."""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, MAX_POSITION
from ..validation import INT32_MAX, check_out, check_range, check_tensor
from ._checks import check_extents
from ._quick import apart, plain
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep

NAME = "batch_replay_start"


def validate(R_per_request, idx_mapping, is_prefilling, *, out=None) -> None:
    check_tensor(NAME, "R_per_request", R_per_request, dtypes=(torch.int32, torch.int64), ndim=1)
    dev = R_per_request.device
    check_tensor(NAME, "idx_mapping", idx_mapping, dtypes=(torch.int32, torch.int64), ndim=1, device=dev)
    check_extents(NAME, "idx_mapping", idx_mapping)
    B = idx_mapping.shape[0]
    check_tensor(NAME, "is_prefilling", is_prefilling, dtypes=torch.bool, shape=(B,), device=dev)
    if out is not None:
        check_out(NAME, "out", out, shape=(B,), dtype=INDEX_DTYPE, device=dev)
    check_range(NAME, "idx_mapping", idx_mapping, low=0, high=R_per_request.shape[0])
    check_range(NAME, "R_per_request", R_per_request, low=0, high=MAX_POSITION + 1)


_OUT = (INDEX_DTYPE,)
_TENSOR = torch.Tensor
_I32, _I64, _BOOL = torch.int32, torch.int64, torch.bool


def quick_check(R_per_request, idx_mapping, is_prefilling, *, out=None) -> tuple | None:
    """``validate``'s host checks and ``check_writes`` for plain tensors (``OpSpec.quick_check``),
    written out, each tensor's facts read once; answered as the facts the launch takes,
    ``(device, B, len(R_per_request), the two index dtypes)``, or None."""
    r, i, p = R_per_request, idx_mapping, is_prefilling
    if r.__class__ is not _TENSOR or i.__class__ is not _TENSOR or p.__class__ is not _TENSOR:
        return None
    r_dtype, i_dtype = r.dtype, i.dtype
    if ((r_dtype is not _I32 and r_dtype is not _I64) or (i_dtype is not _I32 and i_dtype is not _I64)
            or p.dtype is not _BOOL or r.ndim != 1 or i.ndim != 1 or p.ndim != 1):
        return None
    dev = r.device
    if (i.device != dev or p.device != dev or not r.is_contiguous() or not i.is_contiguous() or not p.is_contiguous()
            or r.is_neg() or i.is_neg() or p.is_neg()):
        return None
    n_r, B = r.numel(), i.numel()
    if p.numel() != B or n_r > MAX_POSITION or B > MAX_POSITION:
        return None
    # a tensor of one element may carry any stride (the kernels never read it): the validator
    # bounds it all the same
    if (n_r < 2 and r.stride(0) > INT32_MAX) or (B < 2 and (i.stride(0) > INT32_MAX or p.stride(0) > INT32_MAX)):
        return None
    if out is None or (plain(out, _OUT, 1, dev) and out.shape[0] == B and apart(out, r, i, p)):
        return dev, B, n_r, r_dtype, i_dtype
    return None


def reference(R_per_request, idx_mapping, is_prefilling, *, out=None) -> torch.Tensor:
    """``out[b] = R_per_request[idx_mapping[b]]`` for prefilling rows, else 0 (int32 [B]).

    Pass a persistent ``out`` so a captured graph reads a stable address.
    """
    B = idx_mapping.shape[0]
    if out is None:
        out = torch.empty(B, dtype=INDEX_DTYPE, device=R_per_request.device)
    R = R_per_request.index_select(0, idx_mapping.to(torch.int64)).to(INDEX_DTYPE)
    out.copy_(torch.where(is_prefilling, R, torch.zeros_like(R)))
    return out


RESULTS = Results(("replay_start",), lambda a: {"replay_start": ((a["idx_mapping"].shape[0],), INDEX_DTYPE)}, out="tensor")


def case(d: CaseDraw) -> Call:
    """Replay starts of more requests than the batch has, mapped to its rows in random order."""
    b, rng = d.batch, d.rng
    n_req = b.B + int(rng.integers(0, 4))
    R_all = torch.tensor(rng.integers(0, 500, n_req), dtype=torch.int32, device=d.device)
    idx = torch.tensor(rng.permutation(n_req)[: b.B], dtype=torch.int32, device=d.device)
    kw = {"out": d.out((b.B,), INDEX_DTYPE)} if d.poison else {}
    return (R_all, idx, d.tensors["is_prefilling"]), kw


def warmup(s: WarmupStep):
    """Every pair of index dtypes (replay starts, batch -> request map)."""
    for rd in s.index_dtypes:
        for idd in s.index_dtypes:
            yield (s.R_all.to(rd), s.idx.to(idd), s.prefilling), {}


OP = OpSpec(NAME, reference, validate, RESULTS, short="replay_start", case=case, warmup=warmup,
            quick_check=quick_check)
