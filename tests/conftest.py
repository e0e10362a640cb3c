"""Shared test set-up: Triton's mode, hypothesis profiles and device fixtures.

Without a GPU the suite runs the pack's Triton kernels in Triton's interpreter: Triton
reads ``TRITON_INTERPRET`` when it decorates a kernel, so it is set here, before anything
imports Triton (``import swa_backends`` does not). Profiles: ``ci`` (default; derandomised,
no deadline) and ``dev`` (random). Select with ``SWA_HYPOTHESIS_PROFILE``. Tests that need a
real GPU are marked ``gpu`` and skipped elsewhere.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

# helpers imported from more than one test folder (_tritons, platform_helpers); pytest's default
# "prepend" import mode only puts each test file's own folder on sys.path
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:  # testing/interpreter.py: Triton 3.6's interpreter on NumPy >= 2.4; sparse MLA's reductions at NumPy speed
        from swa_backends.testing.interpreter import fast_reductions, scalar_index_compat

        scalar_index_compat()
        fast_reductions()
    except ImportError:  # no Triton: the Triton tests skip with their reason
        pass
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("SWA_HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """The fuzz suite's counts (tests/dispatch/test_fuzz.py), one line per backend that ran."""
    fuzz = sys.modules.get("test_fuzz")
    if fuzz is None or not getattr(fuzz, "RESULTS", None):
        return
    terminalreporter.write_sep("-", "fuzz suite (tests/dispatch/fuzz_cases.py): outcomes per backend")
    for backend, counts in fuzz.RESULTS.items():
        tried = sum(counts.values())
        failed = sum(counts[k] for k in fuzz.FAILURES)
        terminalreporter.write_line(
            f"{backend:<10} tried {tried}: clear errors {counts['clear']} (+ {counts['schema']} by the custom op "
            f"schema), correct results {counts['ok']}, crashes {counts['crash']}, silent results "
            f"{counts['silent'] + counts['wrong']}, other failures {failed - counts['crash'] - counts['silent'] - counts['wrong']}")
