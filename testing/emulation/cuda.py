"""Contract doubles for the CUDA vendor ops, and ``contract_doubles()`` to install them.

``with contract_doubles(): ...`` makes ``vllm.third_party.flashmla.flash_mla_interface`` and
``flashinfer.mla`` importable as small torch modules with the vendors' signatures, checks and
semantics, and marks the ``vllm_flashmla`` / ``flashinfer_dsv4`` / ``flashinfer_dsv4_sm12x``
probes available, so the CUDA wrappers run on a CPU exactly as they would call the vendors.
Pass ``device="cuda:sm100"`` to pin the emulated arch (arch-specific failure modes); without
it the doubles use :func:`swa_backends.current_device` when that is a CUDA device.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
from collections.abc import Iterator

import torch

from ..doubles import EmulatedDevice, fake_module, installed_modules, probe_overrides

_emulated = EmulatedDevice("cuda", None)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise RuntimeError(msg)


def _sparse_softmax(q, rows, valid, sm_scale, sink):
    """fp32 scores over ``rows [T, K, D]`` with ``valid [T, K]``: ``(out_fp32, lse, max)``
    where ``out = sum exp(s) v / (sum exp(s) + exp(sink))`` and ``lse`` excludes the sink."""
    scores = torch.einsum("thd,tkd->thk", q.float(), rows.float()) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    mx = scores.max(dim=-1).values if scores.shape[-1] else lse.clone()
    denom = lse if sink is None else torch.logaddexp(lse, sink[None, :].float())
    p = torch.exp(scores - torch.where(torch.isfinite(denom), denom, 0.0)[..., None]).masked_fill(~valid[:, None, :], 0)
    return p, lse, mx


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, out=None):
    """Double of ``flash_mla_sparse_fwd`` as bundled in vLLM 0.33 (vllm/third_party/flashmla,
    FlashMLA with DeepSeek-V4 features: vllm-project/FlashMLA ``csrc/api/sparse_prefill.cpp``
    and ``tests/ref.py``; the interface's docstring for the head counts).

    Checks (RuntimeError like TORCH_CHECK): SM90a or SM100f; q/kv/indices 3-D; d_qk in
    {512, 576}; d_v == 512; bf16 q/kv, int32 indices/topk_length, fp32 sink; shapes
    ``kv [s_kv, h_kv, d_qk]``, ``indices [s_q, h_kv, topk]``; h_q in {8, 16, 32, 64, 128}
    on SM90, {64, 128} on SM100; on SM100
    ``topk % B_TOPK == 0`` (64 for h_q 64, 128 for h_q 128), on SM90 ``topk % 64 == 0``.
    Semantics: an index is invalid when < 0 or >= s_kv, or at ``j >= topk_length[i]``;
    ``lse`` natural log, sink excluded, **+inf** for a query with nothing valid (output 0);
    ``max_logits`` -inf there. Returns ``(out bf16, max_logits fp32, lse fp32)``.
    """
    given = out
    arch = _emulated.arch
    _check(arch in (None, "sm90", "sm100", "sm103"),
           "Sparse Attention Forward Kernel is only supported on SM90a and SM100f architectures.")
    _check(q.dim() == 3 and kv.dim() == 3 and indices.dim() == 3, "q, kv and indices must be 3-D")
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv, _ = kv.shape
    topk = indices.shape[2]
    _check(d_qk in (512, 576), f"Invalid d_qk: {d_qk}")
    _check(d_v == 512, f"Invalid d_v{d_v}")
    _check(q.dtype == torch.bfloat16 and kv.dtype == torch.bfloat16, "q and kv must be bfloat16")
    _check(indices.dtype == torch.int32, "indices must be int32")
    _check(tuple(kv.shape) == (s_kv, h_kv, d_qk) and tuple(indices.shape) == (s_q, h_kv, topk), "shape mismatch")
    _check(h_kv == 1, "h_kv must be 1")
    if attn_sink is not None:
        _check(attn_sink.dtype == torch.float32 and tuple(attn_sink.shape) == (h_q,), "attn_sink must be fp32 [h_q]")
    if topk_length is not None:
        _check(topk_length.dtype == torch.int32 and tuple(topk_length.shape) == (s_q,), "topk_length must be int32 [s_q]")
    _check(h_q in ((8, 16, 32, 64, 128) if arch in (None, "sm90") else (64, 128)), f"Unsupported h_q: {h_q}")
    b_topk = 64 if (arch == "sm90" or h_q == 64) else 128
    _check(topk > 0 and topk % b_topk == 0, f"topk ({topk}) mod B_TOPK ({b_topk}) must be 0")
    idx = indices[:, 0, :].to(torch.int64)
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk)[None, :].to(idx.device) < topk_length[:, None].to(torch.int64)
    rows = kv[:, 0, :].index_select(0, torch.where(valid, idx, 0).reshape(-1)).reshape(s_q, topk, d_qk)
    p, lse, mx = _sparse_softmax(q, rows, valid, sm_scale, attn_sink)
    out = torch.einsum("thk,tkd->thd", p, rows[..., :d_v].float()).to(torch.bfloat16)
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    if given is not None:
        out = given.copy_(out)
    return out, mx, lse


def trtllm_batch_decode_sparse_mla_dsv4(query, swa_kv_cache, workspace_buffer, sparse_indices,
                                        compressed_kv_cache=None, sparse_topk_lens=None, seq_lens=None, out=None,
                                        bmm1_scale=1.0, bmm2_scale=1.0, sinks=None, kv_layout="HND",
                                        cum_seq_lens_q=None, max_q_len=None, enable_pdl=None, swa_topk_lens=None,
                                        extra_sparse_indices=None, extra_sparse_topk_lens=None):
    """Double of ``flashinfer.mla.trtllm_batch_decode_sparse_mla_dsv4`` (flashinfer-python
    with the SM120/SM121 sparse path, i.e. the signature with ``swa_topk_lens``; FlashInfer's
    ``_check_dsv4_sparse_mla_inputs`` and ``_trtllm_batch_decode_sparse_mla_dsv4_sm120``).

    Dispatch by arch: SM10x -> TRTLLM-GEN, SM12x -> sparse backend, anything else raises
    (ValueError, like ``_resolve_dsv4_sparse_mla_backend``). Checks: bf16 query (fp8 e4m3
    also on SM10x), head dim 512, heads in {8, 16, 32, 64, 128}, int32 indices, KV pools of
    the query dtype with head dim 512 and one KV head; SM10x: ``[sum_q, cap]`` indices with
    ``cap >= 128`` and ``cap % 4 == 0``, ``sparse_topk_lens`` in [128, cap], ``seq_lens [B]``,
    varlen query needs ``cum_seq_lens_q`` and ``max_q_len``, SM12x-only arguments rejected;
    SM12x: ``swa_topk_lens`` required, ``bmm2_scale == 1``. Semantics: softmax over the valid
    entries (PAD skipped, ``j`` below the active length; on SM10x the window tile also below
    ``min(seq_lens[b] - q_len[b] + q_idx + 1, 128)``) with the sink in the denominator;
    ``bmm1_scale`` is the softmax scale; output bf16, zeros for a token with nothing valid.
    """
    arch = _emulated.arch
    if arch is None:
        arch = "sm120" if swa_topk_lens is not None else "sm100"
    major = int(arch[2:-1])
    if major not in (10, 12):
        raise ValueError("trtllm_batch_decode_sparse_mla_dsv4 supports SM100/SM103 via TRTLLM-GEN or SM120/SM121 "
                         f"via sparse backend, got SM{arch[2:]}")
    if query.dtype not in ((torch.bfloat16, torch.float8_e4m3fn) if major == 10 else (torch.bfloat16,)):
        raise ValueError(f"DeepSeek V4 sparse MLA only supports BF16 (or FP8 E4M3 on SM10x) query, got {query.dtype}")
    num_heads, head_dim = query.shape[-2:]
    if head_dim != 512:
        raise ValueError(f"Expected query head dim 512, got {head_dim}")
    if num_heads not in (8, 16, 32, 64, 128):
        raise ValueError(f"Expected 8, 16, 32, 64, or 128 query heads, got {num_heads}")
    if sinks is not None and (sinks.dtype != torch.float32 or tuple(sinks.shape) != (num_heads,)):
        raise ValueError("sinks must be float32 [num_heads]")

    def pool(cache, name):
        if cache.dim() == 3:
            cache = cache.unsqueeze(1) if kv_layout == "HND" else cache.unsqueeze(2)
        if kv_layout == "HND":
            if cache.shape[1] != 1:
                raise ValueError(f"Expected {name}.shape[1] == 1, got {cache.shape[1]}")
            cache = cache.transpose(1, 2)
        elif cache.shape[2] != 1:
            raise ValueError(f"Expected {name}.shape[2] == 1, got {cache.shape[2]}")
        if cache.dtype != query.dtype or cache.shape[-1] != 512:
            raise ValueError(f"{name} must have the query dtype and head dim 512")
        return cache.reshape(-1, 512)  # token-major: flat index = page * page_size + offset

    q = query if query.dim() == 3 else query.reshape(-1, num_heads, head_dim)
    T = q.shape[0]
    if major == 10:
        if swa_topk_lens is not None or extra_sparse_indices is not None or extra_sparse_topk_lens is not None:
            raise ValueError("swa_topk_lens, extra_sparse_indices, and extra_sparse_topk_lens are only supported on SM120/SM121")
        if sparse_topk_lens is None or compressed_kv_cache is None or seq_lens is None:
            raise ValueError("backend='trtllm-gen' requires compressed_kv_cache, sparse_topk_lens, and seq_lens")
        if query.dim() == 3 and (cum_seq_lens_q is None or max_q_len is None):
            raise ValueError("max_q_len is required when cum_seq_lens_q is provided")
        if sparse_indices.dtype != torch.int32 or sparse_indices.dim() != 2 or sparse_indices.shape[0] != T:
            raise ValueError(f"Expected flattened int32 sparse_indices [{T}, cap], got {tuple(sparse_indices.shape)}")
        cap = sparse_indices.shape[1]
        if cap < 128:
            raise ValueError(f"sparse_indices must include the fixed 128 SWA entries, got {cap}")
        if cap % 4:
            raise ValueError(f"sparse_indices last dimension must be a multiple of 4, got {cap}")
        if sparse_topk_lens.dtype != torch.int32 or tuple(sparse_topk_lens.shape) != (T,):
            raise ValueError("sparse_topk_lens must be int32 [sum_q]")
        if bool(((sparse_topk_lens < 128) | (sparse_topk_lens > cap)).any()):
            raise ValueError("sparse_topk_lens values must include the fixed 128 SWA entries and not exceed capacity")
        cu = cum_seq_lens_q.to(torch.int64) if cum_seq_lens_q is not None else None
        B = cu.numel() - 1 if cu is not None else query.shape[0]
        if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (B,):
            raise ValueError(f"seq_lens must be int32 [{B}]")
        q_lens = (cu[1:] - cu[:-1]) if cu is not None else torch.full((B,), query.shape[1], dtype=torch.int64)
        starts = cu[:-1] if cu is not None else torch.arange(B) * query.shape[1]
        req = torch.repeat_interleave(torch.arange(B), q_lens)
        q_idx = torch.arange(T) - starts[req]
        tile0 = torch.clamp(seq_lens.to(torch.int64)[req] - q_lens[req] + q_idx + 1, max=128)
        j = torch.arange(cap)[None, :]
        swa_pool, cmp_pool = pool(swa_kv_cache, "swa_kv_cache"), pool(compressed_kv_cache, "compressed_kv_cache")
        idx = sparse_indices.to(torch.int64)
        valid = (idx >= 0) & (j < sparse_topk_lens[:, None].to(torch.int64)) & ((j >= 128) | (j < tile0[:, None]))
        safe = torch.where(valid, idx, 0)
        rows = torch.where((j < 128)[..., None], swa_pool[safe.clamp(max=swa_pool.shape[0] - 1)],
                           cmp_pool[safe.clamp(max=cmp_pool.shape[0] - 1)])
    else:
        if bmm2_scale != 1.0:
            raise ValueError("SM120 DSv4 sparse MLA does not support bmm2_scale")
        if swa_topk_lens is None:
            raise ValueError("backend='sparse' requires swa_topk_lens")
        if (extra_sparse_indices is None) != (extra_sparse_topk_lens is None):
            raise ValueError("extra_sparse_indices and extra_sparse_topk_lens must be provided together for backend='sparse'")
        segs = [(sparse_indices.reshape(T, -1), swa_topk_lens, pool(swa_kv_cache, "swa_kv_cache"))]
        if extra_sparse_indices is not None:
            if compressed_kv_cache is None:
                raise ValueError("compressed_kv_cache is required when extra_sparse_indices is provided")
            segs.append((extra_sparse_indices.reshape(T, -1), extra_sparse_topk_lens,
                         pool(compressed_kv_cache, "compressed_kv_cache")))
        rows_l, valid_l = [], []
        for idx, lens, cache in segs:
            idx = idx.to(torch.int64)
            ok = (idx >= 0) & (torch.arange(idx.shape[1])[None, :] < lens[:, None].to(torch.int64))
            rows_l.append(cache[torch.where(ok, idx, 0)])
            valid_l.append(ok)
        rows, valid = torch.cat(rows_l, dim=1), torch.cat(valid_l, dim=1)
    p, _lse, _ = _sparse_softmax(q, rows, valid, float(bmm1_scale), sinks)
    res = torch.einsum("thk,tkd->thd", p, rows.float()) * float(bmm2_scale)
    res = res.to(torch.bfloat16).reshape(*query.shape[:-1], 512)
    if out is not None:
        out.copy_(res)
        return out
    return res


def _modules() -> dict:
    def mod(name, **attrs):
        m = fake_module(name, **attrs)
        m.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
        return m

    return {
        "vllm": mod("vllm"),
        "vllm.third_party": mod("vllm.third_party"),
        "vllm.third_party.flashmla": mod("vllm.third_party.flashmla"),
        "vllm.third_party.flashmla.flash_mla_interface": mod(
            "vllm.third_party.flashmla.flash_mla_interface", flash_mla_sparse_fwd=flash_mla_sparse_fwd),
        "flashinfer": mod("flashinfer"),
        "flashinfer.mla": mod("flashinfer.mla", trtllm_batch_decode_sparse_mla_dsv4=trtllm_batch_decode_sparse_mla_dsv4),
    }


@contextlib.contextmanager
def contract_doubles(device=None) -> Iterator[None]:
    """Install the CUDA contract doubles (FlashMLA sparse prefill, FlashInfer DSv4 decode)
    and mark their probes available for the block. ``device``: the emulated CUDA device
    (``"cuda:sm100"``, a DeviceInfo) or None (:func:`current_device` when it is CUDA)."""
    global _emulated
    saved = _emulated
    _emulated = EmulatedDevice("cuda", device)
    try:
        # Triton (and its Gluon dialect) as a CUDA deployment has them: the emulated chain must not
        # depend on what this machine happens to have installed
        with installed_modules(_modules()), probe_overrides(
                {"vllm_flashmla": None, "flashinfer_dsv4": None, "flashinfer_dsv4_sm12x": None, "triton": None,
                 "gluon": None, "gluon_ws": None}):
            yield
    finally:
        _emulated = saved
