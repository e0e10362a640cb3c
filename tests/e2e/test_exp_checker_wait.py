"""The checker programs' wait experiment on the CPU (``--smoke``: tiny sizes in Triton's interpreter,
numbers meaningless): every size of every op timed at every nap, its checker count recorded;
``--ops`` picks some."""

from __future__ import annotations

from bench_smoke import smoke


def test_smoke_times_every_op(tmp_path):
    res = smoke("experiments/exp_checker_wait.py", tmp_path, "exp_checker_wait.json", timeout=300)
    assert res["naps"] == [0, 32, 128, 512]
    for op in ("plain_indices", "gather_rows", "mixed_indices", "indices_to_csr"):
        assert sorted(res[op]) == ["0", "128", "32", "512"], op  # (JSON keys)
        for by_size in res[op].values():
            assert by_size, op
            for row in by_size.values():
                assert row["checkers"] >= 1 and all(row[k] > 0 for k in ("plain", "form", "form_wait")), (op, row)
                assert (row["torch_check"] > 0) if op == "mixed_indices" else "torch_check" not in row, (op, row)


def test_smoke_times_mixed_indices_under_each_cap_on_its_checkers(tmp_path):
    res = smoke("experiments/exp_checker_wait.py", tmp_path, "exp_checker_wait.json", timeout=300,
                extra=("--ops", "mixed_indices", "--naps", "2048", "--max-checkers", "1024,1"))
    assert res["max_checkers"] == [1024, 1] and "plain_indices" not in res
    assert sorted(res["mixed_indices"]) == ["2048/1", "2048/1024"]
    uncapped, = res["mixed_indices"]["2048/1024"].values()
    capped, = res["mixed_indices"]["2048/1"].values()
    assert capped["checkers"] == 3 < uncapped["checkers"]  # one a tensor: the lengths, the window, the top-k rows
    assert all(r["torch_check"] > 0 for r in (capped, uncapped))
