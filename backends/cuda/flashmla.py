"""``sparse_mla`` through vLLM's bundled FlashMLA sparse prefill (SM90 / SM100 family).

Vendor call (vLLM ``vllm/third_party/flashmla/flash_mla_interface.py``, the FlashMLA build
with DeepSeek-V4 features)::

    flash_mla_sparse_fwd(q [s_q, h_q, d_qk] bf16, kv [s_kv, h_kv=1, d_qk] bf16,
                         indices [s_q, h_kv=1, topk] int32, sm_scale, d_v=512,
                         attn_sink [h_q] fp32 | None, topk_length [s_q] int32 | None)
        -> (out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32)

Facts the wrapper relies on (FlashMLA ``csrc/api/sparse_prefill.cpp`` and ``tests/ref.py``):
``d_qk`` in {512, 576}, ``d_v`` = 512, ``h_q`` in {64, 128}, bf16 only; an index is invalid
when -1 or >= s_kv, and entries at ``j >= topk_length[i]`` are ignored; ``topk`` must be a
multiple of the kernel's B_TOPK (64 for h_q 64, 128 for h_q 128 on SM100); the sink scales
the output by ``exp(lse) / (exp(lse) + exp(sink))`` and does not enter ``lse``; ``lse`` is
the natural-log log-sum-exp, **+inf** for a query with no valid index (output zeros).

Adaptation, exactly the reference semantics:
* kv ``[S, D]`` -> ``[S, 1, D]`` and indices ``[T, K]`` -> ``[T, 1, K']`` (views), with
  ``K' = round_up(K, 128)`` (-1 PAD appended when needed: the combined layout is already a
  multiple of 128, so it passes without a copy); ``lens`` is passed as ``topk_length``;
* fewer than 64 (or 128) heads are zero-padded to 64 (128) and sliced off after;
* ``lse``: FlashMLA's +inf for an empty row becomes the pack's -inf (output forced to 0).
"""

from __future__ import annotations

import torch

from ..adapters import no_tokens, pad_heads, round_up, zero_empty_rows
from ...common.types import PAD
from .probes import find_flashmla

HEADS = (64, 128)
D_QK = (512, 576)
D_V = 512
WIDTH_MULTIPLE = 128  # covers B_TOPK of both head counts on SM90 and SM100
DTYPES = (torch.bfloat16,)


def input_check(q, kv, indices, lens, sm_scale, d_v, *, sink=None) -> list[str]:
    """Per-call reasons this kernel cannot take the call (dispatch falls through)."""
    why = []
    if q.shape[2] not in D_QK:
        why.append(f"FlashMLA sparse prefill needs D_qk in {D_QK}, got {q.shape[2]}")
    if d_v != D_V:
        why.append(f"FlashMLA sparse prefill needs d_v={D_V}, got {d_v}")
    if q.shape[1] > max(HEADS):
        why.append(f"FlashMLA sparse prefill serves at most {max(HEADS)} heads (padded to 64/128), got {q.shape[1]}")
    return why


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None):
    """The reference's ``(out, lse)`` computed by FlashMLA's sparse prefill kernel."""
    T, H, D = q.shape
    if T == 0:
        return no_tokens(q, d_v)
    mod, why = find_flashmla()
    if mod is None:
        raise RuntimeError(why)
    heads = next(h for h in HEADS if H <= h)
    qp, sp = pad_heads(q, sink, heads)
    K = indices.shape[1]
    width = max(WIDTH_MULTIPLE, round_up(K, WIDTH_MULTIPLE))
    idx = indices if width == K else torch.nn.functional.pad(indices, (0, width - K), value=PAD)
    out, _max_logits, lse = mod.flash_mla_sparse_fwd(
        qp, kv.unsqueeze(1), idx.unsqueeze(1), float(sm_scale), d_v, attn_sink=sp,
        topk_length=lens.contiguous())
    out, lse = out[:, :H], lse[:, :H]
    out, lse = zero_empty_rows(out, lse, indices, lens)
    return out.contiguous(), lse.contiguous()
