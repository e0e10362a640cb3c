"""Where vLLM 0.33's replay-metadata kernels live and how its call sites launch them.

Read by ``swa_backends.testing.vllm_kernels`` (the loader, the same for every release), which
takes the kernels out of the installed vLLM or out of copies of the files named here, for the
differential and the whole-step benchmark; the product never launches vLLM's kernels itself.
The four kernels are the ones the pack replaces: ``pad`` (slot padding), ``gather`` (the
decoder sub-batch), ``swa`` (clamped window indices and lengths), ``prefill`` (prefill gather
lengths). The launch functions below call each as vLLM 0.33 does at its call site (grid,
strides, constexprs, vLLM's PAD fill around the gather), so a differential needs nothing else
from vLLM.
"""

from __future__ import annotations

import torch

_MS = "vllm.models.deepseek_v41.nvidia.model_state"
_SWA = "vllm.v1.attention.backends.mla.sparse_swa"

#: the source files a copy holds: file name -> its path under ``vllm/``
FILES = {
    "model_state.py": "models/deepseek_v41/nvidia/model_state.py",
    "sparse_swa.py": "v1/attention/backends/mla/sparse_swa.py",
    # vLLM's launch objects (the loader's load_launchers only)
    "jit_warmup.py": "model_executor/warmup/jit_warmup.py",
    "jit_warmup_triton_helper.py": "model_executor/warmup/jit_warmup_triton_helper.py",
}
#: kernel -> (file, qualified name inside it) of its ``@triton.jit`` function
KERNELS = {
    "pad": ("model_state.py", "_pad_replayed_slots_kernel"),
    "gather": ("model_state.py", "_gather_replay_batch_kernel"),
    "swa": ("sparse_swa.py", "_compute_swa_indices_and_lens_kernel"),
    "prefill": ("sparse_swa.py", "ComputePrefillMetadataKernel.kernel"),
}
#: kernel -> ``"module:qualname"`` of that function in the installed vLLM (a patch's shim there is
#: looked through to vLLM's original)
INSTALLED_KERNELS = {
    "pad": f"{_MS}:_pad_replayed_slots_kernel",
    "gather": f"{_MS}:_gather_replay_batch_kernel",
    "swa": f"{_SWA}:_compute_swa_indices_and_lens_kernel",
    "prefill": f"{_SWA}:ComputePrefillMetadataKernel.kernel",
}

#: what the call sites really call, in the installed vLLM: the model state's two ``@triton.jit``
#: functions (``kernel[grid](...)``) and the builders' two ``VllmTritonJitKernel`` launch objects
#: (each call binds its arguments with ``inspect`` and maps them onto the kernel's)
INSTALLED_LAUNCHERS = {
    "pad": f"{_MS}:_pad_replayed_slots_kernel",
    "gather": f"{_MS}:_gather_replay_batch_kernel",
    "swa": f"{_SWA}:_COMPUTE_SWA_INDICES_AND_LENS_KERNEL",
    "prefill": f"{_SWA}:_COMPUTE_PREFILL_METADATA_KERNEL",
}
#: (file, qualified name) of what is taken out of copies of the files for the launchers, in order
LAUNCH_SOURCES = (
    ("jit_warmup_triton_helper.py", "_LaunchBindingPlan"),
    ("jit_warmup_triton_helper.py", "_launch_binding_plan"),
    ("jit_warmup.py", "kernel_launcher"),
    ("jit_warmup_triton_helper.py", "VllmTritonJitKernel"),
    ("sparse_swa.py", "_compute_swa_indices_and_lens_kernel"),
    ("sparse_swa.py", "ComputeSWAIndicesAndLensKernel"),
    ("sparse_swa.py", "ComputePrefillMetadataKernel"),
    ("model_state.py", "_pad_replayed_slots_kernel"),
    ("model_state.py", "_gather_replay_batch_kernel"),
)
#: launcher -> the name :data:`LAUNCH_SOURCES` define it by; a class (its call sites' object) is
#: instantiated
SOURCE_LAUNCHERS = {
    "pad": ("_pad_replayed_slots_kernel", False),
    "gather": ("_gather_replay_batch_kernel", False),
    "swa": ("ComputeSWAIndicesAndLensKernel", True),
    "prefill": ("ComputePrefillMetadataKernel", True),
}
#: what the launch sources need around them: their imports, vLLM's one-line ``next_power_of_2``
#: restated, and a small base standing in for ``VllmJitKernel`` (``bind_launch_inputs = True``; its
#: warmup tracing, never on the call path, is not carried): every line a launch runs is vLLM's
LAUNCH_PRELUDE = '''\
import ast
import inspect
from abc import abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property, wraps
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch
import triton
import triton.language as tl

CompileKeyT = TypeVar("CompileKeyT")
LaunchSpec = Any  # type aliases and config types, annotations only
VllmConfig = Any


def next_power_of_2(n: int) -> int:  # vllm.utils.math_utils, restated
    return 1 if n < 1 else 1 << (n - 1).bit_length()


class VllmJitKernel(Generic[CompileKeyT]):
    """What vLLM's launch path reads of its JIT-kernel base (warmup tracing not carried)."""

    bind_launch_inputs = True

    def __init__(self) -> None:
        self._compiled_cache = {}


'''

