"""Loader of ``matrix.yaml``: which variants may run per platform/arch row, and the
rules (SPEC §4) that turn encoder and decoder replay on or off.

The loader is strict and fails closed: an unknown or duplicated key, platform, arch, op,
variant, rule field or status, a predicate whose value does not fit its field, or a reason
template naming anything but a plain rule field is a :class:`MatrixError` naming the row and
the value, at load time (not when the rule first applies). A row may *narrow* what variants
declare, never widen it: listing a variant for an arch its declaration excludes is an error; and
it must allow every op its ``reference`` variant (the one that runs everywhere).
A loaded :class:`Matrix` is immutable and safe to share between threads.

A matrix file is untrusted input (``swa-backends matrix --matrix PATH``, ``select(matrix=PATH)``):
plain YAML data only (no anchors, aliases, tags or merge keys), bounded in size, nodes and depth,
read only from a regular file of UTF-8 text; whatever is wrong is one :class:`MatrixError`
naming the file and the place, raised in bounded time and memory.
"""

from __future__ import annotations

import importlib.resources
import os
import stat
import string
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml

from .config import RULE_FIELD_KINDS, RULE_FIELDS
from .device import DeviceInfo, device_spec, known_archs, parse_device
from .errors import MatrixError
from .ops import OPS
from .registry import Variant

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
        # the loader allowed only plain rule-field names in the template (no attribute or
        # index access), so formatting reads nothing but these values
        return f"[{self.id}] " + self.reason.format(**{k: values.get(k) for k in _template_fields(self.reason)})


def _template_fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


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
    _by_arch: Mapping = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:  # built once, read-only: lookups are thread-safe
        object.__setattr__(self, "_by_arch", MappingProxyType({(r.platform, r.arch): r for r in self.rows.values()}))

    def row_for(self, device: DeviceInfo) -> Row | None:
        return self._by_arch.get((device.platform, device.arch))


def _err(source: str, where: str, msg: str) -> MatrixError:
    # a message quotes the file's value, never all of it: one line however large the value
    msg = " ".join(msg.split())
    return MatrixError(f"{source}: {where}: {msg if len(msg) <= 400 else msg[:397] + '...'}")


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: a message quotes a file's value, never all of it."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _keys(keys) -> str:
    # keys of any scalar type (str, int, None...): sorted by their text
    return _short(sorted(keys, key=lambda k: (type(k).__name__, str(k))), 200)


def _expect_keys(source: str, where: str, obj: Any, required: set[str], optional: set[str]) -> None:
    if not isinstance(obj, Mapping):
        raise _err(source, where, f"expected a mapping, got {type(obj).__name__}")
    missing = required - set(obj)
    if missing:
        raise _err(source, where, f"missing key(s) {sorted(missing)}")
    unknown = set(obj) - required - optional
    if unknown:
        raise _err(source, where, f"unknown key(s) {_keys(unknown)}; expected {sorted(required | optional)}")


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
        else:
            op, arg = "eq", pred
        why = _predicate_problem(fname, op, arg)
        if why:
            raise _err(source, f"{where} ({rid})", f"{fname}: {op} {arg!r}: {why}")
        when.append((fname, op, tuple(arg) if isinstance(arg, list) else arg))
    reason = raw["reason"]
    if not isinstance(reason, str) or not reason.strip():
        raise _err(source, f"{where} ({rid})", "reason: expected a non-empty string")
    try:
        names = _template_fields(reason)
    except ValueError as exc:
        raise _err(source, f"{where} ({rid})", f"reason: not a valid template ({exc})") from None
    for name in names:
        if name not in RULE_FIELDS:  # also rejects '{x.attr}', '{x[0]}', '{}', '{0}'
            raise _err(source, f"{where} ({rid})", f"reason: {{{name}}} is not a rule field; expected plain names "
                                                   f"from {sorted(RULE_FIELDS)}")
    if any(spec or conv for _, name, spec, conv in string.Formatter().parse(reason) if name is not None):
        raise _err(source, f"{where} ({rid})", "reason: format specs and conversions are not allowed")
    return Rule(rid, tuple(when), reason.strip())


