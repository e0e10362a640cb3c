"""bench_e2e's ``--prefer``: the stack runs an op through the named variant (``select``'s prefer), the
result records it, and a malformed or unknown value is refused before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_e2e.py"
SMALL = ["--device", "cpu", "--config", "small", "--isl", "256", "--batch", "1", "--drift", "1", "--reps", "1"]


def run(out, *args):
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *SMALL, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_prefer_runs_the_named_variant(tmp_path):
    proc = run(tmp_path, "--prefer", "sparse_mla=reference")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "bench_e2e.json").read_text())
    assert res["prefer"] == {"sparse_mla": "reference"}
    assert res["variants"]["sparse_mla"] == ["reference"]
    assert res["sanity"]["violations"] == [] and res["trim"], res["sanity"]


@pytest.mark.parametrize("value, what", [("sparse_mla", "--prefer 'sparse_mla': expected OP=VARIANT"),
                                         ("sparse_mla=bogus", "prefer['sparse_mla']='bogus': expected one of"),
                                         ("nope=triton", "expected op names from")])
def test_bad_prefer_is_refused(tmp_path, value, what):
    proc = run(tmp_path, "--prefer", value)
    assert proc.returncode != 0 and what in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "bench_e2e.json").exists()
