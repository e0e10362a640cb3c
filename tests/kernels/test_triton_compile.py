"""Every Triton kernel specialisation of the serving path compiles for NVIDIA sm90 and AMD
gfx942 offline (no GPU), with every Triton the host has (this interpreter's, and e.g. the
H200's Triton 3.6 in another venv: tests/helpers/_tritons.py): the CPU interpreter runs the
kernels' Python, this runs Triton's compiler on them (tests/kernels/aot_compile.py, in its own
process). Marked ``compile``: CI's compile stage (``python -m pytest -q -m compile``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from _tritons import NO_TRITON, ids, pythons, run_compile_script


@pytest.mark.compile
@pytest.mark.skipif(NO_TRITON is not None, reason=str(NO_TRITON))
@pytest.mark.parametrize("python", pythons(), ids=ids)
def test_every_kernel_compiles_offline_for_sm90_and_gfx942(python):
    version, out = run_compile_script(python, Path(__file__).with_name("aot_compile.py"), "cuda:90", "hip:gfx942")
    assert out.returncode == 0, f"Triton {version}: " + out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("compiled ")
    for kernel in ("prepare_replay_step.", "gather_replay_batch.", "swa_indices_and_lens."):
        assert any(line.startswith(f"cuda:90 {kernel}") for line in lines), kernel
    assert any(line.startswith("hip:gfx942 rows._copy_rows") for line in lines)
    assert any(line.startswith("cuda:90 value_read._value_read") for line in lines)
    for kernel in ("_sparse_mla_check ", "_sparse_mla_check_flat "):
        assert any(line.startswith(f"cuda:90 sparse_mla_check.{kernel}") for line in lines), kernel

