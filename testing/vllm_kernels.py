"""vLLM's replay-metadata kernels, for the differential against the pack.

``load()`` takes "vLLM's kernels" from one of two places:

* ``SWA_VLLM_KERNELS_DIR=<dir>`` (or ``load(source=dir)``): copies of vLLM's source files,
  for a machine without vLLM (a GPU box: vLLM's wheel cannot travel there). ``<dir>`` holds
  ``model_state.py`` (``vllm/models/deepseek_v41/nvidia/model_state.py``) and ``sparse_swa.py``
  (``vllm/v1/attention/backends/mla/sparse_swa.py``), flat or under those relative paths
  (with or without the leading ``vllm/``). Only the four ``@triton.jit`` functions are taken
  out of the files (``ast``), written to one temporary module and compiled by the installed
  Triton; the rest of each file, which imports vLLM, is never run.
* the installed vLLM (``vllm`` importable): the module attributes themselves (a shim of
  :mod:`swa_backends.integrations.vllm.patches` is looked through to vLLM's original).

The launchers below call each kernel exactly as vLLM 0.33 does at its call site (grid,
strides, constexprs, vLLM's PAD fill around the gather), so a differential needs nothing else
from vLLM.

``load_launchers()`` gives what vLLM's call sites really call (a step's host time depends on
it): the two sparse-SWA kernels through vLLM's own launch objects,
``_COMPUTE_SWA_INDICES_AND_LENS_KERNEL`` and ``_COMPUTE_PREFILL_METADATA_KERNEL``
(``VllmTritonJitKernel`` subclasses: each call binds its arguments with ``inspect`` and maps them
onto the kernel's before ``kernel[grid](**kwargs)``), and the model state's two ``@triton.jit``
functions, launched as ``kernel[grid](...)``. From the installed vLLM those are its module
globals; from copies of the source files, the same classes and functions are taken out of
``sparse_swa.py``, ``jit_warmup.py`` and ``jit_warmup_triton_helper.py`` (``ast``, as above) and
defined on a small base standing in for ``VllmJitKernel`` (``bind_launch_inputs = True``; its
warmup tracing, never on the call path, is not carried), with vLLM's one-line
``next_power_of_2`` restated: every line a launch runs is vLLM's.
"""

from __future__ import annotations

import ast
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

import torch

ENV = "SWA_VLLM_KERNELS_DIR"
FILES = {
    "model_state.py": "models/deepseek_v41/nvidia/model_state.py",
    "sparse_swa.py": "v1/attention/backends/mla/sparse_swa.py",
    # vLLM's launch objects (load_launchers only)
    "jit_warmup.py": "model_executor/warmup/jit_warmup.py",
    "jit_warmup_triton_helper.py": "model_executor/warmup/jit_warmup_triton_helper.py",
}
#: name -> (file, qualified name inside it)
KERNELS = {
    "pad": ("model_state.py", "_pad_replayed_slots_kernel"),
    "gather": ("model_state.py", "_gather_replay_batch_kernel"),
    "swa": ("sparse_swa.py", "_compute_swa_indices_and_lens_kernel"),
    "prefill": ("sparse_swa.py", "ComputePrefillMetadataKernel.kernel"),
}
PAD_SLOT_ID = -1  # vllm/v1/attention/backends/utils.py


@dataclass(frozen=True)
class VllmKernels:
    pad: object
    gather: object
    swa: object
    prefill: object
    origin: str


def _find(root: Path, name: str) -> Path | None:
    rel = FILES[name]
    for cand in (root / name, root / rel, root / "vllm" / rel):
        if cand.is_file():
            return cand
    return None


def _extract(path: Path, qualname: str) -> str:
    """The source of a (possibly class-nested) function, decorators included, minus
    ``@staticmethod``; or of a class (a dotted ``qualname`` ending in a class), as it is."""
    text = path.read_text()
    tree = ast.parse(text)
    parts = qualname.split(".")
    body = tree.body
    node = None
    for i, part in enumerate(parts):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            raise LookupError(f"{qualname} not found in {path}")
        body = node.body
    lines = text.splitlines()
    first = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
    src = textwrap.dedent("\n".join(lines[first: node.end_lineno]))
    if isinstance(node, ast.ClassDef):
        return src
    return "\n".join(ln for ln in src.splitlines() if ln.strip() != "@staticmethod")


