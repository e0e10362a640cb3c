"""The replay-step benchmark against the installed vLLM (``--smoke``: tiny steps through
Triton's interpreter, no timing loops): the script compares the pack's whole step with vLLM's
before it times anything and counts both columns' kernel launches, so a passing run is also a
step-level differential; its counts must be the ones real vLLM steps make
(``test_launch_counts.TABLE``). And the vLLM launch objects the benchmark takes out of copies of
vLLM's source files on the GPU machine are vLLM's own."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (the vLLM CI stage runs this)", allow_module_level=True)

from test_launch_counts import TABLE  # noqa: E402

from swa_backends.integrations import vllm as integration  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full benchmark")
def test_smoke_against_vllm(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SWA_VLLM_KERNELS_DIR"}
    env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_replay_step.py"), "--out", str(tmp_path),
                           "--smoke"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "bench_replay_step.json").read_text())
    assert res["meta"]["vllm_ran"] is True and res["meta"]["vllm_kernels"].startswith(f"installed vllm {integration.vllm_version()}")
    for row in res["steps"]:
        assert row["checked_against"] == "vllm"
        assert row["vllm_host_us"] > 0 and row["pack_vs_vllm_host_us"] > 0
    counts = {(r["step"], r["window_groups"]): tuple(sum(r["launches"][c].values()) for c in ("vllm", "pack"))
              for r in res["steps"]}
    # mixed steps (decodes, a replaying prefill, trimmed prefills): what real vLLM steps launch
    assert counts[("3x140+3d", 1)] == TABLE["eager, trimmed, 1 window group"]
    assert counts[("3x140+3d", 2)] == TABLE["eager, trimmed, 2 window groups"]
    assert counts[("1x140", 1)] == (7, 1)  # one trimmed prefill, no replay: no padding
    assert "launches" in proc.stdout


def test_launchers_from_source_files_are_vllms():
    """``load_launchers(<folder of vLLM's source files>)`` (what the GPU machine runs) builds
    vLLM's classes from its sources: the same ``__call__`` and launch code as the installed
    vLLM's objects, and the same outputs on the same inputs."""
    import vllm

    from swa_backends.testing import vllm_kernels as vk

    installed, origin = vk.load_launchers()
    assert installed is not None and origin.startswith("installed vllm"), origin
    copied, origin = vk.load_launchers(Path(vllm.__file__).parent)
    assert copied is not None and origin.startswith("source files under"), origin
    for name in ("swa", "prefill"):
        a, b = getattr(installed, name), getattr(copied, name)
        assert type(a).__name__ == type(b).__name__
        assert inspect.getsource(type(a).__call__.__wrapped__) == inspect.getsource(type(b).__call__.__wrapped__)
        for method in ("launch", "_prepare_launch_kwargs"):
            assert inspect.getsource(getattr(type(a), method)) == inspect.getsource(getattr(type(b), method))
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(40, 90, (6,), generator=g, dtype=torch.int32)
    q = torch.tensor([1, 1, 9, 17, 30, 5], dtype=torch.int32)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int32), q.cumsum(0).to(torch.int32)])
    R = torch.tensor([0, 0, 12, 0, 7, 0], dtype=torch.int32)
    T, D = int(qsl[-1]), 2
    t2r = torch.repeat_interleave(torch.arange(6, dtype=torch.int32), q)
    valid = torch.ones(T, dtype=torch.bool)
    table = torch.randperm(6 * 12, generator=g).to(torch.int32).view(6, 12)
    outs = []
    for launchers in (installed, copied):
        rows = torch.full((T, 1, 16), -5, dtype=torch.int32)
        lens = torch.full((T,), -5, dtype=torch.int32)
        gl = torch.full((4,), -5, dtype=torch.int32)
        launchers.swa(rows, lens, 16, 16, lens, lens, qsl, seq, t2r, valid, table, 8, R, num_tokens=T - D,
                      token_offset=D, has_image=False)
        launchers.prefill(gl, seq, qsl, R, 4, D, 16)
        outs.append((rows, lens, gl))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert (outs[0][1][: T - D] > 0).all() and (outs[0][2] > 0).all()


def test_the_input_batch_stand_in_has_vllms_fields():
    """The benchmark's ``InputBatch`` carries every field of the installed vLLM's (vLLM's
    ``_kept_input_batch`` copies them all with ``dataclasses.replace``: the stand-in's cost
    follows theirs) and nothing else."""
    import ast
    import dataclasses

    from vllm.v1.worker.gpu.input_batch import InputBatch

    tree = ast.parse((ROOT / "bench" / "bench_replay_step.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InputBatch")
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    assert names == {f.name for f in dataclasses.fields(InputBatch)}
