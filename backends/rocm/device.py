"""ROCm devices: torch's ``cuda`` devices on a ROCm (HIP) build of torch, named by their gfx arch
(``gcnArchName`` ``gfx942:sramecc+:xnack-`` -> ``gfx942``)."""

from __future__ import annotations

import torch

from ...common.device import DeviceInfo, torch_cuda_current, torch_cuda_device

#: torch's current HIP device, which torch names cuda:N (None: torch sees none)
current_index = torch_cuda_current


def rocm_arch(gcn_arch_name: str) -> str:
    """``gfx942:sramecc+:xnack-`` -> ``gfx942``."""
    return gcn_arch_name.split(":", 1)[0].strip()


def fake_arch(arch: str) -> tuple[str, None]:
    """A fake device's arch as typed, or as torch's ``gcnArchName`` reports it
    (``gfx942:sramecc+:xnack-``): the feature flags name no other arch."""
    return rocm_arch(arch), None


def detect(index: int | None) -> DeviceInfo | str:
    """ROCm GPU ``index`` (None: the current one), or why there is none."""
    found = torch_cuda_device(index)
    if isinstance(found, str):
        return found
    if not getattr(torch.version, "hip", None):
        return "a ROCm GPU (this torch is a CUDA build: its cuda devices are CUDA GPUs)"
    index, props = found
    return DeviceInfo("rocm", rocm_arch(getattr(props, "gcnArchName", "unknown")), props.name, f"cuda:{index}")
