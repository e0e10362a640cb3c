"""Contract doubles for the Ascend vendor ops, and ``contract_doubles()`` to install them.

``with contract_doubles(): ...`` makes ``torch_npu`` (one NPU: ``torch_npu.npu.get_soc_version``,
``is_available``, ``device_count``, ``current_device``) and ``vllm_ascend.vllm_ascend_C`` (the
``npu_sparse_flash_mla`` op and its metadata builder) importable as small torch modules with the
vendors' signatures, checks and semantics, and marks the Ascend probes (the sparse-attention op
and triton-ascend) available. Pass ``device="ascend:910b"`` to pin the emulated SoC; without it
the doubles use :func:`swa_backends.current_device` when that is an Ascend device, else an
Ascend 910B.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
from collections.abc import Iterator

import torch

from ..doubles import EmulatedDevice, fake_module, installed_modules, probe_overrides
from ...backends.ascend.constraints import CONSTRAINTS

_emulated = EmulatedDevice("ascend", None)
SOC_VERSIONS = {"910b": 223, "910_93": 251, "950": 260, "310p": 202}
_LAYOUTS = {"BSND": 0, "TND": 1, "PA_BBND": 2}
_META_FIELDS = ("num_heads_q", "num_heads_kv", "head_dim", "batch_size", "max_seqlen_q", "max_seqlen_ori_kv",
                "ori_topk", "cmp_topk", "cmp_ratio", "ori_mask_mode", "cmp_mask_mode", "ori_win_left",
                "ori_win_right", "layout_q", "layout_kv", "has_ori_kv", "has_cmp_kv")


def _soc() -> str:
    return _emulated.arch or "910b"


def get_soc_version() -> int:
    """Double of ``torch_npu.npu.get_soc_version()``: 220-225 A2 (910B), 250-255 A3 (910_93),
    200-205 310P, 260 A5 (950); the emulated SoC's number."""
    return SOC_VERSIONS[_soc()]


def _fail(msg: str):
    raise RuntimeError(f"SparseFlashMla: {msg}")


def npu_sparse_flash_mla_metadata(num_heads_q, num_heads_kv, head_dim, *, cu_seqlens_q=None, cu_seqlens_ori_kv=None,
                                  cu_seqlens_cmp_kv=None, seqused_q=None, seqused_ori_kv=None, seqused_cmp_kv=None,
                                  cmp_residual_kv=None, ori_topk_length=None, cmp_topk_length=None, batch_size=0,
                                  max_seqlen_q=0, max_seqlen_ori_kv=0, max_seqlen_cmp_kv=0, ori_topk=0, cmp_topk=0,
                                  cmp_ratio=1, ori_mask_mode=0, cmp_mask_mode=0, ori_win_left=-1, ori_win_right=-1,
                                  layout_q="BSND", layout_kv="BSND", has_ori_kv=True, has_cmp_kv=True):
    """Double of ``npu_sparse_flash_mla_metadata`` (CANN ops-transformer ``sparse_flash_mla``
    interface document, as in vllm-ascend): the ``int32 [1024]`` task split. The double
    records the split parameters in it so the main op can reject a metadata built from
    different parameters (undefined behaviour on the device). Checks: ``num_heads_kv == 1``,
    ``head_dim == 512``, heads in [1, 128]; TND needs ``max_seqlen_q > 0``."""
    if num_heads_kv != 1:
        _fail(f"num_heads_kv only supports 1, got {num_heads_kv}")
    if head_dim != 512:
        _fail(f"head_dim only supports 512, got {head_dim}")
    if not 1 <= num_heads_q <= 128:
        _fail(f"num_heads_q should be in [1, 128], got {num_heads_q}")
    if layout_q == "TND" and max_seqlen_q <= 0:
        _fail("max_seqlen_q must be > 0 when layout_q is TND")
    values = dict(num_heads_q=num_heads_q, num_heads_kv=num_heads_kv, head_dim=head_dim, batch_size=batch_size,
                  max_seqlen_q=max_seqlen_q, max_seqlen_ori_kv=max_seqlen_ori_kv, ori_topk=ori_topk, cmp_topk=cmp_topk,
                  cmp_ratio=cmp_ratio, ori_mask_mode=ori_mask_mode, cmp_mask_mode=cmp_mask_mode,
                  ori_win_left=ori_win_left, ori_win_right=ori_win_right, layout_q=_LAYOUTS[layout_q],
                  layout_kv=_LAYOUTS[layout_kv], has_ori_kv=int(has_ori_kv), has_cmp_kv=int(has_cmp_kv))
    meta = torch.zeros(1024, dtype=torch.int32)
    meta[: len(_META_FIELDS)] = torch.tensor([int(values[f]) for f in _META_FIELDS], dtype=torch.int32)
    return meta


