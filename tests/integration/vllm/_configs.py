"""VllmConfig-shaped objects for the decision tests (attribute trees, no vLLM import).

``vllm_config(**overrides)`` gives a DeepSeek-V4.1 serving configuration with vLLM 0.33's
defaults (model runner V2, bounded replay on, prefix caching on, FULL_AND_PIECEWISE graphs,
async scheduling, no drafter); keyword overrides use dotted paths with ``__``:
``vllm_config(parallel_config__decode_context_parallel_size=2)``.
"""

from __future__ import annotations

import enum
from types import SimpleNamespace


class CUDAGraphMode(enum.Enum):  # vLLM's names (the decision reads .name)
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (2, 0)
    FULL_AND_PIECEWISE = (2, 1)


def vllm_config(**overrides):
    text = SimpleNamespace(sliding_window=128, kv_source_layer_ids=[0, 1, 2, 20], num_hidden_layers=43,
                           engram_layer_ids=[], hidden_size=7168, hc_mult=4)
    cfg = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=text, hf_text_config=text, max_model_len=65536, enforce_eager=False),
        parallel_config=SimpleNamespace(pipeline_parallel_size=1, prefill_context_parallel_size=1,
                                        decode_context_parallel_size=1, data_parallel_size=1, tensor_parallel_size=1,
                                        enable_expert_parallel=False, use_ubatching=False),
        cache_config=SimpleNamespace(swa_bounded_replay=True, enable_prefix_caching=True),
        scheduler_config=SimpleNamespace(async_scheduling=True),
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE),
        kernel_config=SimpleNamespace(moe_backend="auto"),
        device_config=SimpleNamespace(device="cuda:sm90"),
        speculative_config=None,
        kv_transfer_config=None,
        lora_config=None,
        use_v2_model_runner=True,
    )
    for key, value in overrides.items():
        obj = cfg
        *path, last = key.split("__")
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, last, value)
    return cfg


def drafter(window=128, layer_types=("sliding_attention",), method="dspark"):
    return SimpleNamespace(num_speculative_tokens=3, method=method,
                           draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(sliding_window=window,
                                                                                        layer_types=list(layer_types))))