def _predicate_problem(fname: str, op: str, arg: Any) -> str | None:
    """Why ``arg`` cannot be compared with field ``fname`` by ``op`` (None: it can)."""
    kind, allowed = RULE_FIELD_KINDS[fname]
    if callable(allowed):
        allowed = allowed()
    if op in ("gt", "ge", "lt", "le"):
        if kind not in ("int", "int?"):
            return f"{op} compares numbers; {fname} is a {kind}"
        values = [arg]
    elif op in ("in", "not_in"):
        values = list(arg)
    else:
        values = [arg]
    for v in values:
        if kind == "bool" and type(v) is not bool:
            return f"expected true or false, got {type(v).__name__}"
        if kind in ("int", "int?") and not (type(v) is int or (kind == "int?" and v is None)):
            return f"expected an integer{' or null' if kind == 'int?' else ''}, got {type(v).__name__}"
        if kind == "str":
            if not isinstance(v, str):
                return f"expected a string, got {type(v).__name__}"
            if allowed is not None and v not in allowed:
                return f"expected one of {list(allowed)}"
        if kind == "ints" and not (isinstance(v, list) and all(type(x) is int for x in v)):
            return "expected a list of integers"
    return None


def _parse_gate(source: str, where: str, raw: Any) -> Gate:
    _expect_keys(source, where, raw, {"enabled", "because"}, set())
    if not isinstance(raw["enabled"], bool) or not isinstance(raw["because"], str):
        raise _err(source, where, "expected enabled: bool and because: string")
    return Gate(raw["enabled"], raw["because"].strip())


def _parse_row(source: str, i: int, raw: Any, seen: set, declared: Mapping[str, Mapping[str, Variant]]) -> Row:
    where = f"rows[{i}]"
    _expect_keys(source, where, raw, {"platform", "arch", "variants", "verified", *SIDES}, {"name", "notes"})
    platform, arch = raw["platform"], raw["arch"]
    if not isinstance(platform, str) or not isinstance(arch, str):
        raise _err(source, where, f"platform and arch: expected strings (quote numeric-looking archs), got "
                                  f"{_short(platform)}, {_short(arch)}")
    rid = device_spec(platform, arch)
    where = f"row {_short(rid)}"
    for key in ("name", "notes"):
        if key in raw and not isinstance(raw[key], str):
            raise _err(source, where, f"{key}: expected a string, got {type(raw[key]).__name__}")
    archs = known_archs()
    if platform not in archs:
        raise _err(source, where, f"unknown platform {_short(platform)}; expected one of {sorted(archs)}")
    if arch not in archs[platform]:
        raise _err(source, where, f"unknown arch {_short(arch)} for {platform}; expected one of {archs[platform]}")
    if rid in seen:
        raise _err(source, where, "duplicate platform/arch")
    seen.add(rid)
    fake = parse_device(f"{platform}:{arch}") if platform != "cpu" else parse_device("cpu")
    variants: dict[str, tuple[str, ...]] = {}
    if not isinstance(raw["variants"], Mapping) or not raw["variants"]:
        raise _err(source, where, "variants: expected a mapping op (or '*') -> [variant names]")
    for op, names in raw["variants"].items():
        if op != "*" and op not in OPS:
            raise _err(source, where, f"variants: unknown op {_short(op)}; expected '*' or one of {sorted(OPS)}")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise _err(source, where, f"variants[{op!r}]: expected a non-empty list of variant names")
        if len(set(names)) != len(names):
            raise _err(source, where, f"variants[{op!r}]: a variant is listed twice in {_short(names)}")
        ops = list(OPS) if op == "*" else [op]
        for name in names:
            having = [o for o in ops if name in declared.get(o, {})]
            if not having:
                raise _err(source, where, f"variants[{op!r}]: unknown variant {_short(name)} (not declared for {op})")
            for o in having:
                why = declared[o][name].declared_reasons(fake)
                if why:
                    raise _err(source, where, f"variants[{op!r}]: {name!r} for {o} would widen its declaration "
                                              f"({'; '.join(why)}); a row may narrow, never widen")
        variants[op] = tuple(names)
    for op, spec in OPS.items():
        # the reference runs everywhere: the variant every chain ends with and a call falls back to; a row
        # that does not allow it can leave an op with no variant, and every select() there fails
        ref = spec.reference_variant.name
        listing = op if op in variants else "*" if "*" in variants else None
        if listing is None:
            raise _err(source, where, f"variants: no list for {op} and no '*': every op needs its {ref!r} variant "
                                      "(it runs everywhere), in its own list or in '*'")
        if ref not in variants[listing]:
            raise _err(source, where, f"variants[{listing!r}]: {op} without its {ref!r} variant "
                                      f"({_short(list(variants[listing]))}): every op needs it (it runs everywhere)")
    listed = {n for names in variants.values() for n in names}
    if not isinstance(raw["verified"], Mapping):
        raise _err(source, where, "verified: expected a mapping variant -> status")
    for name, status in raw["verified"].items():
        if name not in listed:
            raise _err(source, where, f"verified: {_short(name)} is not among the row's variants {sorted(listed)}")
        if not isinstance(status, str) or status not in STATUSES:
            raise _err(source, where, f"verified[{name!r}]: status {_short(status)}; expected one of {STATUSES}")
    gates = {side: _parse_gate(source, f"{where}.{side}", raw[side]) for side in SIDES}
    return Row(rid, platform, arch, raw.get("name", ""), variants, dict(raw["verified"]), gates,
               raw.get("notes", "").strip())


