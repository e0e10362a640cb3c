"""Test tooling for runs in Triton's interpreter (``TRITON_INTERPRET=1``).

:func:`scalar_index_compat` works around Triton 3.6's interpreter on NumPy >= 2.4: it turns a
scalar kernel argument into a Python int with ``int(array)``, which NumPy 2.4 rejects for the
1-element arrays the interpreter holds ("only 0-dimensional arrays can be converted to Python
scalars"), so a loop bounded by a runtime argument fails. Triton 3.9 squeezes the array
itself. Applied by the test suite and the matrix runner's interpreter worker, never by the
product (the GPU machine has Triton 3.6 and NumPy 2.5; CI has Triton 3.9).
"""

from __future__ import annotations

import inspect


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
