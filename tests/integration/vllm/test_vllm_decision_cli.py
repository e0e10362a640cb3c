"""README's decision command, run as a user runs it on this machine (no GPU; needs vLLM).

``python -m swa_backends.integrations.vllm --model <dir> --swa-device cuda:sm90`` with a local
DeepSeek-V4.1 ``config.json`` (no weights) and no ``VLLM_TARGET_DEVICE``: it builds the config
on vLLM's CPU platform, answers for the device it is given (model runner V2 there, as vLLM
0.33 picks it on CUDA and ROCm, where a CPU build picks V1), says which fields it re-derived,
and agrees with ``swa-backends info --device cuda:sm90``. An unreachable model id is one line.
The three runs share one process (``runpy``, as ``python -m`` runs the module): vLLM's import
is most of the cost. The rules it re-derives with are tested on config objects below.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

from _env import child_env  # noqa: E402
from _release import installed  # noqa: E402
from swa_backends import ServingConfig, capabilities  # noqa: E402

release = installed()  # the installed vLLM's release subpackage (skips this module where there is none)

DRIVER = textwrap.dedent('''
    import contextlib, io, json, runpy, sys
    runs = []
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        sys.argv = ["python -m swa_backends.integrations.vllm", *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_module("swa_backends.integrations.vllm", run_name="__main__", alter_sys=True)
                rc = 0
            except SystemExit as exc:
                rc = exc.code
        runs.append({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()})
    print("REPORT " + json.dumps(runs))
''')


def _own_lines(stderr: str) -> list[str]:
    """stderr without torch's own import-time warnings (its glog-style ``W1202 12:00:00.000 ...``
    lines, printed by every process that imports vLLM 0.33's torch 2.14)."""
    return [ln for ln in stderr.splitlines() if not re.match(r"^[IWE]\d{4} \d\d:\d\d:\d\d", ln)]


def _model_dir(tmp_path):
    """A DeepSeek-V4.1 checkpoint directory with its config.json only (as the other vLLM tests
    build one): a cut at layer 2, W 128."""
    model = tmp_path / "dsv41"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "torch_dtype": "bfloat16",
        "text_config": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 1024,
                        "sliding_window": 128, "compress_ratios": [0, 1, 2, 0, 0], "kv_source_layer_ids": [1, 2],
                        "max_position_embeddings": 4096, "head_dim": 512, "index_topk": 512, "hc_mult": 4}}))
    return model


def test_the_decision_command_answers_for_the_device_it_is_given(tmp_path):
    model = str(_model_dir(tmp_path))
    common = ["--skip-tokenizer-init", "--max-model-len", "4096"]
    runs = [["--model", model, *common, "--swa-device", "cuda:sm90"],  # first: vLLM's platform is found here
            ["--model", "deepseek-ai/no-such-checkpoint", "--swa-device", "cuda:sm90"],
            ["--model", model, *common, "--swa-device", "rocm:gfx942"]]
    # the hub unreachable (offline): the model id fails at once instead of after the hub's retries
    env = child_env(drop=("VLLM_TARGET_DEVICE", "VLLM_LOGGING_LEVEL"), HF_HUB_OFFLINE="1")
    res = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs)], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    sm90, unreachable, gfx942 = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("REPORT "))[7:])

    # an unreachable model id: exit status 1, one line, no traceback
    assert unreachable["rc"] == 1 and unreachable["stdout"] == ""
    lines = _own_lines(unreachable["stderr"])
    assert len(lines) == 1 and lines[0].startswith("python -m swa_backends.integrations.vllm: error: "), lines
    assert "deepseek-ai/no-such-checkpoint" in lines[0] or "snapshot" in lines[0], lines

    for run in (sm90, gfx942):
        assert run["rc"] == 0 and _own_lines(run["stderr"]) == [], run["stderr"]
    sm90, gfx942 = json.loads(sm90["stdout"]), json.loads(gfx942["stdout"])

    # built on vLLM's CPU platform, answered for cuda:sm90 with what vLLM picks there
    assert sm90["built_on"].startswith("cpu (vLLM finds no platform here")
    assert sm90["inferred"]["model_runner"] == {"value": "v2", "rule": sm90["inferred"]["model_runner"]["rule"]}
    assert set(sm90["inferred"]) == {"model_runner", "graph_mode", "async_scheduling", "enable_prefix_caching"}
    assert sm90["inferred"]["graph_mode"]["value"] == "FULL_AND_PIECEWISE"
    assert sm90["inferred"]["enable_prefix_caching"]["value"] is True  # the CPU platform turns it off for MLA
    sc = sm90["serving_config"]
    assert sc["model_runner"] == "v2" and sc["graph_mode"] == "full_and_piecewise" and sc["async_scheduling"]
    assert sc["cut_layer"] == 2 and sc["window"] == 128
    assert sm90["vllm_encoder"] and sm90["vllm_encoder_reason"] is None and sm90["vllm_differs"] == []
    assert sm90["release"] == release.RELEASE
    # the same answer as `swa-backends info --device cuda:sm90` (the pack's decision for that config)
    cfg = ServingConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in sc.items()})
    for side in ("encoder_replay", "decoder_replay"):
        want = getattr(capabilities("cuda:sm90", config=cfg), side)
        got = sm90["capabilities"][side]
        assert got["enabled"] is want.enabled is True and got["reasons"] == list(want.reasons)
        assert getattr(capabilities("cuda:sm90"), side).enabled is True

    # rocm:gfx942: V2 there too; vLLM 0.33 keeps encoder replay off on ROCm, the pack can turn it on;
    # vLLM 0.34 keeps it on there (CDNA 3)
    assert gfx942["inferred"]["model_runner"]["value"] == "v2"
    assert gfx942["serving_config"]["model_runner"] == "v2"
    assert gfx942["capabilities"]["device"]["arch"] == "gfx942"
    if release.config.PACK_TURNS_ROCM_ENCODER_ON:
        assert not gfx942["vllm_encoder"] and "ROCm" in gfx942["vllm_encoder_reason"]
        assert gfx942["vllm_off_for_rocm_only"] and gfx942["pack_turns_encoder_on_on_rocm"]
    else:
        assert gfx942["vllm_encoder"] and gfx942["vllm_encoder_reason"] is None
        assert not gfx942["vllm_off_for_rocm_only"] and not gfx942["pack_turns_encoder_on_on_rocm"]


