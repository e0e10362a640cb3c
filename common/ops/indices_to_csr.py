"""``indices_to_csr``: padded index rows to CSR with every PAD dropped.

AITER's ``pa_sparse_prefill_opus`` takes ragged (CSR) indices and faults on -1
(a -1 faulted a real deployment), so every PAD -- inside or past the active length -- must go.
"""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, PAD
from ..validation import INT32_MAX, check_out, check_range, check_tensor, fail
from ._checks import check_extents
from ._quick import apart, plain, rows
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep
from .swa_indices_and_lens import step_window

NAME = "indices_to_csr"


def validate(indices, lens, *, out=None) -> None:
    check_tensor(NAME, "indices", indices, dtypes=INDEX_DTYPE, ndim=2)
    check_extents(NAME, "indices", indices)
    T, K = indices.shape
    check_tensor(NAME, "lens", lens, dtypes=INDEX_DTYPE, shape=(T,), device=indices.device)
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 2:
            fail(NAME, "out", out, "a tuple (indptr, values)")
        check_out(NAME, "out[0]", out[0], shape=(T + 1,), dtype=INDEX_DTYPE, device=indices.device)
        check_out(NAME, "out[1]", out[1], shape=(T * K,), dtype=INDEX_DTYPE, device=indices.device)
    if T * K > INT32_MAX:
        fail(NAME, "indices", indices, f"T * K <= {INT32_MAX} (int32 CSR offsets)")
    check_range(NAME, "lens", lens, low=0, high=K + 1)
    # every entry, past a row's length too (SPEC §5): a value below PAD is not dropped and would
    # reach AITER, which faults on any negative index
    check_range(NAME, "indices", indices, low=0, high=INT32_MAX + 1, allow_pad=True)


_INDEX = (INDEX_DTYPE,)


def quick_check(indices, lens, *, out=None) -> bool:
    """``validate``'s host checks and ``check_writes`` for plain tensors (``OpSpec.quick_check``;
    ``indices`` may be a slice of a wider buffer)."""
    if not rows(indices, _INDEX):
        return False
    dev = indices.device
    T, K = indices.shape
    if not plain(lens, _INDEX, 1, dev) or lens.shape[0] != T or T * K > INT32_MAX:
        return False
    if out is None:
        return True
    if out.__class__ is not tuple or len(out) != 2:
        return False
    indptr, values = out
    return (plain(indptr, _INDEX, 1, dev) and indptr.shape[0] == T + 1 and plain(values, _INDEX, 1, dev)
            and values.shape[0] == T * K and apart(indptr, values, indices, lens) and apart(values, indices, lens))


def reference(indices, lens, *, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indptr int32 [T+1], values int32 [T*K])``: row ``t``'s kept entries (``j < lens[t]``
    and not PAD, in order) are ``values[indptr[t]:indptr[t+1]]``. ``values`` has the fixed
    upper-bound size ``T*K`` (no host sync, graph-safe); entries from ``indptr[T]`` on are PAD.
    """
    T, K = indices.shape
    dev = indices.device
    j = torch.arange(K, device=dev)[None, :]
    keep = (j < lens[:, None]) & (indices != PAD)
    counts = keep.sum(dim=1)
    indptr = torch.zeros(T + 1, dtype=torch.int64, device=dev)
    torch.cumsum(counts, 0, out=indptr[1:])
    dest = indptr[:-1, None] + keep.cumsum(dim=1) - 1
    dest = torch.where(keep, dest, T * K)  # dropped entries land in a spare slot
    values = torch.full((T * K + 1,), PAD, dtype=INDEX_DTYPE, device=dev)
    values.scatter_(0, dest.reshape(-1), indices.reshape(-1))
    values = values[: T * K]
    if out is None:
        return indptr.to(INDEX_DTYPE), values
    out[0].copy_(indptr)
    out[1].copy_(values)
    return out


RESULTS = Results(("indptr", "values"), lambda a: {"indptr": ((a["indices"].shape[0] + 1,), INDEX_DTYPE),
                             "values": ((a["indices"].shape[0] * a["indices"].shape[1],), INDEX_DTYPE)})


def case(d: CaseDraw) -> Call:
    """Indices with PAD inside and past the lengths (a third of the entries)."""
    rng, dev = d.rng, d.device
    Tn, K = int(rng.integers(0, 40)), int(rng.integers(1, 70))
    idx = torch.tensor(rng.integers(-1, 5000, size=(Tn, K)), dtype=INDEX_DTYPE, device=dev)
    idx[torch.tensor(rng.random((Tn, K)) < 0.3, device=dev)] = PAD
    lens = torch.tensor(rng.integers(0, K + 1, size=Tn), dtype=INDEX_DTYPE, device=dev)
    kw = {"out": (d.out((Tn + 1,), INDEX_DTYPE), d.out((Tn * K,), INDEX_DTYPE))} if d.poison else {}
    return (idx, lens), kw


def warmup(s: WarmupStep):
    yield step_window(s), {}


OP = OpSpec(NAME, reference, validate, RESULTS, short="to_csr", case=case, warmup=warmup, quick_check=quick_check)
