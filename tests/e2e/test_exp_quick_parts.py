"""The quick checks' attribute costs on the CPU (``--smoke``: a few reads, numbers meaningless):
every read and pad's quick check timed."""

from __future__ import annotations

from bench_smoke import smoke


def test_smoke_times_every_read_and_pads_quick_check(tmp_path):
    res = smoke("experiments/exp_quick_parts.py", tmp_path, "exp_quick_parts.json", timeout=300)
    us = res["us"]
    assert {"device", "get_device", "is_neg", "plain", "pad_quick_check"} <= set(us), sorted(us)
    assert all(v > 0 for v in us.values()), us
