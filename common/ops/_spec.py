"""The op protocol: one typed :class:`OpSpec` per device op, declared in the op's own module.

An op owns its facts: the reference and its validator (one signature), what it returns and
writes, the column label tables use, the schema types of its non-tensor arguments (the custom
ops), the random valid inputs it is tested on (conformance, matrix runner, fuzz) and the calls
that compile its kernels' specialisations (``Backend.warmup``). Everything that loops over ops
loops over ``OPS`` and reads these; nothing keeps a per-op list of its own.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from ..registry import ANY_PLATFORM, KV_FORMAT_OPS, Variant
from ..validation import check_writes, one_read
from ._results import Results

if TYPE_CHECKING:
    from ._steps import CaseDraw, WarmupStep

P = ParamSpec("P")
R = TypeVar("R")

#: One call of an op: ``(args, kwargs)``.
Call = tuple[tuple, dict]

#: Schema types a non-tensor argument may have (``torch.library`` spelling).
SCALAR_TYPES = ("int", "int?", "float", "bool", "str")


@dataclass(frozen=True, eq=False)
class OpSpec(Generic[P, R]):
    """One device op, declared once in its module (``OP = OpSpec(...)``).

    ``reference``: the torch reference (its signature is the op's, its docstring opens with the
    formula); ``validate``: the validator, same signature (raises ``ValueError`` naming the
    argument; its value checks are read with one device transfer); ``results``: names, shapes and
    dtypes of its result tensors; ``mutates``: arguments written in place (``out=`` always is when
    given). ``short``: its label in narrow tables; ``scalars``: schema type of every non-tensor
    argument (:data:`SCALAR_TYPES`; everything else is a tensor); ``case(draw)``: random valid
    arguments from a :class:`~swa_backends.common.ops._steps.CaseDraw` (conformance, the matrix
    runner, the fuzz suite); ``warmup(step)``: the calls on a small serving step that launch every
    specialisation of its kernels (``Backend.warmup``; None: nothing to compile ahead);
    ``compare(got, want, rtol)``: why a result differs from the reference's, None when it matches
    (None: exact equality); ``index_layout``: the index layout its reference reads (attention);
    ``gate``: ``"module:attr"`` of a function with the reference's signature that launches the
    validator's value checks as one device pass and returns a ``Gate`` (its ``flag`` for the
    op's ``gated`` variants, ``failed()`` waiting for the check alone); only for an op that
    writes no caller buffer (a gated variant computes into fresh results). ``quick_check``: the
    validator's host checks and :meth:`check_writes` for plain calls (contiguous tensors, no lazy
    bits), in a few host µs: a true value when every one passes (True, or the facts the op's
    self-checked forms launch with, each read once: sizes, strides, the device), a false one when
    it cannot tell (the validator then runs; so does a call it raises on, e.g. a 0-dim tensor
    where it reads a row count); never true for a call they refuse. A variant's ``self_checked``
    form runs it first and takes only a call it passes (its kernel tests the values). ``writes_on_device``: the quick check
    leaves :meth:`check_writes` out, and the self-checked kernel tests the same overlaps, exactly,
    by address (a call whose written buffer meets an input gets the kernel's ``FAIL``, and the
    validator's error). ``anchor``: the required tensor argument a validated call on an
    accelerator compares with the backend's device (the validator compares every other tensor
    with one of the call's); "": the reference's first parameter.

    As a class attribute (``Ops``) it declares a typed method: on an instance, a callable with
    the reference's signature (the instance prepares it: ``Backend``).
    """

    name: str
    reference: Callable[P, R]
    validate: Callable[..., None]
    results: Results
    mutates: tuple[str, ...] = ()
    short: str = ""
    scalars: Mapping[str, str] = field(default_factory=dict)
    case: Callable[[CaseDraw], Call] | None = None
    warmup: Callable[[WarmupStep], Iterable[Call]] | None = None
    compare: Callable[[Any, Any, float], str | None] | None = None
    index_layout: str | None = None
    gate: str | None = None
    quick_check: Callable[..., object] | None = None
    writes_on_device: bool = False
    anchor: str = ""

    def __post_init__(self) -> None:
        params = inspect.signature(self.reference).parameters
        for arg, kind in self.scalars.items():
            if arg not in params or kind not in SCALAR_TYPES:
                raise ValueError(f"OpSpec {self.name}: scalars[{arg!r}]={kind!r}: expected an argument of the reference "
                                 f"typed one of {SCALAR_TYPES}")
        if not self.short:
            object.__setattr__(self, "short", self.name)
        names = list(params)
        if not self.anchor:
            object.__setattr__(self, "anchor", names[0])
        if (self.anchor not in params or self.anchor in self.scalars
                or params[self.anchor].default is not inspect.Parameter.empty):
            raise ValueError(f"OpSpec {self.name}: anchor={self.anchor!r}: expected a required tensor argument of "
                             "the reference")
        # the value checks are read with one device->host transfer at the validator's end (an
        # enclosing one_read block, the dispatcher's, reads them later still)
        object.__setattr__(self, "validate", _one_read(self.validate))

    @property
    def doc(self) -> str:
        """The first line of the reference's docstring."""
        return (self.reference.__doc__ or "").strip().split("\n")[0]

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.reference)

    @functools.cached_property
    def anchor_at(self) -> tuple[int, str]:
        """``(position, name)`` of :attr:`anchor` in a call (a positional one, or by name)."""
        return list(self.signature.parameters).index(self.anchor), self.anchor

    @functools.cached_property
    def reference_variant(self) -> Variant:
        """The reference as a variant of the op: every platform, every input (the last entry of
        every priority list)."""
        ref = self.reference
        return Variant(
            op=self.name, name="reference", impl=f"{ref.__module__}:{ref.__qualname__}", platforms=ANY_PLATFORM,
            index_layout=self.index_layout,
            kv_formats="*" if self.name in KV_FORMAT_OPS else None,  # the reference is the whole contract
            description="torch reference (vectorised, fp32 softmax for attention)",
        )

    def scalar_type(self, arg: str) -> str:
        """The schema type of argument ``arg`` (``"Tensor"`` unless declared in ``scalars``)."""
        return self.scalars.get(arg, "Tensor")

    def check_writes(self, args: tuple, kwargs: dict) -> None:
        """Every buffer the op writes (``out=`` entries, ``mutates``) overlaps neither itself nor an
        input (a plan's tensors included) nor another written buffer, by address (see
        :func:`check_writes`)."""
        check_writes(self.name, self.signature, args, kwargs, self.mutates)

    # -- as a class attribute: the typed method of an object that prepared it (Backend) ---------

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> OpSpec[P, R]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj, owner=None):
        # On an instance only where it did not prepare the op as an attribute of its own (one
        # it did wins: this descriptor defines no __set__).
        if obj is None:
            return self
        raise AttributeError(f"{type(obj).__name__} object has not prepared op {self.name!r}")


def _one_read(validate: Callable) -> Callable:
    @functools.wraps(validate)
    def run(*args, **kwargs) -> None:
        with one_read():
            validate(*args, **kwargs)

    return run
