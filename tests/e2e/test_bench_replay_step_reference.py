"""The replay-step benchmark keeps working and keeps checking what it times: without a GPU,
``--smoke`` runs every column on tiny steps through Triton's interpreter and compares the
pack's outputs with the oracle's before timing (vLLM's kernels in the vLLM stage:
``tests/integration/vllm/test_bench_replay_step.py``; here the torch reference)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_replay_step.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_replay_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full benchmark")
def test_smoke_without_vllm(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SWA_VLLM_KERNELS_DIR"}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "bench_replay_step.json").read_text())
    meta = res["meta"]
    assert meta["smoke"] is True
    if not meta["vllm_ran"]:  # vLLM absent: the reason is kept, the pack's columns still run
        assert "SWA_VLLM_KERNELS_DIR" in meta["vllm_kernels"]
    assert [r["step"] for r in res["steps"]] == ["1x140", "3x140+3d"]
    for row in res["steps"]:
        assert row["checked_against"] == ("vllm" if meta["vllm_ran"] else "reference")
        for col in ("pack", "pack_fused"):
            for k in ("gpu_us_flushed", "gpu_us_warm", "host_us"):
                assert row[f"{col}_{k}"] > 0, (col, k)
    mixed = res["steps"][1]
    assert (mixed["decodes"], mixed["prefills"], mixed["kept_rows"]) == (3, 3, 3 + 3 * 128)


def test_check_catches_a_difference(monkeypatch):
    """The comparison the benchmark runs before timing fails on a single changed entry."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # as running the script does
    bench = _load_bench()
    rng = __import__("numpy").random.default_rng(1)
    s = bench.ServingStep(2, 140, 2, torch.device("cpu"), rng)
    ref = __import__("swa_backends").select("cpu", prefer="reference")
    want, got = s.buffers(), s.buffers()
    bench.ref_step(ref, s, want, bench.gather_out_view(s, want))  # one op per vLLM call site
    from swa_backends.testing.vllm_shims import routed_shims

    with routed_shims(lambda device: ref) as shims:  # the one-launch step, through the patches' shims
        bench.pack_step(ref, s, got, bench.gather_out_view(s, got), bench.window_target(got), bench.step_scratch(s),
                        shims)
    kept_want = want["kslots"][:, : s.n]
    bench.check(s, want, kept_want, got, bench.gather_out_view(s, got))
    got["pre_idx"][5, 0, 3] += 1
    with pytest.raises(AssertionError, match="prefill window indices"):
        bench.check(s, want, kept_want, got, bench.gather_out_view(s, got))
    got["pre_idx"][5, 0, 3] -= 1
    got["gl"][1] += 1
    with pytest.raises(AssertionError, match="gather lengths"):
        bench.check(s, want, kept_want, got, bench.gather_out_view(s, got))
