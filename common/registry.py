"""Variant declarations and the one function that turns them into reasons.

A *variant* is one implementation of one op. It states, as data, the platforms and archs
it runs on, the data dtypes it takes, the index layout it reads, whether it is graph-safe,
whether it reads its window only through the pack's clamped indices, and which optional
packages it needs (*probes*). Its implementation is a ``"module:attr"`` path imported only
when the variant is chosen and first called.

Platform backends (``swa_backends.backends.<platform>``) declare their variants, and register
the portable kernels' (``swa_backends.kernels``), in their ``PLATFORM``
(:class:`~swa_backends.common.platforms.Platform`); the torch reference of every op is a variant
of its own (``OpSpec.reference_variant``). All plain data, importing nothing heavy; dispatch
collects them.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from .device_info import DeviceInfo

LAYOUTS = ("plain", "combined", "mixed", "csr")

#: Ops whose calls name the format of their KV (``kv_format=``, default "rows"), with the keywords
#: that came with it; a variant states the formats it reads in ``Variant.kv_formats``.
KV_FORMAT_OPS: dict[str, tuple[str, ...]] = {"sparse_mla": ("kv_format", "fp8", "return_lse")}

#: ``Variant.platforms`` of a variant that runs on every platform (the torch reference).
ANY_PLATFORM: tuple[str, ...] = ("*",)

# Bumped whenever a platform or an op is registered at run time: dispatch rebuilds its table of
# variants for the new generation (the declarations themselves never change).
_generation = 0


def declarations_changed() -> None:
    """Tell the readers of the declarations (dispatch's variant table) that a platform or an op
    was registered or removed."""
    global _generation
    _generation += 1


def declarations_version() -> int:
    """Changes whenever :func:`declarations_changed` is called."""
    return _generation

# ---------------------------------------------------------------------------------------
# probes: optional packages, imported only when a variant of their platform is considered
# ---------------------------------------------------------------------------------------

_PROBES: dict[str, Callable[[], str | None]] = {}
_PROBE_OVERRIDES: dict[str, str | None] = {}
#: One probe or vendor import at a time in the process: two threads' first select() would otherwise
#: import a package (Triton) at once, which can fail partway (a partially initialised module), and a
#: probe's answer is kept for the process. Reentrant: a probe's import may run another probe.
_PROBE_LOCK = threading.RLock()


def register_probe(name: str) -> Callable[[Callable[[], str | None]], Callable[[], str | None]]:
    """Register ``fn() -> None | reason`` under ``name`` (result cached until cleared)."""

    def deco(fn: Callable[[], str | None]) -> Callable[[], str | None]:
        _PROBES[name] = functools.cache(fn)
        return fn

    return deco


def probe(name: str) -> str | None:
    """``None`` if the requirement ``name`` is met in this process, else the reason."""
    if name in _PROBE_OVERRIDES:
        return _PROBE_OVERRIDES[name]
    fn = _PROBES.get(name)
    if fn is None:
        return f"unknown requirement {name!r} (no probe registered)"
    try:
        with _PROBE_LOCK:
            return fn()
    except Exception as exc:  # a probe must never raise: a broken vendor install is a reason
        return f"probe {name} failed: {type(exc).__name__}: {exc}"


def override_probe(name: str, result: str | None) -> None:
    """Force a probe's answer (tests, emulation): ``None`` = available, a string = reason."""
    _PROBE_OVERRIDES[name] = result


def clear_probes() -> None:
    _PROBE_OVERRIDES.clear()
    for fn in _PROBES.values():
        fn.cache_clear()  # type: ignore[attr-defined]


def import_reason(module: str, *, attr: str | None = None, what: str | None = None) -> str | None:
    """Import ``module`` (and check ``attr`` on it); ``None`` or the failure as a reason. One
    such import at a time in the process (``_PROBE_LOCK``)."""
    with _PROBE_LOCK:
        return _import_reason(module, attr, what)


def _not_installed(module: str, what: str | None) -> str | None:
    """``module``'s top package not installed, as a reason (None: it is); imports nothing."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return f"{what or module}: module {module.split('.')[0]} is not installed"
    return None


def _import_reason(module: str, attr: str | None, what: str | None) -> str | None:
    label = what or module
    missing = _not_installed(module, what)
    if missing is not None:
        return missing
    try:
        mod = importlib.import_module(module)
    except Exception as exc:
        return f"{label}: import {module} failed: {type(exc).__name__}: {exc}"
    if attr is not None and not hasattr(mod, attr):
        return f"{label}: {module} has no attribute {attr} (a different package with the same name?)"
    return None


def _interpreting() -> bool:
    # Triton's own switch, read where Triton reads it: it fixes, per process and at the time a
    # kernel is decorated, whether kernels are compiled or interpreted on the host.
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Both Triton probes name a Triton that is not installed before the interpreter switch: without Triton the switch
# changes nothing, and a user told only to set it would meet the missing module next. Only where the switch lets
# Triton run is it imported: a CPU process that does not interpret loads no Triton (tests/package/test_architecture.py).
@register_probe("triton")
def _probe_triton() -> str | None:
    """Compiled Triton kernels: Triton importable and the process not in interpreter mode."""
    missing = _not_installed("triton", "Triton")
    if missing is None and _interpreting():
        return "TRITON_INTERPRET=1 is set: this process runs Triton kernels in the host interpreter, not compiled"
    return missing or import_reason("triton", attr="jit", what="Triton")


@register_probe("triton_interpreter")
def _probe_triton_interpreter() -> str | None:
    """Triton kernels on a CPU: Triton importable and the process started with TRITON_INTERPRET=1."""
    missing = _not_installed("triton", "Triton")
    if missing is None and not _interpreting():
        return ("Triton kernels run on a CPU only in Triton's interpreter: start the process with "
                "TRITON_INTERPRET=1 (Triton reads it when a kernel is decorated)")
    return missing or import_reason("triton", attr="jit", what="Triton")


# ---------------------------------------------------------------------------------------
# variants
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One implementation of one op, declared as data.

    ``platforms``: where it runs (:data:`ANY_PLATFORM`: everywhere; empty: on the platforms
    that register it in their ``Platform.variants``, which dispatch fills in);
    ``archs``: explicit allowed archs (None: any arch of ``platforms``);
    ``min_capability``/``max_capability``: CUDA compute-capability range (inclusive);
    ``dtypes``: data dtypes it takes (checked per call on the op's first tensor; None: any);
    ``index_layout``: the layout its vendor kernel reads (attention variants);
    ``clamps_window``: reads SWA KV only through the pack's clamped indices (attention);
    ``requires``: probe names; ``input_check``: ``"module:attr"`` returning per-call
    reasons (e.g. "fewer than 1024 queries"), making dispatch fall through to the next
    variant; ``emulated_on``: platforms where it runs emulated (Triton's interpreter on a
    CPU), allowed only when asked for by name (``prefer``); ``emulated_requires``: the
    probes checked instead of ``requires`` when it runs emulated (None: ``requires``; e.g.
    Triton kernels for triton-ascend need triton-ascend on an NPU but only Triton's
    interpreter on a CPU); ``warmup``: ``"module:attr"`` called by ``Backend.warmup()`` to
    compile what the serving path launches; ``gated``: its implementation takes ``gate=``, the
    device flag of the op's value checks run on the device (``OpSpec.gate``): a validated call
    launches it right behind them instead of waiting for their read (it computes nothing when
    the flag is set, and dispatch raises the host checks' ``ValueError``). ``self_checked``:
    ``"module:attr"`` of the implementation's validated form, which a validated call runs first,
    as ``form(home, *args, **kwargs)`` (``home``: the backend's device, ``dispatch.home_device``;
    None for the host and fake devices, which take any): the form runs the op's quick host checks
    (``OpSpec.quick_check``) first and declines a call they do not pass (or that raises in them) or
    whose tensors are not on ``home`` (dispatch's home check, run then, names it); its kernel then
    tests every value condition of the op's validator itself before it writes, writes nothing when
    one fails, and the form returns ``(result, Verdict)`` (:mod:`swa_backends.kernels._verdict`);
    or ``None`` for a call it does not take (a strided view, sizes past its limits), which dispatch
    then validates as usual.

    ``kv_formats`` (ops of :data:`KV_FORMAT_OPS`): the ``kv_format`` values it reads, an entry
    ``"v4_fp8"`` for every FP8 flavour of the format or ``"v4_fp8/e4m3fn"`` for one; ``None``:
    ``"rows"`` only; ``"*"``: every format the op defines, now and later (the op's torch
    reference, which implements the whole contract). A call in another format gets a per-call reason ("reads KV
    rows only ...") and dispatch runs the next variant. A call passing one of the op's
    keywords that the implementation does not take (one written before them) gets a reason too.
    """

    op: str
    name: str
    impl: str
    platforms: tuple[str, ...] = ()
    archs: tuple[str, ...] | None = None
    min_capability: tuple[int, int] | None = None
    max_capability: tuple[int, int] | None = None
    dtypes: tuple[torch.dtype, ...] | None = None
    index_layout: str | None = None
    graph_safe: bool = True
    clamps_window: bool = True
    requires: tuple[str, ...] = ()
    input_check: str | None = None
    emulated_on: tuple[str, ...] = ()
    emulated_requires: tuple[str, ...] | None = None
    warmup: str | None = None
    kv_formats: tuple[str, ...] | str | None = None
    gated: bool = False
    self_checked: str | None = None
    description: str = ""
    _cache: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    @property
    def key(self) -> str:
        return f"{self.op}/{self.name}"

    def runs_on(self, platform: str) -> bool:
        """Whether its declaration names ``platform`` (emulation aside)."""
        return platform in self.platforms or self.platforms == ANY_PLATFORM

    def declared_reasons(self, device: DeviceInfo) -> list[str]:
        """Reasons from the declaration alone (platform, arch, capability): no imports."""
        reasons: list[str] = []
        if not self.runs_on(device.platform) and device.platform not in self.emulated_on:
            reasons.append(f"requires platform in {_fmt(self.platforms)}, device is {device.platform}")
            return reasons
        if device.platform in self.emulated_on:
            return reasons
        if self.archs is not None and device.arch not in self.archs:
            reasons.append(f"requires arch in {_fmt(self.archs)}, device has {device.arch}")
        if device.platform == "cuda" and (self.min_capability or self.max_capability):
            cap = device.capability
            if cap is None:
                reasons.append("requires a known CUDA compute capability, device has none")
            else:
                if self.min_capability and cap < self.min_capability:
                    reasons.append(f"requires capability >= {self.min_capability}, device has {cap} (too old)")
                if self.max_capability and cap > self.max_capability:
                    reasons.append(f"requires capability <= {self.max_capability}, device has {cap} (too new)")
        return reasons

    def not_supported_reasons(self, device: DeviceInfo, *, probes: bool = True) -> list[str]:
        """Every reason this variant cannot run on ``device`` (empty: it can). Probes of
        optional packages run only when the platform matches, so no foreign vendor
        package is ever imported."""
        reasons = self.declared_reasons(device)
        if reasons or not probes:
            return reasons
        requires = self.requires
        if device.platform in self.emulated_on and self.emulated_requires is not None:
            requires = self.emulated_requires
        for req in requires:
            why = probe(req)
            if why:
                reasons.append(why)
        return reasons

    def input_reasons(self, args: tuple, kwargs: dict) -> list[str]:
        """Per-call reasons (the KV format, keywords its implementation does not take, dtype
        of the data argument, the variant's own input check)."""
        reasons: list[str] = []
        if self.op in KV_FORMAT_OPS:
            why = self._format_reason(kwargs) or self._keyword_reason(kwargs)
            if why:  # the input check may not understand the call: stop here
                return [why]
        if self.dtypes is not None and args and isinstance(args[0], torch.Tensor) and args[0].dtype not in self.dtypes:
            reasons.append(f"requires dtype in {_fmt(self.dtypes)}, input has {args[0].dtype}")
        if self.input_check is not None:
            check = load_attr(self.input_check)
            reasons.extend(check(*args, **_accepted(check, kwargs)))
        return reasons

    @property
    def reads_every_kv_format(self) -> bool:
        return self.op in KV_FORMAT_OPS and self.kv_formats == "*"

    def _format_reason(self, kwargs: dict) -> str | None:
        fmt = kwargs.get("kv_format", "rows")
        if self.reads_every_kv_format:
            return None
        declared = self.kv_formats if self.kv_formats is not None else ("rows",)
        if fmt in declared or f"{fmt}/{kwargs.get('fp8')}" in declared:
            return None
        shown = f"{fmt}/{kwargs['fp8']}" if kwargs.get("fp8") is not None else fmt
        if declared == ("rows",):
            return f"reads KV rows only (kv_format='rows'), the call has kv_format={shown!r}"
        return f"reads kv_format in {_fmt(declared)}, the call has {shown!r}"

    def _keyword_reason(self, kwargs: dict) -> str | None:
        passed = [k for k in KV_FORMAT_OPS[self.op] if k in kwargs]
        if not passed:
            return None
        missing = [k for k in passed if not _takes(self.load(), k)]
        if missing:
            return (f"its implementation {self.impl} takes no {', '.join(missing)} keyword (written before "
                    f"{self.op} had it)")
        return None

    @property
    def per_call(self) -> bool:
        """Whether dispatch must check inputs before picking this variant."""
        return (self.dtypes is not None or self.input_check is not None
                or (self.op in KV_FORMAT_OPS and not self.reads_every_kv_format))

    def load(self) -> Callable:
        """Import and return the implementation (cached)."""
        fn = self._cache.get("impl")
        if fn is None:
            fn = self._cache["impl"] = load_attr(self.impl)
        return fn


@functools.lru_cache(maxsize=None)
def _keywords(fn: Callable) -> frozenset | None:
    """The keyword names ``fn`` takes (None: any, or unknown)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def _takes(fn: Callable, name: str) -> bool:
    """Whether ``fn`` takes the keyword ``name``."""
    names = _keywords(fn)
    return names is None or name in names


def _accepted(fn: Callable, kwargs: dict) -> dict:
    """``kwargs`` without the keywords ``fn`` does not take (input checks written before an
    op gained keywords see the call as they knew it)."""
    if all(_takes(fn, k) for k in kwargs):
        return kwargs
    return {k: v for k, v in kwargs.items() if _takes(fn, k)}


def load_attr(path: str):
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _fmt(values: Iterable) -> str:
    return "(" + ", ".join(str(v).replace("torch.", "") for v in values) + ")"
