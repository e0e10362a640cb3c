"""Selection: per device, the best variant of every op, and the replay decision.

The one dispatch of the pack. ``select(device)`` -> :class:`Backend` (every op as a typed
method, ``.capabilities``, ``.explain()``); ``capabilities(device, *, config=None)`` ->
:class:`Capabilities`; ``explain(device)`` -> :class:`Explanation` (every variant of every op
with its reasons). Everything it reads is declared: the ops (``swa_backends.common.ops.OPS``,
each with its torch reference, a variant on every platform) and the platforms
(:class:`~swa_backends.common.platforms.Platform`, one per ``swa_backends.backends.<platform>``:
the variants it registers, portable kernels included, one priority list per op, the per-call
exceptions to it, its input checks). The first variant with no reasons wins; matrix.yaml
narrows. A variant whose kernel fails to build raises
:class:`~swa_backends.common.errors.KernelUnavailable` before it writes anything, and the call
runs the next variant. A failure of the whole variant (it cannot build at all here) is
remembered: the variant is skipped from then on and the failure becomes its reason in
``explain()`` for the rest of the process. A failure of one specialisation (these shapes, this
dtype) only sends calls like it on, with a warning, and is not shown by ``explain()``. An
unknown device falls back to the reference with a reason.
"""

from __future__ import annotations

import contextlib
import functools
import os
import textwrap
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

import torch

from .common import matrix as _matrix
from .common.config import ServingConfig
from .common.device import HOST, DeviceInfo, current_index, resolve_device
from .common.errors import KernelUnavailable, SelectionError
from .common.matrix import Matrix, Row
from .common.ops import HOST_OPS, OPS, Ops
from .common.platforms import Platform, get_platform, platforms
from .common.registry import KV_FORMAT_OPS, Variant, declarations_version, load_attr
from .common.validation import _env_default as _validation_default
from .common.validation import _state as _validation_state
from .common.validation import (Reduced, fail, one_read, run_held, validation_enabled, value_checks_enabled,
                                values_on_device)

# ---------------------------------------------------------------------------------------
# the declarations: every op's reference and every platform's variants
# ---------------------------------------------------------------------------------------


def all_variants() -> dict[str, dict[str, Variant]]:
    """``{op: {variant name: Variant}}``: every op's reference, then what every platform
    registers (no vendor import). A variant declaring no ``platforms`` runs on those that
    register it."""
    return _variant_table(declarations_version())


@functools.lru_cache(maxsize=4)
def _variant_table(version: int) -> dict[str, dict[str, Variant]]:
    registered: dict[int, list[str]] = {}
    found: dict[int, Variant] = {}
    for spec in OPS.values():
        found[id(spec.reference_variant)] = spec.reference_variant
    for p in platforms().values():
        for v in p.variants:
            if v.platforms and not v.runs_on(p.name):
                raise RuntimeError(f"platform {p.name} registers variant {v.key}, which declares platforms "
                                   f"{v.platforms}")
            found.setdefault(id(v), v)
            registered.setdefault(id(v), []).append(p.name)
    table: dict[str, dict[str, Variant]] = {}
    for key, v in found.items():
        if not v.platforms:
            v = replace(v, platforms=tuple(registered[key]))
        ops = table.setdefault(v.op, {})
        if v.name in ops:
            raise RuntimeError(f"variant {v.key} declared twice")
        ops[v.name] = v
    return table


def platform_of(name: str) -> Platform:
    """The registered platform ``name`` (``ValueError`` naming the registered ones)."""
    p = get_platform(name)
    if p is None:
        fail("dispatch", "platform", name, f"a registered platform, one of {sorted(platforms())}")
    return p


def priority(platform: str, op: str) -> tuple[str, ...]:
    """The platform's priority list for ``op`` (``"*"`` entry as the default)."""
    return platform_of(platform).order(op)


def ahead_rules(device: DeviceInfo, op: str,
                chain: tuple[Variant, ...]) -> tuple[tuple[Variant, str, str, tuple[str, ...] | None], ...]:
    """The per-call exceptions to the priority of ``device``'s platform (``Platform.ahead``) that
    apply to ``chain`` on its arch: ``(variant, name of the variant it runs before, "module:attr"
    predicate, the archs the rule is limited to or None)`` where both are in the chain, the first
    after the second."""
    p = get_platform(device.platform)
    names = [v.name for v in chain]
    return tuple((chain[names.index(r.variant)], r.before, r.when, r.archs)
                 for r in (p.ahead.get(op, ()) if p else ())
                 if r.applies_on(device.arch) and r.variant in names and r.before in names
                 and names.index(r.variant) > names.index(r.before))


def platform_input_check(platform: str, op: str) -> str | None:
    """The platform's own input check for ``op`` (``Platform.input_checks``), if any: a
    ``"module:attr"`` called as ``check(device, *args, **kwargs)`` that raises ``ValueError``
    for inputs valid in general but not on this platform/arch (e.g. the FP8 flavour a ROCm
    arch stores). Runs with the op's validation, before any variant is called."""
    p = get_platform(platform)
    return p.input_checks.get(op) if p else None


def platform_value_reader(platform: str) -> str | None:
    """How a validated call on the platform's device reads its value checks
    (``Platform.value_reader``), None: torch's reductions and one copy."""
    p = get_platform(platform)
    return p.value_reader if p else None


