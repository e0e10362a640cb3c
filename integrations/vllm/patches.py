"""How the integration patches vLLM, for any release: a module global replaced by a shim that
keeps the original's calling convention and follows a route.

A release's ``patches.py`` (``v0_33/patches.py``) lists its :class:`Patch` es -- which module
global, which shim, which check of the original -- and its shims (:class:`Shim` subclasses,
one per calling convention). Everything else is here and the same for every release:

* :func:`apply` replaces each global whose check passes (idempotent) and records each patch's
  outcome (:func:`status`); :func:`restore` puts the originals back;
* :func:`route` sends a patched launch to the pack (a function device -> Backend) or back to
  vLLM's original (None: the shim hands every call to it unchanged, so a patch applied for a
  model the pack does not serve is inert);
* :func:`failed`: a routed launch raised (a failed probe, compile or first call): that route
  is off for the rest of the process, with one warning, unless :func:`pin`-ned (the pack turned
  on what vLLM keeps off, and vLLM's kernel cannot stand in).

One vLLM runs in a process, so the routes and outcomes are this module's, keyed by patch name.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from . import log_once

#: route name -> a function device -> Backend, or None (the shim calls vLLM's original)
_routes: dict[str, Callable | None] = {}
_lock = threading.Lock()
_pinned: set[str] = set()  # routes vLLM's kernel cannot stand in for (failed() raises)
_status: dict[str, str] = {}  # patch name -> "applied" or the reason it is not
_applied: dict[str, "Patch"] = {}  # patch name -> the patch whose shim is in place (what restore() undoes)


class Shim:
    """Stands in a patched global: forwards every attribute it does not define to vLLM's
    original object; a subclass calls :meth:`_backend` for the pack's backend (None: the route
    is off, call the original) and :meth:`_failed` when the pack's call raised."""

    route_name = ""

    def __init__(self, original):
        self._swa_original = original
        self._swa_last = (None, None, None)  # (route, device, backend) of the last routed call

    def __getattr__(self, name):
        return getattr(self.__dict__["_swa_original"], name)

    def __repr__(self) -> str:
        return f"<swa_backends shim of {self._swa_original!r}>"

    def _routed(self) -> bool:
        return _routes.get(self.route_name) is not None

    def _backend(self, device):
        route = _routes.get(self.route_name)
        if route is None:
            return None
        last = self._swa_last
        if last[0] is route and last[1] == device:  # a serving process launches on one device
            return last[2]
        try:
            be = route(device)
        except Exception as exc:  # noqa: BLE001 - no backend (a failed probe or selection): vLLM's kernel
            self._failed(exc)
            return None
        self._swa_last = (route, device, be)
        return be

    def _failed(self, exc: BaseException) -> None:
        failed(self.route_name, exc)


# ---------------------------------------------------------------------------------------
# checks of an original before it is replaced
# ---------------------------------------------------------------------------------------


def _params(fn) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def check_jit(obj, expected: tuple[str, ...], methods: tuple[str, ...]) -> str | None:
    """None when ``obj`` is a Triton ``JITFunction`` with ``methods``, ``[grid]`` and the
    parameters ``expected``; else what differs."""
    fn = getattr(obj, "fn", None)
    if fn is None or not all(callable(getattr(obj, m, None)) for m in methods) or not hasattr(obj, "__getitem__"):
        return f"not a Triton JITFunction with {', '.join(methods)} and [grid] (found {type(obj).__name__})"
    got = _params(fn)
    return None if got == expected else f"kernel parameters {got} != pinned {expected}"


def check_function(obj, expected: tuple[str, ...]) -> str | None:
    """None when ``obj`` is a plain function with the parameters ``expected``."""
    if not inspect.isfunction(obj):
        return f"not a function (found {type(obj).__name__})"
    got = _params(obj)
    return None if got == expected else f"parameters {got} != pinned {expected}"


def check_call(obj, expected: tuple[str, ...], methods: tuple[str, ...]) -> str | None:
    """None when ``obj`` is a callable object with ``methods`` whose ``__call__`` takes
    ``expected``."""
    call = getattr(type(obj), "__call__", None)
    if call is None or not all(callable(getattr(obj, m, None)) for m in methods):
        return f"not a callable kernel object with {', '.join(methods)} (found {type(obj).__name__})"
    got = _params(inspect.unwrap(call))
    return None if got == expected else f"__call__ parameters {got} != pinned {expected}"


