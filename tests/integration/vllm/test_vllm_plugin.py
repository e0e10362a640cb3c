"""The plugin loaded exactly as vLLM loads it, in a fresh process with the real vLLM.

``vllm.plugins.load_general_plugins()`` (what every vLLM process runs before building a
model) calls the pack's entry point; with the integration installed, vLLM's model registry
resolves ``DeepseekV41ForCausalLM`` to the pack's subclass, and the model-state hook
(``resolve_model_state_cls``) to the pack's state on top of the class vLLM picks (the
latency-specialized decode state included). On this CPU-only machine vLLM's platform is
neither CUDA nor ROCm, so the automatic mode leaves vLLM untouched with one log line, and
``SWA_BACKENDS_VLLM=force`` skips that check; ``SWA_BACKENDS_VLLM=0`` and
``VLLM_PLUGINS=""`` leave vLLM untouched too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs vllm==0.33.0 in its own venv)")

SCRIPT = textwrap.dedent('''
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    vllm.plugins.load_general_plugins()
    from types import SimpleNamespace
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.v1.worker.gpu.model_states import resolve_model_state_cls
    import vllm.models.deepseek_v41 as dsv41
    report = {}
    cls = ModelRegistry._try_load_model_cls("DeepseekV41ForCausalLM")
    report["model_cls"] = f"{cls.__module__}.{cls.__qualname__}"
    report["subclass_of_vllm"] = cls is not dsv41.DeepseekV41ForCausalLM and issubclass(cls, dsv41.DeepseekV41ForCausalLM)
    report["name"] = cls.__name__
    try:
        from swa_backends.integrations import vllm as integration
        st = integration.status()
        report["status"] = None if st is None else {"installed": st.installed, "reason": st.reason, "mode": st.mode}
    except Exception as exc:
        report["status"] = repr(exc)
    # the model-state hook, on a model object built without __init__ (no weights, no layers)
    from swa_backends.integrations.vllm.model import Route
    from vllm.models.deepseek_v41.nvidia.model_state import DeepseekV41ModelState
    from vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.model_state import (
        DeepseekV41SpecializedDecodeModelState)
    states = {}
    for base in (DeepseekV41ModelState, DeepseekV41SpecializedDecodeModelState):
        model = cls.__new__(cls)
        object.__setattr__(model, "language_model", SimpleNamespace(get_model_state_cls=lambda base=base: base))
        object.__setattr__(model, "swa_backends_route", Route(None, encoder=True, builders=True, decoder=True))
        state_cls = resolve_model_state_cls(None, model)
        states[base.__name__] = [state_cls.__name__, issubclass(state_cls, base), state_cls is not base]
    report["states"] = states
    print("REPORT " + json.dumps(report))
''')


def _run(env_extra: dict, tmp_path) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "SWA_BACKENDS_VLLM", "PYTHONPATH")}
    env.update({k: v for k, v in env_extra.items() if v is not None})
    script = tmp_path / "load.py"
    script.write_text(SCRIPT)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("REPORT "))
    return json.loads(line[7:]), res.stderr


VLLM_CLS = "vllm.models.deepseek_v41.nvidia.vl_model.DeepseekV41ForCausalLM"
PACK_CLS = "swa_backends.integrations.vllm.model.DeepseekV41ForCausalLM"


def test_force_resolves_the_dsv41_path_into_the_pack(tmp_path):
    rep, log = _run({"SWA_BACKENDS_VLLM": "force"}, tmp_path)
    assert rep["model_cls"] == PACK_CLS and rep["subclass_of_vllm"] and rep["name"] == "DeepseekV41ForCausalLM"
    assert rep["status"]["installed"] is True and rep["status"]["mode"] == "force"
    for base, (name, sub, new) in rep["states"].items():
        assert sub and new and name == f"SwaBackends{base}", rep["states"]
    assert log.count("DeepseekV41ForCausalLM resolves to swa_backends.integrations.vllm.model") == 1


def test_auto_on_a_cpu_platform_leaves_vllm_untouched(tmp_path):
    rep, log = _run({}, tmp_path)
    assert rep["model_cls"] == VLLM_CLS
    assert rep["status"]["installed"] is False and "neither CUDA nor ROCm" in rep["status"]["reason"]
    assert log.count("neither CUDA nor ROCm") == 1


@pytest.mark.parametrize("switch", ["0"])
def test_env_switch_off(tmp_path, switch):
    rep, log = _run({"SWA_BACKENDS_VLLM": switch}, tmp_path)
    assert rep["model_cls"] == VLLM_CLS
    assert rep["status"]["installed"] is False and rep["status"]["mode"] == "off"
    assert log.count("the vLLM integration is off") == 1


def test_vllm_plugins_whitelist_without_the_pack(tmp_path):
    rep, _ = _run({"VLLM_PLUGINS": "", "SWA_BACKENDS_VLLM": "force"}, tmp_path)
    assert rep["model_cls"] == VLLM_CLS
    assert rep["status"] is None  # never installed: vLLM did not load the plugin


def test_a_failing_install_is_one_warning_and_vllm_starts(monkeypatch):
    """Any exception inside the installer: one warning, vLLM's registry untouched."""
    from swa_backends import plugin
    from swa_backends.integrations import vllm as integration
    from vllm.model_executor.models.registry import ModelRegistry

    before = ModelRegistry.models["DeepseekV41ForCausalLM"]
    monkeypatch.setenv("SWA_BACKENDS_VLLM", "force")

    def boom(*a, **k):
        raise RuntimeError("registry exploded")

    monkeypatch.setattr(type(ModelRegistry), "register_model", boom)
    integration._reset_for_tests()
    try:
        plugin._install_vllm()
        st = integration.status()
        assert st is not None and not st.installed and "registry exploded" in st.reason
        assert ModelRegistry.models["DeepseekV41ForCausalLM"] is before
    finally:
        integration._reset_for_tests()


def test_decision_cli_for_a_vllm_config(tmp_path):
    """``python -m swa_backends.integrations.vllm <engine args>``: vLLM builds its config
    from the engine arguments (here a tiny local DeepSeek-V4.1 config.json on vLLM's CPU
    platform), the pack prints its decision for another machine (``--swa-device``)."""
    model = tmp_path / "dsv41"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "torch_dtype": "bfloat16",
        "text_config": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 1024,
                        "sliding_window": 128, "compress_ratios": [0, 1, 2, 0, 0], "kv_source_layer_ids": [1, 2],
                        "max_position_embeddings": 4096, "head_dim": 512, "index_topk": 512, "hc_mult": 4}}))
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "SWA_BACKENDS_VLLM", "PYTHONPATH")}
    env["VLLM_TARGET_DEVICE"] = "cpu"
    res = subprocess.run([sys.executable, "-m", "swa_backends.integrations.vllm", "--model", str(model),
                          "--skip-tokenizer-init", "--max-model-len", "4096", "--swa-device", "rocm:gfx950"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert out["serving_config"]["cut_layer"] == 2 and out["serving_config"]["window"] == 128
    assert out["capabilities"]["device"]["arch"] == "gfx950"
    # vLLM keeps encoder replay off for a ROCm platform (or without model runner V2, which its
    # CPU platform picks when Triton is unusable); the pack gives its own reasons either way
    assert not out["vllm_encoder"]
    if out["serving_config"]["model_runner"] == "v2":
        assert "ROCm" in out["vllm_encoder_reason"] and out["capabilities"]["encoder_replay"]["enabled"]
    else:
        assert any("[runner]" in r for r in out["capabilities"]["encoder_replay"]["reasons"])
