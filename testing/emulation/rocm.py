"""Contract doubles for the ROCm vendor op, and ``contract_doubles()`` to install them.

``with contract_doubles(): ...`` makes ``aiter`` / ``aiter.ops`` /
``aiter.ops.pa_sparse_prefill_opus`` importable as a small torch module with AITER's
signature, checks and semantics, and marks the ``amd_aiter_opus`` probe available. Pass
``device="rocm:gfx950"`` (or gfx942) to pin the emulated arch; without it the double uses
:func:`swa_backends.current_device` when that is a ROCm device (else it skips the arch check).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
from collections.abc import Iterator

import torch

from ..doubles import EmulatedDevice, fake_module, installed_modules, probe_overrides

_emulated = EmulatedDevice("rocm", None)


def _rows(source, indptr, indices, T, name):
    """Gathered rows + validity for one CSR source; a bad index raises like the GPU fault."""
    if indptr.dtype != torch.int32 or tuple(indptr.shape) != (T + 1,):
        raise RuntimeError(f"kv_indptr_{name} must be int32 [T + 1], got {indptr.dtype} {tuple(indptr.shape)}")
    if indices.dtype != torch.int32 or indices.dim() != 1:
        raise RuntimeError(f"kv_indices_{name} must be a 1-D int32 tensor")
    ptr = indptr.to(torch.int64)
    counts = ptr[1:] - ptr[:-1]
    if T and (int(ptr[0]) != 0 or bool((counts < 0).any()) or int(ptr[-1]) > indices.shape[0]):
        raise RuntimeError(f"kv_indptr_{name} is not a CSR row pointer into kv_indices_{name}")
    K = int(counts.max()) if T else 0
    j = torch.arange(K)
    pos = ptr[:-1, None] + j[None, :]
    valid = j[None, :] < counts[:, None]
    idx = indices.to(torch.int64)[torch.where(valid, pos, 0).clamp(max=max(indices.shape[0] - 1, 0))] \
        if indices.shape[0] else torch.zeros(T, K, dtype=torch.int64)
    bad = valid & ((idx < 0) | (idx >= source.shape[0]))
    if bool(bad.any()):
        t, k = (int(v) for v in torch.nonzero(bad)[0])
        raise RuntimeError(f"HIP error: an illegal memory access was encountered (emulated: kv_indices_{name} "
                           f"row {t} entry {k} = {int(idx[t, k])}, outside [0, {source.shape[0]}))")
    rows = source[torch.where(valid, idx, 0).clamp(max=max(source.shape[0] - 1, 0))] if source.shape[0] else \
        source.new_zeros(T, K, source.shape[1])
    return rows, valid


def pa_sparse_prefill_opus(q, unified_kv, kv_indices_prefix, kv_indptr_prefix, kv, kv_indices_extend,
                           kv_indptr_extend, attn_sink, softmax_scale, out=None):
    """Double of ``aiter.ops.pa_sparse_prefill_opus.pa_sparse_prefill_opus`` (AITER's OPUS
    sparse prefill for DeepSeek-V4 on gfx950, the module whose docstring states D = 512,
    bf16/fp16, valid-row-only CSR indices, empty rows allowed).

    Checks (RuntimeError, like AITER): device arch gfx950 or gfx1250 (the archs AITER builds it for;
    "requires gfx950 or gfx1250, got <arch>");
    q bf16/fp16; unified_kv and kv of q's dtype; equal head dims; D == 512; attn_sink fp32
    [H]; ``out`` of q's shape/dtype; int32 CSR pointers; **any referenced index outside its
    source (a PAD -1 included) raises like the GPU memory fault it causes**. Semantics: one
    softmax (scale ``softmax_scale``) over the prefix rows ``unified_kv[...]`` and the extend
    rows ``kv[...]`` of each query, sink in the denominator:
    ``out = sum exp(s) v / (sum exp(s) + exp(sink))`` (an empty row with sink -inf gives 0/0,
    as the math does; the kernel's behaviour there is undocumented). No LSE.
    """
    arch = _emulated.arch
    if arch is not None and arch not in ("gfx950", "gfx1250"):
        raise RuntimeError(f"pa_sparse_prefill_opus requires gfx950 or gfx1250, got {arch}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise RuntimeError(f"pa_sparse_prefill_opus expects fp16/bf16 q, got {q.dtype}")
    if unified_kv.dtype != q.dtype:
        raise RuntimeError(f"unified_kv dtype mismatch: unified_kv={unified_kv.dtype}, q={q.dtype}")
    if kv.dtype != q.dtype:
        raise RuntimeError(f"kv dtype mismatch: kv={kv.dtype}, q={q.dtype}")
    if unified_kv.size(-1) != kv.size(-1):
        raise RuntimeError(f"head_dim mismatch: unified_kv={unified_kv.size(-1)}, kv={kv.size(-1)}")
    T, H, D = q.shape
    if D != 512:
        raise RuntimeError(f"pa_sparse_prefill_opus only compiles D == 512, got {D}")
    if attn_sink.dtype != torch.float32 or tuple(attn_sink.shape) != (H,):
        raise RuntimeError("attn_sink must be fp32 [H]")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype:
        raise RuntimeError(f"out shape/dtype mismatch: got shape={tuple(out.shape)} dtype={out.dtype}, "
                           f"expected shape={tuple(q.shape)} dtype={q.dtype}")
    r1, v1 = _rows(unified_kv, kv_indptr_prefix, kv_indices_prefix, T, "prefix")
    r2, v2 = _rows(kv, kv_indptr_extend, kv_indices_extend, T, "extend")
    rows, valid = torch.cat([r1, r2], dim=1).float(), torch.cat([v1, v2], dim=1)
    s = torch.einsum("thd,tkd->thk", q.float(), rows) * float(softmax_scale)
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    m = torch.maximum(s.max(dim=-1).values if s.shape[-1] else torch.full((T, H), float("-inf")),
                      attn_sink[None, :].float())
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m[..., None])
    denom = p.sum(-1) + torch.exp(attn_sink[None, :].float() - m)
    out.copy_((torch.einsum("thk,tkd->thd", p, rows) / denom[..., None]).to(q.dtype))
    return out


def _modules() -> dict:
    def mod(name, **attrs):
        m = fake_module(name, **attrs)
        m.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=not name.endswith("opus"))
        return m

    return {
        "aiter": mod("aiter"),
        "aiter.ops": mod("aiter.ops"),
        "aiter.ops.pa_sparse_prefill_opus": mod("aiter.ops.pa_sparse_prefill_opus",
                                                pa_sparse_prefill_opus=pa_sparse_prefill_opus),
    }


@contextlib.contextmanager
def contract_doubles(device=None) -> Iterator[None]:
    """Install the ROCm contract double (AITER OPUS sparse prefill) and mark its probe
    available. ``device``: the emulated ROCm device or None (:func:`current_device`)."""
    global _emulated
    saved = _emulated
    _emulated = EmulatedDevice("rocm", device)
    try:
        with installed_modules(_modules()), probe_overrides({"amd_aiter_opus": None, "triton": None}):
            yield
    finally:
        _emulated = saved
