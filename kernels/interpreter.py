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
"""

from __future__ import annotations

import os

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
        elif os.environ.get("TRITON_INTERPRET", "0") == "1":
            raise RuntimeError(
                f"TRITON_INTERPRET=1 is set in this process but device {device} needs compiled Triton kernels; "
                "unset it (it makes every Triton kernel run in the host interpreter)")
        _mode = want
    elif _mode != want:
        raise RuntimeError(
            f"Triton kernels are already loaded in {_mode} mode in this process; device {device} needs {want} mode. "
            "Triton fixes the mode when a kernel is decorated: use one process per mode.")
