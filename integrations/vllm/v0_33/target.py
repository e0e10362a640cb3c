"""vLLM 0.33's own rules for the fields it resolves per platform, re-derived by the decision
command for a device on another platform (the core's ``target.infer``).

The model-runner choice is ``VllmConfig.use_v2_model_runner`` applied with Triton present
(CUDA and ROCm builds of torch ship it), the graph mode the optimization level's default from
vLLM's own table, the async-scheduling default ``VllmConfig.__post_init__``'s; the seam table
pins those functions (scope ``cli``). Each rule returns ``(value, why)``.
"""

from __future__ import annotations

from ..target import Given


def v2_model_runner(vllm_config, platform: str) -> tuple[bool, str]:
    """``VllmConfig.use_v2_model_runner`` of vLLM 0.33 on ``platform`` (CUDA or ROCm, where
    Triton is present): ``(V2, why)``."""
    from vllm import envs

    if getattr(getattr(vllm_config, "attention_config", None), "hisparse_config", None) is not None:
        return True, "HiSparse requires model runner V2"
    if getattr(vllm_config, "watermark_config", None) is not None:
        return True, "watermarking requires model runner V2"
    env = envs.VLLM_USE_V2_MODEL_RUNNER
    if env is not None:
        return bool(env), f"VLLM_USE_V2_MODEL_RUNNER={int(bool(env))}"
    unsupported = vllm_config._get_v2_model_runner_unsupported_features()
    if unsupported:
        return False, f"model runner V2 does not yet support {', '.join(unsupported)}"
    return True, f"vLLM's default on {platform} (Triton present, no feature V2 lacks)"


def graph_mode(given: Given, vllm_config) -> tuple[object, str]:
    """The CUDA-graph mode vLLM 0.33 starts from on a GPU: none under ``--enforce-eager``, the
    mode the arguments give, else the optimization level's default (vLLM's own table; vLLM
    may still lower it on the device, e.g. for an attention backend without full graphs)."""
    from vllm.config import CUDAGraphMode
    from vllm.config.vllm import OPTIMIZATION_LEVEL_TO_CONFIG

    if given.enforce_eager:
        return CUDAGraphMode.NONE, "--enforce-eager"
    if given.cudagraph_mode is not None:
        return CUDAGraphMode[str(given.cudagraph_mode).upper()], "the compilation config's cudagraph_mode"
    level = given.optimization_level
    if level is None:
        level = vllm_config.optimization_level
    mode = OPTIMIZATION_LEVEL_TO_CONFIG[level]["compilation_config"]["cudagraph_mode"]
    return mode, f"vLLM's default for {getattr(level, 'name', level)} on a GPU (it may lower it on the device)"


def async_scheduling(given: Given, vllm_config, v2: bool, platform: str) -> tuple[bool, str]:
    """``--async-scheduling`` as vLLM 0.33's ``VllmConfig.__post_init__`` defaults it on
    ``platform`` with the model runner :func:`v2_model_runner` picks."""
    if given.async_scheduling is not None:
        return bool(given.async_scheduling), "given (--async-scheduling / --no-async-scheduling)"
    from typing import get_args

    from vllm.config.speculative import EagleModelTypes, NgramGPUTypes
    from vllm.v1.executor.abstract import Executor

    model = getattr(vllm_config, "model_config", None)
    if model is not None and model.runner_type == "pooling":
        return False, "vLLM's default for pooling models"
    if not Executor.get_class(vllm_config).supports_async_scheduling():
        return False, f"the {vllm_config.parallel_config.distributed_executor_backend} executor does not support it"
    pc = vllm_config.parallel_config
    if platform == "rocm" and pc.enable_dbo and pc.all2all_backend == "deepep_high_throughput":
        return False, "vLLM turns it off for ROCm DeepEP high-throughput DBO"
    if not v2:
        spec = vllm_config.speculative_config
        if spec is not None and (spec.method not in get_args(EagleModelTypes)
                                 and spec.method not in get_args(NgramGPUTypes)
                                 and spec.method not in ("draft_model", "dspark", "dflash")):
            return False, f"model runner V1 does not support it with {spec.method}-based speculative decoding"
        if spec is not None and spec.disable_padded_drafter_batch:
            return False, "model runner V1 does not support it with disable_padded_drafter_batch"
        if pc.pipeline_parallel_size > 1:
            return False, "model runner V1 does not support it with pipeline parallelism"
    return True, "vLLM's default"


def prefix_caching(given: Given, vllm_config) -> tuple[bool, str]:
    """``--enable-prefix-caching`` as given, else vLLM's default for the model (on a GPU; its
    CPU platform turns it off for MLA models)."""
    if given.enable_prefix_caching is not None:
        return bool(given.enable_prefix_caching), "given (--enable-prefix-caching / --no-enable-prefix-caching)"
    return bool(vllm_config.model_config.is_prefix_caching_supported), "vLLM's default for the model on a GPU"
