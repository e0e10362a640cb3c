"""Input validation shared by every variant of every op (SPEC §5).

Two levels of checks run in front of each public op:

* *metadata* checks (dtype, device, rank, shape, scalar arguments) cost no device work and
  run whenever validation is on;
* *value* checks (monotonic ``query_start_loc``, ``R >= 0``, slots in range or PAD, group
  indices in range) read tensor values. They run when validation is on **and** no CUDA graph
  is being captured on the current stream (a capture cannot synchronise; the metadata checks
  still run there). A call reads the device once: each check registers what it reads (a
  per-request tensor whole, a larger one as a min/max or a few reductions made on the device)
  and a test of those values on the host; at the end of the call's validation (:func:`one_read`)
  everything travels in one device->host transfer and the tests run in order. Only a test
  that fails reads more, to name the first bad value.

The buffers a call writes are checked against everything it reads by address
(:func:`check_writes`), before anything is written.

Dispatch has two ways around the read: a gated variant (``sparse_mla``'s, ``OpSpec.gate``) runs
behind a device pass of the value checks, and a variant with a self-checked form runs it for a
call that passes the op's quick host checks (``OpSpec.quick_check``): its kernel tests the values
itself and writes nothing when one fails. Either way a failed value makes dispatch run the
validator here, which raises the error.

Validation is on by default. Turn it off for a hot path with ``set_validation(False)``, the
``validation(False)`` context manager, or ``SWA_BACKENDS_VALIDATE=0`` in the environment
(read on first use, not at import).

Every error is a ``ValueError`` of the form
``"<op>: <argument>=<value>: expected <expectation>"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch


class _State(threading.local):
    """This thread's validation state. Each name has a class-level default, so that reading one a
    thread has not set is a plain lookup: ``getattr(threading.local(), name, None)`` raises and catches
    an ``AttributeError`` inside, a cost every op call of a thread that never called
    :func:`set_validation` (the default path) would pay."""

    enabled: bool | None = None  # set_validation's; None: the environment's default
    capturing: bool | None = None  # one_read's answer for its block (True: no value is read); None: ask
    held: list | None = None  # values_on_device's value checks, held for one read
    label: tuple | None = None  # the part of an op being checked, for its messages
    pending: list | None = None  # one_read's value checks, read at its end; None: outside a block
    seen: set | None = None  # checked_before's keys of this block
    reader = None  # the value reader one_read's block ends with


_state = _State()
_default: bool | None = None


ENV = "SWA_BACKENDS_VALIDATE"


#: Values that switch an environment switch of the pack off (case-insensitive).
OFF_WORDS = ("0", "false", "no", "off", "disable", "disabled")


def env_switch(name: str) -> bool | None:
    """An environment variable read as a switch: None when unset or empty, False for one of
    :data:`OFF_WORDS`, True for anything else (the pack's one parser of its switches)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return None
    return raw not in OFF_WORDS


def env_setting() -> bool | None:
    """``SWA_BACKENDS_VALIDATE`` as a switch (:func:`env_switch`)."""
    return env_switch(ENV)


def _env_default() -> bool:
    global _default
    if _default is None:
        setting = env_setting()
        _default = True if setting is None else setting
    return _default


def validation_enabled() -> bool:
    """Whether public ops validate their inputs (thread-local, default on)."""
    enabled = _state.enabled
    return _env_default() if enabled is None else enabled


def set_validation(enabled: bool) -> bool:
    """Turn validation on or off for this thread; returns the previous setting."""
    previous = validation_enabled()
    _state.enabled = bool(enabled)
    return previous


@contextlib.contextmanager
def validation(enabled: bool) -> Iterator[None]:
    """Context manager form of :func:`set_validation`."""
    previous = set_validation(enabled)
    try:
        yield
    finally:
        _state.enabled = previous


def _capturing() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        return torch.cuda.is_current_stream_capturing()
    except Exception:  # pragma: no cover - no CUDA context on this thread
        return False


def value_checks_enabled() -> bool:
    """Validation is on and reading tensor values is allowed (no graph capture; asked once per
    :func:`one_read` block)."""
    capturing = _state.capturing
    return validation_enabled() and not (_capturing() if capturing is None else capturing)


@contextlib.contextmanager
def values_on_device() -> Iterator[list]:
    """Inside, validators run their host checks (shapes, dtypes, devices, scalars, overlaps) and
    hold their value checks (the helpers marked :func:`value_check`) unrun, in the list the block
    yields: the caller checks the values on the device instead (``OpSpec.gate``), or runs the held
    checks with :func:`run_held` (one read, as if they had run in place)."""
    previous = _state.held
    held = _state.held = []
    try:
        yield held
    finally:
        _state.held = previous


def value_check(fn: Callable[..., None]) -> Callable[..., None]:
    """A value-check helper: under :func:`values_on_device` the call is held (with the error label
    in force) instead of run."""
    @functools.wraps(fn)
    def run(*args, **kwargs) -> None:
        held = _state.held
        if held is not None:
            held.append((_state.label, functools.partial(fn, *args, **kwargs)))
            return
        fn(*args, **kwargs)

    return run


def run_held(held: list, reader: Callable | None = None) -> None:
    """The value checks :func:`values_on_device` held, read with one transfer (their errors as
    they would have been raised in place; ``reader``: as :func:`one_read`'s)."""
    with one_read(reader):
        for label, check in held:
            previous = _state.label
            _state.label = label
            try:
                check()
            except ValueError as exc:  # raised at once: labelled() would have renamed it in place
                new = _relabel(exc, *label) if label is not None else exc
                if new is exc:
                    raise
                raise new from exc
            finally:
                _state.label = previous


def fail(op: str, name: str, value: object, expected: str) -> None:
    raise ValueError(f"{op}: {name}={_show(value)}: expected {expected}")


def _show(value: object) -> str:
    if isinstance(value, torch.Tensor):
        if value.is_nested:  # (a nested tensor has no single shape)
            return f"nested tensor(dim={value.dim()}, dtype={value.dtype}, device={value.device})"
        layout = "" if value.layout is torch.strided else f", layout={value.layout}"
        return f"tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device}{layout})"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


#: What :func:`check_tensor` and :func:`check_writes` expect of a sparse or nested tensor argument.
DENSE = "a dense (strided) tensor, not a sparse or nested one (call .to_dense() first)"


def check_tensor(
    op: str,
    name: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype] | torch.dtype | None = None,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    device: torch.device | None = None,
    min_ndim: int | None = None,
    lazy_bits: bool = False,
) -> None:
    """Metadata check of one tensor argument (no device work). A tensor with a lazy conjugate
    or negative bit (``x.conj()`` of a complex tensor, its ``.imag``) is refused unless
    ``lazy_bits``: kernels read memory, where the bit is not applied."""
    # (every validated call runs this for each tensor argument: plain comparisons, no generators)
    if not isinstance(t, torch.Tensor):
        fail(op, name, t, "a torch.Tensor")
    if t.layout is not torch.strided or t.is_nested:  # (kernels and checks read strides and a data pointer)
        fail(op, name, t, DENSE)
    if not lazy_bits and (t.is_conj() or t.is_neg()):
        fail(op, name, t, "a tensor without a lazy conjugate or negative bit (call .resolve_conj() / "
                          ".resolve_neg() first)")
    if dtypes is not None and t.dtype is not dtypes and (dtypes.__class__ is torch.dtype or t.dtype not in dtypes):
        fail(op, name, t, f"dtype {_dtype_names((dtypes,) if isinstance(dtypes, torch.dtype) else tuple(dtypes))}")
    if ndim is not None and t.dim() != ndim:
        fail(op, name, t, f"{ndim} dimension(s)")
    if min_ndim is not None and t.dim() < min_ndim:
        fail(op, name, t, f"at least {min_ndim} dimension(s)")
    if shape is not None:
        dims = t.shape
        wrong = len(dims) != len(shape)
        if not wrong:
            for s, d in zip(shape, dims):
                if s is not None and s != d:
                    wrong = True
                    break
        if wrong:
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            fail(op, name, t, f"shape {want}")
    if device is not None and t.device != device:
        fail(op, name, t, f"device {device} (same as the other tensor arguments)")


