"""The reference backend: the torch reference of every op, on any torch device.

It is the whole backend on CPU and the last entry of every other platform's priority list,
so an unknown device or a missing vendor package always has something correct to run.
"""

from __future__ import annotations

from ...common.ops import OPS
from ...common.registry import KV_FORMAT_OPS, Variant

_ALL = ("cpu", "cuda", "rocm", "ascend")

VARIANTS = tuple(
    Variant(
        op=name,
        name="reference",
        impl=f"{spec.reference.__module__}:{spec.reference.__name__}",
        platforms=_ALL,
        index_layout="plain" if name == "sparse_mla" else None,
        kv_formats="*" if name in KV_FORMAT_OPS else None,  # the reference is the whole contract
        description="torch reference (vectorised, fp32 softmax for attention)",
    )
    for name, spec in OPS.items()
)

# CPU: the reference. Triton kernels run here only under the interpreter, and only when
# asked for by name (select(prefer="triton")).
PRIORITY = {"*": ("reference", "triton")}
