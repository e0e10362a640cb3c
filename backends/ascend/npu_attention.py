"""``sparse_mla`` through vllm-ascend's ``torch.ops._C_ascend.npu_sparse_flash_mla``.

Vendor calls (vllm-ascend custom ops; the CANN ops-transformer SparseFlashMla op)::

    metadata = npu_sparse_flash_mla_metadata(num_heads_q, num_heads_kv, head_dim, *, cu_seqlens_q,
        cu_seqlens_ori_kv, ori_topk_length, batch_size, max_seqlen_q, max_seqlen_ori_kv, ori_topk,
        cmp_topk, cmp_ratio, ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right,
        layout_q, layout_kv, has_ori_kv, has_cmp_kv) -> int32 [1024]
    out, lse = npu_sparse_flash_mla(q, *, ori_kv, ori_sparse_indices, ori_topk_length,
        cu_seqlens_q, cu_seqlens_ori_kv, sinks, metadata, softmax_scale, cmp_ratio,
        ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right, layout_q, layout_kv,
        topk_value_mode=1, return_softmax_lse=True)

Why explicit indices: the op's SWA band mask (``ori_mask_mode=4``, ``ori_win_left=W-1``)
computes the causal window itself and has no replay start, so it would read below ``R``.
The wrapper passes the pack's clamped rows instead, in the op's explicit-index SWA mode
(``ori_mask_mode=0``, the mode vllm-ascend uses for DSpark's non-causal drafts), so the clamp
lives entirely in the indices like on every other platform.

Adaptation, exactly the reference semantics:
* TND layout, one batch: ``q [T, H, 512]``, ``ori_kv = kv`` viewed ``[S, 1, 512]``
  (``cu_seqlens_ori_kv = [0, S]``), so an index is a row of ``kv``;
* each row is compacted to "valid entries first, PAD after" on the device and its count
  passed as ``ori_topk_length [T, 1]`` (the op reads ``indices[t, :length]``);
* ``sinks`` is required by the op: without a sink the wrapper passes ``-1e30`` (exp
  underflows to exactly 0 in fp32, no -inf arithmetic in the kernel);
* the op's output has all D = 512 value columns (shared K/V): the first ``d_v`` are returned;
  ``lse`` (``[1, T, H]``, natural log, sink excluded) becomes ``[T, H]``; tokens with
  nothing to read get zeros and ``lse = -inf`` whatever the op wrote;
* ``return_lse`` is passed as the op's ``return_softmax_lse`` (False: ``(out, None)``);
* the op reads bf16/fp16 rows here: the variant reads ``kv_format="rows"`` (the registry
  default); record caches go to the next variant.
"""

from __future__ import annotations

import importlib

import torch

from ..adapters import compact_rows, no_tokens, zero_empty_rows
from .constraints import SERVED
from ...common.registry import import_reason

NO_SINK = -1e30
DTYPES = SERVED.dtypes
CUSTOM_OPS_MODULE = "vllm_ascend.vllm_ascend_C"


def op_namespace():
    """``(namespace, None)`` holding ``npu_sparse_flash_mla`` and its ``_metadata`` builder
    (``torch.ops._C_ascend`` once vllm-ascend's custom-op library is loaded), or ``(None,
    reason)``. A module may carry its namespace as ``__swa_op_namespace__`` (contract
    doubles in tests do)."""
    why = import_reason("torch_npu", what="torch_npu (Ascend PyTorch adapter)")
    if why:
        return None, why
    try:
        mod = importlib.import_module(CUSTOM_OPS_MODULE)
    except Exception as exc:
        return None, f"vllm-ascend custom ops: import {CUSTOM_OPS_MODULE} failed: {type(exc).__name__}: {exc}"
    ns = getattr(mod, "__swa_op_namespace__", None)
    if ns is None:
        ns = getattr(torch.ops, "_C_ascend", None)
    missing = [n for n in ("npu_sparse_flash_mla", "npu_sparse_flash_mla_metadata") if not hasattr(ns, n)]
    if ns is None or missing:
        return None, f"vllm-ascend has no torch.ops._C_ascend.{'/'.join(missing) or 'namespace'} (too old for DeepSeek-V4.1)"
    return ns, None


def input_check(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None,
                return_lse=True) -> list[str]:
    why = []
    if q.shape[2] != SERVED.head_dim:
        why.append(f"npu_sparse_flash_mla needs head dim {SERVED.head_dim}, got {q.shape[2]}")
    heads = SERVED.head_reason(q.shape[1])
    if heads:
        why.append(heads)
    if indices.shape[1] == 0:
        why.append("npu_sparse_flash_mla rejects an empty ori_sparse_indices (index width 0)")
    elif indices.shape[1] > SERVED.window:
        # the op's SWA mode serves a window of SERVED.window (ori_win_left = window - 1); wider rows
        # (a model with another window) are outside what it takes on A2/A3
        why.append(f"npu_sparse_flash_mla's window mode on A2/A3 takes rows of at most W={SERVED.window} "
                   f"(ori_win_left={SERVED.window - 1}), got index width {indices.shape[1]}")
    return why


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None, return_lse=True):
    """The reference's ``(out, lse)`` computed by ``npu_sparse_flash_mla`` (KV rows; ``lse``
    None with ``return_lse=False``)."""
    T, H, D = q.shape
    if T == 0:
        return no_tokens(q, d_v, return_lse)
    ns, why = op_namespace()
    if ns is None:
        raise RuntimeError(why)
    dev = q.device
    S, K = kv.shape[0], indices.shape[1]
    rows, counts = compact_rows(indices, lens)
    ori_indices = rows.unsqueeze(1)  # TND [T, N2 = 1, K]
    topk_length = counts.unsqueeze(1)  # TND [T, N2 = 1]
    two = torch.arange(2, dtype=torch.int32, device=dev)  # built on the device: no host copy
    cu_q, cu_kv = two * T, two * S
    sinks = sink if sink is not None else torch.full((H,), NO_SINK, dtype=torch.float32, device=dev)
    mode = dict(cmp_ratio=0, ori_mask_mode=0, cmp_mask_mode=0, ori_win_left=SERVED.window - 1, ori_win_right=0,
                layout_q="TND", layout_kv="TND")
    metadata = ns.npu_sparse_flash_mla_metadata(
        H, 1, D, cu_seqlens_q=cu_q, cu_seqlens_ori_kv=cu_kv, ori_topk_length=topk_length, batch_size=1,
        max_seqlen_q=T, max_seqlen_ori_kv=S, ori_topk=K, cmp_topk=0, has_ori_kv=True, has_cmp_kv=False, **mode)
    out, lse = ns.npu_sparse_flash_mla(
        q.contiguous(), ori_kv=kv.view(S, 1, D), ori_sparse_indices=ori_indices, ori_topk_length=topk_length,
        cu_seqlens_q=cu_q, cu_seqlens_ori_kv=cu_kv, sinks=sinks.contiguous(), metadata=metadata,
        softmax_scale=float(sm_scale), topk_value_mode=1, return_softmax_lse=bool(return_lse), **mode)
    out, lse = zero_empty_rows(out[..., :d_v], lse.reshape(T, H) if return_lse else None, indices, lens)
    return out.contiguous(), (lse.contiguous() if lse is not None else None)