def _value_reader(device: DeviceInfo):
    """The reader a backend's validated calls hand :func:`~swa_backends.common.validation.one_read`:
    the platform's, loaded on first use; one that fails to load or to read leaves torch's way with
    one warning (a validated call never fails for it) and keeps why in ``read.failure``."""
    path = _reader_path(device)
    if path is None:
        return None
    fn = None

    def read(items):
        nonlocal fn
        if fn is False:
            return None
        try:
            if fn is None:
                fn = load_attr(path)
            return fn(items)
        except Exception as exc:  # a vendor failure (Triton missing, a compile error): torch's way from now on
            fn = False
            read.failure = f"value reader {path} failed ({type(exc).__name__}: {exc})"
            warnings.warn(f"validation on {device}: {read.failure}; reading value checks with torch from now on",
                          RuntimeWarning, stacklevel=2)
            return None

    read.failure = None
    return read


def variant(op: str, name: str) -> Variant | None:
    return all_variants().get(op, {}).get(name)


def load_matrix(path: str | os.PathLike | None = None) -> Matrix:
    """``path`` or the ``matrix.yaml`` shipped inside the package (cached), checked against
    every declared variant."""
    return _matrix.load_matrix(path, all_variants())


@dataclass(frozen=True)
class SideDecision:
    """``enabled``; ``reasons`` it is off (empty when on); ``notes``: why it is safe."""

    enabled: bool
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    device: DeviceInfo
    row: str | None
    encoder_replay: SideDecision
    decoder_replay: SideDecision
    fallback: str | None = None

    def as_dict(self) -> dict:
        side = lambda d: {"enabled": d.enabled, "reasons": list(d.reasons), "notes": list(d.notes)}  # noqa: E731
        return {"device": _device_dict(self.device), "row": self.row, "fallback": self.fallback,
                "encoder_replay": side(self.encoder_replay), "decoder_replay": side(self.decoder_replay)}

    def __str__(self) -> str:
        """The decision as ``swa-backends info`` prints it (device, row, both sides with
        every reason, wrapped)."""
        return "\n".join(_capability_lines(self, _Style(False)))

    def __repr__(self) -> str:
        return (f"<Capabilities {self.device.spec}: encoder replay {_on_off(self.encoder_replay.enabled)}, "
                f"decoder replay {_on_off(self.decoder_replay.enabled)}; print() it for the reasons>")


@dataclass(frozen=True)
class Candidate:
    """One row of :func:`explain`'s table."""

    op: str
    variant: str
    status: str  # chosen | per-call | eligible | rejected
    reasons: tuple[str, ...]
    verified: str | None
    graph_safe: bool
    index_layout: str | None
    #: the per-call exceptions to the chain's order under which this variant runs before another
    #: (``Platform.ahead``)
    ahead: tuple[str, ...] = ()
    #: what a call must satisfy for this variant to take it (a per-call variant: its dtypes, KV
    #: formats, its own input check); a call that does not runs the next variant of the chain
    checks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Explanation:
    device: DeviceInfo
    capabilities: Capabilities
    chosen: Mapping[str, tuple[str, ...]]
    table: tuple[Candidate, ...]
    #: op -> the platform's own input check (``Platform.input_checks``), run with the op's validation
    input_checks: Mapping[str, str] = field(default_factory=dict)
    #: how validated calls read their value checks on this device (``Platform.value_reader``)
    value_reader: str | None = None
    #: the torch device validated calls require their tensors on (:func:`home_device`; None: any)
    home: str | None = None
    #: False: the backend's ops never validate (``select(checked=False)``); True: they validate while
    #: the thread's validation switch is on
    checked: bool = True

    def as_dict(self) -> dict:
        return {
            "capabilities": self.capabilities.as_dict(),
            "chosen": {op: list(names) for op, names in self.chosen.items()},
            "table": [c.__dict__ | {"reasons": list(c.reasons), "ahead": list(c.ahead), "checks": list(c.checks)}
                      for c in self.table],
            "input_checks": dict(self.input_checks),
            "value_reader": self.value_reader,
            "home": self.home,
            "checked": self.checked,
        }

    def __str__(self) -> str:
        """The table ``swa-backends info --all`` prints (:func:`format_explanation`)."""
        return format_explanation(self)

    def __repr__(self) -> str:
        caps = self.capabilities
        return (f"<Explanation {self.device.spec}: encoder replay {_on_off(caps.encoder_replay.enabled)}, "
                f"decoder replay {_on_off(caps.decoder_replay.enabled)}, {len(self.chosen)} ops; "
                "print() it for the table>")


def _device_dict(d: DeviceInfo) -> dict:
    return {"platform": d.platform, "arch": d.arch, "name": d.name, "torch_device": d.torch_device,
            "capability": list(d.capability) if d.capability else None, "fake": d.fake,
            "problems": list(d.problems)}


# ---------------------------------------------------------------------------------------
# rendering: the one text form of a decision (str(), ``swa-backends info``)
# ---------------------------------------------------------------------------------------

#: Text width of a rendered decision: reasons wrap under their bullet.
WIDTH = 100


