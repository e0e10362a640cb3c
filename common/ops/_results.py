"""What an op returns, declared once per op (beside its reference): the result tensors'
names, shapes and dtypes as functions of the arguments (metadata only), how ``out=`` holds
them, and how they make the Python op's return value. ``torch_ops`` builds every custom op
form (functional, ``_out``, fake kernels) from these declarations."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

Shape = tuple  # ints, or None for a size only known from tensor values (query_start_loc[-1])


@dataclass(frozen=True)
class Results:
    """``names``: the result tensors, in return order (``plan_names`` follow when the op is
    given a plan); ``shapes(args) -> {name: (shape, dtype)}`` from the op's bound arguments
    (a mapping name -> value; a plan may hold fake tensors). ``out``: how the op's
    ``out=`` holds the results -- ``"tensor"`` (one result), ``"tuple"`` (in order) or
    ``"dict"`` (by name; ``"a.b"`` nests ``out["a"]["b"]``); None: the op takes no ``out=``.
    ``pack(tensors, args)``: the Python op's return value from the result tensors (default:
    the tensor, or the tuple of them). ``optional_names`` (after ``names``, before
    ``plan_names``): results the op makes only when an argument asks for them; their
    ``out=`` entries may be left out, ``shapes`` gives them size 0 when not asked for, and the
    Python op returns None for them then."""

    names: tuple[str, ...]
    shapes: Callable[[Mapping], dict[str, tuple[Shape, torch.dtype]]]
    out: str | None = "tuple"
    pack: Callable[[dict, Mapping], object] | None = None
    plan_names: tuple[str, ...] = ()
    optional_names: tuple[str, ...] = ()

    def names_for(self, with_plan: bool) -> tuple[str, ...]:
        return self.names + self.optional_names + (self.plan_names if with_plan else ())

    def to_python(self, tensors: dict, args: Mapping):
        if self.pack is not None:
            return self.pack(tensors, args)
        values = tuple(tensors.values())
        return values[0] if len(values) == 1 else values

    def from_python(self, result, names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
        """The result tensors, in declaration order, out of the Python op's return value."""
        if isinstance(result, torch.Tensor):
            return (result,)
        if isinstance(result, tuple) and not hasattr(result, "_fields"):
            return tuple(result)
        out = []
        for name in names:  # attribute paths: ReplayBatch, PreparedStep (None: a part not made)
            obj = result
            for part in name.split("."):
                obj = None if obj is None else getattr(obj, part)
            out.append(obj)
        return tuple(out)

    def out_structure(self, buffers: dict):
        """``out=`` for the Python op from the buffers ``{name: tensor}``."""
        if self.out == "tensor":
            return next(iter(buffers.values()))
        if self.out == "tuple":
            return tuple(buffers.values())
        nested: dict = {}
        for name, t in buffers.items():
            *path, last = name.split(".")
            node = nested
            for part in path:
                node = node.setdefault(part, {})
            node[last] = t
        return nested

    def out_buffers(self, out, names: tuple[str, ...]) -> dict:
        """``{name: tensor}`` out of a Python ``out=`` (the inverse of :meth:`out_structure`);
        a missing entry is None (the op's validation names it)."""
        if self.out == "tensor":
            return {names[0]: out}
        if self.out == "tuple":
            items = tuple(out) if isinstance(out, tuple) else ()
            return {n: (items[i] if i < len(items) else None) for i, n in enumerate(names)}
        res = {}
        for name in names:
            node = out
            for part in name.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            res[name] = node
        return res
