"""The gluon store A/B experiment refuses what it cannot run before timing anything: a ``--before``
that is no file (named in the error), a machine without a CUDA GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "experiments" / "exp_gluon_store_ab.py"

from lib.smoke import run_script  # noqa: E402


def test_a_missing_before_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"--before: '.*nope\.py' is not a file; expected a copy"):
        run_script(SCRIPT, "--before", str(tmp_path / "nope.py"), "--out", str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_stops_with_the_reason(tmp_path, capsys):
    before = tmp_path / "before.py"
    before.write_text((ROOT / "kernels" / "sparse_mla_gluon.py").read_text())
    assert run_script(SCRIPT, "--before", str(before), "--out", str(tmp_path / "o")) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
