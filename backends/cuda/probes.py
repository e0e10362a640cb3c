"""Probes of the CUDA vendor packages. Registered at import (cheap); they run only when a
CUDA device is being assessed, so no CUDA vendor package is imported anywhere else."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys

from ...common.registry import import_reason, register_probe

# Where vLLM ships FlashMLA's Python interface (vllm._flashmla_C underneath), newest first.
# The PyPI `flash-mla` package is an empty placeholder, so it is not a candidate.
FLASHMLA_MODULES = (
    "vllm.third_party.flashmla.flash_mla_interface",
    "vllm.v1.attention.ops.flashmla",
    "vllm.attention.ops.flashmla",
)
# FlashInfer exports the DSv4 decode from flashinfer.mla (docs) and flashinfer.decode (vLLM's import).
FLASHINFER_MODULES = ("flashinfer.mla", "flashinfer.decode")
FLASHINFER_DSV4 = "trtllm_batch_decode_sparse_mla_dsv4"


_memo: dict[str, tuple[tuple, tuple]] = {}


def _memoised(name: str, modules: tuple[str, ...], fn):
    """``fn()`` cached until one of ``modules`` is (re)placed in ``sys.modules`` -- the wrappers
    call the finders per call, so the lookup must be cheap, and contract doubles swap modules."""
    key = tuple(id(sys.modules.get(m)) for m in modules)
    hit = _memo.get(name)
    if hit is not None and hit[0] == key:
        return hit[1]
    result = fn()
    _memo[name] = (tuple(id(sys.modules.get(m)) for m in modules), result)
    return result


def find_flashmla():
    """``(module, None)`` for the first importable interface whose ``flash_mla_sparse_fwd``
    takes ``attn_sink`` and ``topk_length`` (the V4 interface), else ``(None, reason)``."""
    return _memoised("flashmla", ("vllm", *FLASHMLA_MODULES), _find_flashmla)


def _find_flashmla():
    if importlib.util.find_spec("vllm") is None:
        return None, ("vLLM is not installed (FlashMLA's sparse kernels ship inside vLLM's wheel as vllm._flashmla_C; "
                      "the PyPI flash-mla is an empty placeholder)")
    errors = []
    for path in FLASHMLA_MODULES:
        try:
            mod = importlib.import_module(path)
        except Exception as exc:  # a broken build is a reason, not a crash
            errors.append(f"import {path} failed: {type(exc).__name__}: {exc}")
            continue
        fn = getattr(mod, "flash_mla_sparse_fwd", None)
        if fn is None:
            errors.append(f"{path} has no flash_mla_sparse_fwd")
            continue
        params = inspect.signature(fn).parameters
        missing = [p for p in ("attn_sink", "topk_length") if p not in params]
        if missing:
            errors.append(f"{path}.flash_mla_sparse_fwd takes no {'/'.join(missing)} (a FlashMLA older than DeepSeek-V4)")
            continue
        return mod, None
    return None, "vLLM's FlashMLA sparse prefill is unusable: " + "; ".join(errors)


def find_flashinfer_dsv4():
    """``(function, None)`` or ``(None, reason)`` for FlashInfer's DSv4 sparse-MLA decode
    (the module is cached, the function looked up per call)."""
    mod, why = _memoised("flashinfer", ("flashinfer", *FLASHINFER_MODULES), _find_flashinfer_dsv4)
    return (getattr(mod, FLASHINFER_DSV4), None) if mod is not None else (None, why)


def _find_flashinfer_dsv4():
    why = import_reason("flashinfer", what="FlashInfer (flashinfer-python)")
    if why:
        return None, why
    errors = []
    for path in FLASHINFER_MODULES:
        try:
            mod = importlib.import_module(path)
        except Exception as exc:
            errors.append(f"import {path} failed: {type(exc).__name__}: {exc}")
            continue
        if getattr(mod, FLASHINFER_DSV4, None) is not None:
            return mod, None
        errors.append(f"{path} has no {FLASHINFER_DSV4}")
    return None, "FlashInfer has no DeepSeek-V4 sparse-MLA decode: " + "; ".join(errors)


def flashinfer_sm12x_reason(fn) -> str | None:
    """FlashInfer's SM12x path takes the window and compressed segments separately
    (``swa_topk_lens``, ``extra_sparse_indices``); older builds serve SM10x only."""
    params = inspect.signature(fn).parameters
    missing = [p for p in ("swa_topk_lens", "extra_sparse_indices", "extra_sparse_topk_lens") if p not in params]
    if missing:
        return f"FlashInfer's {FLASHINFER_DSV4} takes no {', '.join(missing)} (this build has no SM120/SM121 path)"
    return None


@register_probe("vllm_flashmla")
def _probe_flashmla() -> str | None:
    return find_flashmla()[1]


@register_probe("flashinfer_dsv4")
def _probe_flashinfer() -> str | None:
    return find_flashinfer_dsv4()[1]


@register_probe("flashinfer_dsv4_sm12x")
def _probe_flashinfer_sm12x() -> str | None:
    fn, why = find_flashinfer_dsv4()
    return why or flashinfer_sm12x_reason(fn)
