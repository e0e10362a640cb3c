"""``swa-backends matrix`` on a plain install: Triton is optional (``pip install .`` on a CPU
torch has none). The jobs that need it are skipped with that reason, the contract doubles' jobs
still run in the emulation worker, the exit status is the CPU row's, and neither the runner
nor its hidden ``--worker`` prints a traceback.

Triton is hidden from both processes by a ``sitecustomize`` on ``PYTHONPATH`` (``None`` in
``sys.modules``: what ``import triton`` and ``find_spec`` see when it is not installed), and
``TRITON_INTERPRET`` is unset as in a user's shell, so the runner starts its worker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

NEEDS_TRITON = {"triton", "triton_ascend", "gluon", "gluon_ws"}


@pytest.fixture
def no_triton_env(tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['triton'] = None\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hide), os.environ.get("PYTHONPATH")]))
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _cli(tmp_path, env, *argv):
    return subprocess.run([sys.executable, "-m", "swa_backends", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def test_matrix_skips_what_needs_triton_and_runs_the_rest(tmp_path, no_triton_env):
    res = _cli(tmp_path, no_triton_env, "matrix", "--rows", "cpu,cuda:sm90", "--ops", "sparse_mla,gather_rows",
               "--cases", "1", "--json", "--no-progress")
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(res.stdout)
    assert data["host"]["triton"] == "not installed"
    by = {(r["row"], r["op"], r["variant"]): r for r in data["results"]}
    for (row, op, name), r in by.items():
        if name in NEEDS_TRITON:
            assert r["status"] == "skipped" and "triton is not installed" in r["detail"], r
        else:
            assert r["status"] in ("pass", "emulated"), r
    # the vendor wrappers ran in the worker, inside the contract doubles; the CPU row on this machine
    assert by[("cuda:sm90", "sparse_mla", "flashmla")]["mode"] == "doubles"
    assert by[("cuda:sm90", "sparse_mla", "flashmla")]["status"] == "emulated"
    assert by[("cpu", "gather_rows", "reference")]["status"] == "pass"
    assert {"gluon", "gluon_ws", "triton"} <= {name for (_, _, name) in by}


def test_worker_flag_without_triton_is_one_line(tmp_path, no_triton_env):
    res = _cli(tmp_path, no_triton_env, "matrix", "--worker", str(tmp_path / "missing.json"),
               "--worker-out", str(tmp_path / "out.json"))
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "expected a jobs file written by the matrix runner" in res.stderr


@pytest.mark.parametrize("interpret", [None, "1"])
def test_explain_names_the_missing_triton_before_the_interpreter_switch(tmp_path, no_triton_env, interpret):
    """Without Triton, a Triton variant's reason is the missing module, with the interpreter switch set or not:
    setting TRITON_INTERPRET=1 alone would change nothing (the switch's reason comes once Triton is there:
    tests/kernels/test_triton_kernels.py)."""
    env = dict(no_triton_env, **({"TRITON_INTERPRET": interpret} if interpret else {}))
    res = subprocess.run([sys.executable, "-c", "import swa_backends as sb; print(sb.explain('cpu'))"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = re.split(r"\n  (?=\S)", res.stdout)  # a variant's row with its reasons below it
    triton_rows = [r for r in rows if r.split()[1:2] == ["triton"]]
    assert len(triton_rows) >= 9, res.stdout  # every replay op has a Triton variant
    for r in triton_rows:
        assert "rejected" in r and "Triton: module triton is not installed" in r, r
        assert "TRITON_INTERPRET" not in r, r