#: The largest value the pack's kernels hold in 32-bit arithmetic (positions, slots, sizes).
INT32_MAX = 2**31 - 1


def check_int(op: str, name: str, value: object, *, min_value: int | None = None,
              max_value: int | None = INT32_MAX, why: str = "int32") -> int:
    """A Python integer scalar (bools and tensors rejected) in ``[min_value, max_value]``
    (by default at most ``INT32_MAX``: every scalar the kernels take is 32-bit)."""
    if isinstance(value, bool) or not isinstance(value, int):
        fail(op, name, value, "a Python int")
    if min_value is not None and value < min_value:
        fail(op, name, value, f"an int >= {min_value}")
    if max_value is not None and value > max_value:
        fail(op, name, value, f"an int <= {max_value} ({why})")
    return value


def check_out(op: str, name: str, out: object, *, shape: Sequence[int], dtype: torch.dtype, device: torch.device,
              row_stride: bool = False) -> None:
    """A caller-provided output buffer: exact shape, dtype, device, contiguous -- or, with
    ``row_stride`` (a 2-D buffer), contiguous rows that may lie further apart (a slice of a
    wider persistent buffer). (That it shares no memory with an input is checked for every op
    at once: ``OpSpec.check_writes``.)"""
    check_tensor(op, name, out, dtypes=dtype, shape=shape, device=device)
    assert isinstance(out, torch.Tensor)
    if out.requires_grad:  # (torch refuses out= with autograd too; a kernel's store would bypass it)
        fail(op, name, out, "a buffer that does not require grad (the ops are not differentiable)")
    if row_stride and out.dim() == 2:
        if out.shape[1] > 1 and out.stride(1) != 1 or out.shape[0] > 1 and out.stride(0) < out.shape[1]:
            fail(op, name, f"strides {tuple(out.stride())}", f"contiguous rows, stride(0) >= {out.shape[1]}")
    elif not out.is_contiguous():
        fail(op, name, out, "a contiguous tensor")


