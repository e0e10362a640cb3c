"""Drift guard: what the vLLM integration relies on, checked against the installed vLLM.

A vLLM release that renames, re-signs or rewrites any of these fails here, in CI, instead of
at serving time:

* the patch targets (``patches.PATCHES``): each applies (its own signature check passes);
* the config fields and model-state attributes the integration reads, and vLLM's rules it
  mirrors (checked by behaviour or by the lines it mirrors).

The signatures and source fingerprints of every vLLM definition the integration calls,
overrides, reproduces or mirrors are the seam table (``integrations/vllm/seams_v0_33.py``),
which ``install()`` itself checks before it touches vLLM; ``test_vllm_seams.py`` holds it to
the installed release. On a mismatch: read vLLM's diff, adapt ``integrations/vllm`` (and the
differential), then take the new values (``python -m swa_backends.integrations.vllm.seams``).
"""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs vllm==0.33.0 in its own venv)")

from swa_backends.integrations import vllm as integration  # noqa: E402
from swa_backends.integrations.vllm import config as icfg  # noqa: E402
from swa_backends.integrations.vllm import patches  # noqa: E402


def _resolve(path: str):
    import importlib

    module, _, rest = path.partition(":")
    obj = importlib.import_module(module)
    for part in rest.split(".") if rest else ():
        obj = getattr(obj, part)
    return obj


def test_installed_vllm_is_a_supported_release():
    version = integration.vllm_version()
    assert integration.supported(version), version
    assert version == integration.TESTED_VLLM, (
        f"CI runs vLLM {version}; the pins below were taken from {integration.TESTED_VLLM}")


def test_every_patch_applies_and_restores():
    """Every patch for this platform applies; the ROCm one is left alone (and its module not
    imported: it cannot import without an AMD GPU); ``rocm/`` applies it on a faked one."""
    everywhere = [p for p in patches.PATCHES if p.platform is None]
    try:
        status = patches.apply()
        assert status == {p.name: "applied" if p.platform is None else f"not applied: {p.platform} only (this is other)"
                          for p in patches.PATCHES}, status
        for p in everywhere:
            assert isinstance(_resolve(f"{p.module}:{p.attr}"), p.shim)
    finally:
        patches.restore()
    for p in everywhere:
        assert not isinstance(_resolve(f"{p.module}:{p.attr}"), patches._Shim)


def test_patch_list_is_the_documented_one():
    """README's patch list and patches.py's module docstring name exactly these globals."""
    targets = sorted(p.target for p in patches.PATCHES)
    assert targets == [
        "vllm.models.deepseek_v41.amd.rocm.rocm_sparse_attn_prefill",
        "vllm.models.deepseek_v41.nvidia.model_state._pad_replayed_slots_kernel",
        "vllm.v1.attention.backends.mla.sparse_swa._COMPUTE_PREFILL_METADATA_KERNEL",
        "vllm.v1.attention.backends.mla.sparse_swa._COMPUTE_SWA_INDICES_AND_LENS_KERNEL",
    ]
    doc = " ".join(patches.__doc__.split())
    for p in patches.PATCHES:
        assert p.attr.replace("_", "") in doc.replace("_", "").replace("\\", ""), p.attr


def test_replay_batch_and_config_fields():
    from vllm.config import CacheConfig, CompilationConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode
    from vllm.models.deepseek_v41.decoder_replay_layers import ReplayBatch

    assert [f.name for f in dataclasses.fields(ReplayBatch)] == ["rows", "forward_context", "run_graph", "num_padded"]

    def names(cls):
        return {f.name for f in dataclasses.fields(cls)}

    assert {"swa_bounded_replay", "enable_prefix_caching"} <= names(CacheConfig)
    assert {"pipeline_parallel_size", "prefill_context_parallel_size", "decode_context_parallel_size",
            "data_parallel_size", "tensor_parallel_size", "enable_expert_parallel"} <= names(ParallelConfig)
    assert hasattr(ParallelConfig, "use_ubatching")
    assert {"cudagraph_mode", "decoder_replay_trim_threshold", "cudagraph_decoder_replay"} <= names(CompilationConfig)
    assert "async_scheduling" in names(SchedulerConfig)
    assert {"speculative_config", "kv_transfer_config", "lora_config", "kernel_config"} <= names(VllmConfig)
    assert isinstance(VllmConfig.use_v2_model_runner, property)
    assert set(icfg.GRAPH_MODES) == {m.name for m in CUDAGraphMode}
    from vllm.config.kernel import MEGA_MOE_BACKENDS  # noqa: F401


def test_model_state_attributes_the_mixin_uses(monkeypatch):
    import _cases
    import _vllm_harness as h

    h.install_cpu_stubs(monkeypatch)
    batch = dict(_cases.mixed_batches(0))["mixed"]
    setup = h.make_setup(batch, spec=0)
    state = h.make_state(h.VllmState, setup)
    for name in ("_replay", "_dropped_before", "_kept_rows", "_kept_query_start_loc", "_kept_positions",
                 "_kept_slot_mappings", "_kept_kv_start", "_replay_start", "decoder_replay_layers", "replay_cudagraphs",
                 "pcp_size", "device", "vllm_config", "max_num_reqs", "max_num_tokens"):
        assert hasattr(state, name), name
    layers = setup.layers
    for name in ("window", "run_layers", "replay_batch", "trim_threshold", "metadata_prefixes", "first_swa_prefix"):
        assert hasattr(layers, name), name