class _Style:
    """ANSI colour when enabled (the CLI on a terminal), plain text otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.enabled else text


def _on_off(enabled: bool) -> str:
    return "ON" if enabled else "OFF"


def _bullets(items, indent: int, mark: str = "- ") -> list[str]:
    """Each item as a bullet wrapped at :data:`WIDTH`, continuation lines under its text.
    Long words (module paths, device specs) are never broken."""
    lead = " " * indent + mark
    return [textwrap.fill(" ".join(str(item).split()), WIDTH, initial_indent=lead,
                          subsequent_indent=" " * len(lead), break_long_words=False, break_on_hyphens=False)
            for item in items]


def _capability_lines(caps: Capabilities, style: _Style, emulated: str | None = None) -> list[str]:
    lines = [f"device:        {caps.device}", f"matrix row:    {caps.row or '(none)'}"]
    if emulated:
        lines += _bullets([emulated], 0, "emulated:      ")
    if caps.fallback:
        lines += _bullets([caps.fallback], 0, "fallback:      ")
    for problem in caps.device.problems:
        lines += _bullets([problem], 0, "device note:   ")
    for label, d in (("encoder replay", caps.encoder_replay), ("decoder replay", caps.decoder_replay)):
        lines.append(f"{label}: " + (style("ON", "1;32") if d.enabled else style("OFF", "1;31")))
        lines += _bullets(d.reasons if not d.enabled else d.notes, 4)
    return lines


def _table(rows: list[tuple[str, ...]], style: _Style) -> list[str]:
    """Aligned columns (widths from the plain text; colour codes added after padding)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        cells = [x.ljust(w) for x, w in zip(r, widths)]
        if n == 0:
            cells = [style(c, "1") for c in cells]
        else:
            status = {"hardware": "32", "emulated": "33", "not-run": "2"}.get(r[2].split(" ")[0])
            if status:
                cells[2] = style(cells[2], status)
        out.append("  ".join(cells).rstrip())
    return out


#: How a faked device shows a row's "hardware": the row's record, not this run's.
ROW_CLAIM = " (row)"


def format_explanation(e: Explanation, *, full: bool = True, emulated: str | None = None,
                       colour: bool = False) -> str:
    """The decision and the variant per op as a table; ``full``: every variant of every op
    with its reasons (``info --all``); ``emulated``: a note saying what was emulated.

    The *verified* column is what matrix.yaml records for the device's row. On a faked
    device nothing ran here, so a row's "hardware" reads as the row's claim."""
    style = _Style(colour)
    lines = _capability_lines(e.capabilities, style, emulated)
    lines.append("")
    fake = e.device.fake
    rows = [("op", "variant", "verified", "graph-safe", "layout")]
    by = {(c.op, c.variant): c for c in e.table}
    claimed = False
    for op, names in e.chosen.items():
        for i, name in enumerate(names):
            c = by[(op, name)]
            label = name if len(names) == 1 else f"{name} ({'per-call' if i < len(names) - 1 else 'else'})"
            verified = c.verified or "-"
            if fake and verified == "hardware":
                verified += ROW_CLAIM
                claimed = True
            rows.append((op if i == 0 else "", label, verified, "yes" if c.graph_safe else "no", c.index_layout or "-"))
    lines += _table(rows, style)
    if claimed:
        lines.append("")
        lines += _bullets([f"hardware{ROW_CLAIM}: matrix.yaml records the row as verified on hardware; this "
                           "device is faked, so nothing ran on it here"], 0, "note: ")
    if full:
        if e.input_checks:
            lines.append("")
            lines.append("input checks (the platform's own, run with the op's validation):")
            lines += _bullets([f"{op}: {check}" for op, check in e.input_checks.items()], 2)
        lines.append("")
        lines.append("validated calls (their devices and how their value checks are read):")
        lines += _bullets(["validation: on while the thread's switch is on (set_validation, SWA_BACKENDS_VALIDATE)"
                           if e.checked else "validation: never: this backend's ops validate nothing "
                           "(select(checked=False)), whatever the switch says"], 2)
        lines += _bullets([f"read by: {e.value_reader} (one device pass and one copy; torch's reductions where it "
                           "declines a read)" if e.value_reader else "read by: torch's reductions and one copy"], 2)
        lines += _bullets([f"tensors on: {e.home} (one tensor of a call compared with it first, the others with that "
                           "one; the call runs with it as the current device)" if e.home
                           else "tensors on: any one device (each compared with one of the call's)"], 2)
        lines.append("")
        lines.append("every variant:")
        colours = {"chosen": "32", "per-call": "36", "rejected": "2"}
        for c in e.table:
            lines.append(f"  {c.op:<24} {c.variant:<18} " + style(c.status, colours.get(c.status, "0")))
            lines += _bullets(c.reasons, 6)
            lines += _bullets(c.ahead, 6, "+ ")
            lines += _bullets(c.checks, 6, "+ ")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------------------


def _normalise_prefer(prefer, where: str = "select") -> dict[str, str] | str | None:
    if prefer is None:
        return None
    declared = all_variants()
    if isinstance(prefer, str):
        if not any(prefer in names for names in declared.values()):
            known = sorted({n for names in declared.values() for n in names})
            fail(where, "prefer", prefer, f"a declared variant name, one of {known}")
        return prefer
    if isinstance(prefer, Mapping):
        for op, name in prefer.items():
            if op not in OPS:
                fail(where, "prefer", dict(prefer), f"op names from {sorted(OPS)}")
            if not isinstance(name, str) or name not in declared.get(op, {}):
                fail(where, f"prefer[{op!r}]", name, f"one of {sorted(declared.get(op, {}))}")
        return dict(prefer)
    fail(where, "prefer", prefer, "None, a variant name, or a mapping op -> variant name")
    return None