# ---------------------------------------------------------------------------------------
# memory overlap: decided by addresses, never by storage objects (two storages can share
# memory: ``torch.from_numpy`` of overlapping slices of one array)
# ---------------------------------------------------------------------------------------

#: Runs (contiguous pieces of a tensor) up to which an overlap that no closed form decides is
#: settled by listing every run's address; past it the byte ranges decide (a refusal, on the
#: safe side).
ENUMERATE_RUNS = 1 << 16


def _layout(t: torch.Tensor) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """``(first byte, run bytes, ((size, byte stride), ...))``: a non-empty tensor's elements
    as runs of ``run`` contiguous bytes starting at ``first + sum_k i_k * stride_k``, ``0 <=
    i_k < size_k`` (the outer dims by increasing stride, size-1 dims dropped, a dim that
    continues the run or the previous dim merged into it). torch strides are never negative."""
    e = t.element_size()
    run = e
    outer: list[tuple[int, int]] = []
    for n, s in sorted(((n, s * e) for n, s in zip(t.shape, t.stride()) if n != 1), key=lambda d: d[1]):
        if not outer and s == run:
            run = n * s
        elif outer and s == outer[-1][0] * outer[-1][1]:
            outer[-1] = (outer[-1][0] * n, outer[-1][1])
        else:
            outer.append((n, s))
    return t.data_ptr(), run, tuple(outer)


def _end(first: int, run: int, outer) -> int:
    return first + run + sum((n - 1) * s for n, s in outer)


def byte_range(t: torch.Tensor) -> tuple[int, int] | None:
    """``[lo, hi)``: the bytes a tensor's elements occupy, from its first to past its last
    (None when it has no element, or no memory: a meta tensor)."""
    n = t.numel()
    if n == 0 or t.is_meta:
        return None
    if t.is_contiguous():
        return t.data_ptr(), t.data_ptr() + n * t.element_size()
    first, run, outer = _layout(t)
    return first, _end(first, run, outer)


