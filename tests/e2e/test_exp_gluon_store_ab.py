"""The gluon store A/B experiment refuses what it cannot run before timing anything: a ``--before``
that is no file (named in the error), a machine without a CUDA GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "exp_gluon_store_ab.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_missing_before_file_is_refused(tmp_path):
    proc = run("--before", str(tmp_path / "nope.py"), "--out", str(tmp_path / "o"))
    assert proc.returncode != 0
    assert "--before" in proc.stderr and "nope.py" in proc.stderr and "expected a copy" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "o").exists()


def test_without_a_gpu_it_stops_with_the_reason(tmp_path):
    before = tmp_path / "before.py"
    before.write_text((ROOT / "kernels" / "sparse_mla_gluon.py").read_text())
    proc = run("--before", str(before), "--out", str(tmp_path / "o"))
    assert proc.returncode != 0 and "needs a CUDA GPU" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "o").exists()