def _plan(device: DeviceInfo, matrix: Matrix, prefer,
          where: str = "select") -> tuple[Row | None, str | None, dict, list[Candidate]]:
    row = matrix.row_for(device)
    fallback = None
    if row is None:
        fallback = (f"no row for {device.platform}:{device.arch} in {matrix.source}; "
                    "using the reference backend (correct everywhere, not fast)")
    prefer = _normalise_prefer(prefer, where)
    chains: dict[str, tuple[Variant, ...]] = {}
    table: list[Candidate] = []
    for op in OPS:
        declared = all_variants().get(op, {})
        names = ("reference",) if row is None else tuple(n for n in priority(device.platform, op) if n in declared)
        wanted = prefer.get(op) if isinstance(prefer, dict) else (prefer if prefer in declared else None)
        if wanted is not None and wanted not in names:
            names = (wanted, *names)
        assessed: list[tuple[Variant, list[str]]] = []
        for name in names:
            v = declared[name]
            reasons = v.not_supported_reasons(device)
            if row is not None and name not in row.allowed(op):
                reasons.append(f"matrix.yaml row {row.id} does not list it for {op}")
            elif row is None and name != "reference":  # (a preferred one: what the fallback says runs, runs)
                reasons.append(f"no matrix.yaml row for {device.platform}:{device.arch}: only the reference runs there")
            if device.platform in v.emulated_on and name != wanted:
                reasons.append(f"runs emulated on {device.platform} (interpreter): only with prefer={name!r}")
            assessed.append((v, reasons))
        if wanted is not None:
            # a forced variant is the whole chain: a call it cannot take raises with its reasons
            v, reasons = next(a for a in assessed if a[0].name == wanted)
            if reasons:
                raise SelectionError(f"{op}: prefer={wanted!r} cannot run on {device}", {wanted: reasons})
            assessed = [(v, reasons)] + [(o, [*r, f"not chosen: prefer={wanted!r} forces {wanted}"])
                                         for o, r in assessed if o is not v]
        chain: list[Variant] = []
        for v, reasons in assessed:
            if not reasons and (not chain or chain[-1].per_call):
                chain.append(v)
        if not chain:
            raise SelectionError(f"{op}: no variant can run on {device}", {v.name: r for v, r in assessed})
        chains[op] = tuple(chain)
        ahead: dict[str, list[str]] = {}
        for first, over, pred, archs in ahead_rules(device, op, chains[op]):  # the rules Backend applies
            doc = " ".join((load_attr(pred).__doc__ or "").strip().split("\n\n")[0].split())
            only = f", on {' and '.join(archs)} only," if archs else ""
            ahead.setdefault(first.name, []).append(
                f"runs before {over}{only} for a call where {pred} gives a reason ({doc})")
        own_check = platform_input_check(device.platform, op) is not None
        for v, reasons in assessed:
            in_chain = any(v is c for c in chain)
            if in_chain:
                status = "chosen" if v is chain[-1] else "per-call"
            else:
                status = "rejected" if reasons else "eligible"
            # the path Backend._make takes for it: one variant that is not per-call, or a chain
            # (a variant not in the chain: the path it would take chosen alone)
            alone = _direct(chain) if in_chain else not v.per_call
            table.append(Candidate(op, v.name, status, tuple(reasons), row.status(v.name) if row else None,
                                   v.graph_safe, v.index_layout, tuple(ahead.get(v.name, ())),
                                   _checks(v, alone, own_check)))
    return row, fallback, chains, table


def capture_query(device) -> Callable[[], bool]:
    """What a validated call asks before it takes the self-checked path: is a graph being captured
    (no value is read then)? Validation's own answer, asked of the device's stream API directly on
    a CUDA device (``torch.cuda.is_available()``, which ``value_checks_enabled`` asks too, costs
    more): torch's C query, or its Python wrapper where a torch lacks it. On an NVIDIA GPU the
    current stream's handle comes first: CUDA never captures the legacy default stream (handle 0,
    torch's default stream), so a call on it is answered without the query, which asks the driver
    twice (its primary context, then the stream's capture state)."""
    if device.runnable and str(device.torch_device).startswith("cuda") and torch.cuda.is_available():
        query = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None or torch.version.hip is not None:  # (HIP's rule for its null stream: not relied on)
            return query
        return lambda: raw(-1) != 0 and query()  # (-1: the current device's current stream)
    return lambda: _validation_state.capturing is True


def home_device(device: DeviceInfo) -> torch.device | None:
    """Where a validated call on ``device``'s backend requires its tensors: a real accelerator's
    torch device (its kernels take addresses in its memory: a host tensor's, or another GPU's, is
    memory outside their tensors); None for the host (the reference and the interpreter run on any
    tensor) and for a fake device (the CPU suite runs host tensors through a faked accelerator's
    variants under the interpreter)."""
    if not device.runnable or device.torch_device == "cpu":
        return None
    return torch.device(device.torch_device)


def _home_check(spec, home: torch.device | None):
    """``check(args, kwargs)``: raises ``ValueError`` when the call's anchor tensor
    (``OpSpec.anchor``) is not on ``home``; the validator compares every other tensor with one of the
    call's. None where nothing is required (:func:`home_device`)."""
    if home is None:
        return None
    op = spec.name
    pos, name = spec.anchor_at

    def check(args: tuple, kwargs: dict) -> None:
        t = args[pos] if len(args) > pos else kwargs.get(name)
        if isinstance(t, torch.Tensor) and t.device != home:  # (not a tensor: the validator says so)
            fail(op, name, t, f"a tensor on {home}, the backend's device (every tensor argument on it)")

    return check


