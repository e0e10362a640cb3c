"""Triton kernels written for triton-ascend (imported only when chosen).

Ascend's AI cores run a fixed number of long-lived programs well and pay for every extra
program launched, so these kernels differ from the portable ones in ``swa_backends.kernels``:
the grid is sized to the core count (never zero, never more programs than work), and each
program walks the work in a flat grid-stride loop (program ``pid`` takes items ``pid * B + k * P * B + [0, B)``).
They share the reference semantics exactly and run on a CPU under Triton's interpreter.
"""
