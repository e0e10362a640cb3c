"""vLLM 0.34's seams: every definition the integration relies on, pinned from :data:`RELEASE`.

The table ``swa_backends.integrations.vllm.seams.check`` compares the installed vLLM with
(``install()`` before it registers anything; the core's ``seams`` module says what a
fingerprint covers). Parameters, fingerprints and file hashes come from this module run as a
script (``python -m swa_backends.integrations.vllm.v0_34.seams``) against :data:`RELEASE`;
``tests/integration/vllm/test_vllm_seams.py`` asserts the table matches the installed vLLM.
To move to a new release: copy this subpackage, read vLLM's diff of every seam that script
marks, adapt the copy (and the differential), then take the new values (the checklist:
``swa_backends.integrations.vllm``'s docstring).

Against 0.33's table: the model-runner seams are gone with model runner V1 (0.34 has V2
only); ``vllm.platforms.rocm:get_cdna_version`` is new (encoder replay stays on on ROCm for
CDNA 3 and 4); the ROCm window-cache seams are gone (the pack does not turn encoder replay on
on ROCm with 0.34: ``config.PACK_TURNS_ROCM_ENCODER_ON``).
"""

from __future__ import annotations

from ..seams import Seam, report
from . import RELEASE  # the release every parameter list and fingerprint below was taken from

#: module -> sha256 of its file in RELEASE (the check's fast path: a module whose file is unchanged is not parsed)
FILES: dict[str, str] = {
    "vllm.model_executor.models.registry": "20cbb707bc35751f",
    "vllm.models.deepseek_v41.nvidia.vl_model": "cc514a12874e7d04",
    "vllm.models.deepseek_v41.nvidia.model": "5a947033b0149e1a",
    "vllm.models.deepseek_v41.amd.vl_model": "07414d97958f2ff9",
    "vllm.v1.worker.gpu.model_states": "07815d0b788fc881",
    "vllm.models.deepseek_v41.amd.model": "d3570d307c6579ec",
    "vllm.models.deepseek_v41.attention": "a8fa5d78443bfcf2",
    "vllm.config.kernel": "79693ce16e5af903",
    "vllm.config.speculative": "e157e4cbdd89d756",
    "vllm.platforms.rocm": "906845c0b56a3229",
    "vllm.distributed.utils": "1a9e3b0ebd3a46a5",
    "vllm.config.compilation": "53c277c61273721c",
    "vllm.models.deepseek_v41.nvidia.model_state": "47dd9355a3e9b5d7",
    "vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.model_state": "1cb79434be9893ae",
    "vllm.v1.worker.gpu.model_states.default": "bb56dd4064fbef70",
    "vllm.v1.worker.gpu.attn_utils": "517775bdd900c941",
    "vllm.v1.worker.utils": "3d4eef03676d8b63",
    "vllm.v1.attention.backends.utils": "5f46854f2c72977d",
    "vllm.v1.worker.gpu.cudagraph_utils": "e2f3ad9e831fa261",
    "vllm.v1.worker.gpu.buffer_utils": "49d79a7b166c5586",
    "vllm.models.deepseek_v41.decoder_replay_layers": "c8f1216a012afd62",
    "vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph": "844e8935336a41d3",
    "vllm.forward_context": "0e87c0dbfa2dbcf7",
    "vllm.v1.attention.backends.mla.sparse_swa": "76e948f2a6d25e32",
    "vllm.models.deepseek_v41.sparse_mla": "d6ca9121254f2ecc",
    "vllm.models.deepseek_v41.nvidia.flashinfer_sparse": "5e6276ae87af9066",
    "vllm.models.deepseek_v41.amd.rocm": "53a7035451eec089",
    "vllm.v1.attention.ops.rocm_aiter_mla_sparse": "eb88c468d78fbee4",
    "vllm.config.vllm": "d1bbad8d631ad301",
}

_DSV41 = "vllm.models.deepseek_v41"
_MS = f"{_DSV41}.nvidia.model_state"
_SWA = "vllm.v1.attention.backends.mla.sparse_swa"
_LAYERS = f"{_DSV41}.decoder_replay_layers"
_GRAPHS = f"{_DSV41}.nvidia.decoder_replay_cudagraph"

