"""The device model: which platform and arch an op will run on.

Detection is lazy and cached per torch device; nothing runs at import. Only on Ascend is
``torch_npu`` imported (it fails without the CANN runtime: that becomes a reason).
Tests and the CLI name fake devices with :func:`parse_device` (``"rocm:gfx942"``,
``"ascend:910b"``, ``"cuda:sm90"``) or :func:`fake_device`.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

PLATFORMS = ("cpu", "cuda", "rocm", "ascend")

# Known archs per platform: a matrix row naming anything else is rejected, and a fake device
# whose arch looks like a device index (rocm:0) must name one of these.
KNOWN_ARCHS: dict[str, tuple[str, ...]] = {
    "cpu": ("cpu",),
    "cuda": ("sm70", "sm75", "sm80", "sm86", "sm87", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121"),
    "rocm": ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201", "gfx1250"),
    "ascend": ("310p", "910b", "910_93", "950"),
}

# Ascend SoC version ranges of torch_npu.npu.get_soc_version() (PLATFORMS.md).
_ASCEND_SOCS = (
    (range(200, 206), "310p", "Ascend 310P"),
    (range(220, 226), "910b", "Ascend 910B (A2)"),
    (range(250, 256), "910_93", "Ascend 910_93 (A3)"),
    (range(260, 261), "950", "Ascend 950 (A5)"),
)


@dataclass(frozen=True)
class DeviceInfo:
    """``platform`` (cpu/cuda/rocm/ascend), ``arch`` (cpu, sm90, gfx942, 910b, ...),
    ``name`` (marketing name), ``torch_device`` (where tensors go; None for a fake device),
    ``capability`` (CUDA compute capability), ``fake`` (injected, not detected),
    ``problems`` (why detection was partial, e.g. torch_npu failed to import)."""

    platform: str
    arch: str
    name: str = ""
    torch_device: str | None = None
    capability: tuple[int, int] | None = None
    fake: bool = False
    problems: tuple[str, ...] = field(default=())

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
    return "cpu" if platform == "cpu" else f"{platform}:{arch}"


def cuda_arch(capability: tuple[int, int]) -> str:
    return f"sm{capability[0]}{capability[1]}"


def rocm_arch(gcn_arch_name: str) -> str:
    """``gfx942:sramecc+:xnack-`` -> ``gfx942``."""
    return gcn_arch_name.split(":", 1)[0].strip()


def ascend_arch(soc_version: int) -> tuple[str, str]:
    for versions, arch, name in _ASCEND_SOCS:
        if soc_version in versions:
            return arch, name
    return f"soc{soc_version}", f"Ascend SoC {soc_version}"


_FAKE_RE = re.compile(r"^(cpu|cuda|rocm|ascend|npu)(?::([A-Za-z0-9_.]+))?$")


def parse_device(spec: str) -> DeviceInfo:
    """A fake device from ``platform:arch``: ``cpu``, ``cuda:sm90`` (also ``cuda:9.0``),
    ``rocm:gfx942``, ``ascend:910b``. A bare index (``rocm:0``) is not an arch: real devices
    are ``cuda:N`` (also on ROCm) and ``npu:N`` (:func:`resolve_device`)."""
    if not isinstance(spec, str):
        raise ValueError(f"device={spec!r}: expected a string like 'rocm:gfx942'")
    m = _FAKE_RE.match(spec.strip().lower())
    if not m:
        raise ValueError(
            f"device={spec!r}: expected platform[:arch] with platform in {PLATFORMS} "
            "(e.g. 'cuda:sm90', 'rocm:gfx950', 'ascend:910b')")
    platform, arch = m.group(1), m.group(2)
    if platform == "npu":
        raise ValueError(f"device={spec!r}: expected npu:<index> for a real Ascend NPU, or ascend:<arch> for a "
                         "fake one (e.g. ascend:910b)")
    cap = None
    if platform == "cpu":
        if arch not in (None, "cpu"):
            raise ValueError(f"device={spec!r}: expected 'cpu' (the CPU has no arch to name)")
        arch = "cpu"
    elif arch is None:
        raise ValueError(f"device={spec!r}: expected an arch after '{platform}:' (e.g. {_example(platform)})")
    elif arch.isdigit() and platform != "cuda" and arch not in KNOWN_ARCHS[platform]:
        raise ValueError(f"device={spec!r}: {arch} is a device index, not an arch: a real "
                         f"{'ROCm GPU is cuda:' + arch if platform == 'rocm' else 'Ascend NPU is npu:' + arch}, "
                         f"a fake one names its arch (e.g. {_example(platform)})")
    elif platform == "cuda":
        m2 = re.match(r"^(?:sm_?)?(\d+)(?:_(\d))?$", arch) or re.match(r"^(\d+)\.(\d+)$", arch)
        if m2 and m2.group(2) is not None:
            cap = (int(m2.group(1)), int(m2.group(2)))
        elif m2:
            digits = m2.group(1)
            cap = (int(digits[:-1]), int(digits[-1])) if len(digits) >= 2 else None
        if cap is None:
            raise ValueError(f"device={spec!r}: expected a CUDA arch like sm90 or sm100")
        arch = cuda_arch(cap)
    elif platform == "ascend" and arch.startswith("ascend"):
        arch = arch[len("ascend"):]  # ascend:ascend910b names the same device as ascend:910b
    return DeviceInfo(platform, arch, name=f"fake {device_spec(platform, arch)}", capability=cap, fake=True)


def _example(platform: str) -> str:
    return {"cuda": "cuda:sm90", "rocm": "rocm:gfx942", "ascend": "ascend:910b"}.get(platform, platform)


# Per thread: a fake device installed by one thread (a test trying the ROCm path) must not
# change what another thread's select() sees.
_override = threading.local()


@contextlib.contextmanager
def fake_device(device: DeviceInfo | str) -> Iterator[DeviceInfo]:
    """Within the block, :func:`current_device` returns ``device`` in *this thread* (tests,
    the CLI); other threads, including ones started inside the block, keep their own."""
    info = parse_device(device) if isinstance(device, str) else device
    if not isinstance(info, DeviceInfo):
        raise ValueError(f"fake_device: device={info!r}: expected a DeviceInfo or a string like 'rocm:gfx942'")
    stack = getattr(_override, "stack", None)
    if stack is None:
        stack = _override.stack = []
    stack.append(info)
    try:
        yield info
    finally:
        stack.pop()


def cuda_index(t: torch.Tensor) -> int:
    """Index of the CUDA device holding ``t`` (a bare ``cuda`` device: the current one)."""
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def cuda_l2_bytes(index: int) -> int:
    """L2 size in bytes of CUDA device ``index``, read once per process."""
    return torch.cuda.get_device_properties(index).L2_cache_size


def l2_bytes_of(t: torch.Tensor) -> int | None:
    """L2 size in bytes of the CUDA device holding ``t`` (None: not a CUDA tensor)."""
    if not t.is_cuda:
        return None
    return cuda_l2_bytes(cuda_index(t))


def current_device() -> DeviceInfo:
    """The device ops run on by default: a fake one if this thread installed one
    (:func:`fake_device`), else the first accelerator (CUDA/ROCm through torch, then Ascend),
    else the CPU."""
    stack = getattr(_override, "stack", None)
    if stack:
        return stack[-1]
    return _detect_default()


def resolve_device(device: DeviceInfo | str | torch.device | None) -> DeviceInfo:
    """``None`` -> :func:`current_device`; ``DeviceInfo`` as is; a ``torch.device`` or
    ``"cuda:0"``/``"npu:0"``/``"cpu"`` -> detected; ``"platform:arch"`` -> fake."""
    if device is None:
        return current_device()
    if isinstance(device, DeviceInfo):
        return device
    if isinstance(device, torch.device):
        return detect(str(device))
    if isinstance(device, str):
        s = device.strip().lower()
        if s == "cpu" or re.match(r"^(cuda|npu)(:\d+)?$", s):
            return detect(s)
        return parse_device(s)
    raise ValueError(f"device={device!r}: expected None, a DeviceInfo, a torch.device or a string")


@functools.cache
def _detect_default() -> DeviceInfo:
    if torch.cuda.is_available():
        return detect(f"cuda:{torch.cuda.current_device()}")
    npu = _probe_npu()
    if isinstance(npu, DeviceInfo):
        return npu
    info = detect("cpu")
    return info


@functools.cache
def detect(torch_device: str) -> DeviceInfo:
    """Detect the platform and arch of a real torch device string (cached)."""
    if torch_device.startswith("npu"):  # torch knows 'npu' only once torch_npu is imported
        m = re.match(r"^npu(?::(\d+))?$", torch_device)
        info = _probe_npu(int(m.group(1)) if m and m.group(1) else None) if m else None
        if isinstance(info, DeviceInfo):
            return info
        raise ValueError(f"device={torch_device!r}: expected a usable Ascend NPU ({info or 'npu or npu:<index>'})")
    try:
        dev = torch.device(torch_device)
    except (RuntimeError, ValueError) as exc:  # e.g. an index past int64
        raise ValueError(f"device={torch_device!r}: expected cpu, cuda[:index] or npu[:index] ({exc})") from None
    if dev.type == "cpu":
        return DeviceInfo("cpu", "cpu", name="CPU", torch_device="cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={torch_device!r}: expected an available CUDA/ROCm device (torch sees none)")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(f"device={torch_device!r}: expected an index below {torch.cuda.device_count()} "
                             "(the CUDA/ROCm devices torch sees)")
        props = torch.cuda.get_device_properties(index)
        where = f"cuda:{index}"
        if getattr(torch.version, "hip", None):
            return DeviceInfo("rocm", rocm_arch(getattr(props, "gcnArchName", "unknown")), props.name, where)
        cap = (props.major, props.minor)
        return DeviceInfo("cuda", cuda_arch(cap), props.name, where, capability=cap)
    if dev.type == "npu":
        info = _probe_npu(dev.index)
        if isinstance(info, DeviceInfo):
            return info
        raise ValueError(f"device={torch_device!r}: expected a usable Ascend NPU ({info})")
    raise ValueError(f"device={torch_device!r}: expected a cpu, cuda or npu device")


def _probe_npu(index: int | None = None) -> DeviceInfo | str:
    """An Ascend DeviceInfo, or the reason there is none. Imports torch_npu only here."""
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
        soc = int(torch_npu.npu.get_soc_version())
    except Exception as exc:
        return f"torch_npu could not read the SoC version: {type(exc).__name__}: {exc}"
    arch, name = ascend_arch(soc)
    i = 0 if index is None else index
    return DeviceInfo("ascend", arch, name, f"npu:{i}")


def clear_cache() -> None:
    """Forget detected devices (tests that patch torch)."""
    _detect_default.cache_clear()
    detect.cache_clear()
