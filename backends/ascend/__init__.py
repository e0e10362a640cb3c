"""Ascend backend: the Ascend platform (``PLATFORM``): devices, variants and dispatch priority.

The SoC comes from ``torch_npu.npu.get_soc_version()`` (``device.py``; 220-225 A2 910B, 250-255
A3 910_93, 200-205 310P, 260 A5 950), with ``torch_npu`` imported only there.

* ``sparse_mla`` -> ``npu_sparse_flash_mla``: vllm-ascend's op in its explicit-index SWA mode,
  fed the pack's clamped rows (the op's own band mask has no replay start); constraints as
  data in ``constraints.py`` (W = 128, head dim 512, power-of-two local heads <= 128, top-k
  512/1024 on the compressed path);
* gather/index ops -> ``triton_ascend``: Triton kernels written for triton-ascend (grid sized
  to the core count, flat grid-stride loops); on a CPU they run under Triton's interpreter
  when asked for by name (``select("cpu", prefer="triton_ascend")``);
* everything else -> the torch reference (it runs on the NPU through torch_npu).
"""

from __future__ import annotations

from ...common.platforms import Platform
from ...common.registry import Variant
from . import device, probes  # noqa: F401  (probes registers the Ascend probes; neither imports a vendor package)
from .constraints import CONSTRAINTS, SERVED  # noqa: F401  (the op's constraints, as data)

_PKG = "swa_backends.backends.ascend"


def _triton(op: str, impl: str) -> Variant:
    return Variant(
        op=op, name="triton_ascend", impl=f"{_PKG}.kernels.{impl}", platforms=("ascend",),
        archs=("910b", "910_93", "950"), graph_safe=True, requires=("triton_ascend",),
        emulated_on=("cpu",), emulated_requires=("triton_interpreter",),
        description="triton-ascend kernel: grid sized to the vector-core count, flat grid-stride loop")


VARIANTS: tuple[Variant, ...] = (
    Variant(
        op="sparse_mla", name="npu_sparse_flash_mla", impl=f"{_PKG}.npu_attention:sparse_mla", platforms=("ascend",),
        archs=("910b", "910_93", "950"), dtypes=SERVED.dtypes, index_layout="plain",
        # the op's task-split metadata is rebuilt per call; not shown to be capturable in an ACL graph
        graph_safe=False, clamps_window=True, requires=("vllm_ascend_sparse_flash_mla",),
        input_check=f"{_PKG}.npu_attention:input_check",
        description="vllm-ascend torch.ops._C_ascend.npu_sparse_flash_mla, explicit-index SWA mode "
                    "(ori_sparse_indices + ori_topk_length, ori_mask_mode=0) fed the pack's clamped rows",
    ),
    _triton("gather_rows", "rows:gather_rows"),
    _triton("scatter_rows", "rows:scatter_rows"),
    _triton("swa_indices_and_lens", "swa_indices:swa_indices_and_lens"),
    _triton("pad_replayed_slots", "pad_slots:pad_replayed_slots"),
)

PRIORITY = {
    "sparse_mla": ("npu_sparse_flash_mla", "reference"),
    "*": ("triton_ascend", "triton", "reference"),
}

PLATFORM = Platform(
    name="ascend",
    archs=("310p", "910b", "910_93", "950"),
    label="Ascend NPU",
    example_arch="910b",
    torch_types=("npu",),
    detect=device.detect,
    current_index=device.current_index,
    fake_arch=device.fake_arch,
    variants=VARIANTS,  # the portable Triton kernels are not its: triton-ascend kernels of its own instead
    priority=PRIORITY,
    emulation="swa_backends.testing.emulation.ascend",
)
