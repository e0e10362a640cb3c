"""Portable Triton kernels, one op per module, registered by every platform that can run
them. This package's ``__init__`` only declares variants: kernel modules are imported when
chosen (so ``TRITON_INTERPRET`` can be set first on a CPU)."""

from __future__ import annotations

VARIANTS: tuple = ()