def _device_switch(home: torch.device | None):
    """Where a validated call must run on the backend's GPU whatever the thread's current device:
    ``(reader of the current device's index, the backend's index)``; None where it cannot differ or
    does not matter. Triton (and so every Triton and Gluon kernel of the pack, and the value reader)
    launches on the *current* CUDA device, not on its tensors': a ``select("cuda:1")`` backend called
    from a thread whose current device is cuda:0 would launch there with cuda:1's addresses. torch's
    ops and FlashMLA follow their tensors; a validated call does too, by switching to the backend's
    device for the call (``torch.cuda.device``). A process that sees one GPU has no other current
    device, so it pays no read. (Validation off: the caller keeps the current device the backend's,
    README's contract.)"""
    if home is None or home.type != "cuda" or home.index is None or torch.cuda.device_count() < 2:
        return None
    return getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device), home.index


def _raise_checked(op: str, validate, args: tuple, kwargs: dict) -> None:
    """A call whose device value check failed: the host checks raise its ``ValueError``."""
    validate(*args, **kwargs)
    raise ValueError(f"{op}: a value check on the device failed and the same check on the host passed: an input "
                     "changed during the call (written by another stream or thread?)")


def _direct(chain) -> bool:
    """The path :meth:`Backend._make` takes for an op: a chain of one variant that is not per-call is
    called directly (its validated calls may take the self-checked form; no gate), any other through
    the per-call pick (:meth:`Backend._pick`). ``explain()`` shows each variant by the same rule."""
    return len(chain) == 1 and not chain[0].per_call


def _checks(v: Variant, alone: bool, own_check: bool) -> tuple[str, ...]:
    """What a call must satisfy for a per-call variant to take it (``Variant.input_reasons``), and
    how the variant's validated calls check their values when not on the host. ``alone``: it is
    dispatched as the op's only variant (not per-call, no other in its chain), where the self-checked
    form may run and no gate does; ``own_check``: the platform has an input check for the op, which the
    quick host checks do not hold, so its validated calls never take the self-checked form."""
    lines = []
    if v.per_call:
        parts = []
        if v.op in KV_FORMAT_OPS and not v.reads_every_kv_format:
            formats = v.kv_formats if v.kv_formats is not None else ("rows",)
            parts.append(f"kv_format in ({', '.join(formats)})")
        if v.dtypes is not None:
            parts.append("data dtype in (" + ", ".join(str(d).replace("torch.", "") for d in v.dtypes) + ")")
        if v.input_check is not None:
            parts.append(f"{v.input_check} gives no reason")
        lines.append("takes a call where " + "; ".join(parts))
    if v.gated and OPS[v.op].gate and not alone:
        lines.append(f"validated calls: the value checks run on the device ({OPS[v.op].gate}) and it is "
                     "launched behind them, gated on their flag, with no wait between")
    if v.self_checked and OPS[v.op].quick_check and alone and not own_check:
        lines.append(f"validated calls that pass the quick host checks: its own kernel tests the values "
                     f"({v.self_checked}) and writes nothing when one fails; the host waits for that verdict")
    return tuple(lines)


def _input_checks(device: DeviceInfo) -> dict[str, str]:
    return {op: check for op in OPS if (check := platform_input_check(device.platform, op)) is not None}


def _reader_path(device: DeviceInfo) -> str | None:
    """The value reader a backend for ``device`` loads: the platform's, on a device that is here (a
    fake device's calls run on the host, read by torch, as :func:`home_device` asks no device of them)."""
    return platform_value_reader(device.platform) if device.runnable else None


def _decide(device: DeviceInfo, config: ServingConfig, matrix: Matrix, row: Row | None, fallback: str | None,
            chains: Mapping[str, tuple[Variant, ...]]) -> Capabilities:
    values = dict(config.fields_for_rules(), platform=device.platform, arch=device.arch)
    sides: dict[str, SideDecision] = {}
    for side in ("encoder_replay", "decoder_replay"):
        reasons: list[str] = []
        notes: list[str] = []
        if row is not None:
            gate = row.gates[side]
            (notes if gate.enabled else reasons).append(f"[matrix:{row.id}] {gate.text}")
        elif side == "encoder_replay":
            notes.append(f"[fallback] {fallback}")
        if side == "encoder_replay":
            attention = chains["sparse_mla"]
            unclamped = [v for v in attention if not v.clamps_window]
            for v in unclamped:
                reasons.append(f"[clamp] attention path {v.key} reads its window without the replay-start clamp")
            if not unclamped:
                notes.append("[clamp] attention reads only the pack's clamped indices: "
                             + ", ".join(f"{v.key} ({v.index_layout} layout)" for v in attention))
        else:
            enc = sides["encoder_replay"]
            if not enc.enabled:
                reasons.append("[needs-encoder] decoder replay requires encoder replay, which is off")
        for rule in matrix.rules[side]:
            if rule.applies(values):
                reasons.append(rule.text(values))
        sides[side] = SideDecision(not reasons, tuple(reasons), tuple(notes) if not reasons else ())
    return Capabilities(device, row.id if row else None, sides["encoder_replay"], sides["decoder_replay"], fallback)


def _inputs(device, config, matrix, where: str) -> tuple[DeviceInfo, ServingConfig, Matrix]:
    """The device, config and matrix of one call of ``where`` (select, explain, capabilities: the
    function its errors name)."""
    info = resolve_device(device)
    if config is None:
        config = ServingConfig()
    elif isinstance(config, Mapping):
        config = ServingConfig.from_mapping(config, where)
    elif not isinstance(config, ServingConfig):
        fail(where, "config", config, "None, a ServingConfig or a mapping of its fields")
    if matrix is None or isinstance(matrix, (str, os.PathLike)):
        matrix = load_matrix(matrix)
    elif not isinstance(matrix, Matrix):
        fail(where, "matrix", matrix, "None, a path to a matrix YAML file, or a Matrix")
    return info, config, matrix


