"""Per-platform backends. Each subpackage exports one ``PLATFORM``
(:class:`~swa_backends.common.platforms.Platform`): its devices, the variants it registers, its
dispatch priority; importing one imports no vendor package.

A new platform is a folder here and one entry in ``PLATFORMS`` (``register_platform`` adds one at
run time instead).
"""

#: The pack's platforms, by folder, in the order tables list them (the host first).
PLATFORMS = ("reference", "cuda", "rocm", "ascend")
