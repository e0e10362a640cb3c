"""``sparse_mla`` through AITER's OPUS sparse prefill on gfx950 (large prefill batches).

Vendor call (``aiter/ops/pa_sparse_prefill_opus.py``, the DeepSeek-V4 gfx950 kernel)::

    pa_sparse_prefill_opus(q [T, H, D], unified_kv [total_pages, D], kv_indices_prefix [nnz] int32,
                           kv_indptr_prefix [T+1] int32, kv [total_tokens, D], kv_indices_extend,
                           kv_indptr_extend [T+1], attn_sink [H] fp32, softmax_scale, out=None) -> out

Facts: D = 512 only; q/unified_kv/kv bf16 or fp16 and all the same; ragged (CSR) indices over
two sources sharing one online softmax; every referenced index must be a valid row -- a PAD
(-1) faults the GPU (it did in a real deployment); empty CSR rows are allowed; the sink joins
the softmax denominator; it raises unless the device is gfx950 or gfx1250 (the pack declares gfx950 only: no
gfx1250 row in the matrix); **no LSE is returned**. vLLM
calls it only for prefills of >= 1024 queries (Triton below that).

Adaptation, exactly the reference semantics:
* the pack's ``indices_to_csr`` (its torch reference, on the device, no host sync) turns the
  padded rows into CSR with every PAD and every ``j >= lens`` entry dropped; the unused tail
  of the fixed-size value buffer (PAD there) is set to row 0 so not even a stray read can see
  a -1;
* ``kv`` is the prefix source; the extend source is empty (``indptr`` all 0);
* without a sink the wrapper passes ``-1e30`` per head: ``exp`` underflows to exactly 0 in
  fp32, so it changes nothing and keeps -inf arithmetic out of the kernel;
* ``out`` is the full D = d_v = 512 columns; the LSE is recomputed (an extra q.k pass) only
  with ``return_lse=True`` (the serving path passes False: ``(out, None)``), and tokens with
  nothing to read get zeros and ``lse = -inf``;
* OPUS reads bf16/fp16 rows only (its fp8 sibling has no scales, so no V4 record): the variant
  reads ``kv_format="rows"`` (the registry default), record caches go to the Triton kernel.
"""

from __future__ import annotations

import torch

from ...common.ops.indices_to_csr import reference as indices_to_csr
from ..adapters import lse_from_indices, no_tokens, zero_empty_rows
from .probes import find_opus

HEAD_DIM = 512
MIN_QUERIES = 1024  # vLLM's threshold for the OPUS prefill on gfx950
DTYPES = (torch.bfloat16, torch.float16)
NO_SINK = -1e30


def input_check(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None,
                return_lse=True) -> list[str]:
    why = []
    if q.shape[0] < MIN_QUERIES:
        why.append(f"AITER OPUS prefill is used for >= {MIN_QUERIES} queries (vLLM's threshold), got {q.shape[0]}")
    if q.shape[2] != HEAD_DIM or d_v != HEAD_DIM:
        why.append(f"AITER OPUS prefill needs D = d_v = {HEAD_DIM}, got {q.shape[2]} / {d_v}")
    return why


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None, return_lse=True):
    """The reference's ``(out, lse)`` computed by AITER's ``pa_sparse_prefill_opus`` (KV rows;
    ``lse`` None with ``return_lse=False``)."""
    T, H, D = q.shape
    if T == 0:
        return no_tokens(q, d_v, return_lse)
    fn, why = find_opus()
    if fn is None:
        raise RuntimeError(why)
    indptr, values = indices_to_csr(indices, lens)
    values = torch.clamp_min(values, 0)  # only the unread tail holds PAD; make it a real row anyway
    no_extend = torch.zeros(T + 1, dtype=torch.int32, device=q.device)
    sinks = sink if sink is not None else torch.full((H,), NO_SINK, dtype=torch.float32, device=q.device)
    out = fn(q.contiguous(), kv, values, indptr, kv, values[:1], no_extend, sinks.contiguous(), float(sm_scale))
    lse = lse_from_indices(q, kv, indices, lens, sm_scale) if return_lse else None
    out, lse = zero_empty_rows(out[..., :d_v], lse, indices, lens)
    return out.contiguous(), lse
