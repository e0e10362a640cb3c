"""vLLM runs DeepSeek-V4.1's replay metadata through swa_backends.

:func:`install` is called by ``swa_backends.plugin.register()``, the pack's
``vllm.general_plugins`` entry point, in every vLLM process. It changes nothing unless

* ``SWA_BACKENDS_VLLM`` is not ``0`` (``0``/``off``/``false``/``no``: the whole plugin is off,
  ``plugin.register()`` defines no op either; ``force``: skip the platform check below --
  tests on a CPU-only machine);
* vLLM is importable and its release series is in :data:`SUPPORTED_VLLM` (the one place
  the supported versions are declared);
* vLLM's platform is CUDA or ROCm (the pack's Triton kernels; other platforms keep vLLM's
  path untouched, e.g. vllm-ascend's NPU);
* the integration's own modules import here (the model class, its runtime and patches: a
  worker imports them when it builds the model);
* every vLLM definition the integration relies on matches the release it was written for
  (:mod:`.seams`, the table :mod:`.seams_v0_33`): a ``0.33.x`` that changed one is left
  untouched, with one log line naming the seams that differ.

Then it registers the architecture ``DeepseekV41ForCausalLM`` under the same name as a
lazy ``"module:Class"`` string (vLLM's supported extension point,
``ModelRegistry.register_model``): :class:`swa_backends.integrations.vllm.model.DeepseekV41ForCausalLM`,
a thin subclass of the class vLLM would pick on this platform. Nothing is patched here: when
that model is built in a worker it computes the pack's capability decision from vLLM's
config, applies the few unavoidable patches (:mod:`~swa_backends.integrations.vllm.patches`)
and routes the sides the pack turns on. Every outcome is logged once; every failure is one
warning and vLLM's own path.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import threading
import time
from dataclasses import dataclass

from ...common.validation import env_switch

#: vLLM release series (major.minor) this integration supports. The one place they are declared:
#: the version gate, the patches' reasons and the CI stage (which installs :data:`TESTED_VLLM`) read it.
SUPPORTED_VLLM: tuple[str, ...] = ("0.33",)
#: The release CI installs and every pinned signature and source hash was taken from.
TESTED_VLLM = "0.33.0"

#: The environment switch: ``0``/``off``/``false``/``no`` turn the whole plugin off;
#: ``force`` skips the platform check; anything else (or unset) is automatic.
ENV = "SWA_BACKENDS_VLLM"

ARCH = "DeepseekV41ForCausalLM"
MODEL_CLASS = "swa_backends.integrations.vllm.model:DeepseekV41ForCausalLM"

logger = logging.getLogger("vllm.swa_backends")

_lock = threading.Lock()
_status: "InstallStatus | None" = None
_logged: set[str] = set()


def log_once(level: int, msg: str, *args) -> None:
    """Log ``msg % args`` once per process (at ``level``)."""
    text = msg % args if args else msg
    if text in _logged:
        return
    _logged.add(text)
    logger.log(level, "swa_backends: %s", text)


@dataclass(frozen=True)
class InstallStatus:
    """``installed``: the architecture is registered; ``reason``: why (or why not);
    ``vllm_version``: the vLLM found (None when there is none); ``mode``: the switch;
    ``seams``: the seams that differ from the pinned release (:mod:`.seams`; empty when none
    does or they were not checked); ``seam_check_s``: what checking them took (None: not
    checked)."""

    installed: bool
    reason: str
    vllm_version: str | None = None
    mode: str = "auto"
    seams: tuple[str, ...] = ()
    seam_check_s: float | None = None


def mode() -> str:
    """``off`` (the pack's off words: ``common.validation.env_switch``), ``force`` or ``auto``
    from ``SWA_BACKENDS_VLLM``."""
    if os.environ.get(ENV, "").strip().lower() == "force":
        return "force"
    return "off" if env_switch(ENV) is False else "auto"


def release_series(version: str) -> str | None:
    """``"0.33.1.dev3+gabc"`` -> ``"0.33"``."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def supported(version: str | None) -> bool:
    return version is not None and release_series(version) in SUPPORTED_VLLM


def vllm_version() -> str | None:
    """The installed vLLM's version (distribution metadata, else ``vllm.__version__``),
    None when vLLM is not importable. Imports nothing when vLLM is absent."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        import vllm

        return getattr(vllm, "__version__", None)


def install() -> InstallStatus:
    """Register the pack's DeepSeek-V4.1 architecture with vLLM (once per process).

    Never raises: a failure is one warning and leaves vLLM untouched."""
    global _status
    if _status is not None:
        return _status
    with _lock:
        if _status is None:
            try:
                status = _install()
            except Exception as exc:  # noqa: BLE001 - never stop vLLM from starting
                status = InstallStatus(False, f"integration failed to install ({type(exc).__name__}: {exc}); "
                                              "vLLM's own DeepSeek-V4.1 path is used", None, mode())
                log_once(logging.WARNING, "%s", status.reason)
            else:
                level = logging.INFO if status.installed or status.vllm_version is None else logging.WARNING
                if status.mode == "off":
                    level = logging.INFO
                log_once(level, "%s", status.reason)
            _status = status
    return _status


def _install() -> InstallStatus:
    switch = mode()
    if switch == "off":
        return InstallStatus(False, f"{ENV}={os.environ.get(ENV)}: the swa_backends plugin is off (no "
                                    "torch.ops.swa_backends op is defined, vLLM is left untouched)", None, switch)
    version = vllm_version()
    if version is None:
        return InstallStatus(False, "vLLM is not importable: nothing to integrate with", None, switch)
    if not supported(version):
        return InstallStatus(False, f"vLLM {version} is not a supported release (supported: "
                                    f"{', '.join(s + '.x' for s in SUPPORTED_VLLM)}); vLLM is left untouched",
                             version, switch)
    from vllm.platforms import current_platform

    platform = type(current_platform).__name__
    if switch != "force" and not (current_platform.is_cuda() or current_platform.is_rocm()):
        return InstallStatus(False, f"vLLM platform {platform} is neither CUDA nor ROCm: vLLM is left untouched "
                                    f"({ENV}=force overrides)", version, switch)
    try:  # what a worker imports when it builds the model: proven before vLLM is told about it
        importlib.import_module(MODEL_CLASS.split(":")[0])
    except Exception as exc:  # noqa: BLE001
        return InstallStatus(False, f"the integration's model module does not import ({type(exc).__name__}: {exc}); "
                                    "vLLM is left untouched", version, switch)
    from . import seams
    from .seams_v0_33 import FILES, RELEASE, SEAMS

    t0 = time.perf_counter()
    differ = tuple(seams.check(SEAMS, files=FILES, platform="rocm" if current_platform.is_rocm() else "cuda"))
    took = time.perf_counter() - t0
    if differ:
        return InstallStatus(False, f"vLLM {version}: {len(differ)} seam(s) the integration relies on differ from "
                                    f"{RELEASE}'s: {'; '.join(differ)}; vLLM is left untouched", version, switch,
                             differ, took)
    from vllm.model_executor.models.registry import ModelRegistry

    ModelRegistry.register_model(ARCH, MODEL_CLASS)
    return InstallStatus(True, f"vLLM {version} on {platform}: {ARCH} resolves to {MODEL_CLASS}; its replay "
                               "metadata runs through the pack where swa_backends.capabilities() turns a side on "
                               f"(the vLLM code it relies on matches {RELEASE}'s)", version, switch, (), took)


def status() -> InstallStatus | None:
    """What :func:`install` did in this process (None before it ran)."""
    return _status


def _reset_for_tests() -> None:
    global _status
    with _lock:
        _status = None
        _logged.clear()


__all__ = ["ARCH", "ENV", "InstallStatus", "MODEL_CLASS", "SUPPORTED_VLLM", "TESTED_VLLM", "install", "mode",
           "status", "supported", "vllm_version"]
