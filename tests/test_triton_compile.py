"""Every Triton kernel specialisation of the serving path compiles for NVIDIA sm90 and AMD
gfx942 offline (no GPU), with every Triton the host has (this interpreter's, and e.g. the
H200's Triton 3.6 in another venv: tests/_tritons.py): the CPU interpreter runs the
kernels' Python, this runs Triton's compiler on them (tests/aot_compile.py, in its own
process)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from _tritons import ids, pythons, triton_version

from swa_backends.common.registry import probe


@pytest.mark.skipif(probe("triton") is not None, reason=f"{probe('triton')}")
@pytest.mark.parametrize("python", pythons(), ids=ids)
def test_every_kernel_compiles_offline_for_sm90_and_gfx942(python):
    version = triton_version(python)
    if version is None:
        pytest.skip(f"{python}: no such interpreter, or no Triton there")
    script = Path(__file__).with_name("aot_compile.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([python, str(script), "cuda:90", "hip:gfx942"], env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, f"Triton {version}: " + out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("compiled ")
    assert any(line.startswith("cuda:90 prepare_replay_step.") for line in lines)
    assert any(line.startswith("hip:gfx942 rows._copy_rows") for line in lines)


TRITON36_PYTHON = Path(os.environ.get("SWA_TRITON36_PYTHON", "/work/venv36/bin/python"))


@pytest.mark.skipif(not TRITON36_PYTHON.exists(),
                    reason=f"no Triton 3.6 interpreter at {TRITON36_PYTHON} (set SWA_TRITON36_PYTHON)")
def test_every_kernel_compiles_offline_with_triton_3_6():
    """The H200 runs Triton 3.6: the same offline compile with that version (a separate
    interpreter with triton 3.6 and torch; the package loads from this checkout)."""
    version = subprocess.run([str(TRITON36_PYTHON), "-c", "import triton; print(triton.__version__)"],
                             capture_output=True, text=True, timeout=120)
    if version.returncode != 0:
        pytest.skip(f"{TRITON36_PYTHON} cannot import triton: {version.stderr[-300:]}")
    assert version.stdout.strip().startswith("3.6"), version.stdout
    script = Path(__file__).with_name("aot_compile.py")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    env["SWA_AOT_FROM_CHECKOUT"] = "1"
    out = subprocess.run([str(TRITON36_PYTHON), str(script), "cuda:90", "hip:gfx942"], env=env, capture_output=True,
                         text=True, timeout=900, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("compiled ")
    for kernel in ("gather_replay_batch.", "prepare_replay_step.", "swa_indices_and_lens."):
        assert any(line.startswith(f"cuda:90 {kernel}") for line in lines), kernel
