"""``gather_rows`` / ``scatter_rows`` (SPEC §3.3): hidden states in and out of the sub-batch."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..types import SLOT_DTYPE
from ..validation import INT32_MAX, check_int, check_out, check_range, check_tensor, fail
from ._checks import check_extents
from ._quick import apart, plain
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep

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


_SLOT = (SLOT_DTYPE,)
_COUNT = (torch.int32, torch.int64)


def _rows_and_out(data, rows, n_out: int, out) -> bool:
    """The quick checks shared by both ops: ``data`` any dense ``torch.Tensor`` of at least one dimension
    and at most ``INT32_MAX`` rows (the checked kernels take 32-bit bounds), ``rows`` plain int64 on its
    device, ``out`` None or a contiguous buffer ``[n_out, *data.shape[1:]]`` of its dtype and device
    without lazy bits or autograd, sharing no byte with either."""
    if (data.__class__ is not torch.Tensor or data.layout is not torch.strided or data.dim() < 1
            or data.shape[0] > INT32_MAX):
        return False
    dev = data.device
    if not plain(rows, _SLOT, 1, dev):
        return False
    if out is None:
        return True
    return (out.__class__ is torch.Tensor and out.dtype == data.dtype and out.device == dev and out.is_contiguous()
            and not out.is_conj() and not out.is_neg() and not out.requires_grad and out.shape[0] == n_out
            and out.shape[1:] == data.shape[1:] and apart(out, data, rows))


def quick_gather(x, rows, *, out=None) -> bool:
    """``validate_gather``'s host checks and ``check_writes`` (``OpSpec.quick_check``)."""
    return _rows_and_out(x, rows, rows.shape[0] if rows.__class__ is torch.Tensor else -1, out)


def quick_scatter(y, rows, num_rows, *, count=None, out=None) -> bool:
    """``validate_scatter``'s host checks and ``check_writes`` (``OpSpec.quick_check``); a
    ``count``'s value is the self-checked kernel's to test."""
    if num_rows.__class__ is not int or not 0 <= num_rows <= INT32_MAX:
        return False
    if not (_rows_and_out(y, rows, num_rows, out) and rows.shape[0] == y.shape[0]):
        return False
    return count is None or (plain(count, _COUNT, 1, y.device) and count.shape[0] == 1
                             and (out is None or apart(out, count)))