def _starts(first: int, outer) -> np.ndarray | None:
    """Every run's first byte, sorted (None past :data:`ENUMERATE_RUNS` runs)."""
    if math.prod(n for n, _ in outer) > ENUMERATE_RUNS:
        return None
    starts = np.array([first], dtype=np.int64)
    for n, s in outer:
        starts = (starts[:, None] + np.arange(n, dtype=np.int64) * s).reshape(-1)
    return np.sort(starts)


def self_overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share a byte (an expanded view, an ``as_strided`` view
    with repeated addresses): exact up to :data:`ENUMERATE_RUNS` runs, True past it unless
    the strides prove the elements apart."""
    if t.numel() <= 1 or t.is_contiguous():
        return False
    _, run, outer = _layout(t)
    extent = run
    for n, s in outer:
        if s < extent:
            break
        extent += (n - 1) * s
    else:
        return False  # each dim steps past everything the smaller ones cover
    starts = _starts(0, outer)
    return starts is None or bool((np.diff(starts) < run).any())


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may share a byte of memory (an op reads its inputs while it writes
    its outputs, so an aliased ``out=`` gives wrong rows or a half-written input). Decided by
    addresses: disjoint byte ranges never overlap; two layouts of one period (column slices of
    one buffer, say) and layouts of up to :data:`ENUMERATE_RUNS` runs are decided exactly;
    anything else whose byte ranges intersect counts as overlapping."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0 or a.device.type == "meta":
        return False
    fa, ra, oa = _layout(a)
    fb, rb, ob = _layout(b)
    if _end(fa, ra, oa) <= fb or _end(fb, rb, ob) <= fa:
        return False
    # a dim of stride 0 repeats addresses: the set of bytes is the same without it
    oa = tuple(d for d in oa if d[1])
    ob = tuple(d for d in ob if d[1])
    if len(oa) <= 1 and len(ob) <= 1 and (not oa or not ob or oa[0][1] == ob[0][1]):
        period = (oa or ob or ((1, 1),))[0][1]
        na, nb = (oa[0][0] if oa else 1), (ob[0][0] if ob else 1)
        # run i of a and run j of b meet iff (fb - fa) + (j - i) * period lies in (-rb, ra)
        d = fb - fa
        k_lo = max((-rb - d) // period + 1, -(na - 1))
        k_hi = min(-((d - ra) // period) - 1, nb - 1)
        return k_lo <= k_hi
    sa, sb = _starts(fa, oa), _starts(fb, ob)
    if sa is None or sb is None:
        return True
    # a start x of a meets a run [y, y + rb) of b iff y - ra < x < y + rb
    hits = np.searchsorted(sa, sb + rb, side="left") - np.searchsorted(sa, sb - ra, side="right")
    return bool((hits > 0).any())


def _tensors(name: str, value, depth: int = 0) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every tensor an argument holds: itself, or inside a tuple, list,
    dict or dataclass (a ``ReplayPlan``'s host tensors and the device copies it caches)."""
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if value is None or isinstance(value, (int, float, str, bool)) or depth > 4:
        return []
    if isinstance(value, (tuple, list)):
        return [item for i, v in enumerate(value) for item in _tensors(f"{name}[{i}]", v, depth + 1)]
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in _tensors(f"{name}[{k!r}]", v, depth + 1)]
    names = _FIELD_NAMES.get(value.__class__)
    if names is None:
        is_dc = dataclasses.is_dataclass(value) and not isinstance(value, type)
        names = _FIELD_NAMES[value.__class__] = tuple(f.name for f in dataclasses.fields(value)) if is_dc else ()
    return [item for f in names for item in _tensors(f"{name}.{f}", getattr(value, f, None), depth + 1)]


