"""Ascend devices: torch_npu's ``npu`` devices, named by SoC (``torch_npu.npu.get_soc_version()``).
``torch_npu`` is imported here only, when an Ascend device is detected: without the CANN runtime
its import fails (``libhccl.so``), and that is a reason, never a crash."""

from __future__ import annotations

import sys

from ...common.device import DeviceInfo

# Ascend SoC version ranges of torch_npu.npu.get_soc_version() (torch_npu's numbering).
SOCS = (
    (range(200, 206), "310p", "Ascend 310P"),
    (range(220, 226), "910b", "Ascend 910B (A2)"),
    (range(250, 256), "910_93", "Ascend 910_93 (A3)"),
    (range(260, 261), "950", "Ascend 950 (A5)"),
)


def ascend_arch(soc_version: int) -> tuple[str, str]:
    for versions, arch, name in SOCS:
        if soc_version in versions:
            return arch, name
    return f"soc{soc_version}", f"Ascend SoC {soc_version}"


def probe_npu(index: int | None = None) -> DeviceInfo | str:
    """Ascend NPU ``index`` (None: torch_npu's current NPU) as a DeviceInfo, or the reason there is
    none: an index at or past the NPUs torch_npu sees is one (as ``torch_cuda_device`` refuses a
    CUDA index: ``npu:7`` on a one-NPU host names no device, and its backend would place tensors
    nowhere)."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu is not installed"
    try:
        import torch_npu  # noqa: F401  (registers the 'npu' device with torch)
    except Exception as exc:  # CANN missing (libhccl.so) and friends
        return f"import torch_npu failed: {type(exc).__name__}: {exc}"
    try:
        # torch_npu.npu is the module torch.npu aliases once torch_npu is imported.
        if not torch_npu.npu.is_available():
            return "torch_npu imported but no NPU is available"
        count = int(torch_npu.npu.device_count())
        if index is None:
            index = int(torch_npu.npu.current_device())
        soc = int(torch_npu.npu.get_soc_version())
    except Exception as exc:
        return f"torch_npu could not read the NPUs: {type(exc).__name__}: {exc}"
    if not 0 <= index < count:
        return f"torch_npu sees {count} NPU{'s' if count != 1 else ''}: an index below {count}"
    arch, name = ascend_arch(soc)
    return DeviceInfo("ascend", arch, name, f"npu:{index}")


def current_index() -> int | None:
    """torch_npu's current NPU, None while torch_npu is not imported (detection imports it, and
    from then on this reads it) or has no NPU. A contract double of torch_npu
    (``testing/emulation/ascend.py``) emulates the vendor's calls for a faked device: it is no NPU
    of this host, and its SoC query reads the current device, which would ask this again."""
    npu = sys.modules.get("torch_npu")
    if npu is None or getattr(npu, "__swa_contract_double__", False):
        return None
    try:
        return int(npu.npu.current_device()) if npu.npu.is_available() else None
    except Exception:  # a broken runtime: detection says why
        return None


def detect(index: int | None) -> DeviceInfo | str:
    """NPU ``index`` (None: the current one), or why there is none."""
    info = probe_npu(index)
    return info if isinstance(info, DeviceInfo) else f"a usable Ascend NPU ({info})"


def fake_arch(arch: str) -> tuple[str, None]:
    """``ascend910b`` names the same device as ``910b``."""
    return (arch[len("ascend"):] if arch.startswith("ascend") else arch), None
