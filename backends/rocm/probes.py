"""Probe of AMD's AITER (ROCm only). The PyPI package ``aiter`` is an unrelated
async-iterator library that installs the same top-level module, so the probe asks for
something only AMD's has (``aiter.ops.pa_sparse_prefill_opus``), never just the name."""

from __future__ import annotations

import importlib
import importlib.util
import sys

from ...common.registry import register_probe

OPUS_MODULE = "aiter.ops.pa_sparse_prefill_opus"
OPUS_FN = "pa_sparse_prefill_opus"


def find_opus():
    """``(function, None)`` or ``(None, reason)``; the module is cached until ``aiter`` modules
    change, the function looked up per call."""
    key = tuple(id(sys.modules.get(m)) for m in ("aiter", "aiter.ops", OPUS_MODULE))
    if not (_cache and _cache[0] == key):
        result = _find_opus()
        _cache[:] = [tuple(id(sys.modules.get(m)) for m in ("aiter", "aiter.ops", OPUS_MODULE)), result]
    mod, why = _cache[1]
    return (getattr(mod, OPUS_FN), None) if mod is not None else (None, why)


_cache: list = []


def _find_opus():
    if importlib.util.find_spec("aiter") is None:
        return None, "AMD AITER is not installed (ROCm images ship it; the PyPI amd-aiter wheel is old)"
    try:
        has_ops = importlib.util.find_spec("aiter.ops") is not None
    except ModuleNotFoundError:  # 'aiter' is a plain module, not a package
        has_ops = False
    except Exception as exc:  # importing the parent package failed
        return None, f"import aiter failed: {type(exc).__name__}: {exc}"
    if not has_ops:
        return None, ("the installed 'aiter' is not AMD's AITER (it has no aiter.ops; the PyPI package 'aiter' is an "
                      "unrelated async-iterator library with the same module name)")
    try:
        mod = importlib.import_module(OPUS_MODULE)
    except Exception as exc:
        return None, f"AMD AITER without a usable {OPUS_MODULE}: {type(exc).__name__}: {exc}"
    if getattr(mod, OPUS_FN, None) is None:
        return None, f"{OPUS_MODULE} has no {OPUS_FN} (an AITER older than the DeepSeek-V4 gfx950 sparse prefill)"
    return mod, None


@register_probe("amd_aiter_opus")
def _probe_opus() -> str | None:
    return find_opus()[1]
