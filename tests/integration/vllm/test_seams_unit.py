"""The seam check's mechanism (``integrations/vllm/seams.py``) on a package written here: what
a fingerprint counts, the file and live readings agreeing, the unchanged-file fast path, and
every kind of drift reported by the seam's name, and each release's table well formed. Needs no
vLLM (runs in the main suite too); ``test_vllm_seams.py`` checks the installed release's table
against the real vLLM."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from swa_backends.integrations.vllm import seams
from swa_backends.integrations.vllm.seams import Seam

SOURCE = textwrap.dedent('''
    """A stand-in for a vLLM module."""
    from os.path import join as _join

    LIMIT = 8


    def kernel(x_ptr, n, BLOCK):
        """Docstrings do not count."""
        total = 0  # nor comments
        for i in range(n):
            total += i
        return total


    class State:
        """A class whose objects the integration would subclass."""

        buffers = None

        def __init__(self, config, device):
            self.config = config
            self.device = device
            self.message = """a string
        whose lines are indented"""

        @property
        def size(self):
            return 4

        def prepare(self, batch, *args, mode=None, **kwargs):
            return [batch, args, mode, kwargs]
''')


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """``seamdemo.mod`` (SOURCE) on a path of its own, not imported; removed afterwards."""
    root = tmp_path / "seamdemo"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "mod.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root / "mod.py"
    for name in ("seamdemo.mod", "seamdemo"):
        sys.modules.pop(name, None)


TARGETS = [("seamdemo.mod:kernel", "def"), ("seamdemo.mod:State", "class"), ("seamdemo.mod:State.__init__", "def"),
           ("seamdemo.mod:State.size", "def"), ("seamdemo.mod:State.prepare", "def"), ("seamdemo.mod:LIMIT", "global"),
           ("seamdemo.mod:_join", "global")]


def _pinned(live: bool = False) -> tuple[Seam, ...]:
    out = []
    for s, p, f in seams.current([Seam(t, "test", kind=k) for t, k in TARGETS], live=live):
        assert f is not None, s.target
        out.append(Seam(s.target, "test", p, f, s.kind))
    return tuple(out)


def test_file_and_live_readings_agree_and_the_file_is_never_imported(pkg):
    pinned = _pinned()
    assert "seamdemo.mod" not in sys.modules  # read from the file, not imported
    assert dict(zip([s.target for s in pinned], [s.params for s in pinned]))["seamdemo.mod:State.prepare"] == (
        "self", "batch", "args", "mode", "kwargs")
    assert seams.check(pinned) == []
    importlib.import_module("seamdemo.mod")
    assert [s.fingerprint for s in _pinned(live=True)] == [s.fingerprint for s in pinned]
    assert seams.check(pinned, live=True) == []


def test_comments_docstrings_and_formatting_do_not_count_code_does(pkg):
    pinned = _pinned()
    reformatted = (SOURCE.replace("total = 0  # nor comments", "total = (0)")
                   .replace('"""Docstrings do not count."""', '"""Another docstring."""')
                   .replace("        return total", "        # a new comment\n        return total"))
    pkg.write_text(reformatted)
    assert seams.check(pinned) == []
    pkg.write_text(SOURCE.replace("total += i", "total += 2 * i"))
    assert seams.check(pinned) == [f"seamdemo.mod:kernel: source changed (fingerprint "
                                   f"{seams.fingerprint(seams.definition(pinned[0], live=False))}, pinned "
                                   f"{pinned[0].fingerprint})"]


@pytest.mark.parametrize("edit,name,what", [
    (("def prepare(self, batch, *args", "def prepare(self, batch, extra, *args"), "State.prepare", "parameters"),
    (("        return 4", "        return 5"), "State.size", "source changed"),
    (("    buffers = None", "    buffers = None\n    slots = ()"), "seamdemo.mod:State:", "source changed"),
    (("LIMIT = 8", "LIMIT = 9"), "LIMIT", "source changed"),
    (("from os.path import join as _join", "from posixpath import join as _join"), "_join", "source changed"),
    (("def kernel(", "def kernel2("), "kernel", "not found"),
])
def test_each_kind_of_drift_names_its_seam(pkg, edit, name, what):
    pinned = _pinned()
    pkg.write_text(SOURCE.replace(*edit))
    problems = seams.check(pinned)
    assert len(problems) == 1 and name in problems[0] and what in problems[0], problems


def test_the_fast_path_skips_an_unchanged_file_but_sees_a_replaced_function(pkg, monkeypatch):
    pinned = _pinned()
    files = {"seamdemo.mod": seams.file_hash(str(pkg))}
    calls = []
    real = seams.definition
    monkeypatch.setattr(seams, "definition", lambda *a, **k: calls.append(a[0].target) or real(*a, **k))
    assert seams.check(pinned, files=files) == [] and calls == []  # not parsed at all
    mod = importlib.import_module("seamdemo.mod")
    assert seams.check(pinned, files=files) == [] and calls == []  # the live objects are the file's own

    def prepare(self, batch, *args, mode=None, **kwargs):  # what a 0.33.x could have changed it to
        return None

    monkeypatch.setattr(mod.State, "prepare", prepare)
    problems = seams.check(pinned, files=files)
    assert calls == ["seamdemo.mod:State.prepare"]
    assert len(problems) == 1 and problems[0].startswith("seamdemo.mod:State.prepare: source changed"), problems
    assert seams.check(pinned, files=files, live=False) == []  # the file alone still matches


def test_the_report_marks_what_differs(pkg, capsys):
    """What a release's table run as a script prints (``python -m ...vllm.v0_33.seams``): every
    seam with the installed parameters and fingerprint, ``*`` where it differs from the pin."""
    pinned = _pinned()
    files = {"seamdemo.mod": seams.file_hash(str(pkg))}
    assert seams.report(pinned, files, "demo 1.0") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# vLLM ") and "pinned from demo 1.0" in out[0]
    assert len(out) == 1 + len(pinned) + 1 and not any(line.startswith("*") for line in out[1:]), out
    pkg.write_text(SOURCE.replace("LIMIT = 8", "LIMIT = 9"))
    seams.report(pinned, files, "demo 1.0")
    marked = [line for line in capsys.readouterr().out.splitlines() if line.startswith("*")]
    assert len(marked) == 2 and "seamdemo.mod:LIMIT [global]" in marked[0] and "file seamdemo.mod" in marked[1], marked


def test_platform_and_scope_select_the_seams():
    table = (Seam("m:a", "x"), Seam("m:b", "x", platform="rocm"), Seam("m:c", "x", platform="cuda"),
             Seam("m:d", "x", scope="cli"))
    assert [s.target for s in seams.selected(table, platform="cuda")] == ["m:a", "m:c"]
    assert [s.target for s in seams.selected(table, platform="rocm")] == ["m:a", "m:b"]
    assert [s.target for s in seams.selected(table)] == ["m:a", "m:b", "m:c"]
    assert [s.target for s in seams.selected(table, scope="cli")] == ["m:d"]
    with pytest.raises(ValueError, match="kind='method'"):
        Seam("m:a", "x", kind="method")
    with pytest.raises(ValueError, match="target='nocolon'"):
        Seam("nocolon", "x")


def test_a_release_table_is_well_formed(release):
    """One entry per target, every module of the table has a pinned file hash, every seam pins
    something, and the table was taken from its subpackage's release."""
    table = release.seams
    targets = [s.target for s in table.SEAMS]
    assert len(targets) == len(set(targets))
    assert set(table.FILES) == {s.module for s in table.SEAMS}
    assert table.RELEASE == release.RELEASE
    assert all(s.fingerprint or s.params is not None for s in table.SEAMS)
    assert all(s.module.split(".")[0] == "vllm" for s in table.SEAMS)
