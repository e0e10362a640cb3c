"""Test tooling for runs in Triton's interpreter (``TRITON_INTERPRET=1``).

:func:`scalar_index_compat` works around Triton 3.6's interpreter on NumPy >= 2.4: it turns a
scalar kernel argument into a Python int with ``int(array)``, which NumPy 2.4 rejects for the
1-element arrays the interpreter holds ("only 0-dimensional arrays can be converted to Python
scalars"), so a loop bounded by a runtime argument fails. Triton 3.9 squeezes the array
itself. Applied by the test suite and the matrix runner's interpreter worker, never by the
product (the GPU machine has Triton 3.6 and NumPy 2.5; CI has Triton 3.9).

:func:`fast_reductions` gives ``tl.reduce`` with a sum or max combine function of a kernel's
own (``kernels/sparse_mla.py`` reduces that way: see the note above its ``_sum_fn``) the
interpreter's NumPy speed: the interpreter runs a combine function it does not know one
element at a time through Triton's Python semantics (a split-K combine of a 512-wide record
call: ~10 s per launch); this folds the same elements in the same order with the same NumPy
ufunc, so every result is bit for bit the element-wise fold's (tests/kernels/test_interpreter_reductions.py).
Applied by the test suite.
"""

from __future__ import annotations

import ast
import inspect
import textwrap


def scalar_index_compat() -> bool:
    """Wrap the interpreter's tensor patch so ``__index__`` reads a 1-element array's only
    element, on Triton releases that call ``int(self.handle.data)``. Returns whether it did."""
    import triton.runtime.interpreter as interp

    original = getattr(interp, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_swa_scalar_index", False):
        return False
    try:
        source = inspect.getsource(original)
    except (OSError, TypeError):
        return False
    if "int(self.handle.data)" not in source:  # newer Triton squeezes the array itself
        return False

    def _index(self):
        data = self.handle.data
        return int(data.reshape(-1)[0]) if getattr(data, "size", 0) == 1 else int(data)

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    patched._swa_scalar_index = True
    interp._patch_lang_tensor = patched
    return True


def _combine_kind(fn) -> str | None:
    """``"add"`` for a ``@triton.jit`` combine function whose whole body is ``return a + b``,
    ``"max"`` for ``return tl.maximum(a, b)`` (``a``, ``b`` its two parameters, ``tl``
    triton.language), else None. Read from its source, so a renamed function keeps the fast
    path and a changed body loses it."""
    py = getattr(fn, "fn", None)
    if py is None:
        return None
    cached = _KINDS.get(py)
    if cached is not None or py in _KINDS:
        return cached
    kind = None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(py)))
    except (OSError, TypeError, SyntaxError):
        tree = None
    node = tree.body[0] if tree is not None and len(tree.body) == 1 else None
    if isinstance(node, ast.FunctionDef) and len(node.args.args) == 2 and not node.args.vararg:
        a, b = (arg.arg for arg in node.args.args)
        body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        ret = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
        names = lambda args: [x.id if isinstance(x, ast.Name) else None for x in args]  # noqa: E731
        if isinstance(ret, ast.BinOp) and isinstance(ret.op, ast.Add) and names([ret.left, ret.right]) == [a, b]:
            kind = "add"
        elif (isinstance(ret, ast.Call) and isinstance(ret.func, ast.Attribute) and ret.func.attr == "maximum"
              and isinstance(ret.func.value, ast.Name) and not ret.keywords and names(ret.args) == [a, b]):
            import triton.language as tl

            if py.__globals__.get(ret.func.value.id) is tl:
                kind = "max"
    _KINDS[py] = kind
    return kind


_KINDS: dict = {}


def fast_reductions() -> bool:
    """Wrap the interpreter's ``tl.reduce`` so a one-tensor reduction along an axis whose
    combine function :func:`_combine_kind` knows runs as ``ufunc.accumulate`` over that axis
    (its last element): the element-wise fold's order and arithmetic (``a + b`` in the
    tensor's own dtype; ``tl.maximum`` is ``np.fmax`` on floats, ``np.maximum`` on
    integers), in NumPy. fp32 and 32/64-bit integer tensors only; anything else keeps the
    interpreter's path. Returns whether it wrapped (False: already done, or a Triton whose
    interpreter has no ``ReduceOps.generic_reduce``)."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interp

    ops = getattr(interp, "ReduceOps", None)
    original = getattr(ops, "apply_impl", None)
    if original is None or not hasattr(ops, "generic_reduce") or getattr(original, "_swa_fast", False):
        return False
    dtypes = {tl.float32: "f", tl.int32: "i", tl.int64: "i"}

    def apply_impl(self, input):
        kind = _combine_kind(self.combine_fn)
        if kind is None or len(input) != 1 or self.axis is None or input[0].dtype not in dtypes:
            return original(self, input)
        data = input[0].handle.data
        if data.shape[self.axis] == 0:
            return original(self, input)
        ufunc = np.add if kind == "add" else np.fmax if dtypes[input[0].dtype] == "f" else np.maximum
        out = np.take(ufunc.accumulate(data, axis=self.axis, dtype=data.dtype), -1, axis=self.axis)
        if self.keep_dims:
            out = np.expand_dims(out, self.axis)
        return self.to_tensor(out, input[0].dtype)

    apply_impl._swa_fast = True
    ops.apply_impl = apply_impl
    return True
