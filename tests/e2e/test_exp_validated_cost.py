"""``bench/experiments/exp_validated_cost.py``: its arithmetic (speeds per timing, the validated call's
extra time in three parts), its refusals before anything runs (a bad ``--check``, a loop of one
call), and its stop with the reason on a machine without a GPU; and ``lib.timing``'s sleep for a
given host work, which it sets per cell."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import exp_validated_cost as exp  # noqa: E402
from lib import timing as tm  # noqa: E402
from lib.smoke import run_script  # noqa: E402

SCRIPT = ROOT / "bench" / "experiments" / "exp_validated_cost.py"


def test_speeds_are_unvalidated_over_validated_per_timing():
    ms = {"unvalidated": 1.0, "validated": 1.25, "unvalidated_lead05": 2.0, "validated_lead05": 2.5,
          "unvalidated_loop": 3.0, "validated_loop": 3.0}
    assert exp.speeds(ms) == {"lead": 0.8, "lead05": 0.8, "loop": 1.0}
    assert exp.speeds({"unvalidated": 1.0, "validated": 2.0}) == {"lead": 0.5}


def test_split_adds_up_to_the_validated_calls_extra_time():
    ms = {"unvalidated": 1.0, "gated": 1.002, "check+gated": 1.014, "validated": 1.020}
    got = exp.split_us(ms)
    assert got == pytest.approx({"gated build": 2.0, "device check": 12.0, "host and wait": 6.0})
    assert sum(got.values()) == pytest.approx((ms["validated"] - ms["unvalidated"]) * 1e3)


def test_parse_checks_takes_label_file_pairs(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("")
    assert exp.parse_checks([f"ef={f}", f"b={f}"]) == {"ef": f, "b": f}
    for bad in (f"{f}", f"1x={f}", f"ef={tmp_path / 'nope.py'}"):
        with pytest.raises(ValueError, match=r"--check: .*expected LABEL=FILE"):
            exp.parse_checks([bad])
    with pytest.raises(ValueError, match="not given before"):
        exp.parse_checks([f"ef={f}", f"ef={f}"])


def test_refusals_come_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match=r"--check: 'x=.*nope\.py'"):
        run_script(SCRIPT, "--out", str(tmp_path / "o"), "--check", f"x={tmp_path / 'nope.py'}")
    with pytest.raises(ValueError, match=r"--calls 1; expected at least 2"):
        run_script(SCRIPT, "--out", str(tmp_path / "o"), "--calls", "1")
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_stops_with_the_reason(tmp_path, capsys):
    assert run_script(SCRIPT, "--out", str(tmp_path / "o")) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_lead_covers_four_times_the_host_work_and_never_less_than_the_fixed_sleep():
    assert tm.lead_cycles_for(0.0) == tm.LEAD_CYCLES
    assert tm.lead_cycles_for(100.0) == tm.LEAD_CYCLES  # 0.8M cycles: under the fixed sleep
    assert tm.lead_cycles_for(1000.0) == 4 * 1000 * tm.CYCLES_PER_US


def test_interleaved_ms_refuses_a_loop_of_no_calls():
    with pytest.raises(ValueError, match="calls=0; expected at least 1"):
        tm.interleaved_ms({"f": lambda: None}, 1, calls=0)
