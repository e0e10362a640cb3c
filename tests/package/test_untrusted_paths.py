"""Nothing is loaded from a place another user can write.

A working directory that ``python -m`` / ``-c`` put first on ``sys.path`` may be anyone's
(``/tmp``, a shared folder): the matrix runner's emulation worker runs in a private folder of
its own, with ``PYTHONPATH`` made absolute so that the pack and the user's own entries still
resolve there.
"""

from __future__ import annotations

import os
import sys

from swa_backends.testing import matrix_runner
from swa_backends.testing.matrix_runner import Job, _execute_in_worker

# a Triton kernel under the interpreter: the worker imports triton (and, with -m, swa_backends) to run it
INTERPRETED = Job("cpu", "cpu", "cpu", "gather_rows", "triton", "interpreter")


def _plant(folder, package: str, marker) -> None:
    """A package named ``package`` in ``folder`` that leaves ``marker`` behind when imported."""
    (folder / package).mkdir(parents=True)
    (folder / package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")


def test_matrix_worker_ignores_packages_planted_in_the_working_directory(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    _plant(shared, "triton", tmp_path / "triton_ran")
    _plant(shared, "swa_backends", tmp_path / "swa_backends_ran")
    (shared / "swa_backends" / "__main__.py").write_text("raise SystemExit(3)\n")
    monkeypatch.chdir(shared)
    (res,) = _execute_in_worker([INTERPRETED], cases=1, seed=0, progress=False)
    assert not (tmp_path / "triton_ran").exists() and not (tmp_path / "swa_backends_ran").exists()
    assert (res.status, res.passed, res.failed) == ("emulated", 1, 0), res.detail


def test_matrix_worker_keeps_relative_pythonpath_entries(tmp_path, monkeypatch):
    """``PYTHONPATH=rel`` means ``$PWD/rel`` to the runner; the worker, started elsewhere, still
    reads it there (its ``sitecustomize`` runs)."""
    (tmp_path / "rel").mkdir()
    marker = tmp_path / "site_ran"
    (tmp_path / "rel" / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, ["rel", os.environ.get("PYTHONPATH")])))
    (res,) = _execute_in_worker([Job("cuda:sm90", "cuda", "sm90", "gather_rows", "reference", "cpu")],
                                cases=1, seed=0, progress=False)
    assert marker.exists()
    assert res.status == "emulated", res.detail


def test_matrix_worker_environment(tmp_path, monkeypatch):
    """Each entry absolute (an empty one is the working directory, as Python reads it); the
    folder this process took the pack from leads when that was its working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["rel", "/abs", ""]))
    env = matrix_runner._worker_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "rel"), "/abs", str(tmp_path)]
    assert env["TRITON_INTERPRET"] == "1" and env["CUDA_VISIBLE_DEVICES"] == ""
    # `python -m swa_backends` run beside a checkout folder named swa_backends
    monkeypatch.delenv("PYTHONPATH")
    monkeypatch.setattr(matrix_runner, "__file__", str(tmp_path / "swa_backends" / "testing" / "matrix_runner.py"))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert matrix_runner._worker_env()["PYTHONPATH"] == str(tmp_path)
    monkeypatch.setattr(sys, "path", sys.path[1:])  # the pack came from elsewhere: nothing added
    assert "PYTHONPATH" not in matrix_runner._worker_env()