def gather_rows(x, rows, *, out=None) -> torch.Tensor:
    """``out[i] = x[rows[i]]`` for any trailing shape and dtype. Rows move as bytes, as
    ``scatter_rows``' do (torch's ``index_select`` has no CPU kernel for the wide unsigned types)."""
    n = rows.shape[0]
    if out is None:
        out = torch.empty((n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    src = as_row_bytes(x.resolve_conj().resolve_neg().contiguous(), x.shape[0])
    torch.index_select(src, 0, rows, out=as_row_bytes(out, n))
    return out


def validate_scatter(y, rows, num_rows, *, count=None, out=None) -> None:
    check_tensor(SCATTER, "y", y, min_ndim=1, lazy_bits=True)
    check_tensor(SCATTER, "rows", rows, dtypes=SLOT_DTYPE, ndim=1, device=y.device)
    check_extents(SCATTER, "rows", rows)
    if rows.shape[0] != y.shape[0]:
        fail(SCATTER, "rows", rows, f"{y.shape[0]} entries (one per row of y; slice off graph padding first)")
    check_int(SCATTER, "num_rows", num_rows, min_value=0)
    if count is not None:
        check_tensor(SCATTER, "count", count, dtypes=_COUNT, ndim=1, shape=(1,), device=y.device)
    if out is not None:
        check_out(SCATTER, "out", out, shape=(num_rows, *y.shape[1:]), dtype=y.dtype, device=y.device)
    check_range(SCATTER, "rows", rows, low=0, high=num_rows)
    if count is not None:
        check_range(SCATTER, "count", count, low=0, high=rows.shape[0] + 1)


def scatter_rows(y, rows, num_rows, *, count=None, out=None) -> torch.Tensor:
    """``out = zeros(num_rows, ...)``; ``out[rows[i]] = y[i]`` for ``i < count`` (``count``: a
    one-element device tensor, e.g. a sub-batch's device row count, ``query_start_loc[B:B+1]``;
    None: every row). The rows scattered must be unique (a repeated row keeps an unspecified one
    of its values): rows past ``count`` (a sub-batch's graph padding, row 0 repeated) are not
    written. Trimmed rows are zero (all bits clear). Rows move as bytes, so every dtype moves
    bit for bit (torch's ``index_copy_`` has no CPU kernel for FP8 or the wide unsigned types)."""
    if out is None:
        out = torch.empty((num_rows, *y.shape[1:]), dtype=y.dtype, device=y.device)
    n = y.shape[0] if count is None else min(max(int(count[0]), 0), y.shape[0])  # clamped as the kernels do
    dst = as_row_bytes(out, num_rows)
    dst.zero_()
    dst.index_copy_(0, rows[:n], as_row_bytes(y.resolve_conj().resolve_neg().contiguous(), y.shape[0])[:n])
    return out


#: dtypes Triton loads and stores as they are (a Triton kernel moves any other one as its bytes:
#: :func:`as_row_bytes`)
TRITON_DTYPES = frozenset({torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8,
                           torch.int16, torch.int32, torch.int64})


def as_row_bytes(t: torch.Tensor, n: int) -> torch.Tensor:
    """A contiguous ``[n, ...]`` tensor as ``[n, row bytes]`` uint8, the same memory. (By its
    strides, not ``view``: torch calls a tensor contiguous whatever the strides of its dimensions
    of size 1, and ``view`` can keep such a stride last, where a byte view needs 1.)"""
    row = math.prod(t.shape[1:])
    return t.as_strided((n, row), (row, 1)).view(torch.uint8)


GATHER_RESULTS = Results(("rows",), lambda a: {"rows": ((a["rows"].shape[0], *a["x"].shape[1:]), a["x"].dtype)}, out="tensor")
SCATTER_RESULTS = Results(("rows",), lambda a: {"rows": ((a["num_rows"], *a["y"].shape[1:]), a["y"].dtype)}, out="tensor")


def random_case(op: str, rng: np.random.Generator, dev, *, poison: bool = False) -> Call:
    """Rows of random values in one of five dtypes and trailing shapes, a sorted
    random subset of row ids; ``out=`` filled with 77 when ``poison``. A third of the scatters
    take a ``count`` (int32 or int64) with the rows past it a sub-batch's graph padding (row 0
    repeated: not written)."""
    N = int(rng.integers(1, 60))
    trailing = [(), (3,), (7,), (2, 5), (33,)][int(rng.integers(0, 5))]
    dtype = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8][int(rng.integers(0, 5))]
    n = int(rng.integers(0, N + 1))
    rows = torch.tensor(np.sort(rng.choice(N, size=n, replace=False)), dtype=SLOT_DTYPE, device=dev)
    g = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    if op == GATHER:
        x = (torch.randn(N, *trailing, generator=g) * 50).to(dtype).to(dev)
        kw = {"out": torch.full((n, *trailing), 77, dtype=dtype, device=dev)} if poison else {}
        return (x, rows), kw
    y = (torch.randn(n, *trailing, generator=g) * 50).to(dtype).to(dev)
    kw = {"out": torch.full((N, *trailing), 77, dtype=dtype, device=dev)} if poison else {}
    if rng.integers(0, 3) == 0:
        k = int(rng.integers(0, n + 1))
        rows[k:] = 0
        kw["count"] = torch.tensor([k], dtype=_COUNT[int(rng.integers(0, 2))], device=dev)
    return (y, rows, N), kw


def _rows(s: WarmupStep):
    """Every hidden size and dtype of the model; the step's trimmed rows."""
    for hidden in s.hidden_sizes:
        for dtype in s.hidden_dtypes:
            x = torch.ones(s.T, hidden, dtype=dtype, device=s.device)
            rows = torch.arange(s.T - s.plan.num_rows, s.T, dtype=SLOT_DTYPE, device=s.device)
            yield x, rows


def gather_case(d: CaseDraw) -> Call:
    return random_case(GATHER, d.rng, d.device, poison=d.poison)


def scatter_case(d: CaseDraw) -> Call:
    return random_case(SCATTER, d.rng, d.device, poison=d.poison)


def gather_warmup(s: WarmupStep):
    for x, rows in _rows(s):
        yield (x, rows), {}


def scatter_warmup(s: WarmupStep):
    for x, rows in _rows(s):
        y = x[: s.plan.num_rows].contiguous()
        yield (y, rows, s.T), {}
        # with the sub-batch's device row count (its own specialisation of the kernels)
        yield (y, rows, s.T), {"count": torch.tensor([rows.shape[0]], dtype=torch.int32, device=s.device)}


GATHER_OP = OpSpec(GATHER, gather_rows, validate_gather, GATHER_RESULTS, case=gather_case, warmup=gather_warmup,
                   quick_check=quick_gather)
SCATTER_OP = OpSpec(SCATTER, scatter_rows, validate_scatter, SCATTER_RESULTS, scalars={"num_rows": "int"},
                    case=scatter_case, warmup=scatter_warmup, quick_check=quick_scatter)
