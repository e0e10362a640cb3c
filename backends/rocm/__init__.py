"""ROCm backend: declarations and dispatch priority (vendor variants: issue 5)."""

from __future__ import annotations

VARIANTS: tuple = ()

PRIORITY = {"*": ("triton", "reference")}
