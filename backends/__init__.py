"""Per-platform backends. Each subpackage exports one ``PLATFORM``
(:class:`~swa_backends.common.platforms.Platform`): its devices and how to detect them, the
variants it registers, its dispatch priority, per-call rules and input checks, its contract
doubles; importing one imports no vendor package.

A new platform is a folder here and its entry in ``PLATFORMS`` (``register_platform`` adds one
at run time instead). Beside them: its package in pyproject.toml (tests/package checks the
list), its rows in matrix.yaml (where it was verified: without a row a device falls back to the
reference) and, if it wraps vendor kernels, their contract doubles in ``testing/emulation/``.
"""

#: The pack's platforms, by folder, in the order tables list them (the host first).
PLATFORMS = ("reference", "cuda", "rocm", "ascend")
