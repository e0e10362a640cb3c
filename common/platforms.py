"""The platform protocol: one typed :class:`Platform` per platform, and the registry that holds them.

Each ``swa_backends.backends.<folder>`` exports one ``PLATFORM``; ``swa_backends.backends.PLATFORMS`` lists
the folders (one line per platform). Everything that depends on the platform reads this one object: the
device model (names, archs, detection, fake-device parsing), dispatch (variants, priority, per-call
exceptions, input checks), the matrix loader (known archs) and the matrix runner (contract doubles).

The device model sits below the backends, so it never imports them by statement: the registry imports
the listed modules by name on first use, as vLLM names its built-in platforms by path. Their
``__init__`` files are declarations (no vendor package, no device query), so this costs an import of
plain data once per process. :func:`register_platform` adds one at run time (an out-of-tree platform, a
test's toy one); :func:`unregister_platform` takes it away again.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from .device_info import HOST
from .registry import Variant, declarations_changed
from .validation import fail

if TYPE_CHECKING:
    from .device_info import DeviceInfo

#: Where the pack's own platforms are listed (``PLATFORMS``: the folders, each exporting ``PLATFORM``).
BUILTIN = "swa_backends.backends"


@dataclass(frozen=True)
class Ahead:
    """A per-call exception to a platform's priority: ``variant`` runs before ``before`` for a call
    where ``when`` (``"module:attr"``, called with the op's arguments) returns a reason (not None).
    Applies only where both are in the op's chosen chain, ``variant`` after ``before``, and, with
    ``archs``, only on those archs: a rule drawn from measurements holds where they were taken (a
    predicate sees shapes, not the device)."""

    variant: str
    before: str
    when: str
    archs: tuple[str, ...] | None = None

    def applies_on(self, arch: str) -> bool:
        return self.archs is None or arch in self.archs


@dataclass(frozen=True, eq=False)
class Platform:
    """Everything the pack knows about one platform, declared once.

    Device model: ``name`` (the first part of a device spec, a matrix row's platform, what
    ``Variant.platforms`` names); ``archs`` (every arch a matrix row or a fake device may name);
    ``label`` (its device in messages, "ROCm GPU"); ``example_arch`` (the arch messages suggest);
    ``torch_types`` (the torch device types of its devices: ``"cuda"`` on ROCm too, ``"npu"`` on
    Ascend); ``detect(index)`` (its device ``index`` of those types, None for the current one: a
    ``DeviceInfo``, else why there is none, phrased to follow "expected": it never raises and is
    the only place its vendor runtime may be imported); ``current_index()`` (the index of its
    current device, read before detection on every call that names no index: ``"cuda"``, ``"npu"``,
    ``select()``; None where it has none or cannot tell without importing its runtime; cheap, never
    raises; a platform without one has its current device detected once per process);
    ``fake_arch(arch)`` (a fake device's arch as
    typed -> ``(arch, CUDA capability or None)``; ``ValueError`` saying what was expected).

    Dispatch: ``variants`` (what it registers: its own vendor wrappers and the portable kernels it
    runs; a variant declaring no ``platforms`` gets those that register it); ``priority`` (op ->
    variant names, first with no reasons wins; ``"*"`` for every other op); ``ahead`` (op ->
    :class:`Ahead` rules: the only per-call exceptions to that order); ``input_checks`` (op ->
    ``"module:attr"`` called as ``check(device, *args, **kwargs)`` with the op's validation: inputs
    valid in general but not on this platform raise ``ValueError``); ``value_reader``
    (``"module:attr"`` of ``read(items) -> list of numpy arrays, or None to decline``: how a
    validated call's value checks are read from its devices, in place of torch's reductions and
    copy; see ``common/validation.py``'s ``to_host``).

    Emulation: ``emulation``, the module of its vendor contract doubles (``contract_doubles(device)``),
    or None when it has no vendor package to emulate.
    """

    name: str
    archs: tuple[str, ...]
    label: str
    priority: Mapping[str, tuple[str, ...]]
    example_arch: str | None = None
    torch_types: tuple[str, ...] = ()
    detect: Callable[[int | None], "DeviceInfo | str"] | None = None
    current_index: Callable[[], int | None] | None = None
    fake_arch: Callable[[str], tuple[str, tuple[int, int] | None]] | None = None
    variants: tuple[Variant, ...] = ()
    ahead: Mapping[str, tuple[Ahead, ...]] = field(default_factory=dict)
    input_checks: Mapping[str, str] = field(default_factory=dict)
    value_reader: str | None = None
    emulation: str | None = None

    @property
    def example(self) -> str:
        """A device spec of this platform for messages (``rocm:gfx942``)."""
        return self.name if self.name == HOST else f"{self.name}:{self.example_arch or self.archs[0]}"

    def order(self, op: str) -> tuple[str, ...]:
        """The priority list for ``op`` (its own entry, else ``"*"``)."""
        return tuple(self.priority.get(op, self.priority["*"]))


_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

_lock = threading.RLock()
_platforms: dict[str, Platform] = {}
_loaded = False


def _check(p: Platform, others: Mapping[str, Platform]) -> None:
    where = "register_platform"
    if not isinstance(p, Platform):
        fail(where, "platform", p, "a Platform")
    if not _NAME.match(p.name):
        fail(where, "platform.name", p.name, "a lower-case identifier (the first part of a device spec)")
    if p.name in others:
        fail(where, "platform.name", p.name, f"a name not yet registered (registered: {sorted(others)})")
    taken = {t for q in others.values() for t in q.torch_types if t != q.name} | set(others)
    if p.name in taken:
        fail(where, "platform.name", p.name, "a name that is no registered platform's torch device type")
    if not p.archs or not all(isinstance(a, str) and a for a in p.archs):
        fail(where, f"{p.name}.archs", p.archs, "a non-empty tuple of arch names")
    if p.example_arch is not None and p.example_arch not in p.archs:
        fail(where, f"{p.name}.example_arch", p.example_arch, f"one of its archs {p.archs}")
    if "*" not in p.priority:
        fail(where, f"{p.name}.priority", dict(p.priority), "a '*' entry (the order of every op not named)")
    for op, rules in p.ahead.items():
        for rule in rules:
            if not isinstance(rule, Ahead):
                fail(where, f"{p.name}.ahead[{op!r}]", rule, "Ahead rules")
            order = p.order(op)
            if rule.variant not in order or rule.before not in order:
                fail(where, f"{p.name}.ahead[{op!r}]", rule, f"variants of its priority for {op} {order}")
            if rule.archs is not None and (not rule.archs or not set(rule.archs) <= set(p.archs)):
                fail(where, f"{p.name}.ahead[{op!r}]", rule, f"archs None or some of its archs {p.archs}")
    if p.torch_types and p.detect is None:
        fail(where, f"{p.name}.detect", None, "a detection function (it names torch device types)")


def _load_builtin() -> None:
    global _loaded
    with _lock:
        if _loaded:
            return
        found: dict[str, Platform] = {}
        for folder in importlib.import_module(BUILTIN).PLATFORMS:
            p = importlib.import_module(f"{BUILTIN}.{folder}").PLATFORM
            _check(p, found)
            found[p.name] = p
        if HOST not in found:
            raise RuntimeError(f"{BUILTIN}.PLATFORMS declares no {HOST!r} platform (the host every process has)")
        # run-time registrations made before the first read keep their place after the built-in ones
        for name, p in _platforms.items():
            _check(p, found)
            found[name] = p
        _platforms.clear()
        _platforms.update(found)
        _loaded = True


def platforms() -> Mapping[str, Platform]:
    """Every registered platform by name, built-in ones first in ``PLATFORMS`` order (read-only)."""
    if not _loaded:
        _load_builtin()
    return MappingProxyType(_platforms)


def get_platform(name: str) -> Platform | None:
    """The platform called ``name``, or None."""
    return platforms().get(name)


def register_platform(platform: Platform) -> Platform:
    """Add ``platform`` for the rest of the process (or until :func:`unregister_platform`):
    device specs, detection, dispatch, the matrix loader and the runner see it from now on."""
    with _lock:
        _check(platform, platforms())
        _platforms[platform.name] = platform
        declarations_changed()
    return platform


def unregister_platform(name: str) -> None:
    """Forget a platform :func:`register_platform` added (a built-in one cannot be removed)."""
    with _lock:
        builtin = importlib.import_module(BUILTIN)
        if name not in platforms() or any(importlib.import_module(f"{BUILTIN}.{f}").PLATFORM.name == name
                                          for f in builtin.PLATFORMS):
            fail("unregister_platform", "name", name, "a platform added with register_platform")
        del _platforms[name]
        declarations_changed()
