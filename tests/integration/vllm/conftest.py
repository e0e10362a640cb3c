"""Set-up for the vLLM integration tests.

* The repository root is the package ``swa_backends`` itself, so it holds top-level-looking
  folders (``kernels/``, ``common/``, ``backends/``). ``python -m pytest`` from the root puts
  the root on ``sys.path``, where transformers (imported by vLLM) would then find the pack's
  ``kernels/`` as the hub package ``kernels`` and fail. Where vLLM is installed, the root is
  taken off ``sys.path`` here; ``swa_backends`` itself is found through its install.
* Without a GPU, vLLM's Triton kernels need ``TRITON_INTERPRET=1`` (set by ``tests/conftest.py``)
  and ``CUDA_VISIBLE_DEVICES=`` (else ``vllm.triton_utils`` swaps in a placeholder Triton),
  both before vLLM is imported.
* ``release``: the release subpackage under test (``_release.under_test``: the installed
  vLLM's, else each supported release in turn), for tests of a release's facts.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]


def _is_repo(entry: str) -> bool:
    try:
        return Path(entry or os.getcwd()).resolve() == REPO
    except OSError:
        return False


if importlib.util.find_spec("vllm") is not None:  # the main suite's venv (no vLLM) is left as it is
    sys.path[:] = [p for p in sys.path if not _is_repo(p)]
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def pytest_generate_tests(metafunc):
    if "release" in metafunc.fixturenames:
        import _release

        metafunc.parametrize("release", _release.under_test(), indirect=True, ids=lambda s: f"vllm{s}")


@pytest.fixture(scope="session")
def release(request):
    """The release subpackage of the series under test (an installed vLLM without one fails here,
    saying what to add)."""
    import _release
    from swa_backends.integrations import vllm as integration

    series = request.param
    if series not in integration.RELEASES:
        pytest.fail(_release.missing(_release.installed_version() or series))
    return integration.release_module(series)


@pytest.fixture
def clean_integration(caplog):
    """The integration's process state (log-once memory, patches, routes) fresh before and
    after the test; its log lines captured from INFO up."""
    from swa_backends.integrations import vllm as integration
    from swa_backends.integrations.vllm import patches

    integration._reset_for_tests()
    caplog.set_level(logging.INFO, logger="vllm.swa_backends")
    yield
    patches.restore()
    integration._reset_for_tests()
