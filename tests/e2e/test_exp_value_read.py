"""The value-reader experiment's wiring on the CPU (``--smoke``: one round, numbers meaningless):
every primitive and every metadata op's timings (the gated design's floor, the fused floor and the
memo key among them) and the pieces its checks read."""

from __future__ import annotations

from bench_smoke import smoke


def test_smoke_writes_every_measurement(tmp_path):
    res = smoke("experiments/exp_value_read.py", tmp_path, "exp_value_read.json", timeout=600)
    assert set(res["primitives"]) == {"read_few_bytes", "reader", "reader_plan", "reader_launch", "reader_copy",
                                      "torch_way", "aminmax_20k", "cat_4_small"}
    assert all(v > 0 for v in res["primitives"].values())
    ops = res["ops"]
    assert len(ops) == 13, sorted(ops)
    for op, row in ops.items():
        assert all(row[k] > 0 for k in ("off", "reader", "torch", "host_checks", "no_read", "in_read", "key",
                                        "gated_floor", "gated_floor_ratio", "gated_floor_mapped",
                                        "gated_floor_mapped_ratio", "fused_floor", "fused_floor_ratio")), (op, row)
        assert all(kind in ("W", "R") for kind, _, _ in row["pieces"]), (op, row["pieces"])
    assert sum(bool(row["pieces"]) for row in ops.values()) >= 10  # (host tensors: every piece read whole)
