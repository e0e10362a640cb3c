"""The device model: which platform and arch an op will run on.

The platforms, their archs and how each detects its devices are the platforms' own declarations
(:class:`~swa_backends.common.platforms.Platform`, read here: this module sits above them, and
what a device is, :class:`DeviceInfo`, beneath them in :mod:`.device_info`). Detection is
lazy and cached per torch device *index*; nothing runs at import. A device named without an index
(``"cuda"``, ``"npu"``, None) is the current one, whose index is read on every call, before any
cache: after ``torch.cuda.set_device(1)`` it is ``cuda:1``. A platform imports its vendor runtime
only in its own detection (Ascend's ``torch_npu``, which fails without the CANN runtime: that
becomes a reason). Tests and the CLI name fake devices with :func:`parse_device`
(``"rocm:gfx942"``, ``"ascend:910b"``, ``"cuda:sm90"``) or :func:`fake_device`.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections.abc import Iterator

import torch

from .device_info import HOST, DeviceInfo, device_spec  # noqa: F401  (re-exported: the device API is here)
from .platforms import platforms


def platform_names() -> tuple[str, ...]:
    """Every registered platform (``cpu``, ``cuda``, ``rocm``, ``ascend``, and any added since)."""
    return tuple(platforms())


def known_archs() -> dict[str, tuple[str, ...]]:
    """Known archs per platform: a matrix row naming anything else is rejected, and a fake
    device whose arch looks like a device index (``rocm:0``) must name one of these."""
    return {name: p.archs for name, p in platforms().items()}


# platform[:arch], the arch followed by any feature flags a ROCm gcnArchName carries (":sramecc+:xnack-")
_SPEC_RE = re.compile(r"^([a-z][a-z0-9_]*)(?::([A-Za-z0-9_.]+))?((?::[a-z0-9_]+[+-])*)$")


def parse_device(spec: str) -> DeviceInfo:
    """A fake device from ``platform:arch``: ``cpu``, ``cuda:sm90`` (also ``cuda:9.0``),
    ``rocm:gfx942`` (also as torch's ``gcnArchName`` has it, ``rocm:gfx942:sramecc+:xnack-``: the
    feature flags name no other arch), ``ascend:910b``. A bare index (``rocm:0``) is not an arch: real devices
    are named by their torch device (``cuda:N``, also on ROCm; ``npu:N``; :func:`resolve_device`)."""
    if not isinstance(spec, str):
        raise ValueError(f"device={spec!r}: expected a string like 'rocm:gfx942'")
    registry = platforms()
    m = _SPEC_RE.match(spec.strip().lower())
    p = registry.get(m.group(1)) if m else None
    if p is None:
        real = next((q for q in registry.values() if m and m.group(1) in q.torch_types), None)
        if real is not None:  # a torch device type that names no platform (npu)
            raise ValueError(f"device={spec!r}: expected {m.group(1)}:<index> for a real {real.label}, or "
                             f"{real.name}:<arch> for a fake one (e.g. {real.example})")
        examples = ", ".join(repr(q.example) for q in registry.values() if q.name != HOST)
        raise ValueError(f"device={spec!r}: expected platform[:arch] with platform in {tuple(registry)} "
                         f"(e.g. {examples})")
    arch, features = m.group(2), m.group(3)
    cap = None
    if p.name == HOST:
        if arch not in (None, HOST) or features:
            raise ValueError(f"device={spec!r}: expected {HOST!r} (the {p.label} has no arch to name)")
        arch = HOST
    elif arch is None:
        raise ValueError(f"device={spec!r}: expected an arch after '{p.name}:' (e.g. {p.example})")
    elif arch.isdigit() and p.torch_types and p.name not in p.torch_types and arch not in p.archs:
        raise ValueError(f"device={spec!r}: {arch} is a device index, not an arch: a real {p.label} is "
                         f"{p.torch_types[0]}:{arch}, a fake one names its arch (e.g. {p.example})")
    elif p.fake_arch is not None:
        try:
            arch, cap = p.fake_arch(arch + features)  # the platform drops the flags it knows (ROCm's)
        except ValueError as exc:
            raise ValueError(f"device={spec!r}: {exc}") from None
    if ":" in arch or (features and p.fake_arch is None):
        raise ValueError(f"device={spec!r}: expected {p.name}:<arch> (e.g. {p.example}) without {features!r} (feature "
                         "flags are a ROCm gcnArchName's)")
    return DeviceInfo(p.name, arch, name=f"fake {device_spec(p.name, arch)}", capability=cap, fake=True)


def torch_cuda_device(index: int | None):
    """``(index, properties)`` of torch's CUDA device ``index`` (None: the current one), or why
    there is none (phrased to follow "expected"). One helper for the platforms whose devices are
    torch's ``cuda`` devices (CUDA, and ROCm through HIP)."""
    if not torch.cuda.is_available():
        return "an available CUDA/ROCm device (torch sees none)"
    if index is None:
        index = torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        return f"an index below {torch.cuda.device_count()} (the CUDA/ROCm devices torch sees)"
    return index, torch.cuda.get_device_properties(index)


