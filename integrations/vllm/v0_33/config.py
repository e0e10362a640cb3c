"""What the core's config mapping (``swa_backends.integrations.vllm.config``) reads of vLLM 0.33.

No vLLM import: the lists of vLLM's the mapping mirrors (read where a config is built without
vLLM), the speculative methods it names, the rules that differ between releases (each a small
pure function of config objects), and the lines of vLLM's source each of the integration's
restated rules follows (the drift test finds every one in the installed vLLM; the seam table
pins the same definitions' fingerprints).
"""

from __future__ import annotations

#: ``vllm.config.kernel.MEGA_MOE_BACKENDS``, for configs built without vLLM (with vLLM, its own set
#: is read; the drift test checks they agree)
MEGA_MOE_BACKENDS = frozenset({"deep_gemm_mega_moe", "flashinfer_moe_ep_cutedsl", "flashinfer_moe_ep_mega_deep_gemm"})

#: vLLM's speculative methods (``speculative_config.method`` after its post-init) ->
#: ``ServingConfig.drafter``; an MTP model type (``deepseek_mtp``, ...) is ``mtp``
DRAFTER_KINDS = {"dspark": "dspark", "mtp": "mtp", "eagle": "eagle", "eagle3": "eagle3", "dflash": "dflash",
                 "draft_model": "draft_model", "ngram": "ngram", "ngram_gpu": "ngram", "suffix": "suffix"}
#: the methods of ``SpeculativeMethod`` that are ``other`` on purpose (no drafter the rules know); with
#: :data:`DRAFTER_KINDS` and the MTP model types, every method this release takes
OTHER_DRAFTERS = ("custom_class", "extract_hidden_states")

#: the pack may turn on, on ROCm, the encoder replay vLLM builds off there (``model._encoder_on_rocm``:
#: 0.33's ROCm prefill attention is patched to the pack's clamped ``sparse_mla``)
PACK_TURNS_ROCM_ENCODER_ON = True


def model_runner(vllm_config) -> str:
    """``VllmConfig.use_v2_model_runner`` as ``"v2"`` / ``"v1"`` (0.33 has both runners)."""
    return "v2" if getattr(vllm_config, "use_v2_model_runner", False) else "v1"


def sequence_parallel_moe(parallel_config, mega_moe: bool) -> bool:
    """``_use_sequence_parallel``: PP 1, expert parallel, TP > 1 and (MegaMoE or DP > 1)."""
    pc = parallel_config
    return (pc.pipeline_parallel_size == 1 and bool(getattr(pc, "enable_expert_parallel", False))
            and getattr(pc, "tensor_parallel_size", 1) > 1 and (mega_moe or pc.data_parallel_size > 1))


def rocm_replay_off(arch: str | None) -> str | None:
    """Why 0.33's attention layer turns encoder replay off on ROCm: on every device."""
    return ("vLLM turns prefix-cache SWA replay off on ROCm (its AITER attention reads the window without the "
            "replay-start clamp)")


_DSV41 = "vllm.models.deepseek_v41"

#: ``(rule, where, lines)``: the integration's ``rule`` restates vLLM's code at ``where``
#: (``"module:Qual.name"``, or a module for its whole file), which holds each of ``lines``
MIRRORS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("config.serving_config's PCP refusals (matrix.yaml pcp-*): DeepSeek-V4.1's PCP check",
     f"{_DSV41}.nvidia.model:DeepseekV4Model.__init__",
     ("self.parallel_config.prefill_context_parallel_size > 1 and (",
      "self.parallel_config.pipeline_parallel_size != 1",
      "or self.parallel_config.data_parallel_size != 1",
      "or self.parallel_config.decode_context_parallel_size != 1",
      "or self.parallel_config.use_ubatching",
      "or vllm_config.speculative_config is not None",
      "or vllm_config.kv_transfer_config is not None",
      "or vllm_config.kernel_config.moe_backend in MEGA_MOE_BACKENDS")),
    ("PCP needs model runner V2", "vllm.config.vllm:VllmConfig._get_v1_model_runner_unsupported_features",
     ('unsupported.append("prefill context parallel")',)),
    ("PCP needs CUDA (the ROCm model refuses it)", f"{_DSV41}.amd.model",
     ("DeepSeek-V4.1 PCP currently supports NVIDIA CUDA only.",)),
    ("config.vllm_encoder_replay: the attention layer's three gates", f"{_DSV41}.attention",
     ("swa_bounded_replay = cache_config.swa_bounded_replay",
      "if swa_bounded_replay and not vllm_config.use_v2_model_runner:",
      "and vllm_config.parallel_config.prefill_context_parallel_size > 1",
      "and not cache_config.enable_prefix_caching",
      "if swa_bounded_replay and current_platform.is_rocm():",
      "bounded_replay=swa_bounded_replay")),
    ("model._after_build removes or swaps the replay layers the model built",
     f"{_DSV41}.nvidia.model:DeepseekV4Model.__init__",
     ("self.decoder_replay_layers: DecoderReplayLayers | None = None",
      "self.decoder_replay_start = self.end_layer",
      "and not vllm_config.cache_config.swa_bounded_replay")),
    ("model.ModelMixin.get_model_state_cls is the model state's hook",
     "vllm.v1.worker.gpu.model_states:resolve_model_state_cls", ("get_model_state_cls",)),
)
