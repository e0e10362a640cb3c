"""The H200 benchmark script keeps working: without a GPU it runs its whole pipeline
(correctness per config, sweep, table with the torch baseline, decode splits) on a tiny
plan through Triton's interpreter, in a subprocess started the way the lead runs it (from
the repository root, package loaded from the checkout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full benchmark (minutes)")
def test_bench_smoke(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_sparse_mla.py"), "--out", str(tmp_path),
                           "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "bench_sparse_mla.json").read_text())
    assert result["correctness"] and all(c["ok"] for c in result["correctness"])
    assert result["meta"]["plan"]["D"] == 32  # the tiny plan: every section ran on the interpreter
    assert {r["status"] for r in result["sweep"]} == {"ok"}
    assert result["table"] and all(r["correct"] for r in result["table"])
    # the torch baseline is measured on its own, before any Triton config, for every cell
    assert result["baseline"] and all("torch_ms" in r for r in result["baseline"])
    assert all("torch_ms" in r and "speedup" in r for r in result["table"])
    assert not result["errors"]
    assert all(v.get("correct") for r in result["decode"] for v in r["variants"])
    assert result["meta"]["kernel_sha256_16"] != "unknown"
