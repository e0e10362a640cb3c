"""What a device is: :class:`DeviceInfo` (a platform and an arch) and its one name.

Data only, beneath the platforms' declarations (:mod:`.platforms` and :mod:`.registry` read
it); finding, naming and faking devices is :mod:`.device`, above them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: The host platform: every process has it, detection ends with it, its device spec has no arch.
HOST = "cpu"


@dataclass(frozen=True)
class DeviceInfo:
    """``platform`` (a registered platform: cpu/cuda/rocm/ascend), ``arch`` (cpu, sm90, gfx942, 910b, ...),
    ``name`` (marketing name), ``torch_device`` (where tensors go; None for a fake device),
    ``capability`` (CUDA compute capability: left out on a ``cuda`` device, it is the one its ``smXY``
    arch names, ``DeviceInfo("cuda", "sm90")`` has (9, 0) as ``parse_device("cuda:sm90")`` does: the
    variants gated on a capability then judge it as they judge the parsed one), ``fake`` (injected,
    not detected), ``problems`` (why detection was partial, e.g. torch_npu failed to import)."""

    platform: str
    arch: str
    name: str = ""
    torch_device: str | None = None
    capability: tuple[int, int] | None = None
    fake: bool = False
    problems: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.capability is None and self.platform == "cuda" and isinstance(self.arch, str):
            object.__setattr__(self, "capability", sm_capability(self.arch))

    def __str__(self) -> str:
        where = "fake" if self.fake else (self.torch_device or "?")
        return f"{self.spec} ({self.name or self.arch}, {where})"

    @property
    def spec(self) -> str:
        """The one name of this platform/arch, as ``--device`` takes it and as the matrix
        row is called: ``cpu``, ``cuda:sm90``, ``rocm:gfx942``, ``ascend:910b``."""
        return device_spec(self.platform, self.arch)


    @property
    def runnable(self) -> bool:
        """Tensors can be placed on this device in this process."""
        return not self.fake and self.torch_device is not None


def device_spec(platform: str, arch: str) -> str:
    """``cpu`` or ``platform:arch``: the one name of a device kind (CLI, API, matrix rows)."""
    return HOST if platform == HOST else f"{platform}:{arch}"


def sm_capability(arch: str) -> tuple[int, int] | None:
    """The CUDA compute capability an ``smXY`` arch names (``sm90`` -> (9, 0), ``sm121`` -> (12, 1): the
    last digit is the minor version, as ``cuda:sm90`` parses), None for any other arch."""
    m = re.fullmatch(r"sm(\d+)(\d)", arch)
    return (int(m.group(1)), int(m.group(2))) if m else None
