"""Kernel candidates kept as diffs (``bench/experiments/candidates/``): the strict applier of
``bench/lib/patch.py`` (a hunk that does not stand where it says is refused, naming it), every
candidate applying to the kernel as it is now and loading as a module of its own, the README there
naming each one; and ``bench/experiments/check_ws_copies.py``: outputs poisoned so that an unwritten
one fails, both gather widths forced, a stale diff refused before the GPU is asked for, a machine
without a GPU told so with nothing written."""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import check_ws_copies as cc  # noqa: E402
from lib import patch  # noqa: E402
from lib.sparse_mla import REF, load_module_copy  # noqa: E402

CANDIDATES = sorted((ROOT / "bench" / "experiments" / "candidates").glob("*.diff"))
TEXT = "".join(f"line {i}\n" for i in range(1, 21))


def _diff(*hunks: str, path: str = "kernels/x.py") -> str:
    return f"--- a/{path}\n+++ b/{path}\n" + "".join(hunks)


@pytest.fixture
def sample(tmp_path) -> Path:
    """A candidate as the folder holds one (the folder may hold none): one comment of the kernel changed."""
    name = "kernels/sparse_mla_gluon_ws.py"
    old = (ROOT / name).read_text().splitlines(keepends=True)
    new = list(old)
    at = next(i for i, line in enumerate(old) if line.lstrip().startswith("# "))
    new[at] = new[at].rstrip("\n") + " (a candidate)\n"
    path = tmp_path / "ws_sample.diff"
    path.write_text("".join(difflib.unified_diff(old, new, name, name)))
    return path


def test_apply_changes_exactly_what_the_hunks_say():
    d = _diff("@@ -2,3 +2,4 @@\n line 2\n-line 3\n+three\n+three and a half\n line 4\n",
              "@@ -10,0 +12,1 @@\n+after ten\n",
              "@@ -19,2 +21,1 @@\n line 19\n-line 20\n")
    want = TEXT.replace("line 3\n", "three\nthree and a half\n").replace("line 10\n", "line 10\nafter ten\n")
    assert patch.apply(TEXT, d) == want.replace("line 20\n", "")
    assert patch.target(d) == "kernels/x.py"


@pytest.mark.parametrize("diff, what", [
    (_diff("@@ -2,2 +2,2 @@\n line 2\n-line 4\n+four\n"), r"hunk at line 3 does not apply: line 3 is 'line 3'; "
                                                          r"expected 'line 4'"),
    (_diff("@@ -19,3 +19,3 @@\n line 19\n line 20\n-line 21\n+x\n"), r"line 21 is '\(end of file\)'"),
    (_diff("@@ -2,2 +2,2 @@\n line 2\n-line 3\n"), "has 2 old / 1 new lines; its header says 2 / 2"),
    (_diff("@@ -5,1 +5,1 @@\n-line 5\n+five\n", "@@ -3,1 +3,1 @@\n-line 3\n+three\n"), "expected hunks in order"),
    (_diff("@@ -1,1 +1,1 @@\n-line 1\n*line 1\n"), r"line 5 is '\*line 1'; expected a hunk line"),
    (_diff(), "no hunk"),
    (_diff("@@ -1 +1 @@\n-line 1\n+one\n") + _diff("@@ -1 +1 @@\n-line 1\n+one\n", path="y.py"), "names 2 files"),
])
def test_apply_refuses_what_does_not_stand_where_it_says(diff, what):
    with pytest.raises(ValueError, match=what):
        patch.target(diff)
        patch.apply(TEXT, diff)


@pytest.mark.parametrize("diff", CANDIDATES, ids=lambda p: p.stem)
def test_each_candidate_applies_to_the_kernel_as_it_is_and_loads_apart(diff):
    _applies_and_loads_apart(diff)


def test_a_candidate_made_as_the_readme_says_applies_and_loads_apart(sample):
    _applies_and_loads_apart(sample)  # (the folder may hold no candidate)


def _applies_and_loads_apart(diff: Path) -> None:
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    assert patch.target(diff.read_text()) == "kernels/sparse_mla_gluon_ws.py"
    text = patch.patched(diff)
    assert text != (ROOT / "kernels" / "sparse_mla_gluon_ws.py").read_text()
    mod = load_module_copy(f"_test_{diff.stem}", diff)
    try:
        assert Path(mod.__file__).read_text() == text
        assert (Path(mod.__file__).parent.stat().st_mode & 0o777) == 0o700  # nobody else can write what is loaded
        import swa_backends.kernels.sparse_mla_gluon_ws as shipped

        assert mod._sparse_mla_gluon_ws_fwd is not shipped._sparse_mla_gluon_ws_fwd
        assert callable(mod.sparse_mla) and callable(mod.wide_gathers)
    finally:
        sys.modules.pop(mod.__name__, None)


def test_the_candidates_readme_names_each_candidate():
    readme = (ROOT / "bench" / "experiments" / "candidates" / "README.md").read_text()
    named = set(re.findall(r"`(ws_\w+)\.diff`", readme))
    assert named == {p.stem for p in CANDIDATES}


def _reference_module(broken=lambda args, wide: False):
    """A stand-in for a kernel module: the reference, or (where ``broken``) outputs left unwritten."""
    mod = SimpleNamespace(wide_gathers=lambda kv: False)

    def sparse_mla(q, kv, idx, lens, scale, d_v, sink=None):
        out, lse = REF(q, kv, idx, lens, scale, d_v, sink=sink)
        if broken((q, idx), mod.wide_gathers(kv)):
            # what a kernel that skipped its stores leaves: its output as the kernels allocate it (torch.empty,
            # which check_copies poisons; torch.empty_like is not, and may hand back the reference's bytes)
            return torch.empty(out.shape, dtype=q.dtype, device=out.device), lse
        return out.to(q.dtype), lse

    mod.sparse_mla = sparse_mla
    return mod


