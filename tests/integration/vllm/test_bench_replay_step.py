"""The replay-step benchmark against the installed vLLM's own kernels (``--smoke``: tiny
steps through Triton's interpreter); the script compares the pack's outputs with vLLM's
before it times anything, so a passing run is also a step-level differential."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (the vLLM CI stage runs this)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full benchmark")
def test_smoke_against_vllm(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SWA_VLLM_KERNELS_DIR"}
    env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_replay_step.py"), "--out", str(tmp_path),
                           "--smoke"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "bench_replay_step.json").read_text())
    assert res["meta"]["vllm_ran"] is True and res["meta"]["vllm_kernels"].startswith("installed vllm 0.33")
    for row in res["steps"]:
        assert row["checked_against"] == "vllm"
        for col in ("pack", "pack_fused"):
            assert row[f"{col}_vs_vllm_host_us"] > 0 and row[f"{col}_vs_vllm_gpu_us_flushed"] > 0
            # one round in --smoke: the paired ratio is that round's, the ratio of its two times
            assert row[f"{col}_vs_vllm_host_us_rounds"] == [row[f"{col}_vs_vllm_host_us_paired"]]
            assert row[f"{col}_vs_vllm_host_us_paired"] == pytest.approx(row[f"{col}_vs_vllm_host_us"])
    assert "the median of each round's ratio" in proc.stdout
