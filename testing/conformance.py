"""Random valid inputs for every op, and the comparison with the reference.

Used by ``swa-backends check``, the matrix runner and the test-suite. The inputs are each op's
own (``OpSpec.case``, drawn from serving-like batches: decodes, cold prefills, chunked
prefills, replaying prefills whose replay start is or is not block-aligned), so every variant
is compared with the reference on the same kind of data; :func:`case_for` is the one entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from ..common.ops import OPS
from ..common.ops._steps import POISON_INT, Batch, CaseDraw, host_plan, poisoned, random_batch  # noqa: F401
from ..common.ops.prepare_replay_step import random_case as prepare_case  # noqa: F401
from ..common.ops.rows import random_case as rows_case  # noqa: F401
from ..common.ops.sparse_mla import records_case as sparse_mla_record_case  # noqa: F401
from ..common.ops.sparse_mla import MOVING_MAX_PATTERNS  # noqa: F401
from ..common.ops.sparse_mla import moving_max_case as sparse_mla_moving_max_case  # noqa: F401
from ..common.ops.sparse_mla import rows_case as sparse_mla_case  # noqa: F401
from ..common.types import ReplayBatch

Case = tuple[tuple, dict]


def case_for(op: str, rng: np.random.Generator, device, *, batch: Batch | None = None, poison: bool | None = None,
             exact_out: bool = False) -> Case:
    """Random valid arguments for ``op`` on ``device`` (its ``OpSpec.case``; ``poison``: pass
    out= buffers filled with a value no output may keep; default: half the time;
    ``exact_out``: never longer than the op writes, where an op allows longer ones)."""
    spec = OPS.get(op)
    if spec is None or spec.case is None:
        raise KeyError(op)
    b = batch if batch is not None else random_batch(rng)
    poison = bool(rng.random() < 0.5) if poison is None else poison
    return spec.case(CaseDraw(rng, torch.device(device), b, batch, poison, exact_out))


def poisoning_empty(real=torch.empty, *, ints: bool = True):
    """A stand-in for ``torch.empty`` (``real``) that fills what it allocates with a value no
    output may keep -- NaN, and ``POISON_INT`` for integer dtypes where ``ints`` -- so that an
    output a kernel leaves unwritten shows instead of passing with a previous call's bytes (the
    caching allocator hands the same block back)."""

    def empty(*shape, **kw):
        t = real(*shape, **kw)
        if t.is_floating_point():
            return t.fill_(float("nan"))
        return t.fill_(POISON_INT) if ints else t

    return empty


@contextmanager
def poisoned_allocations(*, ints: bool = True):
    """Inside it, ``torch.empty`` is :func:`poisoning_empty` (``ints``: integer buffers too;
    leave them alone where a call reads a flag it allocated, e.g. a validated call's gate)."""
    real = torch.empty
    torch.empty = poisoning_empty(real, ints=ints)
    try:
        yield
    finally:
        torch.empty = real


# ---------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------


#: the corner steps every kernel's tests meet beside the random ones (``random_batch`` knobs by name):
#: no request (T = 0), one decode, window and block 1, many one-block requests, a window wider than a
#: tile, and a step with no padded slot-mapping columns
ODD_BATCHES = {
    "no request": dict(max_reqs=0),
    "one decode": dict(max_reqs=1, max_q=1),
    "window and block 1": dict(W=1, block_size=1),
    "block 1, many requests": dict(max_reqs=40, max_q=5, block_size=1, W=3),
    "wide window, one group": dict(W=200, num_groups=1, max_q=300, max_reqs=2),
    "no padded columns": dict(max_padded=0),
}


def to_device(obj, device, _storages: dict | None = None):
    """Deep copy of a case's arguments onto ``device``: each tensor's storage copied once, and every
    tensor rebuilt on the copy with its own size, strides and storage offset, so a slice of a wider
    buffer stays one (the op meets the layout the case made) and arguments that share memory still
    share it. A tensor with a lazy bit (negative, conjugate), a non-strided layout or no data
    (``meta``) is copied as ``Tensor.to`` copies it."""
    storages = {} if _storages is None else _storages
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if (t.layout is not torch.strided or t.is_nested or t.is_neg() or t.is_conj() or t.device.type == "meta"
                or t.__class__ is not torch.Tensor):
            return t.to(device, copy=True)
        old = t.untyped_storage()
        key = (old.device, old.data_ptr(), old.nbytes())
        new = storages.get(key)
        if new is None:
            new = storages[key] = torch.UntypedStorage(old.nbytes(), device=device)
            new.copy_(old)
        return torch.empty(0, dtype=t.dtype, device=device).set_(new, t.storage_offset(), t.shape, t.stride())
    if isinstance(obj, tuple):
        return tuple(to_device(o, device, storages) for o in obj)
    if isinstance(obj, list):
        return [to_device(o, device, storages) for o in obj]
    if isinstance(obj, dict):
        return {k: to_device(v, device, storages) for k, v in obj.items()}
    return obj


def mismatch(op: str, got, want, *, rtol: float = 1e-2) -> str | None:
    """None when ``got`` (any device) equals the reference result ``want``: the op's own
    comparison where it declares one (``OpSpec.compare``: ``sparse_mla``'s relative error
    within ``rtol``, identical -inf lse, no NaN), else exact."""
    spec = OPS.get(op)
    if spec is not None and spec.compare is not None:
        return spec.compare(got, want, rtol)
    if isinstance(want, ReplayBatch):
        for f in ("num_rows", "num_rows_padded"):
            if getattr(got, f) != getattr(want, f):
                return f"{f}: {getattr(got, f)} != {getattr(want, f)}"
        for f in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start"):
            why = mismatch(op, getattr(got, f), getattr(want, f))
            if why:
                return f"{f}: {why}"
        return None
    if isinstance(want, tuple):
        if not isinstance(got, tuple) or len(got) != len(want):
            return f"expected a tuple of {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            why = mismatch(op, g, w)
            if why:
                return f"[{i}]: {why}"
        return None
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"expected a tensor, got {type(got).__name__}"
        g, w = got.detach().cpu(), want.detach().cpu()
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"{g.dtype}{tuple(g.shape)} != {w.dtype}{tuple(w.shape)}"
        if not torch.equal(g, w):
            diff = (g != w) if g.dtype != torch.bool else g ^ w
            where = torch.nonzero(diff)[0].tolist()
            return f"differs at {where}: {g[tuple(where)].item()} != {w[tuple(where)].item()}"
        return None
    return None if got == want else f"{got!r} != {want!r}"


def scatter_repeats(args: tuple, kwargs: dict) -> bool:
    """Whether a ``scatter_rows`` call writes some row twice: a repeated row among the rows it
    writes (those before ``count``; a sub-batch's padding past it repeats row 0 unwritten)."""
    rows = args[1].detach().cpu()
    n = _scatter_count(rows, kwargs)
    return rows[:n].unique().numel() < n


def repeated_scatter_mismatch(got, args: tuple, kwargs: dict) -> str | None:
    """``scatter_rows``' result where a row is written twice (the op keeps an unspecified one of
    its values: the reference's is one right answer of several). None when every row written
    holds, bit for bit, the value of one of the rows of ``y`` scattered to it and every other
    row is zero."""
    y, rows, num_rows = args[0].detach().cpu(), args[1].detach().cpu(), int(args[2])
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor, got {type(got).__name__}"
    g = got.detach().cpu()
    if g.dtype != y.dtype or g.shape != (num_rows, *y.shape[1:]):
        return f"{g.dtype}{tuple(g.shape)} != {y.dtype}{(num_rows, *y.shape[1:])}"
    width = math.prod(y.shape[1:])
    gb = g.contiguous().reshape(num_rows, width).view(torch.uint8)
    yb = y.contiguous().reshape(y.shape[0], width).view(torch.uint8)
    writers: dict[int, list[int]] = {}
    for j in range(_scatter_count(rows, kwargs)):
        writers.setdefault(int(rows[j]), []).append(j)
    for r in range(num_rows):
        js = writers.get(r)
        if js is None and bool(gb[r].any()):
            return f"row {r}: no row of y is scattered to it, and it is not zero"
        if js is not None and not any(torch.equal(gb[r], yb[j]) for j in js):
            return f"row {r}: holds the value of none of the rows of y scattered to it ({js[:8]})"
    return None


def _scatter_count(rows: torch.Tensor, kwargs: dict) -> int:
    count = kwargs.get("count")
    return rows.shape[0] if count is None else min(max(int(count.reshape(-1)[0]), 0), rows.shape[0])


@dataclass(frozen=True)
class Result:
    op: str
    variant: str
    passed: int
    failed: int
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.failed == 0


def run_op(op: str, fn: Callable, args: tuple, kwargs: dict, device) -> tuple[object, object]:
    """Run ``fn`` on a copy of the case on ``device`` and the reference on a CPU copy;
    returns ``(got, want)``. In-place ops return their mutated argument."""
    ref = OPS[op].reference
    a, kw = to_device((args, kwargs), device)  # (one copy: arguments that share memory still share it)
    got = fn(*a, **kw)
    a, kw = to_device((args, kwargs), "cpu")
    want = ref(*a, **kw)
    return got, want


def check_backend(backend, *, device, seed: int = 0, cases: int = 20, ops: Iterable[str] | None = None) -> list[Result]:
    """Every op of ``backend`` against the CPU reference on ``cases`` random cases each."""
    results = []
    for op in ops or OPS:
        rng = np.random.default_rng([seed, list(OPS).index(op)])
        fn = getattr(backend, op)
        passed, failed, detail = 0, 0, ""
        for _ in range(cases):
            args, kwargs = case_for(op, rng, "cpu")
            try:
                got, want = run_op(op, fn, args, kwargs, device)
                why = mismatch(op, got, want)
            except Exception as exc:  # a crash is a failure with its message
                why = f"{type(exc).__name__}: {exc}"
            if why:
                failed += 1
                detail = detail or why
            else:
                passed += 1
        results.append(Result(op, "|".join(backend.variants[op]), passed, failed, detail))
    return results
