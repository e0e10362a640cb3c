"""vLLM runs DeepSeek-V4.1's replay metadata through swa_backends.

:func:`install` is called by ``swa_backends.plugin.register()``, the pack's
``vllm.general_plugins`` entry point, in every vLLM process. It changes nothing unless

* ``SWA_BACKENDS_VLLM`` is not ``0`` (``0``/``off``/``false``/``no``: the whole plugin is off,
  ``plugin.register()`` defines no op either; ``force``: skip the platform check below --
  tests on a CPU-only machine);
* vLLM is importable and its release series has a subpackage in :data:`RELEASES` (the one
  place the supported releases are declared);
* vLLM's platform is CUDA or ROCm (the pack's Triton kernels; other platforms keep vLLM's
  path untouched, e.g. vllm-ascend's NPU);
* the release's modules import here (its model class, patches and the runtime: a worker
  imports them when it builds the model);
* every vLLM definition the integration relies on matches the release its subpackage was
  written for (:mod:`.seams` checks the subpackage's table, ``v0_33/seams.py``,
  ``v0_34/seams.py``): a ``0.33.x`` that changed one is left untouched, with one log line naming
  the seams that differ.

Then it registers the architecture ``DeepseekV41ForCausalLM`` under the same name as a
lazy ``"module:Class"`` string (vLLM's supported extension point,
``ModelRegistry.register_model``): the release's ``model:DeepseekV41ForCausalLM``
(``swa_backends.integrations.vllm.v0_33.model:DeepseekV41ForCausalLM`` for 0.33 and for 0.34,
whose ``model`` part is 0.33's), a thin
subclass of the class vLLM would pick on this platform. Nothing is patched here: when that
model is built in a worker it computes the pack's capability decision from vLLM's config
(:mod:`.config`), applies the release's few unavoidable patches and routes the sides the pack
turns on. Every outcome is logged once; every failure is one warning and vLLM's own path.

The layout: a version-free core here -- this installer, the config mapping (:mod:`.config`),
the runtime that answers vLLM's call sites (:mod:`.runtime`), the patch and seam machinery
(:mod:`.patches`, :mod:`.seams`), the decision command (``__main__``, :mod:`.target`) -- and one
subpackage per vLLM release series holding everything tied to that release, each module the
release's part of the core module of the same name:

* ``seams.py``: the seam table (``SEAMS``, ``FILES``) :mod:`.seams` checks;
* ``patches.py``: the patched globals and their shims (``PATCHES``), applied by :mod:`.patches`;
* ``model.py``: the model class and the mixins over the release's model state and replay layers;
* ``config.py``: the facts :mod:`.config` reads (vLLM's lists it mirrors, the lines its rules restate);
* ``target.py``: the release's own rules the decision command re-derives for another platform;
* ``kernels.py``: where vLLM's replay-metadata kernels live and how its call sites launch them
  (``swa_backends.testing.vllm_kernels`` loads them for the differential).

Adding a release (the checklist; 0.34 was added this way):

1. add ``v0_35/`` with its ``RELEASE`` and ``"0.35": "swa_backends.integrations.vllm.v0_35"`` in
   :data:`RELEASES` (and the subpackage in pyproject's packages); start its ``seams`` from the
   newest table's copy;
2. with vLLM 0.35 installed, run ``python -m swa_backends.integrations.vllm.v0_35.seams``: it holds the installed
   vLLM against the copy's table and marks every seam that differs; read vLLM's diff of each.
   A part whose every relied-on definition kept its parameters and (where it is reproduced or
   patched) its fingerprint is the previous release's module, named in the release's
   ``SHARED_PARTS`` (0.34's ``model``, ``patches``, ``kernels`` are 0.33's: ``{"model": "v0_33",
   ...}``); a part that must change is the release's own file. A rule the
   core restates that the release changed is a function of the releases' ``config`` modules,
   which the core reads from ``current_release()`` (0.34 moved ``model_runner``,
   ``sequence_parallel_moe`` and ``rocm_replay_off`` there). Then take the values the script
   prints into the table;
3. point :data:`TESTED_VLLM` at the newest release and run ``tests/integration/vllm`` against
   each supported one: the tests pick the installed release's subpackage
   (``tests/integration/vllm/_release.py``); ``test_releases.py`` fails, naming the fix, while the installed
   vLLM has none. CI installs every subpackage's ``RELEASE`` (``.ci/install_vllm.py``);
4. drop a release series from :data:`RELEASES` (and its subpackage) when it is no longer supported,
   moving a module the newer releases share (``SHARED_PARTS``) into the newest of them first.
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
from types import ModuleType

from ...common.validation import env_switch

#: vLLM release series (major.minor) -> the subpackage holding everything the integration ties to
#: that release. The one place the supported releases are declared: the version gate, the tests
#: (``tests/integration/vllm/_release.py``) and the decision command read it.
RELEASES: dict[str, str] = {"0.33": "swa_backends.integrations.vllm.v0_33",
                             "0.34": "swa_backends.integrations.vllm.v0_34"}
#: the modules every release subpackage holds (each imported on first access: ``release.model``)
RELEASE_PARTS = ("seams", "patches", "model", "config", "target", "kernels")
#: the supported release series (:data:`RELEASES`' keys)
SUPPORTED_VLLM: tuple[str, ...] = tuple(RELEASES)
#: The newest release the integration is tested against: the ``RELEASE`` of one subpackage, every
#: pinned signature and source hash of which was taken from it, and :func:`current_release`'s
#: fallback. CI installs every subpackage's ``RELEASE``, each in a venv of its own (``.ci/run``).
TESTED_VLLM = "0.34.0"

#: The environment switch: ``0``/``off``/``false``/``no`` turn the whole plugin off;
#: ``force`` skips the platform check; anything else (or unset) is automatic.
ENV = "SWA_BACKENDS_VLLM"

ARCH = "DeepseekV41ForCausalLM"

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
    checked); ``release``: the release subpackage chosen (None: none was)."""

    installed: bool
    reason: str
    vllm_version: str | None = None
    mode: str = "auto"
    seams: tuple[str, ...] = ()
    seam_check_s: float | None = None
    release: str | None = None


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
    return version is not None and release_series(version) in RELEASES