def capabilities(device=None, config=None, *, matrix=None) -> Capabilities:
    """Encoder and decoder replay on/off for ``device`` under ``config``, with reasons
    (``capabilities(device, config)``, as SPEC §4 writes it; ``config`` by keyword too)."""
    info, config, matrix = _inputs(device, config, matrix, "capabilities")
    row, fallback, chains, _ = _plan(info, matrix, None)
    return _decide(info, config, matrix, row, fallback, chains)


def _explained(info: DeviceInfo, config, matrix: Matrix, prefer, where: str) -> tuple[dict, Explanation]:
    """The chains and the whole explanation of one decision (what :func:`explain` returns and a
    :class:`Backend` shows)."""
    row, fallback, chains, table = _plan(info, matrix, prefer, where)
    caps = _decide(info, config, matrix, row, fallback, chains)
    home = home_device(info)
    return chains, Explanation(info, caps, {op: tuple(v.name for v in c) for op, c in chains.items()}, tuple(table),
                               _input_checks(info), _reader_path(info), None if home is None else str(home))


def explain(device=None, *, config=None, prefer=None, matrix=None) -> Explanation:
    """The decision plus every variant of every op with its status and reasons."""
    info, config, matrix = _inputs(device, config, matrix, "explain")
    return _explained(info, config, matrix, prefer, "explain")[1]


def select(device=None, *, config=None, prefer=None, matrix=None, checked: bool = True) -> "Backend":
    """A :class:`Backend` for ``device`` (None: this process's accelerator, else CPU).

    ``prefer``: a variant name for every op that has it (``"triton"``), or a mapping
    ``op -> name``; a preferred variant that cannot run raises :class:`SelectionError`
    with its reasons. ``config``: a :class:`ServingConfig` (or its fields as a mapping)
    for ``.capabilities``. ``matrix``: a path (``str`` or ``os.PathLike``) or :class:`Matrix` instead
    of the shipped one.
    ``checked=False``: the device ops never validate, whatever the process's validation
    switch says (a serving engine's hot path whose inputs are its own, validated once in
    its tests; no per-call switch to read or flip). With the default they validate while
    the switch is on (:func:`~swa_backends.set_validation`).
    """
    if not isinstance(checked, bool):
        fail("select", "checked", checked, "a bool")
    info, config, matrix = _inputs(device, config, matrix, "select")
    chains, expl = _explained(info, config, matrix, prefer, "select")
    return Backend(info, chains, expl.capabilities, expl, checked=checked)


@functools.lru_cache(maxsize=None)
def _cached_backend(device: str, prefer: str | tuple[tuple[str, str], ...] | None, checked: bool) -> "Backend":
    return select(device, prefer=dict(prefer) if isinstance(prefer, tuple) else prefer, checked=checked)


def backend_for(device, *, prefer=None, checked: bool = True) -> "Backend":
    """``select(device, prefer=prefer, checked=checked)``, one per process and arguments: the
    backend of the tensors on a torch ``device`` (``"cuda"`` without an index is the current
    CUDA device, so it shares ``"cuda:N"``'s; ``"cpu:0"`` is the host's). ``prefer`` as
    :func:`select` takes it (a name, or a mapping op -> name). The custom ops and the vLLM
    integration take their backends from here; :func:`clear_backends` forgets them."""
    # the custom ops ask once per call: a device seen before (with its index, or the host), with a
    # name or no preference, is one dictionary read
    if checked is True or checked is False:  # (not 1 or 0: equal keys, which the check below refuses)
        try:
            be = _seen.get((device, prefer, checked))
        except TypeError:  # an unhashable argument: the checks below name it
            be = None
        if be is not None:
            return be
    if not isinstance(checked, bool):
        fail("backend_for", "checked", checked, "a bool")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError):  # torch's words for a name it does not know
        fail("backend_for", "device", device, "a torch device or its name ('cuda:0', 'cuda', 'npu:0', 'cpu')")
    if d.type == HOST:
        key = HOST  # one host: torch's cpu:0 is it (select() takes the torch.device, not the text "cpu:0")
    elif d.index is None:
        index = current_index(d.type)  # None: no such device here, and select() says why with a ValueError
        key = d.type if index is None else f"{d.type}:{index}"
    else:
        key = str(d)
    # the cache's key must be hashable: a mapping becomes its sorted items (validated first)
    named = _normalise_prefer(prefer, "backend_for")
    be = _cached_backend(key, tuple(sorted(named.items())) if isinstance(named, dict) else named, checked)
    if (d.type == HOST or d.index is not None) and (prefer is None or prefer.__class__ is str):
        _seen[(device, prefer, checked)] = be  # (not "cuda": its index is the current device's, read each call)
    return be


#: backend_for's answers by its own arguments (a device that names its index, or the host)
_seen: dict = {}


def clear_backends() -> None:
    """Forget the backends :func:`backend_for` made (after changing the matrix, a fake
    device, probes...)."""
    _cached_backend.cache_clear()
    _seen.clear()


# ---------------------------------------------------------------------------------------
# the backend object
# ---------------------------------------------------------------------------------------


if TYPE_CHECKING:
    _Declared = Ops
else:
    # Readers and type checkers see every op as a typed attribute of Backend (Ops: one line per
    # op, the reference's signature). At run time each op is an instance attribute set in
    # __init__ and the class has no attribute of that name: a name on the class, even a
    # shadowed one, keeps the interpreter's attribute loads off their fastest path.
    _Declared = object


