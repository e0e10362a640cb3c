"""``batch_replay_start`` (SPEC §2.1): the per-batch-row replay start."""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, MAX_POSITION
from ..validation import check_out, check_range, check_tensor
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


_INDEX = (torch.int32, torch.int64)
_BOOL = (torch.bool,)
_OUT = (INDEX_DTYPE,)


def quick_check(R_per_request, idx_mapping, is_prefilling, *, out=None) -> bool:
    """``validate``'s host checks and ``check_writes`` for plain tensors (``OpSpec.quick_check``)."""
    if not plain(R_per_request, _INDEX, 1):
        return False
    dev = R_per_request.device
    if not (plain(idx_mapping, _INDEX, 1, dev) and plain(is_prefilling, _BOOL, 1, dev)):
        return False
    B = idx_mapping.shape[0]
    if is_prefilling.shape[0] != B:
        return False
    return out is None or (plain(out, _OUT, 1, dev) and out.shape[0] == B
                           and apart(out, R_per_request, idx_mapping, is_prefilling))


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
