"""Pieces every vendor attention wrapper needs to keep the pack's ``sparse_mla`` contract.

Vendor kernels differ from the reference in three ways the wrappers must undo:

* they mark "no valid index" differently (FlashMLA returns ``lse = +inf``; others leave the
  row to their own devices) -- the pack says zeros and ``lse = -inf``;
* several return no LSE at all (FlashInfer's DSv4 decode, AITER's OPUS prefill) -- the
  wrapper recomputes it here, an extra ``q . k`` pass over the valid entries, only when the
  caller asks for it (``return_lse=True``, the op's default; the serving path passes False);
* they read a valid *prefix* of an index row, or a ragged (CSR) list -- the index layouts'
  own :func:`~swa_backends.common.ops.layouts.compact_rows` turns the pack's rows (PAD holes
  allowed anywhere inside the active length) into that form without a host synchronisation.

Everything here is plain torch on the tensors' own device: no vendor import.
"""

from __future__ import annotations

import torch

from ..common.ops.layouts import compact_rows, valid_mask  # noqa: F401  (re-exported for the wrappers)

# The fp32 gather of [chunk, K, D] rows stays below this many bytes per chunk.
_CHUNK_BYTES = 256 * 2**20


def lse_from_indices(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, lens: torch.Tensor,
                     sm_scale: float) -> torch.Tensor:
    """``fp32 [T, H]``: ``log(sum_j exp(sm_scale * q[t] . kv[indices[t, j]]))`` over the valid
    ``j`` (natural log, sink excluded, ``-inf`` for a row with nothing to read) -- the
    reference's LSE, for vendor kernels that return only the output. Costs one extra
    ``q . k`` pass (no ``p . v``) over the gathered rows, in chunks."""
    T, H, D = q.shape
    K = indices.shape[1]
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    if T == 0:
        return lse
    chunk = max(1, _CHUNK_BYTES // max(1, K * D * 4))
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        idx = indices[s:e].to(torch.int64)
        ok = valid_mask(indices[s:e], lens[s:e])
        rows = kv.index_select(0, torch.where(ok, idx, 0).reshape(-1)).reshape(e - s, K, D).float()
        scores = torch.einsum("thd,tkd->thk", q[s:e].float(), rows) * sm_scale
        lse[s:e] = torch.logsumexp(scores.masked_fill(~ok[:, None, :], float("-inf")), dim=-1)
    return lse


def no_tokens(q: torch.Tensor, d_v: int, return_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference's ``(out, lse)`` for a call with no query token (vendor kernels reject
    an empty batch, so the wrappers never launch one)."""
    T, H, _ = q.shape
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device) if return_lse else None
    return q.new_empty(T, H, d_v), lse


def zero_empty_rows(out: torch.Tensor, lse: torch.Tensor | None, indices: torch.Tensor,
                    lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The pack's convention for a token with no valid index, whatever the vendor wrote
    there: ``out = 0`` and ``lse = -inf``, in place (the wrappers pass the vendor kernel's own
    fresh outputs; elementwise, no host sync; ``lse`` None stays None)."""
    empty = ~valid_mask(indices, lens).any(dim=1)
    out.masked_fill_(empty[:, None, None], 0)
    if lse is not None:
        lse.masked_fill_(empty[:, None], float("-inf"))
    return out, lse


def pad_heads(q: torch.Tensor, sink: torch.Tensor | None, heads: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Zero query heads (and ``-inf`` sinks) appended up to ``heads``: the extra heads attend
    to the same KV and are sliced off after the call (what vLLM does for kernels that only
    come in 64/128-head builds)."""
    T, H, D = q.shape
    if heads == H:
        return q, sink
    qp = q.new_zeros(T, heads, D)
    qp[:, :H] = q
    if sink is not None:
        sp = sink.new_full((heads,), float("-inf"))
        sp[:H] = sink
        sink = sp
    return qp, sink


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple
