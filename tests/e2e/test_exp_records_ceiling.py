"""The records-ceiling experiment's CPU part: ``--numerics-only`` measures what FP8 tensor-core math
(Q and P rounded to e4m3) would add to the output error on each record format, beside the error of
the bf16 kernels' own rounding of P, in a process started as a person would start an experiment
(``bench/experiments/`` puts the shared library on its path itself); bad arguments are refused
before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "experiments" / "exp_records_ceiling.py"
CONTRACT = 1e-2  # testing.conformance.mismatch's rtol for sparse_mla

from lib.smoke import run_script  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_numerics_only_measures_the_fp8_error(tmp_path):
    proc = run("--out", str(tmp_path), "--numerics-only", "--formats", "v4_fp8,v41_mxfp8")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    err = json.loads((tmp_path / "exp_records_ceiling.json").read_text())["fp8_mma_error"]
    assert set(err) == {"v4_fp8", "v41_mxfp8"}
    for fmt, e in err.items():
        assert set(e) == {"p_bf16 (the bf16 kernels)", "q", "p", "q_and_p"}, fmt
        # what bench/README states: bf16 P well inside the contract, FP8 Q or P outside it
        assert 0 < e["p_bf16 (the bf16 kernels)"] < CONTRACT / 4, (fmt, e)
        assert min(e["q"], e["p"], e["q_and_p"]) > CONTRACT, (fmt, e)
        assert e["q_and_p"] > max(e["q"], e["p"]), (fmt, e)
    assert "contract: 0.01" in proc.stdout


@pytest.mark.parametrize("args, what", [(["--formats", "v4_fp8,bogus"], "--formats 'v4_fp8,bogus': ['bogus']"),
                                        (["--l2-rows", "100"], "--l2-rows 100: expected a positive multiple of 64"),
                                        (["--l2-rows", "0"], "--l2-rows 0")])
def test_bad_arguments_are_refused(tmp_path, args, what, capsys):
    assert run_script(SCRIPT, "--out", str(tmp_path), "--numerics-only", *args) != 0
    err = capsys.readouterr().err
    assert what in err, err[-2000:]
    assert not (tmp_path / "exp_records_ceiling.json").exists()
