"""The sparse-MLA benchmark script keeps working: without a GPU, ``--smoke`` runs its whole
pipeline (torch baseline, correctness per kernel, the table with the default dispatch path, a tl
config sweep, decode split-K, decode against vLLM's decode on records) on tiny sizes through
Triton's interpreter, one call per path and measurement (no timing loops). Under the interpreter
only the torch baseline, the tl kernel and the CPU default path run; the Gluon kernels are listed
as not run, with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_sparse_mla.py"

from lib.smoke import run_script  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU --smoke compiles every kernel (minutes)")
def test_bench_smoke(tmp_path, capsys):
    assert run_script(SCRIPT, "--out", str(tmp_path), "--smoke") == 0
    stdout = capsys.readouterr().out
    result = json.loads((tmp_path / "bench_sparse_mla.json").read_text())
    meta = result["meta"]
    assert meta["interpret"] is True and meta["smoke"] is True
    assert meta["plan"]["D"] == 32  # the tiny plan: every section ran on the interpreter
    assert all(v != "unknown" for v in meta["kernel_sha256_16"].values())
    assert not result["errors"]
    # the Gluon kernels do not run in the interpreter, and the output says so
    assert set(result["not_run"]) == {"gluon", "gluon_ws"}
    assert all("TRITON_INTERPRET=1" in why for why in result["not_run"].values())
    assert "TRITON_INTERPRET=1" in stdout and "only the torch baseline, the tl kernel" in stdout
    checks = [c for c in result["correctness"] if c.get("ok") is not None]
    assert {c["kernel"] for c in checks} >= {"torch", "triton", "default", "validated"} and all(c["ok"] for c in checks)
    # the torch baseline is measured on its own, first, for every cell; every cell has each kernel and its ratio
    assert result["baseline"] and all("ms" in r for r in result["baseline"])
    assert result["table"]
    for row in result["table"]:
        assert set(row["runs"]) == {"torch", "triton", "default", "validated"}, row["runs"]
        assert all(r.get("tflops", 0) > 0 for r in row["runs"].values()), row["runs"]
        assert row["runs"]["triton"]["correct"] and row["runs"]["triton"]["label"].startswith("table ")
        assert row["runs"]["default"]["label"] == "reference"  # what dispatch runs on a CPU
        assert set(row["vs_torch"]) == {"torch", "triton", "default", "validated"}
    assert result["dispatch"]["chosen"] == ["reference"]
    # --smoke also runs a short tl config sweep and decode's split-K settings
    assert len(result["sweep"]) == 1 and {r["status"] for r in result["sweep"]} == {"ok"}
    assert all(result["best"].values())
    assert result["decode"] and all(v.get("correct") for r in result["decode"] for v in r["variants"])
    assert any(v["name"].startswith("triton splits=") for r in result["decode"] for v in r["variants"])
    # decode against vLLM's decode: the pack on V4 FP8 records, SWA-only and window + top-k calls, checked
    # against the reference; FlashMLA's flash_mla_with_kvcache is a reason on a CPU
    dm = result["decode_vllm_meta"]
    assert dm["format"] == "v4_fp8/e4m3fn" and dm["record_bytes"] == 584 and "no CUDA device" in dm["flashmla"]
    rows = result["decode_vllm"]
    assert {r["layer"] for r in rows} == {"swa-only", "compressed"}
    for r in rows:
        assert r["K"] == dm["plan"]["window"] + (dm["plan"]["topk"] if r["layer"] == "compressed" else 0)
        assert "no CUDA device" in r["runs"]["flashmla"]["not_run"]
        for name in ("triton", "default"):
            assert r["runs"][name]["correct"] and r["runs"][name]["graph_us"] > 0, (name, r)
    assert "against vLLM's decode: flash_mla_with_kvcache over v4_fp8/e4m3fn records" in stdout
    assert "no vLLM path makes these calls" in stdout


@pytest.mark.parametrize("value", ["1,x", "0", "1,,2", "-3"])
def test_bad_decode_t_is_refused_before_anything_runs(tmp_path, value):
    with pytest.raises(ValueError, match=f"--decode-t: {value!r}; expected comma-separated positive integers"):
        run_script(SCRIPT, "--out", str(tmp_path / "o"), "--decode", f"--decode-t={value}")
    assert not (tmp_path / "o").exists()