class Backend(_Declared):
    """Every op of the pack for one device: device ops dispatch to the chosen variant
    (validated first unless validation is off), host ops are the shared implementations.
    Each op is declared with the reference's signature (:class:`~swa_backends.common.ops.Ops`);
    ``__init__`` prepares one callable per device op.

    ``.variants`` maps op -> chosen variant names (more than one: per-call dispatch, the
    first whose input check passes); ``.capabilities``; ``.explain()`` (the selection table,
    with any whole-variant build failure met since); ``.warmup(**shapes)``.
    """

    def __init__(self, device: DeviceInfo, chains: Mapping[str, tuple[Variant, ...]],
                 caps: Capabilities, explanation: Explanation, *, checked: bool = True):
        self.device = device
        #: False: the device ops never validate (``select(checked=False)``)
        self.checked = checked
        self.capabilities = caps
        self._chains = dict(chains)
        self._explanation = explanation if explanation.checked == checked else replace(explanation, checked=checked)
        #: op -> {variant name: reason}: variants that failed to build at all in this process (a
        #: failure of one specialisation is not recorded: it only sends calls like it on)
        self.failures: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        self.variants = {op: tuple(v.name for v in chain) for op, chain in chains.items()}
        #: what validated calls hand one_read to read their value checks (None: torch's way)
        self._reader = _value_reader(device)
        #: op -> {name: ((variant, "module:attr"), ...)}: variants run before ``name`` when the predicate
        #: gives a reason for the call (the platform's ``Ahead`` rules; explain() shows them)
        self._ahead: dict[str, dict[str, tuple]] = {}
        for op, chain in chains.items():
            for first, over, pred, _ in ahead_rules(device, op, chain):
                rules = self._ahead.setdefault(op, {})
                rules[over] = (*rules.get(over, ()), (first, pred))
        for op in OPS:
            setattr(self, op, self._make(op))
        for name, fn in HOST_OPS.items():
            setattr(self, name, fn)

    def __repr__(self) -> str:
        ops = ", ".join(f"{op}={'|'.join(n)}" for op, n in self.variants.items())
        return f"Backend({self.device}, " + ("" if self.checked else "unchecked, ") + ops + ")"

    def explain(self) -> Explanation:
        """The selection table; a variant that failed to build at all since (a whole-variant
        failure) is ``rejected`` with that failure as its reason, and a value reader that failed
        since is gone (validated calls read with torch from then on)."""
        e = self._explanation
        if self._reader is not None and self._reader.failure is not None:
            e = replace(e, value_reader=None)
        if not self.failures:
            return e
        table = []
        for c in e.table:
            why = self.failures.get(c.op, {}).get(c.variant)
            table.append(c if why is None else replace(c, status="rejected", reasons=(*c.reasons, why)))
        chosen = {op: tuple(n for n in names if n not in self.failures.get(op, {})) for op, names in e.chosen.items()}
        return replace(e, chosen=chosen, table=tuple(table))

    def variant_for(self, op: str, *args, **kwargs) -> str:
        """Name of the variant a call with these arguments would run."""
        return self._pick(op, args, kwargs).name

    def _pick(self, op: str, args: tuple, kwargs: dict, skip: tuple[str, ...] = ()) -> Variant:
        """The first variant of the chain that takes the call (``skip``: those that could not build it
        in this call), or a later one the platform runs before it for this call (its ``Ahead`` rules)."""
        chain = self._chains[op]
        failed = self.failures.get(op, {})
        ahead = self._ahead.get(op)
        reasons: dict[str, list[str]] = {}
        for v in chain:
            if v.name in skip:
                continue
            why = [failed[v.name]] if v.name in failed else (v.input_reasons(args, kwargs) if v.per_call else [])
            if why:
                reasons[v.name] = why
                continue
            for first, pred in (ahead.get(v.name, ()) if ahead else ()):
                if (first.name not in skip and first.name not in failed  # first is in the chain: ahead_rules
                        and load_attr(pred)(*args, **kwargs)
                        and not (first.input_reasons(args, kwargs) if first.per_call else [])):
                    return first
            return v
        raise SelectionError(f"{op}: no chosen variant accepts these inputs on {self.device}", reasons)

    def _failed(self, op: str, v: Variant, exc: KernelUnavailable) -> None:
        """A whole-variant failure is remembered (skipped from now on, shown by explain());
        a per-specialisation one only sends this call on (the kernel remembers its key)."""
        if not exc.whole_variant:
            warnings.warn(f"{op}: variant {v.name!r} on {self.device} cannot build this call ({exc}); running the "
                          "next variant for calls like it", RuntimeWarning, stacklevel=3)
            return
        why = f"failed to build in this process: {exc}"
        with self._lock:
            self.failures.setdefault(op, {})[v.name] = why
        warnings.warn(f"{op}: variant {v.name!r} on {self.device} {why}; running the next variant",
                      RuntimeWarning, stacklevel=3)

    def _make(self, op: str):
        spec = OPS[op]
        chain = self._chains[op]
        device = self.device
        check_path = platform_input_check(device.platform, op)
        platform_check = load_attr(check_path) if check_path is not None else None
        reader = self._reader
        home = home_device(device)
        on_home = _home_check(spec, home)
        switch = _device_switch(home)

        def validate(*args, **kwargs):
            # the value checks' one device read comes at the end of the block: the host work
            # before it (the checks of writes, the platform's check) overlaps the device's queue
            with one_read(reader):
                spec.validate(*args, **kwargs)
                spec.check_writes(args, kwargs)
                if platform_check is not None:
                    platform_check(device, *args, **kwargs)

        if _direct(chain) and not self.checked:
            only = chain[0]

            def call(*args, **kwargs):  # first call: load the variant, then it is the attribute itself
                impl = only.load()
                setattr(self, op, impl)
                return impl(*args, **kwargs)
        elif _direct(chain):
            only = chain[0]
            impl = None
            # a validated call: the variant's self-checked form runs the op's quick host checks and
            # its kernel tests the values itself (Variant.self_checked); the platform's own check is
            # not in them
            form = only.self_checked if self.checked and spec.quick_check and platform_check is None else None
            capturing = capture_query(device)
            self_checked = None

            def call(*args, **kwargs):  # the hot path: a thread-local read, then the variant
                nonlocal impl, self_checked
                enabled = _validation_state.enabled
                if enabled or (enabled is None and _validation_default()):
                    if switch is not None and switch[0]() != switch[1]:  # another GPU is current
                        with torch.cuda.device(switch[1]):
                            return call(*args, **kwargs)
                    if form is not None and not capturing():
                        if self_checked is None:
                            self_checked = load_attr(form)
                        # None: a call it does not take, one off the backend's device included (an
                        # empty **kwargs still costs the call a dict: only passed when there is one)
                        done = self_checked(home, *args, **kwargs) if kwargs else self_checked(home, *args)
                        if done is not None:
                            if not done[1].failed():
                                return done[0]
                            _raise_checked(op, validate, args, kwargs)  # it wrote nothing
                    if on_home is not None:
                        on_home(args, kwargs)
                    validate(*args, **kwargs)
                if impl is None:
                    impl = only.load()
                return impl(*args, **kwargs) if kwargs else impl(*args)
        else:
            checked = self.checked
            # a validated call picked for a gated variant does not wait for its value checks: they
            # run on the device (spec.gate) and the variant is launched behind them (Variant.gated)
            gate_fn = spec.gate if checked and spec.gate and any(v.gated for v in chain) else None

            def call(*args, **kwargs):
                tried: tuple[str, ...] = ()
                v = gate = None
                if checked and validation_enabled():
                    if switch is not None and switch[0]() != switch[1]:  # another GPU is current
                        with torch.cuda.device(switch[1]):
                            return call(*args, **kwargs)
                    if on_home is not None:
                        on_home(args, kwargs)
                    if gate_fn is not None and value_checks_enabled():  # values readable: no capture
                        with values_on_device() as held:  # the host checks now, the value checks held
                            validate(*args, **kwargs)
                            v = self._pick(op, args, kwargs)
                        if v.gated:
                            gate = load_attr(gate_fn)(*args, **kwargs)
                        else:
                            run_held(held, reader)  # an ungated pick: the held value checks, one read
                    else:
                        with one_read(reader):  # the pick, host work too, before the one device read
                            validate(*args, **kwargs)
                            v = self._pick(op, args, kwargs)
                while True:
                    if v is None:
                        v = self._pick(op, args, kwargs, tried)
                    try:
                        if gate is not None and v.gated:
                            result = v.load()(*args, gate=gate.flag, **kwargs)
                            if gate.failed():  # the kernel computed nothing; the host checks say why
                                _raise_checked(op, validate, args, kwargs)
                            return result
                        if gate is not None and gate.failed():  # a gated pick could not build: check first
                            _raise_checked(op, validate, args, kwargs)
                        gate = None
                        return v.load()(*args, **kwargs)
                    except KernelUnavailable as exc:
                        self._failed(op, v, exc)
                        tried += (v.name,)  # this call: the next variant
                        v = None

        functools.update_wrapper(call, spec.reference)
        call.__name__ = op
        return call

    def warmup(self, ops=None, **kwargs) -> list[str]:
        """Compile what the serving path launches: calls each chosen variant's declared
        ``warmup`` hook once (Triton kernels: every specialisation, by real launches).
        ``ops``: only the variants of these ops (None: every op). Where a hook ran, a backend that
        validates (unless ``validated=False``) also reads one reduced piece through the platform's
        value reader: a validated call reads its value checks through it where its op has no
        self-checked form or that form declines the call (``kernels/value_read.py`` compiles one
        kernel for every read). Returns the hooks that ran (the reader as ``value reader <module:attr>``).
        Runs with the backend's GPU current: Triton compiles and launches for the current device
        (``_device_switch``)."""
        home = home_device(self.device)
        with torch.cuda.device(home.index) if home is not None and home.type == "cuda" else contextlib.nullcontext():
            ran: list[str] = []
            for op, chain in self._chains.items():
                if ops is not None and op not in ops:
                    continue
                for v in chain:
                    if v.warmup and v.warmup not in ran:
                        load_attr(v.warmup)(self, **kwargs)
                        ran.append(v.warmup)
            if ran and self.checked and self._reader is not None and kwargs.get("validated") is not False:
                self._reader([Reduced(torch.zeros(2, dtype=torch.int64, device=default_torch_device(self.device)))])
                ran.append(f"value reader {_reader_path(self.device)}")
        return ran


@functools.cache
def _reference_backend_cpu() -> Backend:
    return select("cpu")


def reference_backend() -> Backend:
    """The CPU reference backend (cached)."""
    return _reference_backend_cpu()


def default_torch_device(info: DeviceInfo) -> torch.device:
    if not info.runnable:
        raise ValueError(f"device={info}: expected a real device (this one is fake)")
    return torch.device(info.torch_device)
