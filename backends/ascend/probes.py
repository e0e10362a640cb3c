"""Probes of the Ascend stack. ``torch_npu`` fails to import without the CANN runtime
(``libhccl.so``): that is a reason, never a crash. Nothing here runs unless an Ascend device
is being assessed."""

from __future__ import annotations

import importlib
import importlib.util
from ...common.registry import import_reason, register_probe
from .npu_attention import op_namespace, sparse_mla


def _self_test(ns) -> str | None:
    """One tiny call in the mode the wrapper uses (explicit window indices): older builds
    reject ``ori_sparse_indices`` outside A5, which only a call can tell."""
    import torch

    dev = getattr(ns, "__swa_device__", "npu")  # a contract double's namespace computes on the host
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 512, generator=g).to(torch.bfloat16).to(dev)
    kv = torch.randn(8, 512, generator=g).to(torch.bfloat16).to(dev)
    idx = torch.tensor([[0, 1, -1], [2, 3, 4]], dtype=torch.int32, device=dev)
    lens = torch.tensor([2, 3], dtype=torch.int32, device=dev)
    try:
        sparse_mla(q, kv, idx, lens, 512 ** -0.5, 512)
    except Exception as exc:
        return (f"npu_sparse_flash_mla rejects explicit window indices (ori_sparse_indices, ori_mask_mode=0) in this "
                f"build: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return None


@register_probe("vllm_ascend_sparse_flash_mla")
def _probe_npu_sparse_flash_mla() -> str | None:
    ns, why = op_namespace()
    return why or _self_test(ns)


@register_probe("triton_ascend")
def _probe_triton_ascend() -> str | None:
    why = import_reason("triton", attr="jit", what="triton-ascend")
    if why:
        return why
    try:
        found = importlib.util.find_spec("triton.backends.ascend") is not None
    except Exception as exc:
        return f"triton-ascend: looking up triton.backends.ascend failed: {type(exc).__name__}: {exc}"
    if not found:
        return ("the installed Triton has no Ascend backend (triton.backends.ascend): install triton-ascend, which "
                "replaces the triton package")
    return None