def npu_sparse_flash_mla(q, *, ori_kv=None, cmp_kv=None, ori_sparse_indices=None, cmp_sparse_indices=None,
                         ori_block_table=None, cmp_block_table=None, cu_seqlens_q=None, cu_seqlens_ori_kv=None,
                         cu_seqlens_cmp_kv=None, seqused_q=None, seqused_ori_kv=None, seqused_cmp_kv=None,
                         cmp_residual_kv=None, ori_topk_length=None, cmp_topk_length=None, sinks=None, metadata=None,
                         softmax_scale=1.0, cmp_ratio=1, ori_mask_mode=4, cmp_mask_mode=3, ori_win_left=-1,
                         ori_win_right=-1, layout_q="BSND", layout_kv="BSND", topk_value_mode=1,
                         return_softmax_lse=False):
    """Double of ``torch.ops._C_ascend.npu_sparse_flash_mla`` (vllm-ascend's SparseFlashMla:
    the ops-transformer tiling with the DSpark "ori sparse" SWA mode, and the
    ``sparse_flash_mla`` interface document), for the SWA modes (no ``cmp_kv``) with TND
    layouts -- the modes the pack uses and the band mode it avoids.

    Checks (RuntimeError like a tiling failure): SoC A2/A3/A5; q TND ``[T, N1, 512]``
    bf16/fp16; N1 a power of two <= 128 on A2/A3 (1..128 on A5); ``ori_kv`` required, of q's
    dtype, TND ``[S, 1, 512]`` with ``cu_seqlens_ori_kv``; ``cu_seqlens_q`` required for TND q;
    ``sinks`` fp32 ``[N1]`` and ``metadata`` int32 ``[1024]`` required, the metadata built from
    the same parameters; SWA mode needs ``cmp_ratio == 0`` on A2/A3; with ``ori_sparse_indices``:
    on A2/A3 only in SWA mode with ``ori_mask_mode == 0`` and non-negative window bounds,
    ``ori_topk_length`` required ``[T, 1]``, indices ``[T, 1, K]`` int32 with K > 0; without
    them on A2/A3: ``ori_mask_mode == 4``, ``ori_win_left == 127``, ``ori_win_right == 0``;
    ``topk_value_mode == 1``. Semantics: explicit mode attends to ``indices[t, :length[t]]``
    (-1 skipped; an index outside the batch's KV raises), band mode to the positions
    ``[p - ori_win_left, p + ori_win_right]`` of the batch's KV with ``p = kv_len - q_len + i``
    (no replay start); sink in the denominator; ``lse`` natural log without the sink, shape
    ``[1, T, N1]`` (a ``[1]`` zero tensor when not requested); output of q's shape and dtype.
    """
    soc = _soc()
    if soc not in CONSTRAINTS:
        _fail(f"SOC Version[{SOC_VERSIONS.get(soc, soc)}] is not support.")
    c = CONSTRAINTS[soc]
    a2a3 = soc != "950"
    if layout_q != "TND" or layout_kv != "TND":
        _fail("this double emulates the TND/TND layouts only")
    if q.dim() != 3 or q.dtype not in c.dtypes:
        _fail(f"q must be TND [T, N1, D] of {c.dtypes}, got {q.dtype} {tuple(q.shape)}")
    T, N1, D = q.shape
    if T == 0:
        _fail("T_size of q should be greater than 0, but got 0")
    if D != c.head_dim:
        _fail(f"The head dim of q only support {c.head_dim}, but got {D}")
    why = c.head_reason(N1)
    if why:
        _fail(why)
    if ori_kv is None:
        _fail("ori_kv is nullptr")
    if ori_kv.dtype != q.dtype:
        _fail("The dtype of q and ori_kv must be same")
    if ori_kv.dim() != 3 or ori_kv.shape[1] != 1 or ori_kv.shape[2] != D:
        _fail(f"TND ori_kv must be [S, 1, {D}], got {tuple(ori_kv.shape)}")
    if cu_seqlens_q is None or cu_seqlens_ori_kv is None:
        _fail("TND layouts need cu_seqlens_q and cu_seqlens_ori_kv")
    B = cu_seqlens_q.numel() - 1
    if cu_seqlens_ori_kv.numel() != B + 1:
        _fail("cu_seqlens_ori_kv must have B + 1 entries")
    if sinks is None or sinks.dtype != torch.float32 or tuple(sinks.shape) != (N1,):
        _fail("sinks must be provided as fp32 [N1]")
    if metadata is None or metadata.dtype != torch.int32 or metadata.numel() != 1024:
        _fail("metadata must be provided (int32 [1024] from npu_sparse_flash_mla_metadata)")
    if topk_value_mode != 1:
        _fail("Topk_value_mode should be 1")
    if cmp_kv is not None or cmp_sparse_indices is not None:
        _fail("this double emulates the SWA modes only (cmp_kv is None)")
    if a2a3 and cmp_ratio != 0:
        _fail(f"cmpRatio should be 0 in SWA when cmp_kv is not provided, but got {cmp_ratio}")
    explicit = ori_sparse_indices is not None
    if explicit:
        if not c.explicit_window_indices:
            _fail(f"ori_sparse_indices is only supported on A5 (SoC {soc})")
        if a2a3 and ori_mask_mode != 0:
            _fail("ori_sparse_indices SWA (DSpark) requires oriMaskMode 0.")
        if a2a3 and (ori_win_left < 0 or ori_win_right < 0):
            _fail("ori_win_left/right should be non-negative for ori sparse SWA")
        if ori_sparse_indices.dtype != torch.int32 or ori_sparse_indices.dim() != 3 or \
                ori_sparse_indices.shape[:2] != (T, 1) or ori_sparse_indices.shape[2] == 0:
            _fail(f"ori_sparse_indices must be int32 [T, 1, K>0], got {tuple(ori_sparse_indices.shape)}")
        if ori_topk_length is None:
            _fail("Ori_topk_length is required for SWA ori sparse")
        if ori_topk_length.dtype != torch.int32 or tuple(ori_topk_length.shape) != (T, 1):
            _fail("TND ori_topk_length shape must be [T, N2] int32")
    else:
        if ori_topk_length is not None:
            _fail("Ori_topk_length requires ori_sparse_indices")
        if a2a3 and (ori_mask_mode != 4 or ori_win_left != 127 or ori_win_right != 0):
            _fail("oriMaskMode should be 4, ori_win_left 127 and ori_win_right 0 when ori_sparse_indices is empty")
    got = dict(zip(_META_FIELDS, (int(v) for v in metadata[: len(_META_FIELDS)])))
    want = dict(num_heads_q=N1, num_heads_kv=1, head_dim=D, batch_size=B, max_seqlen_q=int(
        (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()), max_seqlen_ori_kv=int((cu_seqlens_ori_kv[1:] - cu_seqlens_ori_kv[:-1]).max()),
        ori_topk=ori_sparse_indices.shape[2] if explicit else 0, cmp_topk=0, cmp_ratio=cmp_ratio,
        ori_mask_mode=ori_mask_mode, cmp_mask_mode=cmp_mask_mode, ori_win_left=ori_win_left,
        ori_win_right=ori_win_right, layout_q=_LAYOUTS[layout_q], layout_kv=_LAYOUTS[layout_kv], has_ori_kv=1,
        has_cmp_kv=0)
    bad = {k: (got[k], v) for k, v in want.items() if got[k] != v}
    if bad:
        _fail(f"metadata was built from other parameters (metadata, call): {bad}")
    cq = cu_seqlens_q.to(torch.int64)
    ck = cu_seqlens_ori_kv.to(torch.int64)
    req = torch.repeat_interleave(torch.arange(B), cq[1:] - cq[:-1])
    kv_start, kv_len = ck[:-1][req], (ck[1:] - ck[:-1])[req]
    if explicit:
        idx = ori_sparse_indices[:, 0, :].to(torch.int64)
        j = torch.arange(idx.shape[1])[None, :]
        valid = (j < ori_topk_length.to(torch.int64)) & (idx != -1)
        if bool((valid & ((idx < 0) | (idx >= kv_len[:, None]))).any()):
            _fail("an ori_sparse_indices entry lies outside its batch's ori_kv (illegal address)")
        pos = idx
    else:
        p = kv_len - (cq[1:] - cq[:-1])[req] + (torch.arange(T) - cq[:-1][req])
        W = ori_win_left + ori_win_right + 1
        pos = (p - ori_win_left)[:, None] + torch.arange(W)[None, :]
        valid = (pos >= 0) & (pos < kv_len[:, None])
    rows = ori_kv[:, 0, :][(kv_start[:, None] + torch.where(valid, pos, 0)).clamp(max=ori_kv.shape[0] - 1)].float()
    s = torch.einsum("thd,tkd->thk", q.float(), rows) * float(softmax_scale)
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    m = torch.maximum(lse, sinks[None, :])
    p_ = torch.exp(s - m[..., None])
    out = torch.einsum("thk,tkd->thd", p_, rows) / (p_.sum(-1) + torch.exp(sinks[None, :] - m))[..., None]
    lse_out = lse[None] if return_softmax_lse else torch.zeros(1)
    return out.to(q.dtype), lse_out


class _Namespace:
    __swa_device__ = "cpu"  # the doubles compute on the host
    npu_sparse_flash_mla = staticmethod(npu_sparse_flash_mla)
    npu_sparse_flash_mla_metadata = staticmethod(npu_sparse_flash_mla_metadata)


def _modules() -> dict:
    def mod(name, **attrs):
        m = fake_module(name, **attrs)
        m.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
        return m

    npu = mod("torch_npu.npu", get_soc_version=get_soc_version, is_available=lambda: True,
              device_count=lambda: 1, current_device=lambda: 0)
    return {
        "torch_npu": mod("torch_npu", npu=npu),
        "torch_npu.npu": npu,
        "vllm_ascend": mod("vllm_ascend"),
        "vllm_ascend.vllm_ascend_C": mod("vllm_ascend.vllm_ascend_C", __swa_op_namespace__=_Namespace()),
    }


@contextlib.contextmanager
def contract_doubles(device=None) -> Iterator[None]:
    """Install the Ascend contract doubles (torch_npu SoC query, vllm-ascend's
    ``npu_sparse_flash_mla`` and its metadata) and mark the Ascend probes available.
    ``device``: the emulated Ascend device or None (:func:`current_device`, else 910B)."""
    global _emulated
    saved = _emulated
    _emulated = EmulatedDevice("ascend", device)
    try:
        with installed_modules(_modules()), probe_overrides({"vllm_ascend_sparse_flash_mla": None,
                                                              "triton_ascend": None}):
            yield
    finally:
        _emulated = saved