def torch_cuda_current() -> int | None:
    """torch's current CUDA device index, None where torch sees no CUDA/ROCm device (the
    ``current_index`` of the platforms whose devices are torch's ``cuda`` devices)."""
    return torch.cuda.current_device() if torch.cuda.is_available() else None


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
    (:func:`fake_device`), else the first registered platform whose detection finds a current
    device (CUDA/ROCm through torch, then Ascend), else the CPU."""
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
        real = _real_device(s)
        if s == HOST or (real is not None and real[0] != HOST):  # "cpu:0" is a fake spec gone wrong
            return detect(s)
        return parse_device(s)
    raise ValueError(f"device={device!r}: expected None, a DeviceInfo, a torch.device or a string")


def _torch_types() -> tuple[str, ...]:
    return tuple(dict.fromkeys(t for p in platforms().values() for t in p.torch_types))


def _real_device(s: str) -> tuple[str, int | None] | None:
    """``(torch device type, index or None)`` when ``s`` names a torch device of a platform
    (``cuda:0``, ``npu``, ``cpu``)."""
    m = re.match(r"^([a-z][a-z0-9_]*)(?::(\d+))?$", s)
    if not m or m.group(1) not in _torch_types():
        return None
    return m.group(1), int(m.group(2)) if m.group(2) is not None else None


def current_index(kind: str) -> int | None:
    """The index of the current device of torch device type ``kind`` (``cuda``, ``npu``), as the
    platforms of that type read it (``Platform.current_index``, never cached: ``set_device``
    changes it); None where none of them can say (no such device, or a platform that reads none)."""
    for p in platforms().values():
        if kind in p.torch_types and p.current_index is not None:
            index = p.current_index()
            if index is not None:
                return index
    return None


@functools.cache
def _probe(platform: str, index: int | None) -> DeviceInfo | str:
    # detection proper, once per platform and index (None: the current device of a platform that
    # cannot name its index, or none to name)
    return platforms()[platform].detect(index)


def _detect_default() -> DeviceInfo:
    """The first platform (in registration order) whose detection finds a current device, else the
    host. The current index is read first, then detection is the cached one of that index."""
    for p in platforms().values():
        if p.name != HOST and p.detect is not None:
            info = _probe(p.name, p.current_index() if p.current_index is not None else None)
            if isinstance(info, DeviceInfo):
                return info
    return detect(HOST)


def detect(torch_device: str) -> DeviceInfo:
    """Detect the platform and arch of a real torch device string: cached per index, a device
    named without one (``"cuda"``) being the current one (:func:`current_index`, read first)."""
    found = _real_device(torch_device)
    if found is None:
        kinds = _torch_types()
        expected = ", ".join(kinds[:-1]) + f" or {kinds[-1]}" if len(kinds) > 1 else kinds[0]
        raise ValueError(f"device={torch_device!r}: expected a {expected} device "
                         f"({', '.join(k if k == HOST else k + '[:index]' for k in kinds)})")
    kind, index = found
    if index is None and kind != HOST:
        index = current_index(kind)
    why: list[str] = []
    for p in platforms().values():
        if kind in p.torch_types:
            info = _probe(p.name, index)
            if isinstance(info, DeviceInfo):
                return info
            if info not in why:
                why.append(info)
    raise ValueError(f"device={torch_device!r}: expected " + "; or ".join(why))


def clear_cache() -> None:
    """Forget detected devices (tests that patch torch)."""
    _probe.cache_clear()