#: class -> its dataclass field names (() for any other class): :func:`_tensors` meets a plan on
#: every validated call
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def check_writes(op: str, signature, args: tuple, kwargs: dict, mutates: Sequence[str] = ()) -> None:
    """Every buffer a call writes (every tensor of ``out=``: a tensor, or a tuple or dict of
    them, nested; the arguments named in ``mutates``) has no element that overlaps another of
    its own, and shares no byte of memory with an input (the tensors of every other argument,
    a plan's included) or with another written buffer. Checked before anything is written;
    no device work."""
    bound = dict(zip(signature.parameters, args), **kwargs)  # (the validator has bound the same call)
    written = _tensors("out", bound.get("out"))
    for name in mutates:
        written += _tensors(name, bound.get(name))
    inputs = [item for n, v in bound.items() if n != "out" and n not in mutates for item in _tensors(n, v)]
    for name, t in (*written, *inputs):  # (no address to compare: checks_writes runs before a function's checks)
        if t.layout is not torch.strided or t.is_nested:
            fail(op, name, t, DENSE)
    ranges = {id(t): byte_range(t) for _, t in (*written, *inputs)}

    def meet(x: torch.Tensor, y: torch.Tensor) -> bool:
        rx, ry = ranges[id(x)], ranges[id(y)]
        return rx is not None and ry is not None and rx[0] < ry[1] and ry[0] < rx[1] and overlaps(x, y)

    for i, (wname, w) in enumerate(written):
        if self_overlaps(w):
            fail(op, wname, w, "a buffer whose elements do not overlap each other (an expanded or as_strided "
                               f"view with repeated addresses; strides {tuple(w.stride())})")
        for iname, x in inputs:
            if meet(w, x):
                fail(op, wname, w, f"a buffer that shares no memory with the input {iname!r}")
        for oname, o in written[:i]:
            if meet(w, o):
                fail(op, wname, w, f"a buffer that shares no memory with {oname!r}")


def checks_writes(fn):
    """Decorator for a public function taking ``out=``: runs :func:`check_writes` on every
    call while validation is on (ops of the dispatch table get the same check from
    ``OpSpec``)."""
    import functools
    import inspect

    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if validation_enabled():
            check_writes(fn.__name__, sig, args, kwargs)
        return fn(*args, **kwargs)

    return wrapper


# ---------------------------------------------------------------------------------------
# value checks: registered while a call validates, read with one device->host transfer
# ---------------------------------------------------------------------------------------

#: A device tensor a range or finiteness check reads whole when it is at most this many bytes;
#: a larger one is reduced on the device (one min/max) and only the reduction travels.
RAW_BYTES = 4096


class Reduced:
    """A read of a device tensor's min and max instead of its values (a value check's test gets
    ``[min, max]`` in the tensor's dtype; NaN in both when the tensor holds one). ``pad_as``: -1
    counts as this value (PAD allowed below a range that starts above 0); ``limit`` and ``step``
    (a 2-D table): column ``c`` of row ``r`` counts only when ``c * step < limit[r]``, the others
    read as 0 (a block table's entries that no position reads)."""

    __slots__ = ("t", "pad_as", "limit", "step")

    def __init__(self, t: torch.Tensor, *, pad_as: int | None = None, limit: torch.Tensor | None = None,
                 step: int = 0):
        self.t, self.pad_as, self.limit, self.step = t, pad_as, limit, step

    @property
    def device(self) -> torch.device:
        return self.t.device

    def on_device(self) -> torch.Tensor:
        """The min and max as one device tensor, by torch ops."""
        t = self.t.detach()
        if self.limit is not None:
            cols = torch.arange(0, t.shape[1] * self.step, self.step, device=t.device) if self.step else \
                torch.zeros(t.shape[1], dtype=torch.int64, device=t.device)
            t = torch.where(cols[None, :] < self.limit[:, None], t, 0)
        if self.pad_as is not None:
            t = torch.where(t == -1, self.pad_as, t)
        return torch.stack(torch.aminmax(t))


def numpy_dtype(dtype: torch.dtype):
    """The numpy dtype a read gives a tensor of ``dtype`` (float32 for a floating dtype numpy
    lacks: bf16, fp8)."""
    return _NUMPY.get(dtype, np.float32)


def readable(op: str, name: str, t: torch.Tensor) -> None:
    """A tensor whose values a value check reads: a meta tensor has none (trace shapes with
    validation off, or through the custom ops' fake kernels)."""
    if t.is_meta:
        fail(op, name, t, "a tensor with values (validation reads them; a meta tensor has none)")


