"""ROCm backend: the ROCm platform (``PLATFORM``): devices, variants, dispatch priority and the
FP8 input checks.

ROCm is detected by ``torch.version.hip`` and the arch from ``gcnArchName``
(``gfx942:sramecc+:xnack-`` -> ``gfx942``; ``device.py``).

* gfx950: ``sparse_mla`` prefills of >= 1024 queries go to AITER's ``pa_sparse_prefill_opus``
  (``aiter_opus``, a per-call variant: smaller batches and other head dims fall through to
  Triton), fed CSR indices with every PAD removed;
* gfx942: no AITER sparse-MLA for this model; Triton for everything;
* both: the pack's portable Triton kernels ("triton", ``swa_backends.kernels``), then the
  torch reference. FP8 tensors must be of the arch's family (FNUZ on gfx942, OCP on gfx950),
  checked by its input checks (``INPUT_CHECKS``) with the op's own validation.
"""

from __future__ import annotations

import torch

from ...kernels import PORTABLE, VALUE_READER
from ...common.platforms import Platform
from ...common.registry import Variant
from . import device, probes  # noqa: F401  (probes registers the AITER probe; neither imports a vendor package)
from .fp8 import FP8  # noqa: F401  (re-exported: the per-arch FP8 table)

_PKG = "swa_backends.backends.rocm"

VENDOR: tuple[Variant, ...] = (
    Variant(
        op="sparse_mla", name="aiter_opus", impl=f"{_PKG}.aiter_opus:sparse_mla", platforms=("rocm",),
        archs=("gfx950",), dtypes=(torch.bfloat16, torch.float16), index_layout="csr", graph_safe=True,
        clamps_window=True, requires=("amd_aiter_opus",), input_check=f"{_PKG}.aiter_opus:input_check",
        description="AITER pa_sparse_prefill_opus (gfx950, D = 512, >= 1024 queries) on CSR indices with every PAD "
                    "dropped (indices_to_csr); LSE recomputed by the wrapper (the kernel returns none)",
    ),
)

PRIORITY = {
    "sparse_mla": ("aiter_opus", "triton", "reference"),
    "*": ("triton", "reference"),
}

# Platform input checks (run with the op's validation): FP8 data must be the arch's family.
INPUT_CHECKS = {
    "gather_rows": f"{_PKG}.fp8:check_gather_rows",
    "scatter_rows": f"{_PKG}.fp8:check_scatter_rows",
}

PLATFORM = Platform(
    name="rocm",
    archs=("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201", "gfx1250"),
    label="ROCm GPU",
    example_arch="gfx942",
    torch_types=("cuda",),  # torch names HIP devices cuda:N
    detect=device.detect,
    current_index=device.current_index,
    fake_arch=device.fake_arch,
    variants=(*PORTABLE, *VENDOR),
    priority=PRIORITY,
    input_checks=INPUT_CHECKS,
    value_reader=VALUE_READER,
    emulation="swa_backends.testing.emulation.rocm",
)