def test_sequence_parallel_rule_matches_vllm():
    from vllm.models.deepseek_v41.nvidia.model import _use_sequence_parallel

    for pp in (1, 2):
        for ep in (False, True):
            for tp in (1, 4):
                for dp in (1, 2):
                    for moe in ("auto", "deep_gemm_mega_moe"):
                        cfg = SimpleNamespace(
                            parallel_config=SimpleNamespace(pipeline_parallel_size=pp, enable_expert_parallel=ep,
                                                            tensor_parallel_size=tp, data_parallel_size=dp),
                            kernel_config=SimpleNamespace(moe_backend=moe))
                        assert icfg.sequence_parallel_moe(cfg) == _use_sequence_parallel(cfg), (pp, ep, tp, dp, moe)


def test_mega_moe_backends_are_vllms():
    """config.py's fallback for configs built without vLLM is vLLM's own set."""
    from vllm.config.kernel import MEGA_MOE_BACKENDS, MoEBackend
    from typing import get_args

    assert icfg.MEGA_MOE_BACKENDS_0_33 == MEGA_MOE_BACKENDS
    for backend in get_args(MoEBackend):
        cfg = SimpleNamespace(kernel_config=SimpleNamespace(moe_backend=backend))
        assert icfg.mega_moe(cfg) == (backend in MEGA_MOE_BACKENDS or backend == "aiter_mega_moe"), backend


def _literal_values(tp) -> set[str]:
    from typing import get_args

    args = get_args(tp)
    return {tp} if not args else {v for a in args for v in _literal_values(a)}


def test_every_speculative_method_has_a_drafter_kind():
    """Every method vLLM's ``SpeculativeConfig`` takes maps to a ``ServingConfig.drafter`` the
    rules know; the pinned list makes a new vLLM method show up here, to be named or left
    ``other`` on purpose."""
    from vllm.config.speculative import MTPModelTypes, SpeculativeMethod

    from swa_backends.common.config import DRAFTERS

    methods = _literal_values(SpeculativeMethod)
    mtp_types = _literal_values(MTPModelTypes)
    assert methods - mtp_types == {"ngram", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
                                   "extract_hidden_states", "dflash", "ngram_gpu", "dspark"}
    assert "mtp" in mtp_types
    for method in methods:
        kind = icfg.drafter(SimpleNamespace(speculative_config=SimpleNamespace(method=method)))
        assert kind in DRAFTERS and kind != "none", method
        assert (kind == "mtp") == (method in mtp_types), method
    assert icfg.drafter(SimpleNamespace(speculative_config=SimpleNamespace(method="custom_class"))) == "other"


def test_pcp_refusal_config_mirrors():
    """The PCP encoder-replay rules (matrix.yaml pcp-*) mirror DeepSeek-V4.1's PCP check: PP = DP =
    DCP = 1, no microbatching, no drafter, no KV connector, no MegaMoE (vLLM raises; the pack
    says off with a reason); PCP itself needs model runner V2 and CUDA."""
    src = inspect.getsource(_resolve("vllm.models.deepseek_v41.nvidia.model:DeepseekV4Model.__init__"))
    for needle in ("self.parallel_config.prefill_context_parallel_size > 1 and (",
                   "self.parallel_config.pipeline_parallel_size != 1",
                   "or self.parallel_config.data_parallel_size != 1",
                   "or self.parallel_config.decode_context_parallel_size != 1",
                   "or self.parallel_config.use_ubatching",
                   "or vllm_config.speculative_config is not None",
                   "or vllm_config.kv_transfer_config is not None",
                   "or vllm_config.kernel_config.moe_backend in MEGA_MOE_BACKENDS"):
        assert needle in src, needle
    v1 = inspect.getsource(_resolve("vllm.config.vllm:VllmConfig._get_v1_model_runner_unsupported_features"))
    assert 'unsupported.append("prefill context parallel")' in v1
    # read, not imported: the ROCm model module cannot import without an AMD GPU
    from pathlib import Path

    amd = (Path(_resolve("vllm.models.deepseek_v41").__file__).parent / "amd" / "model.py").read_text()
    assert "DeepSeek-V4.1 PCP currently supports NVIDIA CUDA only." in amd


def test_encoder_gate_config_mirrors():
    """config.vllm_encoder_replay mirrors attention.py's three gates."""
    src = inspect.getsource(_resolve("vllm.models.deepseek_v41.attention"))
    for needle in ("swa_bounded_replay = cache_config.swa_bounded_replay",
                   "if swa_bounded_replay and not vllm_config.use_v2_model_runner:",
                   "and vllm_config.parallel_config.prefill_context_parallel_size > 1",
                   "and not cache_config.enable_prefix_caching",
                   "if swa_bounded_replay and current_platform.is_rocm():",
                   "bounded_replay=swa_bounded_replay"):
        assert needle in src, needle
    model_src = inspect.getsource(_resolve("vllm.models.deepseek_v41.nvidia.model:DeepseekV4Model.__init__"))
    for needle in ("self.decoder_replay_layers: DecoderReplayLayers | None = None",
                   "self.decoder_replay_start = self.end_layer",
                   "and not vllm_config.cache_config.swa_bounded_replay"):
        assert needle in model_src, needle
    resolve_src = inspect.getsource(_resolve("vllm.v1.worker.gpu.model_states:resolve_model_state_cls"))
    assert "get_model_state_cls" in resolve_src
