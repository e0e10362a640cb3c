"""The reference backend: the CPU platform (``PLATFORM``), where the torch reference of every op runs.

The reference of an op is a variant of its own (``OpSpec.reference_variant``: it runs on any torch
device), so it is the whole backend on CPU and the last entry of every other platform's priority
list: an unknown device or a missing vendor package always has something correct to run.
"""

from __future__ import annotations

from ...common.device import DeviceInfo
from ...common.platforms import Platform


def detect(index: int | None) -> DeviceInfo:
    """The host: always there."""
    return DeviceInfo("cpu", "cpu", name="CPU", torch_device="cpu")


# CPU: the reference. Triton kernels run here only under the interpreter, and only when
# asked for by name (select(prefer="triton")).
PRIORITY = {"*": ("reference", "triton")}

PLATFORM = Platform(
    name="cpu",
    archs=("cpu",),
    label="CPU",
    torch_types=("cpu",),
    detect=detect,
    priority=PRIORITY,
)