def defer(op: str, reads: Sequence[tuple[str, torch.Tensor]], test: Callable[..., None]) -> None:
    """A value check: ``test(*values)`` runs on the host, ``values`` the numpy copies of the
    tensors of ``reads`` (``(argument name, tensor or Reduced)``; a reduction is named after its
    argument). Inside :func:`one_read` every check of the call is read by one
    transfer at its end; outside, now."""
    for name, t in reads:
        readable(op, name, t.t if isinstance(t, Reduced) else t)
    tensors = [t for _, t in reads]
    label = _state.label
    if label is not None:
        test = _labelled_test(test, *label)
    pending = _state.pending
    if pending is None:
        test(*to_host(tensors))
    else:
        pending.append((tensors, test))


def checked_before(op: str, *key) -> bool:
    """Whether this call's validation (one :func:`one_read` block) has registered the check
    ``key`` for ``op`` already (and registers it): an op validated by its parts' validators
    (``prepare_replay_step``) asks for some checks twice with the same tensors. Always False
    outside a block. ``key``: the check's name, its tensors (by identity) and parameters."""
    seen = _state.seen
    if seen is None:
        return False
    label = _state.label
    full = (label[0] if label is not None else op, *(id(k) if isinstance(k, torch.Tensor) else k for k in key))
    if full in seen:
        return True
    seen.add(full)
    return False


class _OneRead:
    __slots__ = ("outer", "reader")

    def __init__(self, reader) -> None:
        self.reader = reader

    def __enter__(self) -> None:
        self.outer = _state.pending is None
        if self.outer:
            _state.pending, _state.capturing, _state.seen = [], _capturing(), set()

    def __exit__(self, kind, exc, tb) -> bool:
        if not self.outer:
            return False
        pending = _state.pending
        _state.pending = _state.capturing = _state.seen = None
        previous = _state.reader
        _state.reader = self.reader
        try:
            if exc is None:
                _run(pending)
            elif isinstance(exc, Exception):
                try:
                    _run(pending)  # an earlier check's error comes first (this one as its context)
                except ValueError:
                    raise
                except Exception:  # the checks could not be read (a broken device): the first failure stands
                    pass
        finally:
            _state.reader = previous
        return False


def one_read(reader: Callable | None = None) -> _OneRead:
    """``with one_read():`` collects the value checks (:func:`defer`) run inside and reads their
    values with one device->host transfer when the block ends; a test that fails raises its
    ``ValueError`` then. An exception inside the block first lets the checks registered before
    it run (an earlier argument's error comes first, as when each check read at once). Nested
    blocks collect into the outermost. ``reader``: what makes a device's read (see
    :func:`to_host`), given by the dispatcher of a device that has one."""
    return _OneRead(reader)


@contextlib.contextmanager
def labelled(op: str, parts: Sequence[str]) -> Iterator[None]:
    """Errors of the ops ``parts`` raised inside, at once or by a value check read later, name
    ``op`` instead (an op validated by its parts' validators)."""
    previous = _state.label
    _state.label = (op, tuple(parts))
    try:
        yield
    except ValueError as exc:
        new = _relabel(exc, op, parts)
        if new is exc:
            raise
        raise new from exc
    finally:
        _state.label = previous


def _relabel(exc: ValueError, op: str, parts: Sequence[str]) -> ValueError:
    msg = str(exc)
    for part in parts:
        if msg.startswith(part + ": "):
            return ValueError(f"{op}: {msg[len(part) + 2:]}")
    return exc


def _labelled_test(test: Callable[..., None], op: str, parts: tuple[str, ...]) -> Callable[..., None]:
    def run(*values):
        try:
            test(*values)
        except ValueError as exc:
            new = _relabel(exc, op, parts)
            if new is exc:
                raise
            raise new from exc

    return run


def _run(pending: list) -> None:
    if not pending:
        return
    values = to_host([t for tensors, _ in pending for t in tensors])
    i = 0
    for tensors, test in pending:
        test(*values[i:i + len(tensors)])
        i += len(tensors)


