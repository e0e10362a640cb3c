"""Drift guard: what the vLLM integration relies on, checked against the installed vLLM.

A vLLM release that renames, re-signs or rewrites any of these fails here, in CI, instead of
at serving time. Three kinds of checks:

* the patch targets (``patches.PATCHES``): each applies (its own signature check passes);
* pinned signatures and attributes of every vLLM function, method, class and config field
  the integration calls, overrides or reads;
* pinned source hashes of the vLLM code the integration replaces, copies or mirrors (the
  four kernels, the overridden methods, the gates ``config.py`` mirrors). On a mismatch:
  read vLLM's diff, adapt ``integrations/vllm`` (and the differential), then update the hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import textwrap
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs vllm==0.33.0 in its own venv)")

from swa_backends.integrations import vllm as integration  # noqa: E402
from swa_backends.integrations.vllm import config as icfg  # noqa: E402
from swa_backends.integrations.vllm import patches  # noqa: E402


def _source_hash(obj) -> str:
    return hashlib.sha256(textwrap.dedent(inspect.getsource(obj)).encode()).hexdigest()[:16]


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


MS = "vllm.models.deepseek_v41.nvidia.model_state"
SIGNATURES = {
    # the architecture and its model-state hook
    "vllm.models.deepseek_v41:DeepseekV41ForCausalLM.__init__": ("self", "vllm_config", "prefix"),
    "vllm.models.deepseek_v41:DeepseekV41ForCausalLM.get_model_state_cls": ("self",),
    "vllm.models.deepseek_v41.nvidia.model:DeepseekV41LLMForCausalLM.get_model_state_cls": ("self",),
    "vllm.model_executor.models.registry:_ModelRegistry.register_model": ("self", "model_arch", "model_cls"),
    "vllm.v1.worker.gpu.model_states:resolve_model_state_cls": ("vllm_config", "model"),
    # the model state (overridden / called)
    f"{MS}:DeepseekV41ModelState.__init__": ("self", "vllm_config", "model", "encoder_cache", "device"),
    f"{MS}:DeepseekV41ModelState.prepare_attn": (
        "self", "input_batch", "cudagraph_mode", "block_tables", "slot_mappings", "attn_groups", "kv_cache_config",
        "for_capture", "ubatch_idx", "model_specific_attn_metadata"),
    f"{MS}:DeepseekV41ModelState._kept_input_batch": (
        "self", "input_batch", "slot_mappings", "replay_start", "kept_lens", "num_padded"),
    f"{MS}:DeepseekV41ModelState._warm_up_replay_kernels": ("self", "input_batch", "slot_mappings"),
    f"{MS}:DeepseekV41ModelState._prepare_replay_batch": (
        "self", "input_batch", "cudagraph_mode", "block_tables", "slot_mappings", "attn_groups", "kv_cache_config",
        "replay_start", "capture_desc"),
    f"{MS}:DeepseekV41ModelState.capture_inner_cudagraphs": (
        "self", "input_buffers", "block_tables", "attn_groups", "kv_cache_config"),
    "vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.model_state:"
    "DeepseekV41SpecializedDecodeModelState.__init__": ("self", "vllm_config", "model", "encoder_cache", "device"),
    "vllm.v1.worker.gpu.buffer_utils:UvaBufferPool.copy_to_uva": ("self", "x"),
    # the replay layers and their graphs
    "vllm.models.deepseek_v41.decoder_replay_layers:DecoderReplayLayers.__init__": (
        "self", "window", "run_layers", "write_batch_kv", "metadata_prefixes", "first_swa_prefix"),
    "vllm.models.deepseek_v41.decoder_replay_layers:DecoderReplayLayers._run": ("self", "hidden_states", "states"),
    "vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph:DecoderReplayCudaGraphManager.run": (
        "self", "rows", "inputs"),
    "vllm.forward_context:override_forward_context": ("forward_context",),
    "vllm.forward_context:get_forward_context": (),
    # configuration the decision reads
    "vllm.distributed.utils:get_pp_indices": ("num_hidden_layers", "pp_rank", "pp_size"),
    "vllm.models.deepseek_v41.nvidia.model:_use_sequence_parallel": ("vllm_config",),
}


@pytest.mark.parametrize("path", sorted(SIGNATURES))
def test_pinned_signature(path):
    got = tuple(inspect.signature(inspect.unwrap(_resolve(path))).parameters)
    assert got == SIGNATURES[path], f"{path}: {got}"


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


#: sha256[:16] of ``textwrap.dedent(inspect.getsource(...))`` in vLLM 0.33.0
SOURCE_HASHES = {
    # the kernels the pack replaces (the differential compares against them)
    f"{MS}:_pad_replayed_slots_kernel.fn": "a01c3b3c5d778a3d",
    f"{MS}:_gather_replay_batch_kernel.fn": "0a08266fe9a9d4d6",
    "vllm.v1.attention.backends.mla.sparse_swa:_compute_swa_indices_and_lens_kernel.fn": "4954bff106edb182",
    "vllm.v1.attention.backends.mla.sparse_swa:ComputePrefillMetadataKernel.kernel.fn": "e299bccba808a21e",
    # the call sites of the patched globals (their calling convention is the shims')
    f"{MS}:DeepseekV41ModelState.prepare_attn": "1fee775e24dd2e46",
    "vllm.v1.attention.backends.mla.sparse_swa:DeepseekSparseSWAMetadataBuilder.build": "a4fde14ecb55f1a2",
    "vllm.v1.attention.backends.mla.sparse_swa:DeepseekSparseSWAMetadataBuilder.update_draft_decode_metadata":
        "5d5087a3aca1044f",
    "vllm.v1.attention.backends.mla.sparse_swa:DeepseekSparseSWAMetadataBuilder._build_deepseek_v4_metadata":
        "ae4ed4196187fb77",
    # the methods model.py overrides with a copy around the pack's call
    f"{MS}:DeepseekV41ModelState._kept_input_batch": "d2a6a12477056153",
    f"{MS}:DeepseekV41ModelState._warm_up_replay_kernels": "bc5d61966da375a4",
    f"{MS}:DeepseekV41ModelState._prepare_replay_batch": "fba4ffbe3b54b274",
    "vllm.models.deepseek_v41.decoder_replay_layers:DecoderReplayLayers._run": "229aac395656151a",
    "vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph:DecoderReplayCudaGraphManager.run": "5e6382ddaf3aa8e5",
    # what the one-launch step predicts (model.py ``_swa_prepare_step``): the call order around
    # ``_build_attn_metadata``, the builders' arguments, vLLM's decode/prefill split, the
    # replay graphs' padded size
    f"{MS}:DeepseekV41ModelState._build_attn_metadata": "3eca31b31afea49a",
    "vllm.models.deepseek_v41.sparse_mla:DeepseekV41SparseSWAMetadataBuilder.build": "62c1e7f16a9bd6f2",
    "vllm.models.deepseek_v41.nvidia.flashinfer_sparse:DeepseekSparseSWAFlashInferMetadataBuilder.build":
        "8b8b78ed7ffd131f",
    "vllm.v1.attention.backends.utils:split_decodes_and_prefills": "f007f7c52cb563c9",
    "vllm.v1.worker.gpu.attn_utils:build_attn_metadata": "b7faabe5c799633e",
    "vllm.v1.worker.gpu.model_states.default:DefaultModelState.prepare_attn": "b4e721b16fb22bee",
    "vllm.v1.worker.utils:AttentionGroup._with_kernel_block_table": "d2963b7d11fa441e",
    "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.dispatch": "45e4fbcc4da50fd6",
    "vllm.models.deepseek_v41.decoder_replay_layers:DecoderReplayLayers.graph_uses_replay_batch": "7c5242b715bf0b69",
    # the gates config.py mirrors
    "vllm.models.deepseek_v41.nvidia.model:_use_sequence_parallel": "4811b062656f4550",
    "vllm.models.deepseek_v41.nvidia.model:DeepseekV4Model._decoder_replay_supported": "269bbf488252a29f",
}


@pytest.mark.parametrize("path", sorted(SOURCE_HASHES))
def test_pinned_source(path):
    got = _source_hash(_resolve(path))
    assert got == SOURCE_HASHES[path], (
        f"vLLM changed {path} (sha {got}, pinned {SOURCE_HASHES[path]}): re-check the integration against it")


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
