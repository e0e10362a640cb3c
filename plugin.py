"""Serving-engine registration: the ``vllm.general_plugins`` entry point.

vLLM (and vllm-ascend, which runs on vLLM's loader) calls every entry point of the group
``vllm.general_plugins`` whose name passes the ``VLLM_PLUGINS`` filter, with no arguments,
in every process it starts (API server, engine core, each worker). :func:`register` is that
function for this pack. It is

* idempotent: the ops are defined once per process; later calls return the same names;
* cheap: it imports this package (numpy, PyYAML; torch is already loaded) and defines
  the custom ops -- about 80 ms + 60 ms on this project's 2-core CI machine; no device
  query, no kernel build, no ``select()``: a backend is chosen for a device when the
  first op runs there;
* vendor-free: no vLLM, vllm-ascend, torch_npu, Triton, FlashInfer or AITER import here.
  Those load lazily, only for the variant chosen on the device that runs.

It is **not** a ``vllm.platform_plugins`` entry: only one out-of-tree platform can be
active (vllm-ascend is one), and a kernel pack must coexist with it. With ``VLLM_PLUGINS``
set, list this plugin's name next to the platform's (``VLLM_PLUGINS=ascend,swa_backends``).
"""

from __future__ import annotations

import logging
import threading

#: The entry-point name (what ``VLLM_PLUGINS`` lists) and its group.
ENTRY_POINT_NAME = "swa_backends"
ENTRY_POINT_GROUP = "vllm.general_plugins"

_lock = threading.Lock()
_registered: tuple[str, ...] | None = None

logger = logging.getLogger(__name__)


def register() -> tuple[str, ...]:
    """Define the pack's ops as ``torch.ops.swa_backends.*`` (once per process) and return
    their qualified names (``swa_backends::gather_rows``, ...)."""
    global _registered
    if _registered is not None:
        return _registered
    with _lock:
        if _registered is None:
            from . import torch_ops  # defining the custom ops is the import's effect

            _registered = tuple(torch_ops.qualified_names())
            logger.debug("swa_backends: %d ops registered under torch.ops.%s", len(_registered), torch_ops.NAMESPACE)
    return _registered


def registered() -> bool:
    """Whether :func:`register` has run in this process."""
    return _registered is not None
