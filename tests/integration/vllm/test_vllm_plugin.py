"""The plugin loaded exactly as vLLM loads it, in a fresh process with the real vLLM.

``vllm.plugins.load_general_plugins()`` (what every vLLM process runs before building a
model) calls the pack's entry point; with the integration installed, vLLM's model registry
resolves ``DeepseekV41ForCausalLM`` to the pack's subclass, and the model-state hook
(``resolve_model_state_cls``) to the pack's state on top of the class vLLM picks (the
latency-specialized decode state included). On this CPU-only machine vLLM's platform is
neither CUDA nor ROCm, so the automatic mode leaves vLLM untouched with one log line, and
``SWA_BACKENDS_VLLM=force`` skips that check; ``SWA_BACKENDS_VLLM=0`` (the whole plugin
off: no custom op either) and ``VLLM_PLUGINS=""`` leave vLLM untouched too. The decision
command is tested in ``test_vllm_decision_cli.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from _env import child_env

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

from _release import installed  # noqa: E402
from swa_backends.integrations import vllm as integration  # noqa: E402

release = installed()  # the installed vLLM's release subpackage (skips this module where there is none)

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
        report["status"] = None if st is None else {"installed": st.installed, "reason": st.reason, "mode": st.mode,
                                                 "release": st.release}
    except Exception as exc:
        report["status"] = repr(exc)
    # the model-state hook, on a model object built without __init__ (no weights, no layers)
    Route = integration.current_release().model.Route
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
    import torch
    report["has_ops"] = hasattr(torch.ops.swa_backends, "gather_rows")
    print("REPORT " + json.dumps(report))
''')


def _run(env_extra: dict, tmp_path) -> tuple[dict, str]:
    env = child_env(**{k: v for k, v in env_extra.items() if v is not None})
    script = tmp_path / "load.py"
    script.write_text(SCRIPT)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("REPORT "))
    return json.loads(line[7:]), res.stderr


VLLM_CLS = "vllm.models.deepseek_v41.nvidia.vl_model.DeepseekV41ForCausalLM"
PACK_CLS = f"{release.model.__name__}.DeepseekV41ForCausalLM"


def test_force_resolves_the_dsv41_path_into_the_pack(tmp_path):
    rep, log = _run({"SWA_BACKENDS_VLLM": "force"}, tmp_path)
    assert rep["model_cls"] == PACK_CLS and rep["subclass_of_vllm"] and rep["name"] == "DeepseekV41ForCausalLM"
    assert rep["status"]["installed"] is True and rep["status"]["mode"] == "force"
    assert rep["status"]["release"] == release.__name__
    assert rep["has_ops"] is True
    for base, (name, sub, new) in rep["states"].items():
        assert sub and new and name == f"SwaBackends{base}", rep["states"]
    assert log.count(f"DeepseekV41ForCausalLM resolves to {integration.model_class_path(release)}") == 1


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
    assert log.count("the swa_backends plugin is off") == 1
    assert rep["has_ops"] is False  # the whole plugin: no torch.ops.swa_backends either


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

    def boom(self, model_arch, model_cls):  # the pinned signature: it passes the seam check, then raises
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
