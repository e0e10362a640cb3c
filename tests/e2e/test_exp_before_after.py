"""The before/after experiments (a ``--before`` copy of a kernel module timed against the pack's:
the gluon store A/B, the device check's tiling) refuse what they cannot run before timing anything:
a ``--before`` that is no file (named in the error), a machine without a CUDA GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = {"exp_gluon_store_ab.py": "sparse_mla_gluon.py", "exp_check_tile.py": "sparse_mla_check.py"}

from lib.smoke import run_script  # noqa: E402


@pytest.mark.parametrize("script", list(EXPERIMENTS))
def test_a_missing_before_file_is_refused(tmp_path, script):
    with pytest.raises(ValueError, match=r"--before: '.*nope\.py' is not a file; expected a copy"):
        run_script(ROOT / "bench" / "experiments" / script, "--before", str(tmp_path / "nope.py"), "--out",
                   str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
@pytest.mark.parametrize("script", list(EXPERIMENTS))
def test_without_a_gpu_it_stops_with_the_reason(tmp_path, capsys, script):
    before = tmp_path / "before.py"
    before.write_text((ROOT / "kernels" / EXPERIMENTS[script]).read_text())
    assert run_script(ROOT / "bench" / "experiments" / script, "--before", str(before), "--out",
                      str(tmp_path / "o")) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
