"""The replay-step benchmark keeps working and keeps checking what it times: without a GPU,
``--smoke`` runs the whole step of both columns once on tiny steps through Triton's interpreter,
compares the pack's outputs with the oracle's and counts each column's kernel launches (no
timing loops; vLLM's kernels in the vLLM stage: ``tests/integration/vllm/test_bench_replay_step.py``;
here the pack's torch reference, one call at a time)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_replay_step.py"

from lib import replay_step as rs  # noqa: E402
from lib.smoke import run_script  # noqa: E402


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_replay_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full benchmark")
def test_smoke_without_vllm(tmp_path, monkeypatch):
    from swa_backends.testing import vllm_kernels as vk

    monkeypatch.delenv(vk.ENV, raising=False)
    assert run_script(SCRIPT, "--out", str(tmp_path), "--smoke") == 0
    res = json.loads((tmp_path / "bench_replay_step.json").read_text())
    meta = res["meta"]
    assert meta["smoke"] is True
    if not meta["vllm_ran"]:  # vLLM absent: the reason is kept, the pack's column still runs
        assert "SWA_VLLM_KERNELS_DIR" in meta["vllm_kernels"]
    assert [(r["step"], r["window_groups"]) for r in res["steps"]] == [("1x140", 1), ("3x140+3d", 1), ("3x140+3d", 2)]
    for row in res["steps"]:
        assert row["checked_against"] == ("vllm" if meta["vllm_ran"] else "reference")
        assert row["pack_host_us"] > 0 and "pack_gpu_us_flushed" not in row  # no timing loops
    # the pack's launches: one prepare_replay_step per window group (each group's builds, the sub-batch's included)
    assert [sum(r["launches"]["pack"].values()) for r in res["steps"]] == [1, 1, 2]
    mixed = res["steps"][1]
    assert (mixed["decodes"], mixed["prefills"], mixed["kept_rows"]) == (3, 3, 3 + 3 * 128)


def test_the_whole_step_check_catches_a_difference(monkeypatch):
    """The comparison the benchmark makes before timing: the pack's step (one launch, the
    sub-batch's builds one call at a time) against the same step one call at a time, both on
    the torch reference; a single changed entry of a sub-batch build fails it, by name."""
    bench = _load_bench()
    import types

    import numpy as np

    import swa_backends
    from swa_backends.integrations.vllm import runtime
    from swa_backends.testing.vllm_shims import routed_shims

    ref = swa_backends.select("cpu", prefer="reference")
    monkeypatch.setattr(runtime, "backend_for", lambda device: ref)
    w = bench.WholeStep(2, 140, 2, 2, torch.device("cpu"), np.random.default_rng(1))
    cls = bench.vllm_model.model_state_class(bench.VllmModelState)
    with bench.graph_modes(), routed_shims(runtime.backend_for) as shims:
        kernels = types.SimpleNamespace(pad=shims["pad_replayed_slots"], swa=shims["swa_indices_and_lens"],
                                        prefill=shims["prefill_gather_lens"], gather=None)
        fused, step = w.model_state(kernels, cls)
        assert bench.pack_launches(step) == {}  # the reference launches no Triton kernel
        one, step_one = w.model_state(kernels, cls)
        one._swa_fuse = False  # every call launches for itself
        step_one()
    want, got = w.outputs(one), w.outputs(fused)
    assert len(want) > 20
    bench.compare(want, got)
    key = "replay_groups group 3 prefill rows"
    got[key][5, 0, 3] += 1
    with pytest.raises(AssertionError, match=key):
        bench.compare(want, got)


def test_check_catches_a_difference():
    """The comparison the experiments run before timing (``lib.replay_step.check``: the pack's
    one-launch step against one op per vLLM call site) fails on a single changed entry."""
    rng = __import__("numpy").random.default_rng(1)
    s = rs.ServingStep(2, 140, 2, torch.device("cpu"), rng)
    ref = __import__("swa_backends").select("cpu", prefer="reference")
    want, got = s.buffers(), s.buffers()
    rs.ref_step(ref, s, want, rs.gather_out_view(s, want))  # one op per vLLM call site
    from swa_backends.testing.vllm_shims import routed_shims

    with routed_shims(lambda device: ref) as shims:  # the one-launch step, through the patches' shims
        rs.pack_step(ref, s, got, rs.gather_out_view(s, got), rs.window_target(got), rs.step_scratch(s), shims)
    kept_want = want["kslots"][:, : s.n]
    rs.check(s, want, kept_want, got, rs.gather_out_view(s, got))
    got["pre_idx"][5, 0, 3] += 1
    with pytest.raises(AssertionError, match="prefill window indices"):
        rs.check(s, want, kept_want, got, rs.gather_out_view(s, got))
    got["pre_idx"][5, 0, 3] -= 1
    got["gl"][1] += 1
    with pytest.raises(AssertionError, match="gather lengths"):
        rs.check(s, want, kept_want, got, rs.gather_out_view(s, got))


def test_host_rounds_time_every_shape_in_every_round(monkeypatch):
    """The host timing goes round all the step shapes: each round times every shape's columns
    (the shapes' order rotating), the columns taking turns of a few steps, so no shape is timed
    only early in the run and a slow stretch of the host falls on every column; each row gets its
    columns' medians over the timed rounds, the ratios and the paired ratio."""
    bench = _load_bench()
    monkeypatch.setattr(bench, "HOST_WARM_ROUNDS", 1)
    monkeypatch.setattr(bench, "HOST_ROUNDS", 3)
    monkeypatch.setattr(bench, "HOST_CALLS", 5)
    monkeypatch.setattr(bench, "HOST_TURN", 2)
    order: list[str] = []

    def column(tag: str):
        def call():
            order.append(tag)
        return call

    cols = ("vllm", "pack", "vllm_no_kernels")
    rows = [{"step": s} for s in ("a", "b")]
    for row in rows:
        row.update({f"{c}_{k}": 1.0 for c in ("vllm", "pack") for k in ("gpu_us_flushed", "gpu_us_warm")})
    configs = [(row, {c: column(f"{row['step']}.{c}") for c in cols}) for row in rows]
    configs.append(({"step": "smoke"}, {}))  # a shape with nothing to time is left as it is
    bench.host_rounds(configs)
    per_shape_round = len(cols) * (1 + 5)  # one untimed call of each column, then 5 timed
    assert len(order) == 4 * 2 * per_shape_round
    for row in rows:
        for c in cols:
            assert order.count(f"{row['step']}.{c}") == 4 * (1 + 5)
            assert row[f"{c}_host_us"] > 0
        assert len(row["pack_vs_vllm_host_us_rounds"]) == 3
        assert row["pack_vs_vllm_host_us"] == row["pack_host_us"] / row["vllm_host_us"]
        assert row["pack_over_vllm_no_kernels_host_us"] == row["pack_host_us"] - row["vllm_no_kernels_host_us"]
    # the shape each round starts with rotates; within a shape's round, turns of 2, 2 and 1 steps
    assert [order[i * 2 * per_shape_round].split(".")[0] for i in range(4)] == ["a", "b", "a", "b"]
    first = [t.split(".")[1] for t in order[:per_shape_round]]
    assert first == ["vllm", "pack", "vllm_no_kernels"] + ["vllm"] * 2 + ["pack"] * 2 + ["vllm_no_kernels"] * 2 \
        + ["vllm"] * 2 + ["pack"] * 2 + ["vllm_no_kernels"] * 2 + ["vllm", "pack", "vllm_no_kernels"]
    assert configs[-1][0] == {"step": "smoke"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the parts run with real launches")
def test_parts_time_the_pack_pieces_and_put_them_back(tmp_path):
    """``--parts``: the pack's column against vLLM's without kernels, and the time inside each of the
    pack's functions of the step; every function it wrapped to time it is the same object after."""
    bench = _load_bench()
    from swa_backends.integrations.vllm import runtime

    import os

    from swa_backends.common.validation import validation_enabled

    before = {name: getattr(runtime, name) for name in bench.RUNTIME_PIECES}
    pack_cls = bench.vllm_model.model_state_class(bench.VllmModelState)
    env = os.environ.get(runtime.PREFER_ENV)
    assert validation_enabled()
    assert bench.run_parts("1x1K", 1, tmp_path, smoke_run=True) == 0
    assert validation_enabled() and os.environ.get(runtime.PREFER_ENV) == env  # the process's settings put back
    res = json.loads((tmp_path / "bench_replay_step_parts.json").read_text())
    assert res["calls_in_the_step"]["prepare_step"] == 1 and res["calls_in_the_step"]["gather_lens.answered"] == 3
    assert res["launches"] == "no-ops after one real call" and res["rounds"] == 1
    assert res["pack_host_us"] > 0 and res["vllm_no_kernels_host_us"] > 0
    pieces = res["pieces_us"]
    assert {"model._swa_prepare_step", "runtime.prepare_step", "backend.prepare_replay_step",
            "runtime.answered_gather_lens"} <= set(pieces) and all(v > 0 for v in pieces.values())
    assert pieces["model._swa_prepare_step"] >= pieces["runtime.prepare_step"]  # inclusive
    assert {name: getattr(runtime, name) for name in bench.RUNTIME_PIECES} == before
    assert not set(bench.MODEL_PIECES) & set(vars(pack_cls))
