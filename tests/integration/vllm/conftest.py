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


@pytest.fixture
def as_release(release, monkeypatch):
    """``release``, whose facts and rules the decision then reads (``config.facts()``:
    ``current_release()`` answers ``release``), for the tests of a decision on config objects."""
    from swa_backends.integrations import vllm as integration

    monkeypatch.setattr(integration, "current_release", lambda: release)
    return release


@pytest.fixture
def with_v1(as_release):
    """``as_release`` for a release that still has model runner V1 (0.33); skips the others."""
    import _configs

    if as_release.config.model_runner(_configs.vllm_config(use_v2_model_runner=False)) != "v1":
        pytest.skip(f"vLLM {as_release.RELEASE} has model runner V2 only")
    return as_release


@pytest.fixture
def rocm_turn_on(as_release):
    """``as_release`` for a release where the pack turns on the encoder replay vLLM keeps off on
    ROCm (0.33); skips the others (0.34 keeps it on itself on CDNA 3 and 4)."""
    if not as_release.config.PACK_TURNS_ROCM_ENCODER_ON:
        pytest.skip(f"with vLLM {as_release.RELEASE} the pack does not turn encoder replay on on ROCm")
    return as_release
