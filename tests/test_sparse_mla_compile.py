"""The sparse-MLA kernels compile for NVIDIA sm90 and AMD gfx942 with the installed Triton,
offline (no GPU), and the shipped configs fit the targets' shared memory
(tests/aot_compile_sparse_mla.py, in its own process: compiled mode)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swa_backends.common.registry import probe


@pytest.mark.skipif(probe("triton") is not None, reason=f"{probe('triton')}")
def test_sparse_mla_compiles_offline_for_sm90_and_gfx942():
    script = Path(__file__).with_name("aot_compile_sparse_mla.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(script), "cuda:90", "hip:gfx942"], env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("compiled ")
    for needle in ("cuda:90 _sparse_mla_fwd [cuda table H=64", "cuda:90 _sparse_mla_combine",
                   "hip:gfx942 _sparse_mla_fwd [rocm table H=64", "hip:gfx942 _sparse_mla_combine"):
        assert any(line.startswith(needle) for line in lines), needle
