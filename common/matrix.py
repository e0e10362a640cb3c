"""Loader of ``matrix.yaml``: which variants may run per platform/arch row, and the
rules (SPEC §4) that turn encoder and decoder replay on or off.

The loader is strict: an unknown key, platform, arch, op, variant, rule field or status
is a :class:`MatrixError` naming the row and the value. A row may *narrow* what variants
declare, never widen it: listing a variant for an arch its declaration excludes is an error.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from .config import RULE_FIELDS
from .device import DeviceInfo, parse_device
from .errors import MatrixError
from .ops import OPS
from .registry import KNOWN_ARCHS, Variant

STATUSES = ("hardware", "emulated", "not-run")
_PREDICATES = ("eq", "ne", "gt", "ge", "lt", "le", "in", "not_in")
SIDES = ("encoder_replay", "decoder_replay")


@dataclass(frozen=True)
class Rule:
    """Turns a side off when every predicate of ``when`` holds; ``reason`` is formatted
    with the rule fields (``{pcp}``-style names of ServingConfig, ``platform``, ``arch``)."""

    id: str
    when: tuple[tuple[str, str, Any], ...]
    reason: str

    def applies(self, values: Mapping[str, Any]) -> bool:
        return all(_holds(values.get(f), op, arg) for f, op, arg in self.when)

    def text(self, values: Mapping[str, Any]) -> str:
        return f"[{self.id}] " + self.reason.format_map(_Missing(values))


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _holds(value: Any, op: str, arg: Any) -> bool:
    if op == "eq":
        return value == arg
    if op == "ne":
        return value != arg
    if op == "in":
        return value in arg
    if op == "not_in":
        return value not in arg
    if value is None:
        return False
    return {"gt": value > arg, "ge": value >= arg, "lt": value < arg, "le": value <= arg}[op]


@dataclass(frozen=True)
class Gate:
    """A row's own word on one side: ``enabled`` false turns it off with ``text`` as the
    reason; true keeps it possible, ``text`` saying which clamping paths make it safe."""

    enabled: bool
    text: str


@dataclass(frozen=True)
class Row:
    id: str
    platform: str
    arch: str
    name: str
    variants: Mapping[str, tuple[str, ...]]
    verified: Mapping[str, str]
    gates: Mapping[str, Gate]
    notes: str = ""

    def allowed(self, op: str) -> tuple[str, ...]:
        return self.variants.get(op, self.variants.get("*", ()))

    def status(self, variant_name: str) -> str:
        return self.verified.get(variant_name, "not-run")


@dataclass(frozen=True)
class Matrix:
    rules: Mapping[str, tuple[Rule, ...]]
    rows: Mapping[str, Row]
    source: str = "matrix.yaml"
    _by_arch: dict = field(default_factory=dict, repr=False, compare=False)

    def row_for(self, device: DeviceInfo) -> Row | None:
        if not self._by_arch:
            for row in self.rows.values():
                self._by_arch[(row.platform, row.arch)] = row
        return self._by_arch.get((device.platform, device.arch))


def _err(source: str, where: str, msg: str) -> MatrixError:
    return MatrixError(f"{source}: {where}: {msg}")


def _expect_keys(source: str, where: str, obj: Any, required: set[str], optional: set[str]) -> None:
    if not isinstance(obj, Mapping):
        raise _err(source, where, f"expected a mapping, got {type(obj).__name__}")
    missing = required - set(obj)
    if missing:
        raise _err(source, where, f"missing key(s) {sorted(missing)}")
    unknown = set(obj) - required - optional
    if unknown:
        raise _err(source, where, f"unknown key(s) {sorted(unknown)}; expected {sorted(required | optional)}")


def _parse_rule(source: str, side: str, i: int, raw: Any, ids: set[str]) -> Rule:
    where = f"{side}[{i}]"
    _expect_keys(source, where, raw, {"id", "when", "reason"}, set())
    rid = raw["id"]
    if not isinstance(rid, str) or rid in ids:
        raise _err(source, where, f"id {rid!r} must be a unique string")
    ids.add(rid)
    if not isinstance(raw["when"], Mapping) or not raw["when"]:
        raise _err(source, f"{where} ({rid})", "when: expected a non-empty mapping field -> predicate")
    when = []
    for fname, pred in raw["when"].items():
        if fname not in RULE_FIELDS:
            raise _err(source, f"{where} ({rid})", f"unknown field {fname!r}; expected one of {sorted(RULE_FIELDS)}")
        if isinstance(pred, Mapping):
            if len(pred) != 1 or next(iter(pred)) not in _PREDICATES:
                raise _err(source, f"{where} ({rid})", f"{fname}: predicate {dict(pred)!r}; expected one of {_PREDICATES}")
            op, arg = next(iter(pred.items()))
            if op in ("in", "not_in") and not isinstance(arg, list):
                raise _err(source, f"{where} ({rid})", f"{fname}: {op} needs a list, got {arg!r}")
            when.append((fname, op, tuple(arg) if isinstance(arg, list) else arg))
        else:
            when.append((fname, "eq", pred))
    if not isinstance(raw["reason"], str) or not raw["reason"].strip():
        raise _err(source, f"{where} ({rid})", "reason: expected a non-empty string")
    return Rule(rid, tuple(when), raw["reason"].strip())


def _parse_gate(source: str, where: str, raw: Any) -> Gate:
    _expect_keys(source, where, raw, {"enabled", "because"}, set())
    if not isinstance(raw["enabled"], bool) or not isinstance(raw["because"], str):
        raise _err(source, where, "expected enabled: bool and because: string")
    return Gate(raw["enabled"], raw["because"].strip())


def _parse_row(source: str, i: int, raw: Any, seen: set, declared: Mapping[str, Mapping[str, Variant]]) -> Row:
    where = f"rows[{i}]"
    _expect_keys(source, where, raw, {"id", "platform", "arch", "variants", "verified", *SIDES}, {"name", "notes"})
    rid, platform, arch = raw["id"], raw["platform"], raw["arch"]
    where = f"row {rid!r}"
    if platform not in KNOWN_ARCHS:
        raise _err(source, where, f"unknown platform {platform!r}; expected one of {sorted(KNOWN_ARCHS)}")
    if arch not in KNOWN_ARCHS[platform]:
        raise _err(source, where, f"unknown arch {arch!r} for {platform}; expected one of {KNOWN_ARCHS[platform]}")
    if rid in {r for r, _ in seen} or (platform, arch) in {k for _, k in seen}:
        raise _err(source, where, "duplicate row id or platform/arch")
    seen.add((rid, (platform, arch)))
    fake = parse_device(f"{platform}:{arch}") if platform != "cpu" else parse_device("cpu")
    variants: dict[str, tuple[str, ...]] = {}
    if not isinstance(raw["variants"], Mapping) or not raw["variants"]:
        raise _err(source, where, "variants: expected a mapping op (or '*') -> [variant names]")
    for op, names in raw["variants"].items():
        if op != "*" and op not in OPS:
            raise _err(source, where, f"variants: unknown op {op!r}; expected '*' or one of {sorted(OPS)}")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise _err(source, where, f"variants[{op!r}]: expected a non-empty list of variant names")
        ops = list(OPS) if op == "*" else [op]
        for name in names:
            having = [o for o in ops if name in declared.get(o, {})]
            if not having:
                raise _err(source, where, f"variants[{op!r}]: unknown variant {name!r} (not declared for {op})")
            for o in having:
                why = declared[o][name].declared_reasons(fake)
                if why:
                    raise _err(source, where, f"variants[{op!r}]: {name!r} for {o} would widen its declaration "
                                              f"({'; '.join(why)}); a row may narrow, never widen")
        variants[op] = tuple(names)
    listed = {n for names in variants.values() for n in names}
    if not isinstance(raw["verified"], Mapping):
        raise _err(source, where, "verified: expected a mapping variant -> status")
    for name, status in raw["verified"].items():
        if name not in listed:
            raise _err(source, where, f"verified: {name!r} is not among the row's variants {sorted(listed)}")
        if status not in STATUSES:
            raise _err(source, where, f"verified[{name!r}]: status {status!r}; expected one of {STATUSES}")
    gates = {side: _parse_gate(source, f"{where}.{side}", raw[side]) for side in SIDES}
    return Row(rid, platform, arch, str(raw.get("name", "")), variants, dict(raw["verified"]), gates,
               str(raw.get("notes", "")).strip())


def parse_matrix(data: Any, source: str, variants: Mapping[str, Mapping[str, Variant]]) -> Matrix:
    """Validate and build a :class:`Matrix` from parsed YAML data; ``variants`` is every
    declared variant (``{op: {name: Variant}}``, dispatch's ``all_variants()``): a row may
    name only those, and only where their declaration allows."""
    _expect_keys(source, "top level", data, {"version", "rows", *SIDES}, set())
    if data["version"] != 1:
        raise _err(source, "version", f"{data['version']!r}; expected 1")
    rules = {}
    ids: set[str] = set()
    for side in SIDES:
        if not isinstance(data[side], list):
            raise _err(source, side, "expected a list of rules")
        rules[side] = tuple(_parse_rule(source, side, i, r, ids) for i, r in enumerate(data[side]))
    if not isinstance(data["rows"], list):
        raise _err(source, "rows", "expected a list of rows")
    seen: set = set()
    rows = {}
    for i, raw in enumerate(data["rows"]):
        row = _parse_row(source, i, raw, seen, variants)
        rows[row.id] = row
    return Matrix(rules, rows, source)


def load_matrix(path: str | None, variants: Mapping[str, Mapping[str, Variant]]) -> Matrix:
    """``path`` or the ``matrix.yaml`` shipped inside the package (parsed once per process)."""
    if path is None:
        return _packaged(variants)
    with open(path, encoding="utf-8") as fh:
        return parse_matrix(yaml.safe_load(fh), path, variants)


_PACKAGED: list[Matrix] = []


def _packaged(variants) -> Matrix:
    if not _PACKAGED:
        text = importlib.resources.files("swa_backends").joinpath("matrix.yaml").read_text(encoding="utf-8")
        _PACKAGED.append(parse_matrix(yaml.safe_load(text), "matrix.yaml", variants))
    return _PACKAGED[0]