PAD_SLOT_ID = -1  # vllm/v1/attention/backends/utils.py


# ---------------------------------------------------------------------------------------
# vLLM 0.33's launches, as at its call sites (``k``: the loader's kernels)
# ---------------------------------------------------------------------------------------


def pad_replayed_slots(k, slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, window: int,
                       num_reqs: int) -> None:
    """``DeepseekV41ModelState.prepare_attn`` (model_state.py L386)."""
    k.pad[(num_reqs,)](slot_mappings, slot_mappings.stride(0), cacheable_groups, query_start_loc, positions,
                       replay_start, window, PAD_SLOT_ID, NUM_GROUPS=cacheable_groups.numel(), BLOCK=1024)


def swa_indices_and_lens(k, swa_indices, swa_lens, window_size, index_width, query_start_loc, seq_lens,
                         token_to_req_indices, is_valid_token, block_table, block_size, replay_start, *, num_tokens,
                         token_offset) -> None:
    """``ComputeSWAIndicesAndLensKernel.__call__``'s launch (sparse_swa.py L1199-1231), no image."""
    if num_tokens == 0:
        return
    k.swa[(num_tokens,)](swa_indices, swa_indices.stride(0), swa_lens, window_size, index_width, swa_lens, swa_lens,
                         query_start_loc, seq_lens, token_to_req_indices, is_valid_token, block_table,
                         block_table.stride(0), block_size, replay_start, token_offset, HAS_IMAGE=False,
                         TRITON_BLOCK_SIZE=1024)


def prefill_gather_lens(k, out, seq_lens, query_start_loc, replay_start, num_prefills, num_decodes,
                        window_size) -> None:
    """``ComputePrefillMetadataKernel.__call__``'s launch (grid (1,), BLOCK_SIZE = next pow2)."""
    block = 1 << max(num_prefills - 1, 0).bit_length()
    k.prefill[(1,)](out, seq_lens, query_start_loc, replay_start, num_prefills, num_decodes, window_size,
                    BLOCK_SIZE=block)


def gather_replay_batch(k, query_start_loc, dropped_before, seq_lens, replay_start, positions, slot_mappings, rows,
                        kept_query_start_loc, kept_positions, kept_slot_mappings_buf, kept_kv_start, window: int,
                        num_reqs: int, num_tokens: int, num_padded: int) -> torch.Tensor:
    """``DeepseekV41ModelState._kept_input_batch``'s PAD fill and launch (model_state.py
    L684-707); returns the kept slot mappings view it hands on."""
    kept = kept_slot_mappings_buf[:, :num_padded]
    kept[:, num_tokens:].fill_(PAD_SLOT_ID)
    k.gather[(num_reqs,)](query_start_loc, dropped_before, seq_lens, replay_start, positions, slot_mappings,
                          slot_mappings.stride(0), rows, kept_query_start_loc, kept_positions, kept,
                          kept.stride(0), kept_kv_start, window, NUM_GROUPS=slot_mappings.shape[0], BLOCK=1024)
    return kept
