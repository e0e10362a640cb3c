"""CUDA devices: torch's ``cuda`` devices on a CUDA build of torch (on a ROCm build they are the
ROCm platform's), named by compute capability (``sm90``)."""

from __future__ import annotations

import re

import torch

from ...common.device import DeviceInfo, torch_cuda_current, torch_cuda_device

#: torch's current CUDA device (None: torch sees none)
current_index = torch_cuda_current


def cuda_arch(capability: tuple[int, int]) -> str:
    return f"sm{capability[0]}{capability[1]}"


def detect(index: int | None) -> DeviceInfo | str:
    """CUDA device ``index`` (None: the current one), or why there is none."""
    found = torch_cuda_device(index)
    if isinstance(found, str):
        return found
    if getattr(torch.version, "hip", None):
        return "a CUDA device (this torch is a ROCm build: its cuda devices are ROCm GPUs)"
    index, props = found
    cap = (props.major, props.minor)
    return DeviceInfo("cuda", cuda_arch(cap), props.name, f"cuda:{index}", capability=cap)


def fake_arch(arch: str) -> tuple[str, tuple[int, int]]:
    """A fake device's arch as typed (``sm90``, ``sm_90``, ``90``, ``9.0``, ``sm_120``) ->
    ``("sm90", (9, 0))``: the compute capability is the arch."""
    m = re.match(r"^(?:sm_?)?(\d+)(?:_(\d))?$", arch) or re.match(r"^(\d+)\.(\d+)$", arch)
    cap = None
    if m and m.group(2) is not None:
        cap = (int(m.group(1)), int(m.group(2)))
    elif m:
        digits = m.group(1)
        cap = (int(digits[:-1]), int(digits[-1])) if len(digits) >= 2 else None
    if cap is None:
        raise ValueError("expected a CUDA arch like sm90 or sm100")
    return cuda_arch(cap), cap
