"""Pieces of the ops' quick host checks (``OpSpec.quick_check``).

A quick check answers, in a few host µs, whether a call of plain tensors passes every host check
of its op's validator and of ``check_writes``; anything it is unsure of (a strided view, a tensor
subclass, a lazy bit, an odd layout) answers False and the validator runs as ever. So each piece
is at least as strict as the check it stands for, never looser: the tests compare them with the
validator on random calls, bad ones included.

The quick checks of the ops a serving step calls most (their self-checked forms run them first,
``Variant.self_checked``) are written out in the op's module instead of calling these pieces: every
fact of every tensor read once, in one function call per op, answered with what the form's launch
needs (sizes, strides, the device). Every torch attribute read and every Python call is host time a
validated call pays over the unvalidated one, and issue 38 bounds that ratio (bench/README.md, the
summary of 2026-12-06, 10:35-11:20Z, has the measurements); so those checks repeat one another's shape
on purpose.
"""

from __future__ import annotations

import torch

from ..types import MAX_POSITION
from ..validation import INT32_MAX

_TENSOR = torch.Tensor
_STRIDED = torch.strided  # (a sparse COO tensor has strides, all 0: a layout of one row or column passes them)
_INT32 = (torch.int32,)


def plain(t, dtypes: tuple[torch.dtype, ...], ndim: int, device: torch.device | None = None) -> bool:
    """A contiguous ``torch.Tensor`` itself (no subclass, no negative bit) of one of ``dtypes``
    (integer or bool: no conjugate bit exists for them), ``ndim`` dimensions, on ``device`` when
    given, its sizes and strides within the kernels' 32-bit arguments (``_checks.check_extents``;
    a dimension of one element may carry any stride)."""
    if (t.__class__ is not _TENSOR or t.dtype not in dtypes or t.ndim != ndim or not t.is_contiguous()
            or t.is_neg() or (device is not None and t.device != device)):
        return False
    if ndim == 1:
        n = t.numel()
        return n <= MAX_POSITION and (n > 1 or t.stride(0) <= INT32_MAX)
    return max(t.shape) <= MAX_POSITION and max(t.stride()) <= INT32_MAX


def length(t, dtype: torch.dtype, device: torch.device) -> int:
    """:func:`plain` of a 1-D tensor of ``dtype`` on ``device``, answered as its length (-1: not
    plain), for a quick check that compares lengths next: one call and one size read a tensor."""
    if (t.__class__ is not _TENSOR or t.dtype is not dtype or t.ndim != 1 or not t.is_contiguous() or t.is_neg()
            or t.device != device):
        return -1
    n = t.numel()
    return n if n <= MAX_POSITION and (n > 1 or t.stride(0) <= INT32_MAX) else -1


def rows(t, dtypes: tuple[torch.dtype, ...], device: torch.device | None = None) -> bool:
    """A 2-D ``torch.Tensor`` itself whose rows are contiguous and apart (``stride(1) == 1``,
    ``stride(0) >= shape[1]``: a slice of a wider buffer), otherwise as :func:`plain`."""
    return shape2(t, dtypes, device) is not None


def shape2(t, dtypes: tuple[torch.dtype, ...], device: torch.device | None = None) -> tuple[int, int] | None:
    """:func:`rows`, answered as the tensor's ``(rows, columns)`` (None: not such rows), for a quick
    check that compares sizes next."""
    if (t.__class__ is not _TENSOR or t.dtype not in dtypes or t.ndim != 2 or t.is_neg() or t.layout is not _STRIDED
            or (device is not None and t.device != device)):
        return None
    (n, m), (s0, s1) = t.shape, t.stride()
    if (n <= MAX_POSITION and m <= MAX_POSITION and s0 <= INT32_MAX and s1 <= INT32_MAX
            and (n == 0 or m == 0 or ((s1 == 1 or m == 1) and (s0 >= m or n == 1)))):
        return n, m
    return None


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    """The bytes from a tensor's first element to past its last (strides are never negative)."""
    if t.is_contiguous():
        lo = t.data_ptr()
        return (lo, lo + t.nbytes) if t.nbytes else None
    if t.numel() == 0:
        return None
    lo = t.data_ptr()
    last = 0
    for n, s in zip(t.shape, t.stride()):
        last += (n - 1) * s
    return lo, lo + (last + 1) * t.element_size()


def apart(out: torch.Tensor, *others: torch.Tensor) -> bool:
    """``out`` shares no byte with any of ``others``: their spans, first to last byte, are disjoint
    (a layout that interleaves two spans answers False)."""
    mine = _span(out)
    if mine is None:
        return True
    lo, hi = mine
    for t in others:
        if t.is_contiguous():  # (the common case, without _span's call)
            a = t.data_ptr()
            if a < hi and lo < a + t.nbytes:
                return False
        else:
            theirs = _span(t)
            if theirs is not None and theirs[0] < hi and lo < theirs[1]:
                return False
    return True


def pair_out(out, dev: torch.device, shape0: tuple[int, int], n: int, *inputs: torch.Tensor) -> bool:
    """``out`` a tuple of two contiguous int32 buffers ``[shape0]`` and ``[n]`` on ``dev``, apart
    from each other and from ``inputs`` (``check_out`` of both and ``check_writes``)."""
    if out.__class__ is not tuple or len(out) != 2:
        return False
    a, b = out
    return (plain(a, _INT32, 2, dev) and a.shape == shape0 and plain(b, _INT32, 1, dev) and b.shape[0] == n
            and apart(a, b, *inputs) and apart(b, *inputs))


def disjoint(written, inputs) -> bool:
    """No buffer of ``written`` shares a byte with another of them or with one of ``inputs`` (inputs
    may share with each other: they are only read): every tensor's span, first to last byte, sorted
    and swept once (a layout that interleaves two spans answers False)."""
    spans = []
    for flag, tensors in ((True, written), (False, inputs)):
        for t in tensors:
            span = _span(t)
            if span is not None:
                spans.append((span[0], span[1], flag))
    spans.sort()
    reach = reach_written = 0  # the furthest end of the spans before, and of the written ones
    for lo, hi, is_written in spans:
        if lo < (reach if is_written else reach_written):
            return False
        reach = max(reach, hi)
        if is_written:
            reach_written = max(reach_written, hi)
    return True
