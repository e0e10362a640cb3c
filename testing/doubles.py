"""Machinery for *contract doubles*: how the pack tests vendor wrappers on hardware that is
not here.

A contract double is a small torch function with a vendor op's documented signature and
semantics, failure modes included (e.g. AITER's OPUS prefill raising on a PAD index or on an
arch other than gfx950). Each platform's ``emulation.py`` builds fake vendor modules holding
its doubles and exposes ``contract_doubles()``, a context manager that

* puts the fake modules into ``sys.modules`` (restoring whatever was there on exit), so the
  wrappers' ordinary ``import`` of the vendor module finds the double;
* overrides the platform's probes to "available" (restoring previous overrides on exit);
* records the emulated device, so doubles can apply arch-specific failure modes.

Nothing here runs at import time. Doubles never claim hardware results: rows they make pass
are marked ``emulated`` in matrix.yaml, never ``hardware``.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator, Mapping

from ..common import registry
from ..common.device import DeviceInfo, current_device, parse_device


def fake_module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__swa_contract_double__ = True  # type: ignore[attr-defined]
    return mod


@contextlib.contextmanager
def installed_modules(modules: Mapping[str, types.ModuleType]) -> Iterator[None]:
    """``sys.modules[name] = module`` for each entry (parents get the child as attribute),
    restored on exit."""
    saved = {name: sys.modules.get(name) for name in modules}
    try:
        for name, mod in modules.items():
            sys.modules[name] = mod
            parent, _, child = name.rpartition(".")
            if parent in modules:
                setattr(modules[parent], child, mod)
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


@contextlib.contextmanager
def probe_overrides(results: Mapping[str, str | None]) -> Iterator[None]:
    """Override probes (``None`` = available) for the block; previous overrides restored."""
    saved = {name: registry._PROBE_OVERRIDES[name] for name in results if name in registry._PROBE_OVERRIDES}
    try:
        for name, result in results.items():
            registry.override_probe(name, result)
        yield
    finally:
        for name in results:
            registry._PROBE_OVERRIDES.pop(name, None)
        registry._PROBE_OVERRIDES.update(saved)


class EmulatedDevice:
    """The device a set of doubles emulates: fixed, or (``None``) whatever
    :func:`current_device` says at call time when it belongs to ``platform``."""

    def __init__(self, platform: str, device: DeviceInfo | str | None):
        if isinstance(device, str):
            device = parse_device(device)
        if device is not None and device.platform != platform:
            raise ValueError(f"device={device}: expected a {platform} device for the {platform} contract doubles")
        self.platform = platform
        self._device = device

    def get(self) -> DeviceInfo | None:
        if self._device is not None:
            return self._device
        cur = current_device()
        return cur if cur.platform == self.platform else None

    @property
    def arch(self) -> str | None:
        d = self.get()
        return d.arch if d is not None else None
