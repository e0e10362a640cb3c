"""The validation-floor experiment's wiring on the CPU (``--smoke``: one round, numbers
meaningless): every measurement of the GPU run is present and the profile table is written."""

from __future__ import annotations

from bench_smoke import smoke


def test_smoke_writes_every_measurement(tmp_path):
    res = smoke("experiments/exp_validation_floor.py", tmp_path, "exp_validation_floor.json")
    assert set(res["host_us"]) == {"read", "read_after_kernel", "busy_kernel_launch", "launch", "validated",
                                   "sparse_mla", "sparse_mla_validated"}
    assert all(v > 0 for v in res["host_us"].values()) and "Self CPU" in res["profile"]
    ops = res["validators_us"]
    assert len(ops) == 13 and all(0 < t["host_checks"] and 0 < t["all_checks"] for t in ops.values()), ops
