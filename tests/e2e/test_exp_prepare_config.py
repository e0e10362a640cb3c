"""The tile experiment of ``prepare_replay_step`` keeps working and keeps checking what it
times: without a GPU, ``--smoke`` rebuilds the launch with other token tiles, checks each
against the oracle's outputs (here the torch reference) and times every column."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "exp_prepare_config.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full experiment")
def test_smoke_checks_other_tiles(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SWA_VLLM_KERNELS_DIR"}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--smoke", "--steps", "1x1K",
                           "--configs", "T4W64n2,T16W128n4"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 configs checked against" in proc.stdout
    res = json.loads((tmp_path / "exp_prepare_config.json").read_text())
    row = res["steps"]["1x1K"]
    assert set(row) >= {"empty", "op", "tokens only", "requests only", "T4W64n2", "T16W128n4"}
    assert all(v["warm"] > 0 and v["flushed"] > 0 for v in row.values())


def test_step_and_config_names(monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # as running the script does
    spec = importlib.util.spec_from_file_location("exp_prepare_config", SCRIPT)
    exp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exp)
    assert exp.step_shape("8x4K+32d") == (8, 4096, 32) and exp.step_shape("1x140") == (1, 140, 0)
    assert exp.config_of("T8W128n2") == (8, 128, 2)
    with pytest.raises(ValueError, match=r"step '1x1Q': expected <prefills>x<tokens>\[K\]\[\+<decodes>d\]"):
        exp.step_shape("1x1Q")
    with pytest.raises(ValueError, match="config 'T8W64': expected T<tokens>W<columns>n<warps>"):
        exp.config_of("T8W64")
