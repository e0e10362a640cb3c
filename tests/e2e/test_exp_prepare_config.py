"""The tile experiment of ``prepare_replay_step`` keeps working and keeps checking what it
times: without a GPU, ``--smoke`` rebuilds the launch with other token tiles, checks each
against the oracle's outputs (here the torch reference) and times every column once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "experiments" / "exp_prepare_config.py"

from lib.smoke import run_script  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full experiment")
def test_smoke_checks_other_tiles(tmp_path, monkeypatch, capsys):
    from swa_backends.testing import vllm_kernels as vk

    monkeypatch.delenv(vk.ENV, raising=False)
    assert run_script(SCRIPT, "--out", str(tmp_path), "--smoke", "--steps", "1x1K",
                      "--configs", "T16W128n4,T8W128n2") == 0
    assert "2 configs checked against" in capsys.readouterr().out
    res = json.loads((tmp_path / "exp_prepare_config.json").read_text())
    assert res["meta"]["smoke"] is True
    row = res["steps"]["1x1K"]
    assert set(row) >= {"empty", "op", "tokens only", "requests only", "T16W128n4", "T8W128n2"}
    assert all(v["warm"] > 0 and v["flushed"] > 0 and len(v["warm_all"]) == 1 for v in row.values())


def test_step_and_config_names():
    import importlib.util

    spec = importlib.util.spec_from_file_location("exp_prepare_config", SCRIPT)
    exp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exp)
    assert exp.step_shape("8x4K+32d") == (8, 4096, 32) and exp.step_shape("1x140") == (1, 140, 0)
    assert exp.config_of("T8W128n2") == (8, 128, 2)
    with pytest.raises(ValueError, match=r"step '1x1Q': expected <prefills>x<tokens>\[K\]\[\+<decodes>d\]"):
        exp.step_shape("1x1Q")
    with pytest.raises(ValueError, match="config 'T8W64': expected T<tokens>W<columns>n<warps>"):
        exp.config_of("T8W64")
