"""The self-checked path's experiment on the CPU (``--smoke``: one round in Triton's interpreter,
numbers meaningless): every op with a self-checked form, every part of its validated call."""

from __future__ import annotations

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
