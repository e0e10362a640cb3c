"""matrix.yaml as untrusted input (``--matrix PATH``, ``select(matrix=PATH)``): every malformed
file is one :class:`MatrixError` that names the file and the place, in bounded time and memory.

Families: alias and anchor bombs, deep nesting, non-scalar (unhashable) keys, bytes that are
not UTF-8, explicit tags, scalars Python cannot hold, files too large or not files at all, and
a wrong type in every field of a rule and of a row. Each case runs in a worker that reports
it (tests/helpers/case_worker.py), so a crash, a hang or a memory blow-up fails that case.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import os
import tempfile

import pytest
import yaml

from case_worker import failed, over_bounds, run_cases

from swa_backends import MatrixError
from swa_backends.common.matrix import MAX_BYTES, MAX_DEPTH, MAX_NODES, parse_matrix
from swa_backends.dispatch import all_variants, load_matrix

#: Bounds every case must keep (the loader's own are far tighter: about a second at most).
MAX_SECONDS = 5.0
MAX_RSS_GROWTH_MB = 200

_DIR: list[tempfile.TemporaryDirectory] = []  # made in the worker on first use, removed when it exits


def _path(name: str) -> str:
    if not _DIR:
        _DIR.append(tempfile.TemporaryDirectory(prefix="swa-matrix-untrusted-"))
    return os.path.join(_DIR[0].name, name)


@functools.cache
def _shipped_text() -> str:
    return importlib.resources.files("swa_backends").joinpath("matrix.yaml").read_text(encoding="utf-8")


def _refused(path: str, *, mentions: str = "") -> str:
    """``load_matrix(path)`` raises one MatrixError: one line, naming the file (and ``mentions``)."""
    try:
        load_matrix(path)
    except MatrixError as exc:
        msg = str(exc)
        assert msg.startswith(f"{path}: "), msg
        assert "\n" not in msg and len(msg) < 1000, msg
        assert mentions in msg, (mentions, msg)
        return msg
    raise AssertionError(f"{path} loaded; expected a MatrixError")


def _file(name: str, content: str | bytes, *, mentions: str = ""):
    def case():
        path = _path(name)
        with open(path, "wb") as fh:
            fh.write(content.encode() if isinstance(content, str) else content)
        return _refused(path, mentions=mentions)

    return name, case


def _in_name(value: str) -> str:
    """The shipped file with ``value`` as the first row's ``name`` (YAML source text)."""
    text = _shipped_text()
    old = "    name: any CPU (the reference; Triton kernels only through the interpreter, by name)\n"
    assert old in text
    return text.replace(old, f"    name: {value}\n")


# ---------------------------------------------------------------------------------------
# YAML-level families: written as files, read by load_matrix(path)
# ---------------------------------------------------------------------------------------

BOMB = "".join(f"{n}: &{n} [" + ",".join([f"*{p}"] * 9 if p else ['"lol"'] * 9) + "]\n"
               for p, n in zip(["", "a", "b", "c", "d", "e", "f"], "abcdefg"))

