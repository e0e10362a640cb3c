"""Portable Triton kernels, one op per module, registered by every platform that can run
them. This package's ``__init__`` only declares variants: kernel modules are imported when
chosen (so ``TRITON_INTERPRET`` can be set first on a CPU)."""

from __future__ import annotations

VARIANTS: tuple = ()

# --- metadata and data-movement kernels (one module per op; issue 3) -------------------
from ..common.registry import Variant  # noqa: E402  (declarations only: no Triton import)

_TRITON_COMMON = dict(
    platforms=("cuda", "rocm"),
    emulated_on=("cpu",),
    requires=("triton",),
    setup="swa_backends.kernels.interpreter:setup",
    warmup="swa_backends.kernels.warmup:warmup",
)

# op -> (module:function, graph_safe, what to know)
_METADATA_KERNELS = {
    "batch_replay_start": ("batch_replay_start:batch_replay_start", True, "one lane per batch row"),
    "pad_replayed_slots": ("pad_replayed_slots:pad_replayed_slots", True,
                           "in place, one lane per token; stores only PAD into replayed cacheable slots"),
    "compressed_slot_mapping": ("compressed_slot_mapping:compressed_slot_mapping", True,
                                "one lane per token (ratio 1: a copy)"),
    "swa_indices_and_lens": ("swa_indices_and_lens:swa_indices_and_lens", True,
                             "tokens x columns tiles; graph-safe when num_tokens (or valid) is given"),
    "prefill_gather_lens": ("prefill_gather_lens:prefill_gather_lens", True, "one lane per request"),
    "combined_indices": ("combined_indices:combined_indices", True, "tokens x columns tiles"),
    "mixed_indices": ("mixed_indices:mixed_indices", True, "tokens x columns tiles"),
    "plain_indices": ("plain_indices:plain_indices", True, "tokens x columns tiles"),
    "indices_to_csr": ("indices_to_csr:indices_to_csr", True, "three launches: counts, scan, compaction"),
    "gather_replay_batch": ("gather_replay_batch:gather_replay_batch", True,
                            "one launch; graph-safe once the plan's device copy exists (plan.device_tensors)"),
    "gather_rows": ("rows:gather_rows", True, "wide word copies, int64 offsets"),
    "scatter_rows": ("rows:scatter_rows", True, "memset + wide word copies, int64 offsets"),
    "prepare_replay_step": ("prepare_replay_step:prepare_replay_step", True,
                            "ONE launch: replay start, padding, window indices and the sub-batch"),
}

VARIANTS += tuple(
    Variant(op=op, name="triton", impl=f"swa_backends.kernels.{impl}", graph_safe=safe,
            description=f"portable Triton kernel ({what})", **_TRITON_COMMON)
    for op, (impl, safe, what) in _METADATA_KERNELS.items()
)

# --- sparse_mla (issue 4): heads as the MMA M dimension, one gather per KV tile ---------
import torch  # noqa: E402

VARIANTS += (
    Variant(
        op="sparse_mla",
        name="triton",
        impl="swa_backends.kernels.sparse_mla:sparse_mla",
        platforms=("cuda", "rocm"),
        emulated_on=("cpu",),
        dtypes=(torch.bfloat16, torch.float16),
        index_layout="plain",
        clamps_window=True,
        requires=("triton",),
        setup="swa_backends.kernels.interpreter:setup",
        warmup="swa_backends.kernels.sparse_mla:warmup",
        description="portable Triton sparse-MLA forward (plain layout: PAD anywhere skipped; fp32 softmax; "
                    "split-K decode)",
    ),
)