@dataclass(frozen=True)
class Patch:
    """One module-global replacement: ``module.attr`` -> ``shim(original)`` if ``check``
    returns None for the original (else the reason it does not apply); ``platform``: applied
    only on that vLLM platform (None: every platform)."""

    name: str
    module: str
    attr: str
    shim: type
    check: Callable[[object], str | None]
    why: str
    platform: str | None = None

    @property
    def target(self) -> str:
        return f"{self.module}.{self.attr}"


# ---------------------------------------------------------------------------------------
# applying, routing, restoring
# ---------------------------------------------------------------------------------------


def _platform() -> str:
    from vllm.platforms import current_platform

    return "rocm" if current_platform.is_rocm() else "cuda" if current_platform.is_cuda() else "other"


def apply(patches: Iterable[Patch], *, release: str, platform: str | None = None) -> dict[str, str]:
    """Apply every patch of ``patches`` whose check passes (idempotent); returns :func:`status`.
    ``release``: the vLLM release the checks pin (named in a failed check's reason);
    ``platform``: ``"rocm"``, ``"cuda"``, ... (None: vLLM's current platform); a patch for
    another platform is not applied and its module not imported."""
    with _lock:
        platform = platform or _platform()
        for p in patches:
            _routes.setdefault(p.name, None)
            if _status.get(p.name) == "applied":
                continue
            if p.platform is not None and p.platform != platform:
                _status[p.name] = f"not applied: {p.platform} only (this is {platform})"
                continue
            try:
                module = importlib.import_module(p.module)
                original = getattr(module, p.attr)
                if isinstance(original, Shim):
                    _status[p.name] = "applied"
                    _applied[p.name] = p
                    continue
                why = p.check(original)
                if why is None:
                    setattr(module, p.attr, p.shim(original))
                    _status[p.name] = "applied"
                    _applied[p.name] = p
                else:
                    _status[p.name] = f"not applied: {p.target} does not match vLLM {release}: {why}"
            except Exception as exc:  # noqa: BLE001
                _status[p.name] = f"not applied: {p.target}: {type(exc).__name__}: {exc}"
            if _status[p.name] != "applied":
                log_once(logging.WARNING, "patch %s %s; vLLM's kernel stays there (%s)", p.name, _status[p.name],
                         p.why)
    return status()


def status() -> dict[str, str]:
    """Patch name -> ``"applied"`` or why not (empty before :func:`apply`)."""
    return dict(_status)


def applied(name: str) -> bool:
    return _status.get(name) == "applied"


def failed(name: str, exc: BaseException) -> None:
    """A routed launch ``name`` raised (a failed probe, compile or first call): the route is off
    for the rest of the process, with one warning; vLLM's kernel runs that call and every later one.
    A route :func:`pin`-ned (vLLM's kernel cannot stand in: the pack turned on encoder replay
    that vLLM keeps off there) logs an error instead and the exception propagates."""
    if name in _pinned:
        log_once(logging.ERROR, "%s through the pack failed (%s: %s) where the pack turned encoder replay on and "
                 "vLLM's kernel cannot stand in; set SWA_BACKENDS_VLLM=0 to serve with vLLM's own path", name,
                 type(exc).__name__, exc)
        raise exc
    _routes[name] = None
    log_once(logging.WARNING, "%s through the pack failed (%s: %s); vLLM's kernel runs from now on", name,
             type(exc).__name__, exc)


def pin(names) -> None:
    """The routes ``names`` have no fallback (:func:`failed`); ``pin(())`` clears every pin."""
    _pinned.clear()
    _pinned.update(names)


def route(name: str, backend_for: Callable | None) -> bool:
    """Send the patched launch ``name`` to the pack (``backend_for``: device -> Backend) or
    back to vLLM's kernel (None). Returns whether the route is now on (its patch applied: a
    route no applied patch has stays off)."""
    if backend_for is not None and not applied(name):
        return False
    _routes[name] = backend_for
    return backend_for is not None


def routes() -> dict[str, bool]:
    return {name: fn is not None for name, fn in _routes.items()}


def restore() -> None:
    """Put vLLM's originals back and turn every route off (tests)."""
    with _lock:
        for p in _applied.values():
            module = sys.modules.get(p.module)  # a module never imported holds no shim
            current = getattr(module, p.attr, None)
            if isinstance(current, Shim):
                setattr(module, p.attr, current._swa_original)
        _applied.clear()
        _status.clear()
        _pinned.clear()
        for name in _routes:
            _routes[name] = None