def parse_matrix(data: Any, source: str, variants: Mapping[str, Mapping[str, Variant]]) -> Matrix:
    """Validate and build a :class:`Matrix` from parsed YAML data; ``variants`` is every
    declared variant (``{op: {name: Variant}}``, dispatch's ``all_variants()``): a row may
    name only those, and only where their declaration allows."""
    _expect_keys(source, "top level", data, {"version", "rows", *SIDES}, set())
    if type(data["version"]) is not int or data["version"] != 1:
        raise _err(source, "version", f"{_short(data['version'])}; expected 1")
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


# ---------------------------------------------------------------------------------------
# reading: the file is untrusted input (``--matrix PATH``, ``select(matrix=PATH)``)
# ---------------------------------------------------------------------------------------

#: Bounds on a matrix file, far above the shipped one (about 14 KB, 600 nodes, nested 7 deep):
#: past them a file is refused before it costs time or memory. PyYAML's pure-Python loader is slow
#: per node, so the node bound keeps a file at the bounds to about a second of loading on a busy
#: CPU (bench/README.md, "Host costs on the CPU").
MAX_BYTES = 256 * 1024
MAX_DEPTH = 20
MAX_NODES = 10_000


class _Refused(Exception):
    """A YAML construct the loader refuses, at ``mark``."""

    def __init__(self, mark, message: str):
        super().__init__(message)
        self.mark = mark


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, restricted to plain data: no anchors or aliases (a few hundred
    bytes of nested aliases expand to gigabytes), no explicit tags, no merge keys, scalar
    mapping keys, each key once (plain YAML keeps the last one: one appended line could
    silently override a rule), at most ``MAX_DEPTH`` levels and ``MAX_NODES`` nodes."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(event.start_mark, f"alias *{event.anchor}: aliases and anchors are not allowed")
        if event.anchor is not None:
            raise _Refused(event.start_mark, f"anchor &{event.anchor}: aliases and anchors are not allowed")
        if event.tag is not None and event.tag != "!":
            raise _Refused(event.start_mark, f"tag {event.tag}: explicit tags are not allowed")
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _Refused(event.start_mark, f"more than {MAX_NODES} nodes")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise _Refused(key_node.start_mark, "merge keys (<<) are not allowed")
        if not isinstance(key_node, yaml.ScalarNode):
            raise _Refused(key_node.start_mark, "a mapping key must be a plain scalar, not a list or a mapping")
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise _Refused(key_node.start_mark, f"duplicate key {_short(key)}")
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _at(mark) -> str:
    return "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"


