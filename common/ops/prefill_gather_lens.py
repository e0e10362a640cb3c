"""``prefill_gather_lens`` (SPEC §2.5): how many window positions a prefill chunk gathers."""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, MAX_POSITION, MAX_WINDOW
from ..validation import INT32_MAX, check_out, check_tensor
from ._batch import live_replay_start
from ._checks import check_batch, check_window
from ._quick import apart, plain
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep

NAME = "prefill_gather_lens"


def validate(query_start_loc, seq_lens, replay_start, W, *, out=None) -> None:
    check_tensor(NAME, "query_start_loc", query_start_loc, dtypes=INDEX_DTYPE, ndim=1)
    check_window(NAME, "W", W)
    # only query lengths are read: a slice of a batch's requests (its prefills) needs no shift to 0
    B = check_batch(NAME, query_start_loc, seq_lens, replay_start, from_zero=False)
    if out is not None:
        check_out(NAME, "out", out, shape=(B,), dtype=INDEX_DTYPE, device=query_start_loc.device)


_INDEX = (INDEX_DTYPE,)
_TENSOR = torch.Tensor


def quick_check(query_start_loc, seq_lens, replay_start, W, *, out=None) -> tuple | None:
    """``validate``'s host checks and ``check_writes`` for plain tensors (``OpSpec.quick_check``),
    written out, each tensor's facts read once; answered as the facts the launch takes,
    ``(device, B)``, or None."""
    q, s, r = query_start_loc, seq_lens, replay_start
    if q.__class__ is not _TENSOR or s.__class__ is not _TENSOR or r.__class__ is not _TENSOR:
        return None
    if (q.dtype is not INDEX_DTYPE or s.dtype is not INDEX_DTYPE or r.dtype is not INDEX_DTYPE or q.ndim != 1
            or s.ndim != 1 or r.ndim != 1):
        return None
    dev = q.device
    if (s.device != dev or r.device != dev or not q.is_contiguous() or not s.is_contiguous() or not r.is_contiguous()
            or q.is_neg() or s.is_neg() or r.is_neg()):
        return None
    B = q.numel() - 1
    if B < 0 or B >= MAX_POSITION or s.numel() != B or r.numel() != B or W.__class__ is not int or not 1 <= W <= MAX_WINDOW:
        return None
    # a tensor of one element may carry any stride (the kernels never read it): the validator
    # bounds it all the same
    if (B < 1 and q.stride(0) > INT32_MAX) or (B < 2 and (s.stride(0) > INT32_MAX or r.stride(0) > INT32_MAX)):
        return None
    if out is None or (plain(out, _INDEX, 1, dev) and out.shape[0] == B and apart(out, q, s, r)):
        return dev, B
    return None


def reference(query_start_loc, seq_lens, replay_start, W, *, out=None) -> torch.Tensor:
    """int32 [B]: ``q + min(max(prefix - R, 0), W - 1)`` with ``q = qsl[b+1] - qsl[b]`` (so
    ``query_start_loc`` may be a slice of a batch's, not starting at 0); the chunk gathers window KV of
    positions ``[seq_len - gather_len, seq_len)``. The first replay chunk (prefix = R)
    gathers exactly from R; a stale R (above ``prefix``, SPEC §0) counts as 0."""
    q = (query_start_loc[1:] - query_start_loc[:-1]).to(torch.int64)
    prefix = seq_lens.to(torch.int64) - q
    R = live_replay_start(query_start_loc, seq_lens, replay_start)
    back = torch.clamp(prefix - R, min=0).clamp(max=W - 1)
    lens = (q + back).to(INDEX_DTYPE)
    if out is None:
        return lens
    return out.copy_(lens)


RESULTS = Results(("gather_lens",), lambda a: {"gather_lens": ((a["query_start_loc"].shape[0] - 1,), INDEX_DTYPE)}, out="tensor")


def case(d: CaseDraw) -> Call:
    """At times a slice of the requests (vLLM's prefills): ``query_start_loc`` not from 0."""
    b, t, rng = d.batch, d.tensors, d.rng
    lo, hi = 0, b.B
    if b.B and rng.random() < 0.3:
        lo = int(rng.integers(0, b.B + 1))
        hi = int(rng.integers(lo, b.B + 1))
    kw = {"out": d.out((hi - lo,), INDEX_DTYPE)} if d.poison else {}
    return (t["query_start_loc"][lo: hi + 1], t["seq_lens"][lo:hi], t["replay_start"][lo:hi], b.W), kw


def warmup(s: WarmupStep):
    yield (s.qsl, s.seq, s.R, s.W), {}


OP = OpSpec(NAME, reference, validate, RESULTS, short="gather_lens", scalars={"W": "int"}, case=case, warmup=warmup,
            quick_check=quick_check)
