"""Ascend backend: declarations and dispatch priority (NPU variants: issue 5)."""

from __future__ import annotations

VARIANTS: tuple = ()

PRIORITY = {"*": ("reference",)}