def read_yaml(text: str, source: str) -> Any:
    """YAML text -> plain data (:class:`_StrictLoader`); anything malformed or refused is one
    :class:`MatrixError` naming ``source`` and the line."""
    if not isinstance(text, str):
        raise MatrixError(f"{source}: expected YAML text (a str), got {type(text).__name__}")
    if len(text) > MAX_BYTES:
        raise MatrixError(f"{source}: {len(text)} characters: expected at most {MAX_BYTES}")
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _Refused as exc:
        raise MatrixError(f"{source}: {exc}{_at(exc.mark)}") from None
    except yaml.MarkedYAMLError as exc:
        what = "; ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise MatrixError(f"{source}: not valid YAML: {what}{_at(exc.problem_mark or exc.context_mark)}") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise MatrixError(f"{source}: not valid YAML: character #x{exc.character:04x} is not allowed at line {line}, "
                          f"column {column}") from None
    except yaml.YAMLError as exc:
        raise MatrixError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    except (ValueError, OverflowError) as exc:  # a scalar Python cannot hold (e.g. an int of 5000 digits)
        raise MatrixError(f"{source}: a value that cannot be read: {' '.join(str(exc).split())[:200]}") from None


def read_file(path) -> str:
    """The text of a matrix file: a regular file of at most ``MAX_BYTES`` bytes of UTF-8
    (:class:`MatrixError` naming the path otherwise, before reading more than that)."""
    if not isinstance(path, (str, os.PathLike)) or not str(os.fspath(path)).strip():
        raise MatrixError(f"matrix={_short(path)}: expected a path to a matrix YAML file")
    try:
        # stat first: opening a FIFO would block, reading a device would not end
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise MatrixError(f"{path}: {kind}: expected a matrix YAML file")
        if info.st_size > MAX_BYTES:
            raise MatrixError(f"{path}: {info.st_size} bytes: expected at most {MAX_BYTES}")
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:  # an embedded NUL byte in the path
        if isinstance(exc, MatrixError):
            raise
        raise MatrixError(f"matrix={_short(path)}: expected a path to a matrix YAML file ({exc})") from None
    if len(data) > MAX_BYTES:
        raise MatrixError(f"{path}: more than {MAX_BYTES} bytes: expected at most {MAX_BYTES}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise MatrixError(f"{path}: line {line}: byte {data[exc.start]:#04x} at offset {exc.start}: "
                          "expected UTF-8 text") from None


def load_matrix(path: str | None, variants: Mapping[str, Mapping[str, Variant]]) -> Matrix:
    """``path`` or the ``matrix.yaml`` shipped inside the package (parsed once per process)."""
    if path is None:
        return _packaged(variants)
    source = os.fspath(path) if isinstance(path, os.PathLike) else path
    return parse_matrix(read_yaml(read_file(path), source), source, variants)


_PACKAGED: list[Matrix] = []
_PACKAGED_LOCK = threading.Lock()


def _packaged(variants) -> Matrix:
    with _PACKAGED_LOCK:
        if not _PACKAGED:
            text = importlib.resources.files("swa_backends").joinpath("matrix.yaml").read_text(encoding="utf-8")
            _PACKAGED.append(parse_matrix(read_yaml(text, "matrix.yaml"), "matrix.yaml", variants))
    return _PACKAGED[0]
