"""``gather_rows`` / ``scatter_rows`` (SPEC §3.3): hidden states in and out of the sub-batch."""

from __future__ import annotations

import math

import torch

from ..types import SLOT_DTYPE
from ..validation import check_int, check_out, check_range, check_tensor, fail
from ._checks import check_extents
from ._results import Results

GATHER = "gather_rows"
SCATTER = "scatter_rows"


def validate_gather(x, rows, *, out=None) -> None:
    # rows of any dtype and layout (a conjugate or negative view included) are read; the
    # buffer written must be plain
    check_tensor(GATHER, "x", x, min_ndim=1, lazy_bits=True)
    check_tensor(GATHER, "rows", rows, dtypes=SLOT_DTYPE, ndim=1, device=x.device)
    check_extents(GATHER, "rows", rows)
    if out is not None:
        check_out(GATHER, "out", out, shape=(rows.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    check_range(GATHER, "rows", rows, low=0, high=x.shape[0])


def gather_rows(x, rows, *, out=None) -> torch.Tensor:
    """``out[i] = x[rows[i]]`` for any trailing shape and dtype."""
    if out is None:
        return x.index_select(0, rows)
    return torch.index_select(x, 0, rows, out=out)


def validate_scatter(y, rows, num_rows, *, out=None) -> None:
    check_tensor(SCATTER, "y", y, min_ndim=1, lazy_bits=True)
    check_tensor(SCATTER, "rows", rows, dtypes=SLOT_DTYPE, ndim=1, device=y.device)
    check_extents(SCATTER, "rows", rows)
    if rows.shape[0] != y.shape[0]:
        fail(SCATTER, "rows", rows, f"{y.shape[0]} entries (one per row of y; slice off graph padding first)")
    check_int(SCATTER, "num_rows", num_rows, min_value=0)
    if out is not None:
        check_out(SCATTER, "out", out, shape=(num_rows, *y.shape[1:]), dtype=y.dtype, device=y.device)
    check_range(SCATTER, "rows", rows, low=0, high=num_rows)


def scatter_rows(y, rows, num_rows, *, out=None) -> torch.Tensor:
    """``out = zeros(num_rows, ...)``; ``out[rows[i]] = y[i]``. ``rows`` must be unique
    (a repeated row keeps an unspecified one of its values); trimmed rows are zero (all bits
    clear). Rows move as bytes, so every dtype moves bit for bit (torch's ``index_copy_``
    has no CPU kernel for FP8 or the wide unsigned types)."""
    if out is None:
        out = torch.empty((num_rows, *y.shape[1:]), dtype=y.dtype, device=y.device)
    dst = _bytes(out, num_rows)
    dst.zero_()
    dst.index_copy_(0, rows, _bytes(y.resolve_conj().resolve_neg().contiguous(), y.shape[0]))
    return out


def _bytes(t: torch.Tensor, n: int) -> torch.Tensor:
    """A contiguous ``[n, ...]`` tensor as ``[n, row bytes]`` uint8, the same memory."""
    return t.view(n, math.prod(t.shape[1:])).view(torch.uint8)


GATHER_RESULTS = Results(("rows",), lambda a: {"rows": ((a["rows"].shape[0], *a["x"].shape[1:]), a["x"].dtype)}, out="tensor")
SCATTER_RESULTS = Results(("rows",), lambda a: {"rows": ((a["num_rows"], *a["y"].shape[1:]), a["y"].dtype)}, out="tensor")
