"""The validation benchmark keeps working: without a GPU, ``--smoke`` runs every op validated and
not on the generator's small steps and one tiny sparse-MLA cell, one call each (no timing
loops). What it checks before timing is asserted here: validated and unvalidated results are
equal and a validated call reads the device at most once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_validation.py"

from lib.smoke import run_script  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script times the grid (minutes)")
def test_smoke(tmp_path, capsys):
    assert run_script(SCRIPT, "--out", str(tmp_path), "--smoke") == 0
    stdout = capsys.readouterr().out
    res = json.loads((tmp_path / "bench_validation.json").read_text())
    assert res["meta"]["smoke"] is True and res["meta"]["rounds"] == 1
    from swa_backends.common.ops import OPS

    assert [r["op"] for r in res["ops"]] == [op for op in OPS if op != "sparse_mla"]
    for row in (*res["ops"], *res["sparse_mla"]):
        assert row["same_result"] and row["reads"] == 1, row
    for row in res["ops"]:
        assert row["host_on_us"] > 0 and row["host_off_us"] > 0 and row["host_ratio"] > 0
        assert row["host_bare_us"] > 0 and row["host_ratio_bare"] == row["host_on_us"] / row["host_bare_us"]
    (cell,) = res["sparse_mla"]
    assert (cell["H"], cell["K"], cell["T"]) == (16, 64, 48) and cell["loop_speed"] > 0
    assert "| op | variant |" in stdout and "loop speed (goal >= 0.97)" in stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script times every op (a minute)")
def test_skip_grid_runs_the_metadata_ops_alone(tmp_path, capsys):
    """``--skip-grid`` (bench_validation_ops.json's command): every metadata op, no sparse-MLA cell."""
    assert run_script(SCRIPT, "--out", str(tmp_path), "--smoke", "--skip-grid") == 0
    stdout = capsys.readouterr().out
    res = json.loads((tmp_path / "bench_validation.json").read_text())
    assert res["sparse_mla"] == [] and len(res["ops"]) == 13
    assert all(row["same_result"] for row in res["ops"])
    assert "| op | variant |" in stdout and "loop speed" not in stdout


def test_cells_are_checked_before_anything_runs(tmp_path):
    from lib.sparse_mla import parse_cells

    assert parse_cells("64:640:4096:16384,128:1152:16384:1048576") == [(64, 640, 4096, 16384),
                                                                             (128, 1152, 16384, 1048576)]
    for bad in ("64:640:4096", "64:640:4096:512", "a:1:1:1", "0:1:1:1"):
        with pytest.raises(ValueError, match="--cells"):
            parse_cells(bad)
    with pytest.raises(ValueError, match="--cells: '64:640:4096'"):
        run_script(SCRIPT, "--out", str(tmp_path / "o"), "--smoke", "--cells", "64:640:4096")
    assert not (tmp_path / "o").exists()


def test_host_times_sets_the_switch_outside_the_timed_call(monkeypatch):
    """Each timed call runs under the switch its column names, set before the timing (the timed call
    is the op's call alone, no ``with sb.validation(...)`` block), and the thread's switch is the
    caller's again afterwards."""
    import importlib.util
    import swa_backends as sb
    from lib import timing as tm

    spec = importlib.util.spec_from_file_location("bench_validation_under_test", SCRIPT)
    bv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bv)
    seen = []

    def one_call_us(prepares, rounds):
        out = {}
        for name, prepare in prepares.items():
            call = prepare()
            entered = []
            monkeypatch.setattr(sb, "validation", lambda on: entered.append(on))  # a block would call it
            call()
            monkeypatch.undo()
            assert not entered, name
            out[name] = {"host": 1.0, "wall": 2.0}
        return out

    monkeypatch.setattr(tm, "one_call_us", one_call_us)
    sb.set_validation(False)
    try:
        t = bv.host_times(lambda x: seen.append(("fn", sb.validation_enabled(), x)),
                          lambda x: seen.append(("bare", sb.validation_enabled(), x)), (torch.ones(1),), {}, 3)
        assert sb.validation_enabled() is False  # the caller's switch again
    finally:
        sb.set_validation(True)
    assert [(who, on) for who, on, _ in seen] == [("fn", True), ("fn", False), ("bare", True)]
    assert set(t) == {f"{k}_{c}" for k in ("host", "wall") for c in ("on", "off", "bare")}