SEAMS: tuple[Seam, ...] = (
    # -- the architecture: registered lazily, a subclass of the class vLLM picks --------------
    Seam("vllm.model_executor.models.registry:_ModelRegistry.register_model",
         "install() registers the pack's class path under DeepseekV41ForCausalLM",
         ("self", "model_arch", "model_cls")),
    Seam(f"{_DSV41}.nvidia.vl_model:DeepseekV41ForCausalLM", "model.py subclasses it (NVIDIA)",
         fingerprint="98ccc78f89114608", kind="class", platform="cuda"),
    Seam(f"{_DSV41}.nvidia.vl_model:DeepseekV41ForCausalLM.__init__", "ModelMixin.__init__ wraps it",
         ("self", "vllm_config", "prefix"), platform="cuda"),
    Seam(f"{_DSV41}.nvidia.vl_model:DeepseekV41ForCausalLM.get_model_state_cls",
         "ModelMixin.get_model_state_cls subclasses what it returns", ("self",), "3411da3a4532c3c4",
         platform="cuda"),
    Seam(f"{_DSV41}.nvidia.model:DeepseekV41LLMForCausalLM.get_model_state_cls",
         "picks the state the pack subclasses (the latency-specialized decode state included)", ("self",),
         "1d2234dc8869beba", platform="cuda"),
    Seam(f"{_DSV41}.amd.vl_model:DeepseekV41ForCausalLM", "model.py subclasses it (ROCm)",
         fingerprint="f39019d8fac6ca17", kind="class", platform="rocm"),
    Seam(f"{_DSV41}.amd.vl_model:DeepseekV41ForCausalLM.__init__", "ModelMixin.__init__ wraps it",
         ("self", "vllm_config", "prefix"), platform="rocm"),
    Seam(f"{_DSV41}.amd.vl_model:DeepseekV41ForCausalLM.get_model_state_cls",
         "ModelMixin.get_model_state_cls subclasses what it returns", (), "27373aa6b0ed885e", platform="rocm"),
    Seam("vllm.v1.worker.gpu.model_states:resolve_model_state_cls",
         "asks the model for its state class (the pack's hook)", ("vllm_config", "model"), "89e1c201588ac340"),
    # -- the model: replay layers built or not; what the decision mirrors ---------------------
    Seam(f"{_DSV41}.nvidia.model:DeepseekV4Model.__init__",
         "builds decoder_replay_layers / decoder_replay_start, which _after_build removes or swaps; requires "
         "encoder replay under PCP with prefix caching (config.vllm_requires_encoder_replay)",
         ("self", "vllm_config", "prefix"), "45a206bb4688eeff", platform="cuda"),
    Seam(f"{_DSV41}.nvidia.model:DeepseekV4Model._decoder_replay_supported",
         "mirrored by config.stage_holds_all_layers_after_cut", ("self", "vllm_config", "cut"), "8a3cc25bd3e94cac",
         platform="cuda"),
    Seam(f"{_DSV41}.amd.model:DeepseekV4Model.__init__", "as the NVIDIA model's (ROCm)",
         ("self", "vllm_config", "prefix"), "d2e50120e0e591d1", platform="rocm"),
    Seam(f"{_DSV41}.amd.model:DeepseekV4Model._decoder_replay_supported", "as the NVIDIA model's (ROCm)",
         ("self", "vllm_config", "cut"), "abc84384232eb9a2", platform="rocm"),
    Seam(f"{_DSV41}.nvidia.model:_use_sequence_parallel", "mirrored by config.sequence_parallel_moe",
         ("vllm_config",), "4efa28d06587489a"),
    Seam(f"{_DSV41}.attention:DeepseekV4Attention.__init__",
         "its encoder-replay gates (0.34: on on ROCm for CDNA 3 and 4) are mirrored by config.vllm_encoder_replay; "
         "it reads "
         "cache_config.swa_bounded_replay, which _before_build sets, and warms the patched kernels",
         ("self", "vllm_config", "prefix", "topk_indices_buffer", "aux_stream_list", "candidate_block_buffer"),
         "4368787002253f46"),
    Seam("vllm.config.kernel:MEGA_MOE_BACKENDS",
         "mirrored by this release's config.MEGA_MOE_BACKENDS (the core's config.mega_moe)",
         fingerprint="9e942dc11b1e86ab", kind="global"),
    Seam("vllm.config.kernel:NATIVE_MEGA_MOE_BACKENDS", "part of MEGA_MOE_BACKENDS", fingerprint="d9bf6c7d98134809",
         kind="global"),
    Seam("vllm.config.kernel:FLASHINFER_MOE_EP_BACKENDS", "part of MEGA_MOE_BACKENDS",
         fingerprint="6961c7f8168ba68f", kind="global"),
    Seam("vllm.config.speculative:SpeculativeMethod", "this release's config.DRAFTER_KINDS maps its methods",
         fingerprint="4db305ea5780d0ee", kind="global"),
    Seam("vllm.config.speculative:MTPModelTypes", "config.drafter folds them into mtp",
         fingerprint="79544dddb7b06b58", kind="global"),
    Seam("vllm.platforms.rocm:get_cdna_version",
         "mirrored by this release's config.REPLAY_CDNA_ARCHS (the attention layer's ROCm gate)",
         (), "f814c8ea6a9bd0e8", platform="rocm"),
    Seam("vllm.distributed.utils:get_pp_indices", "config.stage_holds_all_layers_after_cut calls it",
         ("num_hidden_layers", "pp_rank", "pp_size")),
    Seam("vllm.config.compilation:CUDAGraphMode", "config.GRAPH_MODES maps its members",
         fingerprint="a3129ca1a29ae3d9", kind="class"),
    # -- the model state: subclassed, four methods overridden -------------------------------
    Seam(f"{_MS}:DeepseekV41ModelState", "model_state_class subclasses it (attributes the mixin reads)",
         fingerprint="c537025ed2d5d654", kind="class"),
    Seam(f"{_MS}:DeepseekV41ModelState.__init__", "sets the _replay / _kept_* buffers the mixin writes",
         ("self", "vllm_config", "model", "encoder_cache", "device"), "146dc1915829d0f6"),
    Seam(f"{_MS}:DeepseekV41ModelState.prepare_attn",
         "overridden around (one launch per step); launches the patched pad kernel",
         ("self", "input_batch", "cudagraph_mode", "block_tables", "slot_mappings", "attn_groups", "kv_cache_config",
          "for_capture", "ubatch_idx", "model_specific_attn_metadata"), "342877b6eb24c440"),
    Seam(f"{_MS}:DeepseekV41ModelState._build_attn_metadata",
         "overridden: the step's launch runs before it (the builders' call order and arguments)",
         fingerprint="367b1795af6a7f5e"),
    Seam(f"{_MS}:DeepseekV41ModelState._kept_input_batch", "overridden with the pack's gather (its body reproduced)",
         ("self", "input_batch", "slot_mappings", "replay_start", "kept_lens", "num_padded"), "4d1a388b24f5df28"),
    Seam(f"{_MS}:DeepseekV41ModelState._warm_up_replay_kernels", "overridden: the pack's warmup after vLLM's",
         ("self", "input_batch", "slot_mappings"), "c9efda4ff6f34958"),
    Seam(f"{_MS}:DeepseekV41ModelState._prepare_replay_batch",
         "its plan (trim rule, padded size) is what the step predicts (runtime.predicted_kept); its sub-batch builds "
         "(the replay groups made lazily, their clamps) are what the step's launch writes ahead",
         ("self", "input_batch", "cudagraph_mode", "block_tables", "slot_mappings", "attn_groups", "kv_cache_config",
          "replay_start", "capture_desc"), "741dc0424e6e68b5"),
    Seam(f"{_MS}:DeepseekV41ModelState._copy_attn_groups",
         "the model state calls it to make vLLM's replay groups a little earlier in the same step",
         ("self", "attn_groups", "prefixes"), "9cea9d6a720916e4", platform="cuda"),
    Seam(f"{_MS}:DeepseekV41ModelState.capture_inner_cudagraphs", "the replay graphs' capture path",
         ('self', 'input_buffers', 'block_tables', 'attn_groups', 'kv_cache_config', 'stream')),
    Seam(f"{_MS}:_pad_replayed_slots_kernel", "patch pad_replayed_slots replaces its launches (the same output)",
         ("slot_mappings_ptr", "group_stride", "cacheable_groups_ptr", "query_start_loc_ptr", "positions_ptr",
          "replay_start_ptr", "window", "pad_slot_id", "NUM_GROUPS", "BLOCK"), "839643f23f7adfd9"),
    Seam(f"{_MS}:_gather_replay_batch_kernel", "the pack's gather_replay_batch replaces its launch (the same output)",
         fingerprint="13af49e8127ed385"),
    Seam(f"{_DSV41}.nvidia.specialized_decode.runtime.model_state:DeepseekV41SpecializedDecodeModelState",
         "model_state_class subclasses it too", fingerprint="66f3181d808b805e", kind="class", platform="cuda"),
    Seam(f"{_DSV41}.nvidia.specialized_decode.runtime.model_state:DeepseekV41SpecializedDecodeModelState.__init__",
         "ModelStateMixin.__init__ wraps it", ("self", "vllm_config", "model", "encoder_cache", "device"),
         platform="cuda"),
    Seam("vllm.v1.worker.gpu.model_states.default:DefaultModelState.prepare_attn",
         "what the step predicts runs inside prepare_attn (max_query_len, the builders' order)",
         fingerprint="ab28e277dc72cf07"),
    Seam("vllm.v1.worker.gpu.attn_utils:build_attn_metadata", "the builders' arguments the step predicts",
         fingerprint="9ab13bba1a631085"),
    Seam("vllm.v1.worker.utils:AttentionGroup._with_kernel_block_table",
         "the window builder's block table (no kernel-block mapping) the step predicts",
         fingerprint="131c2baee187ec51"),
    Seam("vllm.v1.worker.utils:AttentionGroup.get_metadata_builder", "_window_builder calls it",
         ("self", "ubatch_id")),
    Seam("vllm.v1.attention.backends.utils:split_decodes_and_prefills",
         "mirrored by runtime.predicted_split", fingerprint="4bb4d6b29c9279c4"),
    Seam("vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.dispatch",
         "the replay graphs' padded size the step predicts", fingerprint="454641be89fec66b"),
    Seam("vllm.v1.worker.gpu.buffer_utils:UvaBufferPool.copy_to_uva", "the pack's gather uploads dropped_before",
         ("self", "x")),
    # -- the replay layers and their graphs: __class__ swapped to a subclass ----------------
    Seam(f"{_LAYERS}:ReplayBatch", "ReplayLayersMixin reads its fields", fingerprint="19cdb2242ac70a10",
         kind="class"),
    Seam(f"{_LAYERS}:DecoderReplayLayers", "its objects' __class__ is swapped to a subclass",
         fingerprint="3910e44c678a6841", kind="class"),
    Seam(f"{_LAYERS}:DecoderReplayLayers.__init__", "the attributes ReplayLayersMixin reads",
         ('self', 'window', 'run_layers', 'write_batch_kv', 'metadata_prefixes', 'first_swa_prefix', 'has_early_aux'),
         "36e266f65a66e17a"),
    Seam(f"{_LAYERS}:DecoderReplayLayers._run", "overridden with the pack's row gather/scatter (its body reproduced)",
         ("self", "hidden_states", "states"), "90c19c3f75d76a2c"),
    Seam(f"{_LAYERS}:DecoderReplayLayers.graph_uses_replay_batch", "the step predicts PIECEWISE sub-batches by it",
         fingerprint="c1f000d1f485e745"),
    Seam(f"{_GRAPHS}:DecoderReplayCudaGraphManager", "its objects' __class__ is swapped to a subclass",
         fingerprint="e5c3a69eb2b47593", kind="class", platform="cuda"),
    Seam(f"{_GRAPHS}:DecoderReplayCudaGraphManager.__init__", "the input buffers ReplayGraphsMixin fills",
         fingerprint="1a88121619a0936b", platform="cuda"),
    Seam(f"{_GRAPHS}:DecoderReplayCudaGraphManager.run", "overridden with the pack's row gather (its body reproduced)",
         ("self", "rows", "inputs"), "926610b753e6380f", platform="cuda"),
    Seam("vllm.forward_context:override_forward_context", "ReplayLayersMixin enters the replay batch's context",
         ("forward_context",)),
    Seam("vllm.forward_context:get_forward_context", "ReplayGraphsMixin reads the batch descriptor", ()),
    # -- the sparse-SWA builders: call sites of two patched globals --------------------------
    Seam(f"{_SWA}:DeepseekSparseSWAMetadataBuilder.__init__", "the persistent buffers the step writes",
         fingerprint="b0d6d18d07c08f98"),
    Seam(f"{_SWA}:DeepseekSparseSWAMetadataBuilder.build", "calls the patched window-index kernel; the step "
         "predicts its calls", fingerprint="410368713a807e8a"),
    Seam(f"{_SWA}:DeepseekSparseSWAMetadataBuilder.update_draft_decode_metadata",
         "calls the patched window-index kernel", fingerprint="c51b7f1a9e1e1cdb"),
    Seam(f"{_SWA}:DeepseekSparseSWAMetadataBuilder._build_deepseek_v4_metadata",
         "calls the patched gather-length kernel; the step predicts its call", fingerprint="9ad46379c5324f8f"),
    Seam(f"{_DSV41}.sparse_mla:DeepseekV41SparseSWAMetadataBuilder.build", "a build the step predicts",
         fingerprint="1d6e6dfa8bf8d45f"),
    Seam(f"{_DSV41}.nvidia.flashinfer_sparse:DeepseekSparseSWAFlashInferMetadataBuilder.build",
         "a build the step predicts (FlashInfer's, vLLM's default on sm120)", fingerprint="46d112a8cbc05469"),
    Seam(f"{_SWA}:_compute_swa_indices_and_lens_kernel",
         "patch swa_indices_and_lens replaces its launches (the same output)", fingerprint="1cf7bd50294fbb6d"),
    Seam(f"{_SWA}:ComputeSWAIndicesAndLensKernel.__call__", "the shim's calling convention",
         ("self", "swa_indices", "swa_lens", "window_size", "index_width", "left_visible", "right_visible",
          "query_start_loc", "seq_lens", "token_to_req_indices", "is_valid_token", "block_table", "block_size",
          "replay_start", "num_tokens", "token_offset", "has_image"), "f18bf0c5337432bd"),
    Seam(f"{_SWA}:ComputePrefillMetadataKernel.kernel",
         "patch prefill_gather_lens replaces its launches (the same output)", fingerprint="a90db23daec2885a"),
    Seam(f"{_SWA}:ComputePrefillMetadataKernel.__call__", "the shim's calling convention",
         ("self", "prefill_gather_lens", "seq_lens", "query_start_loc", "replay_start", "num_prefills",
          "num_decodes", "window_size"), "9d9503462fac8f15"),
    Seam(f"{_SWA}:_COMPUTE_SWA_INDICES_AND_LENS_KERNEL", "patched global", fingerprint="88e50125f3c4af18",
         kind="global"),
    Seam(f"{_SWA}:_COMPUTE_PREFILL_METADATA_KERNEL", "patched global", fingerprint="034b440036f0fdbe",
         kind="global"),
    # -- ROCm: the window indices through the pack; the prefill attention's patch stays inert --
    Seam(f"{_DSV41}.amd.rocm:DeepseekV41ROCMAiterSparseSWAMetadataBuilder.build",
         "calls the patched window-index kernel (ROCm)", fingerprint="91df7f1e7b53018d", platform="rocm"),
    Seam(f"{_DSV41}.amd.rocm:rocm_sparse_attn_prefill", "patched global (ROCm)", fingerprint="7b077a860e2fd074",
         kind="global", platform="rocm"),
    Seam(f"{_DSV41}.amd.rocm:DeepseekV41ROCMAiterMLAAttention._forward_prefill",
         "calls the patched prefill attention", fingerprint="a3e84366fdaf6dad", platform="rocm"),
    Seam("vllm.v1.attention.ops.rocm_aiter_mla_sparse:rocm_sparse_attn_prefill",
         "patch rocm_sparse_attn_prefill replaces its calls (the same output)",
         ("q", "kv", "indices", "topk_length", "scale", "head_dim", "nope_head_dim", "rope_head_dim", "attn_sink",
          "output", "ragged_indices", "ragged_indptr"), "8f70df245c38e7cf", platform="rocm"),
    # -- the decision command (python -m swa_backends.integrations.vllm) ---------------------
    Seam("vllm.config.vllm:VllmConfig.__post_init__",
         "the decision command mirrors its async-scheduling and graph-mode defaults for the device it is given "
         "(0.34: model runner V2 only)",
         fingerprint="a4637d1e1018ef80", scope="cli"),
)


if __name__ == "__main__":  # this table against the installed vLLM, each seam that differs marked
    raise SystemExit(report(SEAMS, FILES, RELEASE))
