"""The metadata-kernel benchmark keeps working without a GPU: ``--smoke`` walks every section but
the GPU-only calibration kernels and the warmup on tiny sizes through Triton's interpreter, each
measurement one call on the host clock (no timing loops), checks what it times against the
reference and writes a result of the full run's layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

from lib.smoke import run_script  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full benchmark")
def test_smoke(tmp_path, capsys):
    assert run_script(ROOT / "bench" / "bench_triton_ops.py", "--out", str(tmp_path), "--smoke") == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "bench_triton_ops.json").read_text())
    meta = res["meta"]
    assert meta["smoke"] is True and meta["warmup_s"] is None and meta["device"] == "cpu"
    assert meta["sizes"]["calibration"] is False and "calibration" not in res
    for key in ("gather_replay_batch", "prepare_replay_step", "gather_rows", "scatter_rows"):
        assert res[key], key
    assert [r["step"] for r in res["gather_replay_batch"]] == list(meta["sizes"]["steps"])
    # host time per call through the pack's launch path and through Triton's kernel[grid] (check_keys)
    assert res["empty_launch_paths"]["host_us_pack"] > 0 and res["empty_launch_paths"]["host_us_triton_path"] > 0
    for row in res["gather_replay_batch"]:
        for k in ("triton_gpu_us_flushed", "triton_gpu_us_warm", "triton_graph_us", "triton_host_us",
                  "triton_host_us_triton_path", "triton_host_us_no_out", "reference_gpu_us_flushed",
                  "reference_host_us"):
            assert row[k] > 0, k
        # smoke mode: one call of each callable, every measurement of it that call's time
        assert row["triton_gpu_us_flushed"] == row["triton_gpu_us_warm"] == row["triton_graph_us"]
    for key in ("swa_indices_and_lens_64k", "pad_replayed_slots_64k", "prepare_replay_step_64k"):
        assert res[key]["triton_us_flushed"] > 0 and res[key]["triton_us_warm"] > 0
    assert res["prepare_replay_step"][0]["fused_host_us"] > 0 and res["gather_rows"][0]["triton_us"] > 0
    assert "gather_replay_batch" in out and "L2-flushed" in out and "TRITON_INTERPRET=1" in out


def test_refuses_to_time_without_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert run_script(ROOT / "bench" / "bench_triton_ops.py", "--out", str(tmp_path / "o")) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _break(monkeypatch, what: str) -> str:
    """Make one kernel write nothing (a wrong result); returns the check that must stop the run."""
    if what == "scatter_rows":  # the scatter's copy launch alone (gather_rows shares the launcher)
        from swa_backends.kernels import rows

        real = rows._launch
        monkeypatch.setattr(rows, "_launch", lambda src, dst, idx, n, scatter, *a, **kw:
                            None if scatter else real(src, dst, idx, n, scatter, *a, **kw))
        return "scatter_rows, 8 rows"
    from swa_backends.kernels import pad_replayed_slots as k

    real = k._K
    # "pad_64k": only at the smoke's "64K" step (3 prefills of 140 tokens, slot rows of 420 columns)
    monkeypatch.setattr(k, "_K", lambda key, grid, slots, *a: None if what == "pad" or slots.shape[1] == 3 * 140
                        else real(key, grid, slots, *a))
    return "the four ops' slot_mappings" if what == "pad" else "pad_replayed_slots at the 64K step"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full benchmark")
@pytest.mark.parametrize("what", ["scatter_rows", "pad", "pad_64k"])
def test_a_wrong_result_is_never_timed(tmp_path, monkeypatch, what):
    """``scatter_rows``, ``pad_replayed_slots`` at the 64K step and ``prepare_replay_step``'s four ops
    one by one are each compared with the reference before they are timed (they were timed unchecked):
    a kernel that writes nothing stops the run. The smoke's steps replay, so the padding has slots to pad."""
    match = _break(monkeypatch, what)
    with pytest.raises(AssertionError, match=match):
        run_script(ROOT / "bench" / "bench_triton_ops.py", "--out", str(tmp_path), "--smoke")
    assert not (tmp_path / "bench_triton_ops.json").exists()
