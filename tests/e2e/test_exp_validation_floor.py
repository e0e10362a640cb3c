"""The validation-floor experiment's wiring on the CPU (``--smoke``: one round, numbers
meaningless): every measurement of the GPU run is present and the profile table is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "experiments" / "exp_validation_floor.py"


def test_smoke_writes_every_measurement(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--smoke"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((tmp_path / "exp_validation_floor.json").read_text())
    assert set(res["host_us"]) == {"read", "read_after_kernel", "busy_kernel_launch", "launch", "validated",
                                   "sparse_mla", "sparse_mla_validated"}
    assert all(v > 0 for v in res["host_us"].values()) and "Self CPU" in res["profile"]
    ops = res["validators_us"]
    assert len(ops) == 13 and all(0 < t["host_checks"] and 0 < t["all_checks"] for t in ops.values()), ops
