"""Portable Triton kernels, one op per module, registered by every platform that can run
them. This package's ``__init__`` only declares variants: kernel modules are imported when
chosen (so ``TRITON_INTERPRET`` can be set first on a CPU)."""

from __future__ import annotations

import torch

from ..common.registry import Variant

# sparse_mla (issue 4): heads as the MMA M dimension, one gather per KV tile, split-K decode.
SPARSE_MLA = Variant(
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
    description="portable Triton sparse-MLA forward (plain layout, PAD inside the length skipped, fp32 softmax)",
)

VARIANTS: tuple = (SPARSE_MLA,)
