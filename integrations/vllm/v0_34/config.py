"""What the core's config mapping (``swa_backends.integrations.vllm.config``) reads of vLLM 0.34.

No vLLM import: the lists of vLLM's the mapping mirrors, the speculative methods it names, the
rules 0.34 changed from 0.33, and the lines of vLLM's source each restated rule follows (the
drift test finds every one in the installed vLLM; the seam table pins the same definitions).

What 0.34 changed for the decision, each read from its source:

* model runner V1 is gone (``VllmConfig.use_v2_model_runner`` and V1's feature list with it):
  every config runs V2, so neither side is refused for the runner;
* ``_use_sequence_parallel`` no longer needs PP 1;
* the attention layer keeps encoder replay on on ROCm for CDNA 3 and 4 (gfx942, gfx950), whose
  AITER sparse-MLA and Triton gather read the clamped window; the pack routes the replay
  metadata there as on CUDA and leaves the prefill attention vLLM's;
* DeepSeek-V4.1's PCP check allows PP and DP and a fixed-length DSpark drafter with PP 1. The
  pack's PCP rules (``matrix.yaml`` ``pcp-*``, from the seed) still refuse them: where vLLM then
  requires encoder replay (PCP with prefix caching) it stays on through vLLM's kernels
  (``config.vllm_requires_encoder_replay``);
* the NVIDIA model builds no replay layers with LoRA (the pack's decision for LoRA is unchanged:
  vLLM's own "off" is logged as vLLM's).
"""

from __future__ import annotations

#: ``vllm.config.kernel.MEGA_MOE_BACKENDS`` (0.34's: the same three as 0.33's)
MEGA_MOE_BACKENDS = frozenset({"deep_gemm_mega_moe", "flashinfer_moe_ep_cutedsl", "flashinfer_moe_ep_mega_deep_gemm"})

#: ``speculative_config.method`` -> ``ServingConfig.drafter`` (an MTP model type is ``mtp``)
DRAFTER_KINDS = {"dspark": "dspark", "mtp": "mtp", "eagle": "eagle", "eagle3": "eagle3", "dflash": "dflash",
                 "draft_model": "draft_model", "ngram": "ngram", "ngram_gpu": "ngram", "suffix": "suffix"}
#: the methods of ``SpeculativeMethod`` that are ``other`` on purpose (0.34 dropped ``custom_class``)
OTHER_DRAFTERS = ("extract_hidden_states",)

#: vLLM 0.34 builds encoder replay on on the ROCm devices the pack serves, with its own clamped
#: prefill attention: the pack has nothing to turn on there (``model._encoder_on_rocm`` stays unused)
PACK_TURNS_ROCM_ENCODER_ON = False

#: ``vllm.platforms.rocm.get_cdna_version``'s archs of CDNA 3 and 4, where replay stays on
REPLAY_CDNA_ARCHS = {"gfx942": 3, "gfx950": 4}


def model_runner(vllm_config) -> str:
    """``"v2"``: vLLM 0.34 has no other model runner."""
    return "v2"


def sequence_parallel_moe(parallel_config, mega_moe: bool) -> bool:
    """``_use_sequence_parallel``: expert parallel, TP > 1 and (MegaMoE or DP > 1), at any PP."""
    pc = parallel_config
    return (bool(getattr(pc, "enable_expert_parallel", False)) and getattr(pc, "tensor_parallel_size", 1) > 1
            and (mega_moe or pc.data_parallel_size > 1))


def rocm_replay_off(arch: str | None) -> str | None:
    """Why 0.34's attention layer turns encoder replay off on a ROCm device of ``arch``: it is
    not CDNA 3 or 4 (None: it stays on)."""
    if arch in REPLAY_CDNA_ARCHS:
        return None
    return (f"vLLM turns prefix-cache SWA replay off on ROCm outside CDNA 3 and 4 (gfx942, gfx950); this device: "
            f"{arch or 'unknown'}")


_DSV41 = "vllm.models.deepseek_v41"

#: ``(rule, where, lines)``: the integration's ``rule`` restates vLLM's code at ``where``
#: (``"module:Qual.name"``, or a module for its whole file), which holds each of ``lines``
MIRRORS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("config.serving_config's PCP refusals (matrix.yaml pcp-*): DeepSeek-V4.1's PCP check (0.34 allows more)",
     f"{_DSV41}.nvidia.model:DeepseekV4Model.__init__",
     ("self.parallel_config.prefill_context_parallel_size > 1 and (",
      "self.parallel_config.decode_context_parallel_size != 1",
      "or self.parallel_config.use_ubatching",
      "vllm_config.speculative_config is not None",
      "self.parallel_config.pipeline_parallel_size > 1",
      "or not vllm_config.speculative_config.use_dspark()",
      "or vllm_config.kv_transfer_config is not None",
      "or vllm_config.kernel_config.moe_backend in MEGA_MOE_BACKENDS")),
    ("PCP needs CUDA (the ROCm model refuses it)", f"{_DSV41}.amd.model",
     ("DeepSeek-V4.1 PCP currently supports NVIDIA CUDA only.",)),
    ("config.vllm_encoder_replay: the attention layer's gates", f"{_DSV41}.attention",
     ("swa_bounded_replay = cache_config.swa_bounded_replay",
      "and vllm_config.parallel_config.prefill_context_parallel_size > 1",
      "and not cache_config.enable_prefix_caching",
      "if swa_bounded_replay and current_platform.is_rocm():",
      "if get_cdna_version() not in (3, 4):",
      "bounded_replay=swa_bounded_replay")),
    ("config.REPLAY_CDNA_ARCHS: the archs of CDNA 3 and 4", "vllm.platforms.rocm:get_cdna_version",
     ("if on_gfx942():", "return 3", "if on_gfx950():", "return 4")),
    ("model._after_build removes or swaps the replay layers the model built",
     f"{_DSV41}.nvidia.model:DeepseekV4Model.__init__",
     ("self.decoder_replay_layers: DecoderReplayLayers | None = None",
      "self.decoder_replay_start = self.end_layer",
      "and not vllm_config.cache_config.swa_bounded_replay")),
    ("model.ModelMixin.get_model_state_cls is the model state's hook",
     "vllm.v1.worker.gpu.model_states:resolve_model_state_cls", ("get_model_state_cls",)),
)
