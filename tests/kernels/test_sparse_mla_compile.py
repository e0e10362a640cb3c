"""The sparse-MLA kernels compile for NVIDIA sm90 and AMD gfx942 offline (no GPU), with
every Triton the host has (this interpreter's, and e.g. the H200's Triton 3.6 in another
venv: tests/helpers/_tritons.py): the shipped configs and the split-K decode path
(tests/kernels/aot_compile_sparse_mla.py, in its own process: compiled mode). Triton 3.6 failed a
pass on configs 3.9 compiled (on the H200), hence both. Marked ``compile``: CI's compile stage
(``python -m pytest -q -m compile``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from _tritons import NO_TRITON, ids, pythons, run_compile_script


@pytest.mark.compile
@pytest.mark.skipif(NO_TRITON is not None, reason=str(NO_TRITON))
@pytest.mark.parametrize("python", pythons(), ids=ids)
def test_sparse_mla_compiles_offline_for_sm90_and_gfx942(python):
    version, out = run_compile_script(python, Path(__file__).with_name("aot_compile_sparse_mla.py"), "cuda:90",
                                      "hip:gfx942")
    fails = [line for line in out.stderr.splitlines() if line.startswith("FAIL")]
    assert out.returncode == 0, f"Triton {version}: " + "\n".join(fails) + out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("compiled ")
    for needle in ("cuda:90 _sparse_mla_fwd [cuda table H=64", "cuda:90 _sparse_mla_combine",
                   "hip:gfx942 _sparse_mla_fwd [rocm table H=64", "hip:gfx942 _sparse_mla_combine"):
        assert any(line.startswith(needle) for line in lines), f"Triton {version}: {needle}"