CALLS = [("grow", 3, 70, 5, True), ("spiky", 2, 130, 4, False)]


def test_copies_are_checked_per_call_and_width_with_poisoned_outputs():
    wide_only = _reference_module(lambda args, wide: wide)
    rows = cc.check_copies({"ok": _reference_module(), "wide_only": wide_only}, CALLS, dev="cpu")
    assert [(r["pattern"], r["wide"]) for r in rows["ok"]] == [("grow", False), ("grow", True),
                                                                ("spiky", False), ("spiky", True)]
    assert all(r["mismatch"] is None and r["rel"] < 1e-2 for r in rows["ok"])
    assert [r["mismatch"] is not None for r in rows["wide_only"]] == [False, True, False, True]
    assert wide_only.wide_gathers(None) is False  # the module's own choice is put back


@pytest.mark.parametrize("argv, what", [([], "expected --out DIR and at least one FILE"),
                                        (["x.diff"], "expected an existing .py or .diff file"),
                                        (["bench/experiments/candidates/README.md"],
                                         "expected an existing .py or .diff file"),
                                        (["bench/bench_flashmla.py", "bench/bench_flashmla.py"], "not given before")])
def test_bad_copies_refused(tmp_path, monkeypatch, argv, what):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match=what):
        cc.main(["--out", str(tmp_path / "o")] + argv)
    assert not (tmp_path / "o").exists()


def test_a_copy_may_not_take_the_kernels_own_label(tmp_path):
    (tmp_path / "kernel.py").write_text((ROOT / "kernels" / "sparse_mla_gluon_ws.py").read_text())
    with pytest.raises(ValueError, match="other than 'kernel'"):
        cc.main(["--out", str(tmp_path / "o"), str(tmp_path / "kernel.py")])


def test_a_stale_diff_is_refused_before_the_gpu(tmp_path):
    stale = tmp_path / "stale.diff"
    stale.write_text(_diff("@@ -1,1 +1,1 @@\n-not the kernel's first line\n+x\n",
                           path="kernels/sparse_mla_gluon_ws.py"))
    with pytest.raises(ValueError, match="stale.diff: the hunk at line 3 does not apply: line 1 is"):
        cc.main(["--out", str(tmp_path / "o"), str(stale)])
    assert not (tmp_path / "o").exists()


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, monkeypatch, capsys, sample):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cc.main(["--out", str(tmp_path / "o"), str(sample)]) == 2
    said = capsys.readouterr()
    assert "needs a CUDA GPU" in said.err + said.out
    assert not (tmp_path / "o").exists()


class _Event:
    """torch.cuda.Event's stand-in: done after ``polls`` queries (never: None)."""

    def __init__(self, polls):
        self.polls = polls

    def record(self):
        pass

    def query(self):
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0


@pytest.mark.parametrize("polls, finished", [(0, True), (3, True), (None, False)])
def test_a_deadlocked_copy_is_told_by_a_watch_not_a_synchronize(monkeypatch, polls, finished):
    calls = []
    monkeypatch.setattr(torch.cuda, "Event", lambda: _Event(polls))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("a synchronize would hang with the kernel"))
    assert cc.finishes(lambda: calls.append(1), 0.2) is finished
    assert calls == [1]


@pytest.mark.parametrize("rc, stderr, verdict", [(0, "", "ok"), (cc.DEADLOCKED, "", "deadlocked"),
                                                 (1, "Traceback\nRuntimeError: PassManager::run failed\n",
                                                  "failed (exit 1): RuntimeError: PassManager::run failed")])
def test_each_copy_is_probed_in_a_process_of_its_own(monkeypatch, rc, stderr, verdict, sample):
    seen = []

    def run(cmd, **kw):
        seen.append(cmd)
        return SimpleNamespace(returncode=rc, stderr=stderr, stdout="")

    monkeypatch.setattr(cc.subprocess, "run", run)
    assert cc.probe_apart(sample, 7.5) == verdict
    assert seen == [[sys.executable, cc.__file__, "--probe", str(sample), "--hang-seconds", "7.5"]]


def test_the_probe_exits_deadlocked_at_once_when_a_call_does_not_finish(monkeypatch, sample):
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    calls = []
    monkeypatch.setattr(cc, "sparse_mla_moving_max_case", lambda *a, **k: ((), {}))
    monkeypatch.setattr(cc, "finishes", lambda fn, seconds: calls.append(seconds) or len(calls) < 2)

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(cc.os, "_exit", exit_)
    with pytest.raises(SystemExit) as e:
        cc.main(["--probe", str(sample), "--hang-seconds", "5"])
    assert e.value.code == cc.DEADLOCKED and calls == [5.0, 5.0]  # narrow finished, wide did not


def test_each_call_is_settled_through_the_callers_watch():
    seen, rows = [], {}
    cc.check_copies({"ok": _reference_module()}, CALLS[:1], dev="cpu",
                    settled=lambda label, call, wide: seen.append((label, call, wide)), rows=rows)
    assert seen == [("ok", CALLS[0], False), ("ok", CALLS[0], True)]
    assert [r["wide"] for r in rows["ok"]] == [False, True]  # filled in place: what a stopped run writes
