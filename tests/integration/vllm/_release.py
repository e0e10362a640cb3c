"""The vLLM release the integration's tests run against (no vLLM import).

Everything the integration ties to a release lives in its subpackage
(``swa_backends.integrations.vllm.RELEASES``: ``"0.33"`` -> ``...vllm.v0_33``). The tests take
it from here rather than naming one:

* :func:`under_test`: the release series to test: the installed vLLM's, where vLLM is
  installed; every supported series where it is not (the tests on config objects and tables
  run once per release); the ``release`` fixture (``conftest.py``) is parametrised by it;
* :func:`installed`: the installed vLLM's subpackage, for the modules that need vLLM (each
  binds ``release.model``, ``release.patches``, ... at import). Where the installed vLLM has no
  subpackage those modules are skipped with the reason, and ``test_releases.py`` fails naming
  what to add.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from swa_backends.integrations import vllm as integration


def installed_version() -> str | None:
    return integration.vllm_version()


def under_test() -> list[str]:
    version = installed_version()
    if version is None:
        return list(integration.RELEASES)
    return [integration.release_series(version) or version]


def missing(version: str) -> str:
    """What to do for an installed vLLM without a release subpackage."""
    series = integration.release_series(version) or version
    return (f"vLLM {version} is installed and the integration has no subpackage for its release {series} "
            f"(RELEASES: {', '.join(integration.RELEASES)}): add integrations/vllm/v{series.replace('.', '_')}/ "
            f"and its RELEASES entry (the checklist in integrations/vllm/__init__.py)")


def installed() -> ModuleType:
    """The installed vLLM's release subpackage; skips the calling test module where vLLM is
    missing or its release has no subpackage (``test_releases.py`` fails for the latter)."""
    version = installed_version()
    if version is None:
        pytest.skip("needs vLLM (the CI stage installs vllm==TESTED_VLLM in its own venv)", allow_module_level=True)
    if not integration.supported(version):
        pytest.skip(missing(version), allow_module_level=True)
    return integration.release_module(version)
