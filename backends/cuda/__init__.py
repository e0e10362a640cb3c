"""CUDA backend: the CUDA platform (``PLATFORM``): devices, variants, dispatch priority.

``sparse_mla`` vendor variants (imported only when chosen and first called):

* ``flashmla`` -- vLLM's bundled FlashMLA sparse prefill (SM90 and the SM100 family, bf16,
  D_qk 512/576, d_v 512, <= 128 heads), fed the combined-compatible plain layout (width a
  multiple of 128) with ``lens`` as ``topk_length``;
* ``flashinfer`` -- FlashInfer's DSv4 sparse-MLA decode on SM100/SM103 and
  ``flashinfer_sm12x`` on SM120/SM121, fed the mixed layout (128 window columns + top-k).

On SM90 the pack's own Gluon kernels come next (``gluon_ws``, then ``gluon``: prefill-sized
calls of D 512, H >= 64), then the portable ``triton`` kernel. Everything else -- and
``sparse_mla`` on SM80/SM89 -- runs the pack's portable Triton kernels ("triton"), then the
torch reference. All of these are declared in ``swa_backends.kernels``. Arch gating is data:
``archs`` and the capability range.
"""

from __future__ import annotations

import torch

from ...kernels import VALUE_READER
from ...kernels import VARIANTS as KERNELS
from ...common.platforms import Ahead, Platform
from ...common.registry import Variant
from . import device, probes  # noqa: F401  (probes registers the probes; neither imports a vendor package)

_PKG = "swa_backends.backends.cuda"

VENDOR: tuple[Variant, ...] = (
    Variant(
        op="sparse_mla", name="flashmla", impl=f"{_PKG}.flashmla:sparse_mla", platforms=("cuda",),
        archs=("sm90", "sm100", "sm103"), min_capability=(9, 0), max_capability=(10, 3),
        dtypes=(torch.bfloat16,), index_layout="combined", graph_safe=True, clamps_window=True,
        requires=("vllm_flashmla",), input_check=f"{_PKG}.flashmla:input_check",
        description="vLLM's bundled FlashMLA sparse prefill (flash_mla_sparse_fwd): SM90a / SM100f, bf16, "
                    "h_q padded to 64/128, index width rounded up to 128 with PAD, lens as topk_length",
    ),
    Variant(
        op="sparse_mla", name="flashinfer", impl=f"{_PKG}.flashinfer:sparse_mla_sm10x", platforms=("cuda",),
        archs=("sm100", "sm103"), min_capability=(10, 0), max_capability=(10, 3),
        dtypes=(torch.bfloat16,), index_layout="mixed", graph_safe=True, clamps_window=True,
        requires=("flashinfer_dsv4",), input_check=f"{_PKG}.flashinfer:input_check",
        description="FlashInfer trtllm_batch_decode_sparse_mla_dsv4 (TRTLLM-GEN, SM100/SM103) on the mixed layout; "
                    "LSE recomputed by the wrapper (the kernel returns none)",
    ),
    Variant(
        op="sparse_mla", name="flashinfer_sm12x", impl=f"{_PKG}.flashinfer:sparse_mla_sm12x", platforms=("cuda",),
        archs=("sm120", "sm121"), min_capability=(12, 0), max_capability=(12, 1),
        dtypes=(torch.bfloat16,), index_layout="mixed", graph_safe=True, clamps_window=True,
        requires=("flashinfer_dsv4_sm12x",), input_check=f"{_PKG}.flashinfer:input_check",
        description="FlashInfer trtllm_batch_decode_sparse_mla_dsv4 (sparse backend, SM120/SM121): window and "
                    "top-k segments of the mixed layout; LSE recomputed by the wrapper",
    ),
)

# First variant with no reasons wins; names not declared for an op are skipped. On sm90 the pack's
# gluon_ws leads FlashMLA: measured faster (bench/README.md, "FlashMLA three ways";
# bench/results/h200/bench_flashmla.json); FlashMLA serves the calls gluon_ws does not take
# (decode-sized, H < 64, D_qk 576) and, per call, the class where it measured faster (AHEAD below); of
# the decode-sized calls the tl kernel takes the smallest (AHEAD), where its split-K measured faster.
PRIORITY = {
    "sparse_mla": ("gluon_ws", "flashmla", "gluon", "flashinfer", "flashinfer_sm12x", "triton", "reference"),
    "*": ("triton", "reference"),
}

# Per-call exceptions to PRIORITY: the predicate takes the op's arguments and returns why the variant
# runs first for this call, or None. Both where the earlier variant measured faster on the H200:
# FlashMLA before gluon_ws (large K at 128 heads over a cache larger than L2; flashmla.ahead_of_gluon_ws),
# the tl kernel before FlashMLA (calls of at most 12 token x 64-head items; flashmla.triton_ahead_of_flashmla).
# Both on sm90 only, the arch they were measured on: on sm100 FlashMLA's SM100 kernel and FlashInfer's
# decode were never timed against the tl kernel, so there the priority stands.
AHEAD = {
    "sparse_mla": (Ahead("flashmla", "gluon_ws", f"{_PKG}.flashmla:ahead_of_gluon_ws", archs=("sm90",)),
                   Ahead("triton", "flashmla", f"{_PKG}.flashmla:triton_ahead_of_flashmla", archs=("sm90",))),
}

PLATFORM = Platform(
    name="cuda",
    archs=("sm70", "sm75", "sm80", "sm86", "sm87", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121"),
    label="CUDA GPU",
    example_arch="sm90",
    torch_types=("cuda",),
    detect=device.detect,
    current_index=device.current_index,
    fake_arch=device.fake_arch,
    # the portable kernels first: the order variants are listed in where a table shows them all
    variants=(*KERNELS, *VENDOR),
    priority=PRIORITY,
    ahead=AHEAD,
    value_reader=VALUE_READER,
    emulation="swa_backends.testing.emulation.cuda",
)
