"""Serving-engine registration: the ``vllm.general_plugins`` entry point.

vLLM (and vllm-ascend, which runs on vLLM's loader) calls every entry point of the group
``vllm.general_plugins`` whose name passes the ``VLLM_PLUGINS`` filter, with no arguments,
in every process it starts (API server, engine core, each worker). :func:`register` is that
function for this pack. It is

* idempotent: the ops are defined once per process; later calls return the same names;
* cheap: it imports this package (numpy, PyYAML; torch is already loaded) and defines
  the custom ops (their cost: bench/README.md, "Host costs on the CPU"); no device
  query, no kernel build, no ``select()``: a backend is chosen for a device when the
  first op runs there;
* vendor-free where there is no vLLM: no vLLM, vllm-ascend, torch_npu, Triton, FlashInfer
  or AITER import here. Those load lazily, only for the variant chosen on the device that runs;
* the vLLM integration's installer: when vLLM is importable (it is, when vLLM calls this),
  :func:`swa_backends.integrations.vllm.install` registers the pack's DeepSeek-V4.1
  architecture (supported vLLM releases on CUDA and ROCm only, after importing the
  integration's model module and checking the vLLM code it relies on against the pinned
  release, which is quick through unchanged files; their costs are in bench/README.md's
  "Host costs on the CPU"; nothing more of vLLM is imported). It never raises: a failure is
  one warning and vLLM's own path;
* switched off whole by ``SWA_BACKENDS_VLLM=0`` (or ``off``, ``false``, ``no``): no custom
  op is defined and vLLM is left untouched, with one log line.

It is **not** a ``vllm.platform_plugins`` entry: only one out-of-tree platform can be
active (vllm-ascend is one), and a kernel pack must coexist with it. With ``VLLM_PLUGINS``
set, it is one whitelist for every plugin group: list this plugin's name next to every other
plugin the deployment needs (vllm-ascend's general plugins are ``ascend_kv_connector``,
``ascend_model_loader``, ``ascend_service_profiling`` and ``ascend_model``, its platform plugin
``ascend``), or leave it unset.
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
    """Define the pack's ops as ``torch.ops.swa_backends.*`` (once per process), install the
    vLLM integration where vLLM is importable, and return the ops' qualified names
    (``swa_backends::gather_rows``, ...; empty, with one warning, if defining them failed;
    empty, with one log line, when ``SWA_BACKENDS_VLLM`` switches the plugin off).
    Never raises."""
    global _registered
    if _registered is not None:
        return _registered
    with _lock:
        if _registered is None:
            if _switched_off():
                _registered = ()
                return _registered
            try:
                from . import torch_ops  # defining the custom ops is the import's effect

                names = tuple(torch_ops.qualified_names())
                logger.debug("swa_backends: %d ops registered under torch.ops.%s", len(names), torch_ops.NAMESPACE)
            except Exception as exc:  # noqa: BLE001 - loading the plugin never stops vLLM from starting
                names = ()
                logger.warning("swa_backends: defining torch.ops.swa_backends failed (%s: %s); the pack's Python "
                               "API is unaffected", type(exc).__name__, exc)
            _registered = names
            _install_vllm()
    return _registered


def _switched_off() -> bool:
    """``SWA_BACKENDS_VLLM`` turns the whole plugin off (the integration's ``install()`` logs
    the one line and records the switch in its status); never raises."""
    try:
        from .integrations import vllm as integration

        if integration.mode() != "off":
            return False
        integration.install()
        return True
    except Exception as exc:  # noqa: BLE001 - loading the plugin never stops vLLM from starting
        logger.warning("swa_backends: reading SWA_BACKENDS_VLLM failed (%s: %s); the plugin stays off",
                       type(exc).__name__, exc)
        return True


def _install_vllm() -> None:
    """The vLLM integration (``swa_backends.integrations.vllm.install``), when vLLM can be
    imported; never raises."""
    try:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            return
        from .integrations.vllm import install

        install()
    except Exception as exc:  # noqa: BLE001 - loading the plugin never stops vLLM from starting
        logger.warning("swa_backends: the vLLM integration failed to install (%s: %s); vLLM's own path is used",
                       type(exc).__name__, exc)


def registered() -> bool:
    """Whether :func:`register` has run in this process."""
    return _registered is not None
