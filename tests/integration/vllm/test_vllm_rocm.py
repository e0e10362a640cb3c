"""vLLM's ROCm DeepSeek-V4.1 path with the pack, on a faked gfx942 and a faked gfx950 (needs vLLM).

vLLM's ROCm modules read the GPU's arch once, at import, so each arch runs ``rocm/`` in its
own pytest process (``rocm/conftest.py`` fakes the arch there; that folder is not collected
otherwise). See ``rocm/test_rocm_path.py`` for what is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

from swa_backends.integrations.vllm import vllm_version  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_rocm_path_on_a_faked_gpu(arch):
    env = dict(os.environ, SWA_TEST_FAKE_GCN=arch, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", str(HERE / "rocm")],
                          env=env, cwd=HERE, capture_output=True, text=True, timeout=1200)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and "deselected" not in tail, tail
    # a skip only for what the installed release does itself (0.34 keeps encoder replay on on ROCm)
    skips = [ln for ln in tail.splitlines() if ln.startswith("SKIPPED")]
    assert all(f"vLLM {vllm_version()} keeps encoder replay" in ln for ln in skips), skips
