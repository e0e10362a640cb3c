"""A bench script's ``--smoke`` run on the CPU, as the e2e wiring tests make it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def smoke(script: str, out: Path, result: str, timeout: int = 300, extra: tuple[str, ...] = ()) -> dict:
    """Run ``bench/<script> --out <out> --smoke <extra>`` from the checkout; assert it exits 0 and
    return the JSON it wrote to ``out / result``."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--out", str(out), "--smoke", *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((out / result).read_text())