def to_host(tensors: Sequence) -> list[np.ndarray]:
    """numpy copies of ``tensors`` (views of CPU tensors; a :class:`Reduced` as ``[min, max]``),
    the device ones read by one transfer per device: by the device's reader where the
    dispatcher gave one (:func:`one_read`; it may decline a read, returning None), else their
    bytes joined on the device by torch (a reduction by torch ops), copied once, split on the
    host. A tensor several checks read (the same object) travels once."""
    first: dict[int, int] = {}
    for t in tensors:
        first.setdefault(id(t), len(first))
    if len(first) < len(tensors):
        once = _to_host(list({id(t): t for t in tensors}.values()))
        return [once[first[id(t)]] for t in tensors]
    return _to_host(tensors)


def _to_host(tensors: Sequence) -> list[np.ndarray]:
    out: list = [None] * len(tensors)
    by_device: dict = {}
    reader = _state.reader
    for i, t in enumerate(tensors):
        if t.device.type != "cpu" or reader is not None and _for_reader(t.device):
            by_device.setdefault(t.device, []).append((i, t))
        else:
            out[i] = _host_values(t.on_device() if isinstance(t, Reduced) else t)
    for device, items in by_device.items():
        got = reader([t for _, t in items]) if reader is not None and _for_reader(device) else None
        if got is not None:
            for (i, _), v in zip(items, got):
                out[i] = v
            continue
        items = [(i, _readable(t.on_device() if isinstance(t, Reduced) else t)) for i, t in items]
        if device.type == "cpu":  # (a reader declined the host's tensors: tests)
            for i, t in items:
                out[i] = _host_values(t)
            continue
        flat = []
        for _, t in items:
            flat.append(flat_bytes(t))
        host = (flat[0] if len(flat) == 1 else torch.cat(flat)).cpu().numpy()
        at = 0
        for (i, t), f in zip(items, flat):
            n = f.numel()
            out[i] = host[at:at + n].view(_NUMPY[t.dtype]).reshape(t.shape)
            at += n
    return out


def _readable(t: torch.Tensor) -> torch.Tensor:
    """``t`` as numpy can hold it: detached, a dtype numpy lacks (bf16, fp8) as float32."""
    if t.requires_grad:
        t = t.detach()
    return t if t.dtype in _NUMPY else t.float()


def _host_values(t: torch.Tensor) -> np.ndarray:
    """A host tensor's values (a view where it can be)."""
    t = _readable(t)
    return t.resolve_conj().resolve_neg().numpy() if t.is_conj() or t.is_neg() else t.numpy()


