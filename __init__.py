"""swa_backends: hardware-portable kernels for DeepSeek-V4.1 SWA bounded replay.

``select(device)`` returns a backend with every op of the pack (best variant per op for
that device) and ``.capabilities`` (encoder / decoder replay on or off, with reasons).
Importing this package imports torch, numpy and PyYAML only: no vendor package, no Triton,
no environment change, no subprocess, no device query (detection runs on first use).

Layers, bottom-up: ``common`` (the contract: types, validation, device model, variant
declarations, matrix loader, index layouts and the torch reference of every op) ->
``kernels`` (portable Triton kernels) -> ``backends`` (platform declarations and vendor
wrappers) -> ``dispatch`` -> ``pcp`` (the PCP composite, which takes a backend) ->
``torch_ops``, ``plugin``, ``cli`` (integration). ``testing`` holds the test tooling.
"""

from __future__ import annotations

from .common.config import ServingConfig
from .common.device import DeviceInfo, current_device, fake_device, parse_device
from .common.errors import KernelUnavailable, MatrixError, SelectionError
from .common.ops import (
    OPS,
    TRIM_THRESHOLD,
    PCPPartition,
    admit_prefix_hit,
    agree_across_dp,
    allocate_replay_batch_out,
    mark_prefix_replay,
    pcp_gather_columns,
    pcp_partition,
    pcp_restore_tokens,
    plan_replay_batch,
    replay_block_is_live,
    replay_layer_ids,
)
from .common.ops.layouts import combined_to_plain, combined_workspace_rows, compact_indices, csr_to_plain, mixed_to_plain
from .common.types import PAD, Admission, ReplayBatch, ReplayPlan
from .common.validation import set_validation, validation, validation_enabled
from .dispatch import Backend, Capabilities, Explanation, SideDecision, capabilities, explain, load_matrix, reference_backend, select
from .pcp import pcp_pad_own_block, pcp_pad_replayed_slots

__version__ = "0.1.0"

__all__ = [
    "PAD", "OPS", "TRIM_THRESHOLD", "Admission", "Backend", "Capabilities", "DeviceInfo", "Explanation", "KernelUnavailable",
    "MatrixError", "PCPPartition", "pcp_gather_columns", "pcp_pad_own_block", "pcp_pad_replayed_slots",
    "pcp_partition", "pcp_restore_tokens", "ReplayBatch", "ReplayPlan", "SelectionError", "ServingConfig",
    "SideDecision", "admit_prefix_hit", "agree_across_dp", "allocate_replay_batch_out", "capabilities",
    "current_device", "explain", "fake_device", "load_matrix", "mark_prefix_replay", "parse_device",
    "plan_replay_batch", "reference_backend", "replay_block_is_live", "replay_layer_ids", "select",
    "set_validation", "validation", "validation_enabled", "combined_to_plain", "combined_workspace_rows",
    "compact_indices", "csr_to_plain", "mixed_to_plain",
]