# ---------------------------------------------------------------------------------------
# the release's rules re-derived for another platform (integrations/vllm/v0_33/target.py), on config objects
# ---------------------------------------------------------------------------------------


def _cfg(*, unsupported=(), pp=1, spec=None, backend="uni", hisparse=None):
    from types import SimpleNamespace

    from vllm.config.vllm import OptimizationLevel

    return SimpleNamespace(
        attention_config=SimpleNamespace(hisparse_config=hisparse), watermark_config=None,
        _get_v2_model_runner_unsupported_features=lambda: list(unsupported),
        optimization_level=OptimizationLevel.O2, speculative_config=spec,
        model_config=SimpleNamespace(runner_type="generate", is_prefix_caching_supported=True),
        parallel_config=SimpleNamespace(distributed_executor_backend=backend, pipeline_parallel_size=pp,
                                        enable_dbo=False, all2all_backend="allgather_reducescatter"))


def test_the_model_runner_rule(monkeypatch):
    target = release.target

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    if release.config.model_runner(_cfg()) == "v2":  # model runner V2 only (0.34): whatever the config
        for platform in ("cuda", "rocm"):
            assert target.v2_model_runner(_cfg(unsupported=["speculative method 'suffix'"]), platform) == (
                True, f"vLLM {release.RELEASE.rsplit('.', 1)[0]} has model runner V2 only")
        return
    assert target.v2_model_runner(_cfg(), "cuda")[0] is True
    v2, why = target.v2_model_runner(_cfg(unsupported=["speculative method 'suffix'"]), "rocm")
    assert v2 is False and "suffix" in why
    assert target.v2_model_runner(_cfg(unsupported=["x"], hisparse=object()), "cuda")[0] is True
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert target.v2_model_runner(_cfg(), "cuda") == (False, "VLLM_USE_V2_MODEL_RUNNER=0")


def test_the_graph_mode_async_and_prefix_caching_rules():
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode
    from vllm.config.vllm import OptimizationLevel

    from swa_backends.integrations.vllm.target import Given

    async_scheduling, graph_mode = release.target.async_scheduling, release.target.graph_mode
    prefix_caching = release.target.prefix_caching

    cfg = _cfg()
    assert graph_mode(Given(), cfg)[0] == CUDAGraphMode.FULL_AND_PIECEWISE
    assert graph_mode(Given(optimization_level=OptimizationLevel.O1), cfg)[0] == CUDAGraphMode.PIECEWISE
    assert graph_mode(Given(cudagraph_mode="full_decode_only"), cfg)[0] == CUDAGraphMode.FULL_DECODE_ONLY
    assert graph_mode(Given(enforce_eager=True, cudagraph_mode="FULL"), cfg) == (CUDAGraphMode.NONE, "--enforce-eager")
    assert async_scheduling(Given(), cfg, True, "cuda")[0] is True
    assert async_scheduling(Given(async_scheduling=False), cfg, True, "cuda")[0] is False
    assert async_scheduling(Given(), _cfg(pp=2), True, "cuda")[0] is True  # V2 schedules PP asynchronously
    assert async_scheduling(Given(), _cfg(pp=2), False, "cuda") == (
        False, "model runner V1 does not support it with pipeline parallelism")
    suffix = SimpleNamespace(method="suffix", disable_padded_drafter_batch=False)
    assert async_scheduling(Given(), _cfg(spec=suffix), False, "cuda")[0] is False
    from vllm.v1.executor.abstract import Executor  # its base supports no async scheduling

    assert async_scheduling(Given(), _cfg(backend=Executor), True, "cuda")[0] is False
    assert prefix_caching(Given(), cfg)[0] is True and prefix_caching(Given(enable_prefix_caching=False), cfg)[0] is False
