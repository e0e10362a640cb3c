"""FP8 formats per ROCm arch, as data, and the check every ROCm op that can carry FP8 data runs.

gfx942 (MI300 series) computes FP8 in the FNUZ formats (``float8_e4m3fnuz``, finite max 240;
vLLM scales to 224 there), gfx950 (MI350 series) in the OCP formats (``float8_e4m3fn``, max
448). A cache written in one format and read as the other is silently wrong by a factor of
two in every value, so an FP8 tensor of the other family is a ``ValueError`` on ROCm.

Which ops can carry FP8 data: ``gather_rows`` / ``scatter_rows`` (any dtype). ``sparse_mla``
takes q and KV rows in bf16/fp16/fp32 (its validator rejects FP8 rows before this check) and
paged FP8 records as uint8 with the flavour named per call (``fp8=``: the flavour belongs to
the cache, not the arch: on gfx942 vLLM writes its SWA cache FNUZ and its compressed cache
OCP); the metadata ops carry integers.
"""

from __future__ import annotations

import torch

from ...common.ops._records import FP8_FLAVOURS
from ...common.validation import fail

FNUZ = (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
OCP = (torch.float8_e4m3fn, torch.float8_e5m2)

# arch -> (family name, accepted FP8 dtypes, the e4m3 dtype caches use, scale max used by vLLM)
FP8 = {
    "gfx942": ("FNUZ", FNUZ, *FP8_FLAVOURS["e4m3fnuz"]),
    "gfx950": ("OCP", OCP, *FP8_FLAVOURS["e4m3fn"]),
}


def fp8_cache_dtype(arch: str) -> torch.dtype:
    """The e4m3 dtype an FP8 KV cache must use on ``arch``."""
    if arch not in FP8:
        fail("fp8_cache_dtype", "arch", arch, f"one of {sorted(FP8)} (ROCm archs with a known FP8 format)")
    return FP8[arch][2]


def check_fp8(op: str, name: str, tensor, arch: str) -> None:
    """``ValueError`` when ``tensor`` is FP8 but not of ``arch``'s family (no-op otherwise)."""
    if not isinstance(tensor, torch.Tensor) or arch not in FP8:
        return
    family, accepted, cache_dtype, _ = FP8[arch]
    if tensor.dtype in FNUZ + OCP and tensor.dtype not in accepted:
        fail(op, name, f"{tensor.dtype} tensor",
             f"an FP8 dtype of the {family} family on {arch} ({', '.join(str(d) for d in accepted)}; "
             f"caches use {cache_dtype})")


def check_gather_rows(device, x, rows, *, out=None) -> None:
    check_fp8("gather_rows", "x", x, device.arch)
    check_fp8("gather_rows", "out", out, device.arch)


def check_scatter_rows(device, y, rows, num_rows, *, count=None, out=None) -> None:
    check_fp8("scatter_rows", "y", y, device.arch)
    check_fp8("scatter_rows", "out", out, device.arch)