def _for_reader(device: torch.device) -> bool:
    """Whether a device's reads go to the reader: not a host's (its values are read in place;
    the tests point the reader at the host to run it in Triton's interpreter)."""
    return device.type != "cpu"


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements in order as a flat uint8 tensor on its device (a view where ``t`` is one
    run of unit stride; a copy for a strided tensor and for a 0- or 1-element one whose stride is
    0, which ``view`` refuses)."""
    f = t.reshape(-1)
    if f.stride(0) != 1:
        f = torch.empty(f.numel(), dtype=f.dtype, device=f.device).copy_(f)
    return f.view(torch.uint8)


_NUMPY = {torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
          torch.int32: np.int32, torch.int64: np.int64, torch.float16: np.float16, torch.float32: np.float32,
          torch.float64: np.float64, torch.uint16: np.uint16, torch.uint32: np.uint32, torch.uint64: np.uint64}


def first_true(mask: np.ndarray) -> int:
    """Index of the first True of a flat mask (a test calls it only after finding one)."""
    return int(np.argmax(mask))


def reads_whole(t: torch.Tensor) -> bool:
    """Whether a value check reads ``t`` whole (on the host already, or at most
    :data:`RAW_BYTES`) rather than a reduction of it made on the device."""
    return t.is_cpu or t.numel() * t.element_size() <= RAW_BYTES


@value_check
def check_query_start_loc(op: str, qsl: torch.Tensor, *, num_tokens: int | None, name: str = "query_start_loc",
                          from_zero: bool = True) -> None:
    """``qsl[0] == 0`` (``>= 0`` with ``from_zero=False``: ops that read only query lengths
    take a slice of a batch's requests), non-decreasing, and ``qsl[-1] <= num_tokens`` when
    it is known. Read whole (one entry per request)."""
    if not value_checks_enabled() or qsl.numel() == 0:
        return

    def test(values: np.ndarray) -> None:
        values = values.astype(np.int64)
        if from_zero and int(values[0]) != 0:
            fail(op, name, values.tolist()[:8], "query_start_loc[0] == 0")
        if not from_zero and int(values[0]) < 0:
            fail(op, name, values.tolist()[:8], "query_start_loc[0] >= 0")
        down = np.flatnonzero(np.diff(values) < 0)
        if down.size:
            fail(op, name, values.tolist()[:16], f"non-decreasing values (index {int(down[0]) + 1} decreases)")
        if num_tokens is not None and int(values[-1]) > num_tokens:
            fail(op, name, int(values[-1]), f"query_start_loc[-1] <= {num_tokens} (the number of tokens)")

    defer(op, ((name, qsl),), test)


@value_check
def check_finite(op: str, name: str, t: torch.Tensor, *, allow_neg_inf: bool = False) -> None:
    """No NaN and no +inf (and no -inf unless allowed) in a floating tensor: one min/max
    (NaN propagates through both)."""
    if not value_checks_enabled() or t.numel() == 0:
        return
    readable(op, name, t)

    def bad(lo, hi) -> bool:
        return bool(np.isnan(hi) or hi == np.inf or not allow_neg_inf and lo == -np.inf)

    def explain(values: np.ndarray) -> None:
        v = values.reshape(-1)
        wrong = np.isnan(v) | (v == np.inf)
        if not allow_neg_inf:
            wrong |= v == -np.inf
        fail(op, name, float(v[first_true(wrong)]), "finite values" + (" (or -inf)" if allow_neg_inf else ""))

    _min_max(op, name, t, bad, explain)


@value_check
def check_range(op: str, name: str, t: torch.Tensor, *, low: int, high: int | None, allow_pad: bool = False) -> None:
    """Every value in ``[low, high)`` (``high=None``: unbounded), or PAD (-1) when allowed: one
    min/max (with ``low`` 0, PAD is the one allowed value below the range)."""
    if not value_checks_enabled() or t.numel() == 0:
        return
    readable(op, name, t)
    floor = -1 if allow_pad and low == 0 else low  # PAD: the one value allowed below a range from 0
    pad_as = low if allow_pad and low != 0 else None

    def bad(lo, hi) -> bool:
        return int(lo) < floor or high is not None and int(hi) >= high

    _min_max(op, name, t, bad, lambda values: host_range(op, name, values, low=low, high=high, allow_pad=allow_pad),
             pad_as=pad_as)


def host_range(op: str, name: str, values: np.ndarray, *, low: int, high: int | None, allow_pad: bool = False) -> None:
    """:func:`check_range` on values already on the host."""
    v = values.reshape(-1).astype(np.int64)
    wrong = v < low
    if high is not None:
        wrong |= v >= high
    if allow_pad:
        wrong &= v != -1
    if wrong.any():
        span = f"[{low}, {high})" if high is not None else f">= {low}"
        fail(op, name, int(v[first_true(wrong)]), f"values in {span}" + (" or PAD (-1)" if allow_pad else ""))


def _min_max(op: str, name: str, t: torch.Tensor, bad: Callable, explain: Callable[[np.ndarray], None], *,
             pad_as: int | None = None) -> None:
    """``bad(min, max)`` decides; ``explain(values)`` raises (on the host copy of ``t``). A small
    tensor travels whole, a large one as its min and max (:class:`Reduced`; read again whole
    only to explain). ``pad_as``: -1 counts as this value in the min and max."""
    if reads_whole(t):
        def test(v: np.ndarray) -> None:
            w = v if pad_as is None else np.where(v == -1, pad_as, v)
            if bad(np.minimum.reduce(w, axis=None), np.maximum.reduce(w, axis=None)):
                explain(v)

        defer(op, ((name, t),), test)
        return
    defer(op, ((name, Reduced(t, pad_as=pad_as)),), lambda mm: explain(to_host([t])[0]) if bad(mm[0], mm[1]) else None)
