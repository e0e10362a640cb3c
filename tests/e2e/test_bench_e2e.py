"""bench_e2e on the CPU (the small stack, one ISL, one rep: the script's own CPU mode) and its
``--prefer``: the stack runs an op through the named variant (``select``'s prefer), the result
records it with the machine it ran on, and a malformed or unknown value is refused before
anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_e2e.py"
SMALL = ["--device", "cpu", "--config", "small", "--isl", "256", "--batch", "1", "--drift", "1", "--reps", "1"]

from lib.smoke import run_script  # noqa: E402


def run(out, *args):
    return run_script(SCRIPT, "--out", str(out), *SMALL, *args)


def test_prefer_runs_the_named_variant(tmp_path):
    assert run(tmp_path, "--prefer", "sparse_mla=reference") == 0
    res = json.loads((tmp_path / "bench_e2e.json").read_text())
    assert res["prefer"] == {"sparse_mla": "reference"} and res["device"] == "cpu" and res["torch"] == torch.__version__
    assert res["variants"]["sparse_mla"] == ["reference"]
    assert res["sanity"]["violations"] == [] and res["trim"], res["sanity"]


@pytest.mark.parametrize("value, what", [("sparse_mla", "--prefer 'sparse_mla': expected OP=VARIANT"),
                                         ("sparse_mla=bogus", "prefer['sparse_mla']='bogus': expected one of"),
                                         ("nope=triton", "expected op names from")])
def test_bad_prefer_is_refused(tmp_path, value, what, capsys):
    try:
        rc = run(tmp_path, "--prefer", value)
        err = capsys.readouterr().err
    except ValueError as exc:  # select() refuses a value that names no op or variant
        rc, err = 1, str(exc)
    assert rc != 0 and what in err, err[-2000:]
    assert not (tmp_path / "bench_e2e.json").exists()