def _yaml_cases():
    deep_flow = "[" * 100_000 + "]" * 100_000
    deep_block = "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v\n"
    deep_map = "a: " + "{a: " * 5000 + "1" + "}" * 5000
    return [
        # aliases, anchors, merge keys
        _file("alias-bomb.yaml", BOMB, mentions="anchors are not allowed"),
        # the bomb: nested aliases in a row's name (gigabytes once expanded)
        _file("alias-bomb-in-name.yaml", _in_name("*x8").replace(
            "version: 1\n", "version: 1\n_a: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
                f"_b{i}: &x{i + 1} [{', '.join([f'*x{i}'] * 9)}]\n" for i in range(8))), mentions="line 2"),
        _file("anchor-only.yaml", _in_name("&n plain"), mentions="anchor &n"),
        _file("alias-undefined.yaml", _in_name("*nowhere"), mentions="alias *nowhere"),
        _file("merge-key.yaml", "version: 1\n<<: {rows: []}\nencoder_replay: []\ndecoder_replay: []\n",
              mentions="merge keys"),
        # nesting
        _file("deep-flow.yaml", deep_flow, mentions=f"deeper than {MAX_DEPTH}"),
        _file("deep-block.yaml", deep_block, mentions=f"deeper than {MAX_DEPTH}"),
        _file("deep-mapping.yaml", deep_map, mentions=f"deeper than {MAX_DEPTH}"),
        _file("deep-in-row.yaml", _in_name("[" * 60 + "]" * 60), mentions="line"),
        # keys
        _file("key-list.yaml", "? [a, b]\n: 1\n", mentions="plain scalar"),
        _file("key-flow-list.yaml", "{[1]: 2}\n", mentions="plain scalar"),
        _file("key-mapping.yaml", "? {a: 1}\n: 1\n", mentions="plain scalar"),
        _file("key-in-row.yaml", _shipped_text().replace("    arch: sm90\n", "    arch: sm90\n    ? [x]\n    : 1\n"),
              mentions="plain scalar"),
        _file("key-duplicate.yaml", "version: 1\nversion: 1\n", mentions="duplicate key 'version' at line 2"),
        _file("keys-mixed-types.yaml", "version: 1\nrows: []\nencoder_replay: []\ndecoder_replay: []\n1: a\nnull: b\n",
              mentions="unknown key(s)"),
        # bytes
        _file("latin-1.yaml", _in_name("caf\u00e9").encode("latin-1"), mentions="expected UTF-8"),
        _file("utf-16.yaml", _shipped_text().encode("utf-16"), mentions="expected UTF-8"),
        _file("surrogate.yaml", b"version: 1\nx: \xed\xa0\x80\n", mentions="line 2"),
        _file("nul-byte.yaml", b"version: 1\x00\n", mentions="character #x0000 is not allowed at line 1, column 11"),
        _file("control-char.yaml", "version: 1\nx: \x07\n", mentions="character #x0007 is not allowed at line 2"),
        _file("binary-noise.yaml", bytes(range(256)) * 4, mentions="UTF-8"),
        # tags and scalars
        _file("tag-python.yaml", "!!python/object/apply:os.system [echo hi]\n", mentions="explicit tags"),
        _file("tag-binary.yaml", _in_name("!!binary aGVsbG8="), mentions="explicit tags"),
        _file("tag-set.yaml", "version: 1\nrows: !!set {a, b}\n", mentions="explicit tags"),
        _file("tag-local.yaml", _in_name("!custom x"), mentions="explicit tags"),
        _file("int-5000-digits.yaml", "version: " + "9" * 5000 + "\n", mentions="cannot be read"),
        _file("bad-date.yaml", "version: 2001-13-45\n", mentions="cannot be read"),
        _file("version-nan.yaml", "version: .nan\nrows: []\nencoder_replay: []\ndecoder_replay: []\n",
              mentions="version"),
        _file("version-huge-float.yaml", "version: 1e999\nrows: []\nencoder_replay: []\ndecoder_replay: []\n",
              mentions="version"),
        # structure of the document
        _file("empty.yaml", "", mentions="top level"),
        _file("comments-only.yaml", "# nothing\n", mentions="top level"),
        _file("two-documents.yaml", "version: 1\n---\nversion: 1\n", mentions="not valid YAML"),
        _file("a-list.yaml", "- 1\n- 2\n", mentions="expected a mapping"),
        _file("a-scalar.yaml", "just text\n", mentions="expected a mapping"),
        _file("unclosed.yaml", "version: [1, 2\n", mentions="not valid YAML"),
        _file("tab-indent.yaml", "version: 1\nrows:\n\t- 1\n", mentions="not valid YAML"),
        _file("name-a-list.yaml", _in_name("[a, b]"), mentions="name: expected a string"),
        _file("name-a-mapping.yaml", _in_name("{a: b}"), mentions="name: expected a string"),
        _file("notes-a-date.yaml", _shipped_text().replace(
            '    notes: >-\n      triton_ascend runs here only under Triton\'s interpreter, with select("cpu", '
            'prefer="triton_ascend").\n', "    notes: 2024-01-01\n"), mentions="row 'cpu': notes: expected a string"),
        # size
        _file("too-large.yaml", "# " + "x" * MAX_BYTES + "\n", mentions=f"at most {MAX_BYTES}"),
        _file("too-many-nodes.yaml", "x: [" + ",".join(["1"] * (MAX_NODES + 10)) + "]\n",
              mentions=f"more than {MAX_NODES} nodes"),
        ("long-but-allowed-name", _long_name_loads),
        # not a file
        ("missing", lambda: _refused(_path("no-such-file.yaml"), mentions="cannot read it")),
        ("directory", lambda: _refused(os.path.dirname(_path("x")), mentions="a directory")),
        ("dev-zero", lambda: _refused("/dev/zero", mentions="not a regular file")),
        ("fifo", _fifo),
        ("symlink-loop", _symlink_loop),
        ("nul-in-path", lambda: _refused_path("bad\x00path.yaml")),
        ("not-a-path", lambda: _refused_path(12345)),
        ("shipped-loads", _shipped_loads),
    ]