def _module_from(parts: list[str], name: str):
    """``parts`` written to one module file and imported (Triton compiles a ``@jit`` function
    from its file's source, so an ``exec`` of a string will not do)."""
    import importlib.util
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="swa_vllm_kernels_"))
    module_path = folder / f"{name}.py"
    module_path.write_text("\n".join(parts))
    spec = importlib.util.spec_from_file_location(f"swa_{name}", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _source_of(root: Path, fname: str, qualname: str) -> list[str]:
    path = _find(root, fname)
    if path is None:
        raise FileNotFoundError(f"{fname} (vllm/{FILES[fname]}) not under {root}")
    return [f"# {path}: {qualname}", _extract(path, qualname), "", ""]


def _from_source(root: Path) -> VllmKernels:
    """The four kernels' sources, written to one module file and imported."""
    parts = ["import triton", "import triton.language as tl", ""]
    names = {}
    for key, (fname, qualname) in KERNELS.items():
        parts += _source_of(root, fname, qualname)
        names[key] = qualname.split(".")[-1]
    module = _module_from(parts, "vllm_replay_kernels")
    return VllmKernels(**{key: getattr(module, name) for key, name in names.items()},
                       origin=f"source files under {root}")


def _from_installed() -> VllmKernels:
    import vllm
    from vllm.models.deepseek_v41.nvidia import model_state as ms
    from vllm.v1.attention.backends.mla import sparse_swa

    def original(obj):
        return getattr(obj, "_swa_original", obj)

    return VllmKernels(pad=original(ms._pad_replayed_slots_kernel), gather=original(ms._gather_replay_batch_kernel),
                       swa=sparse_swa._compute_swa_indices_and_lens_kernel,
                       prefill=sparse_swa.ComputePrefillMetadataKernel.kernel,
                       origin=f"installed vllm {getattr(vllm, '__version__', '?')}")


def load(source: str | os.PathLike | None = None) -> tuple[VllmKernels | None, str]:
    """``(kernels, where from)`` or ``(None, why not)``."""
    return _load(source, _from_source, _from_installed, "model_state.py and sparse_swa.py")


def _load(source, from_source, installed, files: str) -> tuple:
    """``from_source(folder)`` when ``source`` or ``$SWA_VLLM_KERNELS_DIR`` names one, else
    ``installed()`` when vLLM is: ``(result, its origin)``, or ``(None, why not)``."""
    source = source or os.environ.get(ENV)
    if source:
        try:
            k = from_source(Path(source))
            return k, k.origin
        except Exception as exc:  # noqa: BLE001
            return None, f"{ENV}={source}: {type(exc).__name__}: {exc}"
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None, f"vLLM is not installed and {ENV} is not set (copies of vLLM's {files})"
    try:
        k = installed()
        return k, k.origin
    except Exception as exc:  # noqa: BLE001
        return None, f"vLLM's kernels did not import: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class VllmLaunchers:
    """What vLLM 0.33's replay-metadata call sites call: ``pad[(num_reqs,)](...)`` and
    ``gather[(num_reqs,)](...)`` (``@triton.jit`` functions), ``swa(...)`` and ``prefill(...)``
    (vLLM's ``VllmTritonJitKernel`` launch objects, called with the builders' arguments)."""

    pad: object
    gather: object
    swa: object
    prefill: object
    origin: str


#: (file, qualified name) of what ``load_launchers`` takes out of the source files, in order
LAUNCH_SOURCES = (
    ("jit_warmup_triton_helper.py", "_LaunchBindingPlan"),
    ("jit_warmup_triton_helper.py", "_launch_binding_plan"),
    ("jit_warmup.py", "kernel_launcher"),
    ("jit_warmup_triton_helper.py", "VllmTritonJitKernel"),
    ("sparse_swa.py", "_compute_swa_indices_and_lens_kernel"),
    ("sparse_swa.py", "ComputeSWAIndicesAndLensKernel"),
    ("sparse_swa.py", "ComputePrefillMetadataKernel"),
    ("model_state.py", "_pad_replayed_slots_kernel"),
    ("model_state.py", "_gather_replay_batch_kernel"),
)

_LAUNCH_PRELUDE = '''\
import ast
import inspect
from abc import abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property, wraps
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch
import triton
import triton.language as tl

CompileKeyT = TypeVar("CompileKeyT")
LaunchSpec = Any  # type aliases and config types, annotations only
VllmConfig = Any


def next_power_of_2(n: int) -> int:  # vllm.utils.math_utils, restated
    return 1 if n < 1 else 1 << (n - 1).bit_length()


class VllmJitKernel(Generic[CompileKeyT]):
    """What vLLM's launch path reads of its JIT-kernel base (warmup tracing not carried)."""

    bind_launch_inputs = True

    def __init__(self) -> None:
        self._compiled_cache = {}


'''


def _launchers_from_source(root: Path) -> VllmLaunchers:
    parts = [_LAUNCH_PRELUDE]
    for fname, qualname in LAUNCH_SOURCES:
        parts += _source_of(root, fname, qualname)
    module = _module_from(parts, "vllm_replay_launchers")
    return VllmLaunchers(pad=module._pad_replayed_slots_kernel, gather=module._gather_replay_batch_kernel,
                         swa=module.ComputeSWAIndicesAndLensKernel(), prefill=module.ComputePrefillMetadataKernel(),
                         origin=f"source files under {root}")


def _launchers_installed() -> VllmLaunchers:
    import vllm
    from vllm.models.deepseek_v41.nvidia import model_state as ms
    from vllm.v1.attention.backends.mla import sparse_swa

    def original(obj):
        return getattr(obj, "_swa_original", obj)

    return VllmLaunchers(pad=original(ms._pad_replayed_slots_kernel), gather=original(ms._gather_replay_batch_kernel),
                         swa=original(sparse_swa._COMPUTE_SWA_INDICES_AND_LENS_KERNEL),
                         prefill=original(sparse_swa._COMPUTE_PREFILL_METADATA_KERNEL),
                         origin=f"installed vllm {getattr(vllm, '__version__', '?')}")


def load_launchers(source: str | os.PathLike | None = None) -> tuple[VllmLaunchers | None, str]:
    """``(launchers, where from)`` or ``(None, why not)``: :func:`load`'s sources (the
    folder needs ``jit_warmup.py`` and ``jit_warmup_triton_helper.py`` too)."""
    return _load(source, _launchers_from_source, _launchers_installed,
                 "model_state.py, sparse_swa.py, jit_warmup.py and jit_warmup_triton_helper.py")


# ---------------------------------------------------------------------------------------
# vLLM 0.33's launches, as at its call sites
# ---------------------------------------------------------------------------------------


def pad_replayed_slots(k: VllmKernels, slot_mappings, cacheable_groups, query_start_loc, positions, replay_start,
                       window: int, num_reqs: int) -> None:
    """``DeepseekV41ModelState.prepare_attn`` (model_state.py L386)."""
    k.pad[(num_reqs,)](slot_mappings, slot_mappings.stride(0), cacheable_groups, query_start_loc, positions,
                       replay_start, window, PAD_SLOT_ID, NUM_GROUPS=cacheable_groups.numel(), BLOCK=1024)


def swa_indices_and_lens(k: VllmKernels, swa_indices, swa_lens, window_size, index_width, query_start_loc, seq_lens,
                         token_to_req_indices, is_valid_token, block_table, block_size, replay_start, *, num_tokens,
                         token_offset) -> None:
    """``ComputeSWAIndicesAndLensKernel.__call__``'s launch (sparse_swa.py L1199-1231), no image."""
    if num_tokens == 0:
        return
    k.swa[(num_tokens,)](swa_indices, swa_indices.stride(0), swa_lens, window_size, index_width, swa_lens, swa_lens,
                         query_start_loc, seq_lens, token_to_req_indices, is_valid_token, block_table,
                         block_table.stride(0), block_size, replay_start, token_offset, HAS_IMAGE=False,
                         TRITON_BLOCK_SIZE=1024)


def prefill_gather_lens(k: VllmKernels, out, seq_lens, query_start_loc, replay_start, num_prefills, num_decodes,
                        window_size) -> None:
    """``ComputePrefillMetadataKernel.__call__``'s launch (grid (1,), BLOCK_SIZE = next pow2)."""
    block = 1 << max(num_prefills - 1, 0).bit_length()
    k.prefill[(1,)](out, seq_lens, query_start_loc, replay_start, num_prefills, num_decodes, window_size,
                    BLOCK_SIZE=block)


def gather_replay_batch(k: VllmKernels, query_start_loc, dropped_before, seq_lens, replay_start, positions,
                        slot_mappings, rows, kept_query_start_loc, kept_positions, kept_slot_mappings_buf, kept_kv_start,
                        window: int, num_reqs: int, num_tokens: int, num_padded: int) -> torch.Tensor:
    """``DeepseekV41ModelState._kept_input_batch``'s PAD fill and launch (model_state.py
    L684-707); returns the kept slot mappings view it hands on."""
    kept = kept_slot_mappings_buf[:, :num_padded]
    kept[:, num_tokens:].fill_(PAD_SLOT_ID)
    k.gather[(num_reqs,)](query_start_loc, dropped_before, seq_lens, replay_start, positions, slot_mappings,
                          slot_mappings.stride(0), rows, kept_query_start_loc, kept_positions, kept,
                          kept.stride(0), kept_kv_start, window, NUM_GROUPS=slot_mappings.shape[0], BLOCK=1024)
    return kept


def token_to_req_indices(query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """What vLLM's ``compute_token_to_req_indices`` gives for tokens inside the batch
    (``searchsorted`` over the device ``query_start_loc``); tokens past it map to the last
    request (invalid there anyway)."""
    from ..common.ops._batch import token_view

    return token_view(query_start_loc, None, num_tokens).req.to(torch.int32)