class UnsupportedRelease(LookupError):
    """A vLLM release with no subpackage in :data:`RELEASES`."""


def release_module(version: str) -> ModuleType:
    """The subpackage of ``version``'s release series (``"0.33.2"`` or ``"0.33"`` ->
    ``swa_backends.integrations.vllm.v0_33``; its parts, :data:`RELEASE_PARTS`, import on first
    access and import no vLLM then);
    :class:`UnsupportedRelease` names the supported series when there is none."""
    name = RELEASES.get(release_series(version) or "")
    if name is None:
        raise UnsupportedRelease(f"vLLM {version} is not a supported release (supported: "
                                 f"{', '.join(s + '.x' for s in RELEASES)})")
    return importlib.import_module(name)


def current_release() -> ModuleType:
    """The release whose facts apply in this process: the installed vLLM's subpackage; where
    vLLM is not installed or its release has none, :data:`TESTED_VLLM`'s (configs built by
    hand, copies of vLLM's kernel files on a machine without vLLM, the decision command
    holding an unsupported vLLM against the newest table). :func:`install`
    never falls back: an unsupported vLLM is left untouched."""
    version = _installed_version()
    return release_module(version if supported(version) else TESTED_VLLM)


def part_module_name(release: str, part: str, shared: dict[str, str]) -> str:
    """The module that is release subpackage ``release``'s ``part`` (one of :data:`RELEASE_PARTS`):
    its own, or, where the release's ``SHARED_PARTS`` names an earlier release for ``part``, that
    release's module (0.34's ``model`` is ``v0_33.model``). AttributeError for any other name."""
    if part not in RELEASE_PARTS:
        raise AttributeError(f"module {release!r} has no attribute {part!r}")
    owner = shared.get(part)
    return f"{__name__}.{owner}.{part}" if owner else f"{release}.{part}"


def release_part(release: str, part: str, shared: dict[str, str]) -> ModuleType:
    """A release subpackage's ``__getattr__``: its ``part``, imported on first access
    (:func:`part_module_name`)."""
    return importlib.import_module(part_module_name(release, part, shared))


def model_class_path(release: ModuleType) -> str:
    """The ``"module:Class"`` string vLLM's registry is given for ``release``: the module that
    is its ``model`` part (read without importing it)."""
    return f"{part_module_name(release.__name__, 'model', release.SHARED_PARTS)}:{ARCH}"


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


_version_read: list[str | None] = []


def _installed_version() -> str | None:
    """:func:`vllm_version`, read once per process (the installed vLLM does not change)."""
    if not _version_read:
        _version_read.append(vllm_version())
    return _version_read[0]


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
    try:
        release = release_module(version)
    except UnsupportedRelease as exc:
        return InstallStatus(False, f"{exc}; vLLM is left untouched", version, switch)
    from vllm.platforms import current_platform

    platform = type(current_platform).__name__
    if switch != "force" and not (current_platform.is_cuda() or current_platform.is_rocm()):
        return InstallStatus(False, f"vLLM platform {platform} is neither CUDA nor ROCm: vLLM is left untouched "
                                    f"({ENV}=force overrides)", version, switch, release=release.__name__)
    model_class = model_class_path(release)
    try:  # what a worker imports when it builds the model: proven before vLLM is told about it
        importlib.import_module(model_class.split(":")[0])
    except Exception as exc:  # noqa: BLE001
        return InstallStatus(False, f"the integration's model module does not import ({type(exc).__name__}: {exc}); "
                                    "vLLM is left untouched", version, switch, release=release.__name__)
    from . import seams

    table = release.seams
    t0 = time.perf_counter()
    differ = tuple(seams.check(table.SEAMS, files=table.FILES,
                               platform="rocm" if current_platform.is_rocm() else "cuda"))
    took = time.perf_counter() - t0
    if differ:
        return InstallStatus(False, f"vLLM {version}: {len(differ)} seam(s) the integration relies on differ from "
                                    f"{release.RELEASE}'s: {'; '.join(differ)}; vLLM is left untouched", version,
                             switch, differ, took, release.__name__)
    from vllm.model_executor.models.registry import ModelRegistry

    ModelRegistry.register_model(ARCH, model_class)
    return InstallStatus(True, f"vLLM {version} on {platform}: {ARCH} resolves to {model_class}; its replay "
                               "metadata runs through the pack where swa_backends.capabilities() turns a side on "
                               f"(the vLLM code it relies on matches {release.RELEASE}'s)", version, switch, (), took,
                         release.__name__)


def status() -> InstallStatus | None:
    """What :func:`install` did in this process (None before it ran)."""
    return _status


def _reset_for_tests() -> None:
    global _status
    with _lock:
        _status = None
        _logged.clear()


__all__ = ["ARCH", "ENV", "RELEASES", "RELEASE_PARTS", "SUPPORTED_VLLM", "TESTED_VLLM", "InstallStatus",
           "UnsupportedRelease", "current_release", "install", "mode", "model_class_path", "release_module", "status",
           "supported", "vllm_version"]
