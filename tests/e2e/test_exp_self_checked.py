"""The self-checked path's experiment on the CPU (``--smoke``: one round in Triton's interpreter,
numbers meaningless): every op with a self-checked form, every part of its validated call."""

from __future__ import annotations

from pathlib import Path

from bench_smoke import smoke

from swa_backends.kernels import SELF_CHECKED


def test_smoke_writes_every_part_of_every_self_checked_op(tmp_path):
    res = smoke("experiments/exp_self_checked.py", tmp_path, "exp_self_checked.json", timeout=600)
    ops = res["ops"]
    assert set(ops) == set(SELF_CHECKED), sorted(ops)
    timed = {op: row for op, row in ops.items() if not row.get("declined")}
    assert len(timed) >= len(ops) - 2, sorted(timed)  # (the generator's small steps: a ratio-1 step, say)
    for op, row in timed.items():
        assert all(row[k] > 0 for k in ("off", "on", "plain", "form", "form_wait", "quick", "enabled",
                                        "verdict_open", "ratio")), (op, row)


def test_a_path_whose_result_differs_from_the_reference_is_not_timed(tmp_path, monkeypatch):
    """Every path is compared with the op's reference before it is timed (none was): a self-checked form
    that returns a wrong result leaves its op untimed, named, and the run's status 1."""
    import json

    import torch
    from lib.smoke import run_script

    from swa_backends.kernels import rows

    if torch.cuda.is_available():
        import pytest

        pytest.skip("--smoke runs on a CPU")
    real = rows.gather_rows_checked

    def wrong(*a, **kw):
        done = real(*a, **kw)  # (the interpreter: the launch is over when it returns)
        if done is not None:
            done[0].zero_()
        return done

    monkeypatch.setattr(rows, "gather_rows_checked", wrong)
    script = Path(__file__).resolve().parents[2] / "bench" / "experiments" / "exp_self_checked.py"
    assert run_script(script, "--out", str(tmp_path), "--smoke") == 1
    ops = json.loads((tmp_path / "exp_self_checked.json").read_text())["ops"]
    # (the validated call takes the form)
    assert set(ops["gather_rows"]) == {"wrong"} and set(ops["gather_rows"]["wrong"]) == {"on", "form"}
    assert "off" in ops["scatter_rows"]  # the others timed as before