def _refused_path(path) -> str:
    try:
        load_matrix(path)
    except MatrixError as exc:
        assert "\n" not in str(exc) and "expected a path" in str(exc), str(exc)
        return str(exc)
    raise AssertionError("loaded")


def _fifo() -> str:
    path = _path("fifo.yaml")
    if not os.path.exists(path):
        os.mkfifo(path)
    return _refused(path, mentions="not a regular file")  # refused without opening it (no writer: it would block)


def _symlink_loop() -> str:
    path = _path("loop.yaml")
    if not os.path.lexists(path):
        os.symlink(path, path)
    return _refused(path, mentions="cannot read it")


def _long_name_loads() -> str:
    path = _path("long-name.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(_in_name("y" * 100_000))
    return f"{len(load_matrix(path).rows['cpu'].name)} characters"


def _shipped_loads() -> str:
    path = _path("shipped-with-bom.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\ufeff" + _shipped_text())
    return f"{len(load_matrix(path).rows)} rows"


# ---------------------------------------------------------------------------------------
# a wrong type in every field: parsed data, one rule and two rows of the shipped file
# ---------------------------------------------------------------------------------------

WRONG = (None, True, 7, 2.5, "s", [], ["x"], {}, {"k": "v"}, [[1]])


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:2]):
            yield from _paths(v, (*prefix, i))


def _field_paths(data) -> list[tuple]:
    rows = [i for i, r in enumerate(data["rows"]) if (r["platform"], r["arch"]) in (("cuda", "sm90"), ("rocm", "gfx942"))]
    found = [(k,) for k in data]
    found += [p for p in _paths(data["encoder_replay"][0], ("encoder_replay", 0))]
    found += [p for i in rows for p in _paths(data["rows"][i], ("rows", i))]
    return found


def _set(data, path, value):
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@functools.cache
def _shipped_data():
    return yaml.safe_load(_shipped_text())


def _typed(path, value):
    def case():
        data = copy.deepcopy(_shipped_data())
        _set(data, path, copy.deepcopy(value))
        try:
            parse_matrix(data, "typed.yaml", all_variants())
        except MatrixError as exc:
            assert str(exc).startswith("typed.yaml: ") and "\n" not in str(exc), str(exc)
            return str(exc)
        return "loaded (a value of an accepted type)"

    return f"field {'.'.join(map(str, path))}={value!r}", case


def cases():
    return _yaml_cases() + [_typed(p, v) for p in _field_paths(_shipped_data()) for v in WRONG]


# ---------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return run_cases(__file__, env=env)


def test_every_malformed_file_is_one_clear_matrix_error(reports):
    assert not failed(reports), failed(reports)
    assert len(reports) == len(cases())


def test_every_case_is_bounded_in_time_and_memory(reports):
    assert not over_bounds(reports, seconds=MAX_SECONDS, rss_mb=MAX_RSS_GROWTH_MB)


def test_wrong_types_are_refused_where_the_field_demands_a_type(reports):
    """Not all of a field's wrong values may load: every field checked here has a type."""
    by_field: dict[str, list[str]] = {}
    for r in (r for r in reports if r["label"].startswith("field ")):
        by_field.setdefault(r["label"].split("=", 1)[0], []).append(r["detail"])
    loose = [f for f, details in by_field.items() if all(d.startswith("loaded") for d in details)]
    assert by_field and not loose, loose
