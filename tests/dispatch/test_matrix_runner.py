"""``swa-backends matrix``: the conformance suite over every matrix.yaml row.

The pytest entry of the runner is :func:`test_matrix_cli_every_row` (a subprocess: Triton's
interpreter mode is process-wide); its GPU twin runs the real device's row on hardware.
The other tests drive the runner in-process with injected variants to show that a wrong
variant fails the run, that a missing contract-double module skips with its reason, and
that contract doubles are installed around a vendor variant pinned to the row's device.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import types

import pytest
import torch
import yaml

from swa_backends import OPS, load_matrix
from swa_backends.common import registry
from swa_backends.common.matrix import parse_matrix
from swa_backends.common.registry import Variant
from swa_backends.dispatch import all_variants
from swa_backends.testing.matrix_runner import Job, Progress, _execute_in_worker, run_matrix

STATUSES = {"pass", "emulated", "fail", "skipped"}


def _run_cli(tmp_path, *extra, env=None):
    cmd = [sys.executable, "-m", "swa_backends", "matrix", "--out", str(tmp_path), "--cases", "2", "--progress", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)


def _check_report(tmp_path, res) -> dict:
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads((tmp_path / "matrix_report.json").read_text())
    md = (tmp_path / "matrix_report.md").read_text()
    matrix = load_matrix()
    assert [r["id"] for r in data["rows"]] == list(matrix.rows)
    declared = all_variants()
    for row in data["rows"]:
        mrow = matrix.rows[row["id"]]
        assert f"| {row['id']} | {row['mode']} |" in md
        assert row["id"] in res.stdout
        for op in OPS:
            got = {r["variant"] for r in data["results"] if r["row"] == row["id"] and r["op"] == op}
            assert got == {n for n in mrow.allowed(op) if n in declared.get(op, {})}, (row["id"], op)
            assert row["cells"][op] in {"pass", "emulated", "pass+emu", "FAIL", "skipped"}
    for r in data["results"]:
        assert r["status"] in STATUSES
        mode = next(x["mode"] for x in data["rows"] if x["id"] == r["row"])
        if r["status"] == "pass":
            assert mode == "hardware" and r["mode"] == "hardware" and r["passed"] > 0 and not r["failed"]
        if r["status"] == "emulated":
            assert r["mode"] in ("interpreter", "cpu", "doubles") and r["passed"] > 0 and not r["failed"]
        if r["status"] == "skipped":
            assert r["detail"], f"skipped without a reason: {r}"
    assert data["summary"]["fail"] == 0
    assert "[" in res.stderr and "#" in res.stderr  # the progress bar
    return data


def test_matrix_cli_every_row(tmp_path):
    """Every row, every op, every listed variant; on this CPU machine the cpu row is
    hardware and every other row is emulated."""
    res = _run_cli(tmp_path)
    data = _check_report(tmp_path, res)
    for row in data["rows"]:
        if torch.cuda.is_available():
            break
        assert row["mode"] == ("hardware" if row["id"] == "cpu" else "emulated")
    ref = [r for r in data["results"] if r["variant"] == "reference"]
    assert {r["status"] for r in ref if r["row"] == "cpu"} == {"pass"}
    assert {r["status"] for r in ref if r["row"] != "cpu"} <= {"emulated"}


@pytest.mark.gpu
def test_matrix_cli_on_the_gpu(tmp_path):
    """On a GPU machine the detected row runs on hardware (in this process) and the rest
    emulated in a CPU-only worker."""
    from swa_backends.common.device import detect

    real = detect(f"cuda:{torch.cuda.current_device()}")
    res = _run_cli(tmp_path)
    data = _check_report(tmp_path, res)
    assert data["settings"]["in_process"] is False
    hw = [r for r in data["rows"] if r["mode"] == "hardware"]
    row_ids = {(r["platform"], r["arch"]): r["id"] for r in data["rows"]}
    assert {r["id"] for r in hw} == {"cpu"} | ({row_ids[(real.platform, real.arch)]}
                                             if (real.platform, real.arch) in row_ids else set())
    mine = [r for r in data["results"] if r["row"] in {x["id"] for x in hw} - {"cpu"}]
    assert all(r["status"] in ("pass", "skipped", "emulated") for r in mine)
    assert any(r["status"] == "pass" for r in mine) or not mine


# ---------------------------------------------------------------------------------------
# in-process: injected variants and a custom matrix
# ---------------------------------------------------------------------------------------

ALL = ("cpu", "cuda", "rocm", "ascend")


def _bad_gather(x, rows, *, out=None):
    got = x.index_select(0, rows)
    got = got + 1 if got.dtype != torch.bool else ~got
    return got if out is None else out.copy_(got)


def _crash(*args, **kwargs):
    raise RuntimeError("kernel exploded")


@pytest.fixture
def injected(monkeypatch):
    """Test variants: a wrong gather_rows, a crashing scatter_rows, and a 'vendor'
    gather_rows for ROCm that needs a package this machine lacks (probe swa_test_vendor)."""
    impls = types.ModuleType("swa_test_impls")
    impls.bad_gather = _bad_gather
    impls.crash = _crash
    monkeypatch.setitem(sys.modules, "swa_test_impls", impls)
    table = all_variants()
    monkeypatch.setitem(table["gather_rows"], "broken",
                        Variant(op="gather_rows", name="broken", impl="swa_test_impls:bad_gather", platforms=ALL))
    monkeypatch.setitem(table["scatter_rows"], "crashy",
                        Variant(op="scatter_rows", name="crashy", impl="swa_test_impls:crash", platforms=ALL))
    monkeypatch.setitem(table["gather_rows"], "vendorlib",
                        Variant(op="gather_rows", name="vendorlib", impl="swa_backends.common.ops.rows:gather_rows",
                                platforms=("rocm",), archs=("gfx942", "gfx950"), requires=("swa_test_vendor",)))
    monkeypatch.setitem(registry._PROBES, "swa_test_vendor", lambda: "swa_test_vendor is not installed")
    return table


def _matrix(rows: list[dict]):
    base = {"version": 1, "encoder_replay": [], "decoder_replay": [], "rows": []}
    for r in rows:
        base["rows"].append({"encoder_replay": {"enabled": True, "because": "test"},
                             "decoder_replay": {"enabled": True, "because": "test"}, "verified": {}, **r})
    return parse_matrix(yaml.safe_load(yaml.safe_dump(base)), "test-matrix", all_variants())


def test_a_wrong_variant_fails_the_run(injected):
    m = _matrix([
        {"platform": "cpu", "arch": "cpu",
         "variants": {"*": ["reference"], "gather_rows": ["broken", "reference"], "scatter_rows": ["crashy", "reference"]}},
        {"platform": "cuda", "arch": "sm90", "variants": {"*": ["reference"], "gather_rows": ["broken", "reference"]}},
    ])
    rep = run_matrix(matrix=m, ops=["gather_rows", "scatter_rows", "gather_replay_batch"], cases=5, in_process=True)
    by = {(r.row, r.op, r.variant): r for r in rep.results}
    assert by[("cpu", "gather_rows", "broken")].status == "fail"
    assert "differs at" in by[("cpu", "gather_rows", "broken")].detail
    assert by[("cpu", "gather_rows", "reference")].status == "pass"
    assert by[("cpu", "scatter_rows", "crashy")].status == "fail"
    assert "RuntimeError: kernel exploded" in by[("cpu", "scatter_rows", "crashy")].detail
    # the fake sm90 row reuses the CPU run of the same code on the same inputs
    sm90 = by[("cuda:sm90", "gather_rows", "broken")]
    assert sm90.status == "fail" and sm90.shared_with == "cpu" and sm90.mode == "cpu"
    assert by[("cuda:sm90", "gather_replay_batch", "reference")].status == "emulated"
    assert rep.exit_code == 1
    assert rep.cell("cpu", "gather_rows") == "FAIL" and rep.cell("cpu", "gather_replay_batch") == "pass"
    assert rep.cell("cuda:sm90", "gather_replay_batch") == "emulated"
    text = rep.text()
    assert "FAIL: cpu / scatter_rows / crashy: RuntimeError: kernel exploded" in text
    md = rep.markdown()
    assert "| cpu | hardware | FAIL | FAIL | pass |" in md


def test_cli_exit_code_and_reports(injected, tmp_path, monkeypatch, capsys):
    from swa_backends import cli

    m = _matrix([{"platform": "cpu", "arch": "cpu", "variants": {"*": ["reference"],
                                                                           "gather_rows": ["broken", "reference"]}}])
    monkeypatch.setattr("swa_backends.testing.matrix_runner.load_matrix", lambda path=None: m)
    rc = cli.main(["matrix", "--ops", "gather_rows,gather_replay_batch", "--cases", "4", "--out", str(tmp_path),
                   "--no-progress", "--in-process"])
    out = capsys.readouterr()
    assert rc == 1
    assert "FAIL" in out.out and "reports:" in out.out
    data = json.loads((tmp_path / "matrix_report.json").read_text())
    assert data["summary"]["fail"] == 1 and data["summary"]["exit_code"] == 1
    rc = cli.main(["matrix", "--ops", "gather_replay_batch", "--cases", "2", "--no-progress", "--in-process"])
    assert rc == 0
    assert cli.main(["matrix", "--rows", "nope", "--no-progress"]) == 2
    assert "rows='nope'" in capsys.readouterr().err


def test_missing_contract_doubles_skip_with_reason(injected, monkeypatch):
    name = "swa_backends.testing.emulation.rocm"
    monkeypatch.setitem(sys.modules, name, None)  # as if the module did not exist
    m = _matrix([{"platform": "rocm", "arch": "gfx942",
                  "variants": {"*": ["reference"], "gather_rows": ["vendorlib", "reference"]}}])
    rep = run_matrix(matrix=m, ops=["gather_rows"], cases=2, in_process=True)
    by = {r.variant: r for r in rep.results}
    assert by["vendorlib"].status == "skipped"
    assert by["vendorlib"].detail == f"no contract doubles for rocm ({name} does not exist in this build)"
    assert by["reference"].status == "emulated"
    assert rep.cell("rocm:gfx942", "gather_rows") == "emulated" and rep.exit_code == 0


def test_vendor_variant_runs_inside_the_rows_contract_doubles(injected, monkeypatch):
    entered = []

    @contextlib.contextmanager
    def contract_doubles(device=None):
        entered.append(str(device.arch))
        registry.override_probe("swa_test_vendor", None)
        try:
            yield
        finally:
            registry._PROBE_OVERRIDES.pop("swa_test_vendor", None)

    emu = types.ModuleType("swa_backends.testing.emulation.rocm")
    emu.contract_doubles = contract_doubles
    monkeypatch.setitem(sys.modules, "swa_backends.testing.emulation.rocm", emu)
    m = _matrix([
        {"platform": "rocm", "arch": "gfx942", "variants": {"*": ["reference"],
                                                                         "gather_rows": ["vendorlib", "reference"]}},
        {"platform": "rocm", "arch": "gfx950", "variants": {"*": ["reference"],
                                                                         "gather_rows": ["vendorlib", "reference"]}},
        {"platform": "rocm", "arch": "gfx1100", "variants": {"*": ["reference"]}},
    ])
    rep = run_matrix(matrix=m, ops=["gather_rows"], cases=3, in_process=True)
    by = {(r.row, r.variant): r for r in rep.results}
    assert entered == ["gfx942", "gfx950"]  # once per row, pinned to the row's arch
    for row in ("rocm:gfx942", "rocm:gfx950"):
        r = by[(row, "vendorlib")]
        assert r.status == "emulated" and r.mode == "doubles" and r.passed == 3 and r.shared_with is None
    assert ("rocm:gfx1100", "vendorlib") not in by  # the row does not list it
    assert registry.probe("swa_test_vendor") == "swa_test_vendor is not installed"  # restored


def test_declared_reasons_skip(injected):
    m = _matrix([{"platform": "cuda", "arch": "sm90", "variants": {"*": ["reference"]}}])
    jobs_rep = run_matrix(matrix=m, ops=["gather_rows"], cases=1, in_process=True)
    assert {r.variant for r in jobs_rep.results} == {"reference"}
    # a ROCm-only vendor variant cannot even be listed on a CUDA row (the loader rejects widening)
    with pytest.raises(Exception, match="widen"):
        _matrix([{"platform": "cuda", "arch": "sm90", "variants": {"*": ["reference"],
                                                                              "gather_rows": ["vendorlib"]}}])


def test_worker_subprocess_gives_the_same_results():
    """The path used when an accelerator is present: jobs run in a CPU-only subprocess."""
    jobs = [Job("cuda:sm90", "cuda", "sm90", op, "reference", "cpu", verified="not-run")
            for op in ("gather_replay_batch", "sparse_mla")]
    remote = _execute_in_worker(jobs, cases=2, seed=4, progress=False)
    from swa_backends.testing.matrix_runner import execute

    local = execute(jobs, cases=2, seed=4, progress=Progress(0, False))
    assert [(r.status, r.passed, r.failed) for r in remote] == [(r.status, r.passed, r.failed) for r in local]
    assert [r.status for r in remote] == ["emulated", "emulated"]


def test_progress_bar():
    s = io.StringIO()
    p = Progress(3, True, stream=s, tty=True)
    for i in range(3):
        p.step(f"job {i}")
    out = s.getvalue()
    assert out.count("\r") == 3 and out.endswith("\n") and "[########################] 3/3" in out
    s = io.StringIO()
    p = Progress(2, True, stream=s, tty=False)
    p.step("a")
    p.step("b")
    assert s.getvalue().count("\n") == 2 and "1/2" in s.getvalue()
    s = io.StringIO()
    Progress(2, False, stream=s).step("a")
    assert s.getvalue() == ""


def test_bad_arguments():
    with pytest.raises(ValueError, match="cases=0"):
        run_matrix(cases=0)
    with pytest.raises(ValueError, match="ops='nope'"):
        run_matrix(ops=["nope"])


def _needs_512(q, kv, indices, lens, sm_scale, d_v, *, sink=None):
    return [] if q.shape[2] == 512 and d_v == 512 else [f"needs D = d_v = 512, got {q.shape[2]} / {d_v}"]


def test_vendor_variant_that_declines_random_cases_runs_serving_shapes(monkeypatch):
    """A variant serving only production shapes (per-call input_check) is run on the
    serving-shaped cases, and the note says so; one that declines those too is skipped."""
    impls = types.ModuleType("swa_test_impls2")
    impls.needs_512 = _needs_512
    impls.never = lambda *a, **k: ["never accepts anything"]
    monkeypatch.setitem(sys.modules, "swa_test_impls2", impls)
    table = all_variants()
    monkeypatch.setitem(table["sparse_mla"], "big_only", Variant(
        op="sparse_mla", name="big_only", impl="swa_backends.common.ops.sparse_mla:reference", platforms=ALL,
        input_check="swa_test_impls2:needs_512"))
    monkeypatch.setitem(table["sparse_mla"], "picky", Variant(
        op="sparse_mla", name="picky", impl="swa_backends.common.ops.sparse_mla:reference", platforms=ALL,
        input_check="swa_test_impls2:never", kv_formats="*"))  # its own check is its only reason
    m = _matrix([{"platform": "cpu", "arch": "cpu",
                  "variants": {"*": ["reference"], "sparse_mla": ["big_only", "picky", "reference"]}}])
    rep = run_matrix(matrix=m, ops=["sparse_mla"], cases=2, in_process=True)
    by = {r.variant: r for r in rep.results}
    big = by["big_only"]
    assert big.status == "pass" and big.passed == 2 and big.rejected == 2
    assert "ran serving-shaped cases (T=8, H=16, D=512, d_v=512, K=128, S=512, bfloat16)" in big.detail
    assert by["picky"].status == "skipped" and "never accepts anything" in by["picky"].detail
    assert by["reference"].status == "pass" and rep.exit_code == 0


def test_run_op_hands_the_op_the_cases_layout_and_shared_memory():
    """``conformance.to_device`` (what ``run_op`` and the matrix runner hand a variant) keeps each
    tensor's strides and storage offset, so a slice of a wider buffer reaches the op as one, and
    arguments that share memory share the copy's; the case's own tensors are not the copies'. A
    negative-bit view is copied as ``Tensor.to`` copies it (its values)."""
    from swa_backends.testing.conformance import to_device

    buf = torch.arange(40, dtype=torch.int32).reshape(4, 10)
    rows, row = buf[:, 2:7], buf[1]
    (a, b), kw = to_device(((rows, row), {"x": buf}), "cpu")
    assert (a.stride(), a.storage_offset(), b.storage_offset()) == ((10, 1), 2, 10)
    assert torch.equal(a, rows) and torch.equal(b, row) and torch.equal(kw["x"], buf)
    ptrs = {t.untyped_storage().data_ptr() for t in (a, b, kw["x"])}
    assert len(ptrs) == 1 and buf.untyped_storage().data_ptr() not in ptrs
    a[0, 0] = -5
    assert int(kw["x"][0, 2]) == -5 and int(buf[0, 2]) == 2  # shared with the copies, not with the case
    neg = torch._neg_view(torch.arange(3, dtype=torch.int32))
    assert torch.equal(to_device(neg, "cpu"), neg)
