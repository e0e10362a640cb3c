"""Where the portable Triton kernels run: compiled on a GPU, interpreted on a CPU.

Triton decides per kernel *at decoration time* whether it is compiled or interpreted
(``TRITON_INTERPRET=1``). The kernel modules of this package are therefore imported only
when a Triton variant is chosen, after :func:`setup` has fixed the mode for the process:

* a CPU device sets ``TRITON_INTERPRET=1`` in this process's environment. From then on
  every Triton kernel decorated in this process -- this pack's and any other library's --
  runs in Triton's interpreter (numpy on the host: exact, slow, no GPU needed);
* any other device leaves the environment alone (compiled kernels).

The two cannot mix in one process: asking for the other mode after the first kernel
module was imported raises ``RuntimeError`` (run CPU emulation in its own process).

What interpret mode changes in the process, all of it only when a Triton variant is first
loaded for a CPU device (``select("cpu", prefer="triton")`` then the first call):

* ``os.environ["TRITON_INTERPRET"] = "1"``: Triton kernels decorated from then on (this
  pack's and any other library's) are interpreted; child processes inherit the variable;
* if ``triton`` was already imported before that (the variants' ``triton`` probe imports
  it, and so may other libraries), the helpers of ``triton.language`` written in Triton
  itself (``tl.sum``, ``tl.cumsum``, ``tl.zeros_like``, ``tl.cdiv``, ... and their
  ``tensor`` methods) were decorated as compiled functions, which an interpreted kernel
  cannot call. :func:`setup` rebinds each of them, in ``triton.language``'s modules and on
  ``triton.language.tensor``, to an interpreted wrapper of the same Python function.
  Kernels that other libraries decorated before the switch stay compiled;
* on Triton releases whose interpreter turns a scalar argument into a Python int with
  ``int(array)`` (3.6 does; NumPy 2.4+ rejects that for the 1-element arrays it holds, so a
  loop bounded by a runtime argument fails), :func:`setup` wraps the interpreter's tensor
  patch so ``__index__`` reads the single element (what Triton 3.9 does itself).
"""

from __future__ import annotations

import os
import sys

from ..common.device import DeviceInfo

_mode: str | None = None


def mode() -> str | None:
    """``"interpret"``, ``"compiled"``, or None before the first Triton variant loads."""
    return _mode


def setup(device: DeviceInfo) -> None:
    """Fix the mode for ``device`` before a kernel module is imported (idempotent)."""
    global _mode
    want = "interpret" if device.platform == "cpu" else "compiled"
    if _mode is None:
        if want == "interpret":
            os.environ["TRITON_INTERPRET"] = "1"
            if "triton" in sys.modules:
                _interpret_language_helpers()
            _scalar_index_compat()
        elif os.environ.get("TRITON_INTERPRET", "0") == "1":
            raise RuntimeError(
                f"TRITON_INTERPRET=1 is set in this process but device {device} needs compiled Triton kernels; "
                "unset it (it makes every Triton kernel run in the host interpreter)")
        _mode = want
    elif _mode != want:
        raise RuntimeError(
            f"Triton kernels are already loaded in {_mode} mode in this process; device {device} needs {want} mode. "
            "Triton fixes the mode when a kernel is decorated: use one process per mode.")


def _interpret_language_helpers() -> int:
    """Rebind the compiled ``@triton.jit`` helpers of ``triton.language`` (decorated when
    ``triton`` was imported without ``TRITON_INTERPRET``) to interpreted wrappers of the same
    Python functions; returns how many were rebound."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    owners = [m for name, m in list(sys.modules.items())
              if m is not None and (name == "triton.language" or name.startswith("triton.language."))]
    owners.append(tl.core.tensor)
    swapped: dict[int, InterpretedFunction] = {}
    for owner in owners:
        for name, value in list(vars(owner).items()):
            if isinstance(value, JITFunction):
                new = swapped.get(id(value))
                if new is None:
                    new = swapped[id(value)] = InterpretedFunction(value.fn)
                setattr(owner, name, new)
    return len(swapped)


def _scalar_index_compat() -> bool:
    """Make the interpreter's ``tensor.__index__`` accept 1-element arrays on Triton
    releases that call ``int(self.handle.data)`` (Triton 3.6 + NumPy >= 2.4 raise
    "only 0-dimensional arrays can be converted to Python scalars" for
    ``range(runtime_int_argument)``). Returns whether the interpreter was wrapped."""
    import inspect

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
