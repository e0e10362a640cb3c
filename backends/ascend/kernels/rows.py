"""``gather_rows`` / ``scatter_rows`` for triton-ascend: flat grid-stride copies.

Each program walks ``BLOCK``-element chunks of the flattened ``[n, C]`` output (gather) or
input (scatter) with a stride of ``programs * BLOCK``; the row of an element is
``e // C``. Any dtype: a type without a Triton pointer type (bool, FP8 and FP4, complex, ...) moves as
its bytes, and a lazy conjugate or negative bit is applied first (the ops move values bit for bit).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ....common.ops.rows import TRITON_DTYPES, as_row_bytes
from ._launch import grid

BLOCK = 1024


@triton.jit
def _move_kernel(src_ptr, rows_ptr, out_ptr, count_ptr, total, C, SCATTER: tl.constexpr, BLOCK: tl.constexpr,
                 HAS_COUNT: tl.constexpr):
    """Element ``e`` of the row-major ``[len(rows), C]`` side: gather ``out[e] =
    src[rows[r], c]`` or scatter ``out[rows[r], c] = src[e]`` (``r, c = divmod(e, C)``);
    a grid-stride loop over int64 element offsets. ``HAS_COUNT``: only the first ``count``
    rows (clamped to ``[0, len(rows)]``: any value stays inside the tensors)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    base = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64 element offsets
    limit = total
    if HAS_COUNT:
        limit = tl.minimum(tl.maximum(tl.load(count_ptr).to(tl.int64), 0) * C, total)
    for start in range(0, total, step):
        e = base + start
        m = e < limit
        r = e // C
        row = tl.load(rows_ptr + r, mask=m, other=0).to(tl.int64)  # int64: row * C can pass 2**31
        if SCATTER:
            tl.store(out_ptr + row * C + (e - r * C), tl.load(src_ptr + e, mask=m), mask=m)
        else:
            tl.store(out_ptr + e, tl.load(src_ptr + row * C + (e - r * C), mask=m), mask=m)


@triton.jit
def _zero_kernel(out_ptr, total, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    base = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64 element offsets
    for start in range(0, total, step):
        e = base + start
        tl.store(out_ptr + e, 0, mask=e < total)  # the scalar is cast to the element type


def _flat(t: torch.Tensor, source: bool = True) -> tuple[torch.Tensor, int]:
    """``t`` contiguous (a source with its lazy bits applied; a destination is written as it is) as
    a type Triton moves, and the elements of that type one element of ``t`` is (its bytes where
    ``t``'s type is not one Triton moves)."""
    t = t.resolve_conj().resolve_neg().contiguous() if source else t
    if t.dtype in TRITON_DTYPES:
        return t, 1
    return as_row_bytes(t, t.shape[0]), t.element_size()


def gather_rows(x, rows, *, out=None):
    """``out[i] = x[rows[i]]`` (the reference's semantics)."""
    n = rows.shape[0]
    C = math.prod(x.shape[1:])
    if out is None:
        out = torch.empty((n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    total = n * C
    if total == 0:
        return out
    dst = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
    idx = rows.contiguous()
    (src, k), (flat, _) = _flat(x), _flat(dst, source=False)
    _move_kernel[grid(total * k, BLOCK, x.device)](src, idx, flat, idx, total * k, C * k, SCATTER=False, BLOCK=BLOCK,
                                                   HAS_COUNT=False)
    if dst is not out:
        out.copy_(dst)
    return out


def scatter_rows(y, rows, num_rows, *, count=None, out=None):
    """``out = zeros(num_rows, ...)``; ``out[rows[i]] = y[i]`` for ``i < count`` (the
    reference's semantics)."""
    if out is None:
        out = torch.empty((num_rows, *y.shape[1:]), dtype=y.dtype, device=y.device)
    C = math.prod(y.shape[1:])
    dst = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
    flat, k = _flat(dst, source=False)
    if num_rows * C:
        _zero_kernel[grid(num_rows * C * k, BLOCK, y.device)](flat, num_rows * C * k, BLOCK=BLOCK)
    total = rows.shape[0] * C * k
    if total:
        idx = rows.contiguous()
        _move_kernel[grid(total, BLOCK, y.device)](_flat(y)[0], idx, flat, idx if count is None else count, total,
                                                   C * k, SCATTER=True, BLOCK=BLOCK, HAS_COUNT=count is not None)
    if dst is not out:
        out.copy_(dst)
    return out
