"""CUDA backend: declarations and dispatch priority (vendor variants: issue 5)."""

from __future__ import annotations

VARIANTS: tuple = ()

# First variant with no reasons wins; names not declared for an op are skipped.
PRIORITY = {"*": ("triton", "reference")}
