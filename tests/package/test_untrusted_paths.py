"""Nothing is loaded from a place another user can write.

A working directory that ``python -m`` / ``-c`` put first on ``sys.path`` may be anyone's
(``/tmp``, a shared folder): the matrix runner's emulation worker runs in a private folder of
its own, with ``PYTHONPATH`` made absolute so that the pack and the user's own entries still
resolve there. Copies of vLLM's sources (``SWA_VLLM_KERNELS_DIR``), whose decorators run when
they are loaded, are refused unless this user's (or root's) and writable by no one else. CI's
vLLM venvs (``/tmp/swa-backends-vllm-venv-<release>`` by default) are reused only when they are
this user's own: another's is never run, written or removed. ``bench/gpu_env.sh`` asks where
``swa_backends`` imports from in an empty private folder, not in ``/tmp``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from swa_backends.testing import matrix_runner, vllm_kernels
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


# ---------------------------------------------------------------------------------------
# SWA_VLLM_KERNELS_DIR: copies of vLLM's source files
# ---------------------------------------------------------------------------------------

def _copies(root, marker, *, nested: bool = False):
    """The two files ``load()`` reads (flat, or under vLLM's own paths), their kernels stand-ins
    whose decorator leaves ``marker`` behind: code taken from a copy runs when it is loaded."""
    files = vllm_kernels.release_kernels().FILES
    mark = f"@__import__('builtins').open({str(marker)!r}, 'w').close() or (lambda f: f)\n"
    bodies = {
        "model_state.py": mark + "def _pad_replayed_slots_kernel():\n    pass\n\n\n"
                          "def _gather_replay_batch_kernel():\n    pass\n",
        "sparse_swa.py": "def _compute_swa_indices_and_lens_kernel():\n    pass\n\n\n"
                         "class ComputePrefillMetadataKernel:\n    def kernel():\n        pass\n",
    }
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)  # whatever the umask
    for name, body in bodies.items():
        path = root / "vllm" / files[name] if nested else root / name
        for folder in reversed(path.relative_to(root).parents[:-1]):
            (root / folder).mkdir(exist_ok=True)
            os.chmod(root / folder, 0o755)
        path.write_text(body)
        os.chmod(path, 0o644)
    return root


def test_own_copies_load(tmp_path, monkeypatch):
    pytest.importorskip("triton")  # the kernels' module imports it
    for nested in (False, True):
        root = _copies(tmp_path / f"copies{nested}", tmp_path / "ran", nested=nested)
        monkeypatch.setenv(vllm_kernels.ENV, str(root))
        kernels, origin = vllm_kernels.load()
        assert kernels is not None and origin == f"source files under {root}", origin
        assert (tmp_path / "ran").exists()
        (tmp_path / "ran").unlink()


def _writable_folder(root):
    os.chmod(root, 0o777)
    return root, f"{root} is writable by its group and others (mode 777)"


def _group_writable_file(root):
    os.chmod(root / "model_state.py", 0o664)
    return root, f"{root / 'model_state.py'} is writable by its group (mode 664): code taken from it would run " \
                 f"here; chmod go-w {root / 'model_state.py'}"


def _writable_folder_on_the_way(root):
    os.chmod(root / "vllm" / "models", 0o757)
    return root, f"{root / 'vllm' / 'models'} is writable by others (mode 757)"


def _link_to_a_writable_folder(root):
    os.chmod(root, 0o1777)
    link = root.parent / "link"
    link.symlink_to(root)
    return link, (f"{link} (-> {root}) is writable by its group and others (mode 1777): code taken from it would "
                  "run here; use a folder of your own")  # a sticky folder is everyone's: no chmod hint


def _file_linked_from_a_writable_folder(root):
    shared = root.parent / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (root / "sparse_swa.py").rename(shared / "sparse_swa.py")
    (root / "sparse_swa.py").symlink_to(shared / "sparse_swa.py")
    return root, f"{shared} is writable by its group and others (mode 777)"


def _another_users_folder(root):
    if os.geteuid() != 0:
        pytest.skip("making a folder another user's takes root")
    os.chown(root, 65534, -1)  # nobody
    return root, f"{root} is owned by "


@pytest.mark.parametrize("make", [_writable_folder, _group_writable_file, _writable_folder_on_the_way,
                                  _link_to_a_writable_folder, _file_linked_from_a_writable_folder,
                                  _another_users_folder])
@pytest.mark.parametrize("how", ["env", "argument"])
def test_copies_another_user_can_write_are_refused(tmp_path, monkeypatch, make, how):
    marker = tmp_path / "ran"
    source, says = make(_copies(tmp_path / "copies", marker, nested=make is _writable_folder_on_the_way))
    if how == "env":
        monkeypatch.setenv(vllm_kernels.ENV, str(source))
    else:
        monkeypatch.delenv(vllm_kernels.ENV, raising=False)
    for load in (vllm_kernels.load, vllm_kernels.load_launchers):
        got, why = load(str(source) if how == "argument" else None)
        assert got is None and not marker.exists()
        assert why.startswith(f"{vllm_kernels.ENV}={source}: UntrustedSourceError: {says}"), why
        assert "would run here" in why


# ---------------------------------------------------------------------------------------
# .ci/run, stage 3: which vLLM venv it uses
# ---------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
posix_tools = pytest.mark.skipif(sys.platform != "linux", reason=".ci/run uses GNU stat, find and readlink")


def _pick_venv(tmp_path, prefix, release="0.33.0") -> tuple[str, str, str, str]:
    """``.ci/run``'s own ``pick_venv`` (and ``untrusted_venv``): ``(VENV, reused, scratch, what it said)``."""
    text = (ROOT / ".ci" / "run").read_text()
    functions = "".join(re.search(rf"^{name}\(\) {{\n.*?^}}\n", text, re.S | re.M).group(0)
                        for name in ("untrusted_venv", "pick_venv"))
    script = (f"set -euo pipefail\n{functions}SWA_VLLM_VENV={shlex.quote(str(prefix))}\npick_venv {release}\n"
              'printf "%s\\n%s\\n%s\\n" "$VENV" "$reused" "$scratch"\n')
    (tmp_path / "tmpdir").mkdir(exist_ok=True)
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, TMPDIR=str(tmp_path / "tmpdir")))
    assert res.returncode == 0, res.stderr
    *said, venv, reused, scratch = res.stdout.split("\n")[:-1]
    return venv, reused, scratch, "\n".join(said)


def _fake_venv(path, marker, version="0.33.0"):
    """A venv as far as the probe goes: ``bin/python`` prints ``version`` (and leaves ``marker``)."""
    (path / "bin").mkdir(parents=True)
    python = path / "bin" / "python"
    python.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\necho {version}\n")
    for p in (path, path / "bin", python):
        os.chmod(p, 0o755)
    return path


@posix_tools
def test_ci_reuses_its_own_venv(tmp_path):
    venv = _fake_venv(tmp_path / "v-0.33.0", tmp_path / "probed")
    assert _pick_venv(tmp_path, tmp_path / "v") == (str(venv), f" (reused {venv})", "", "")
    assert (tmp_path / "probed").exists()


@posix_tools
def test_ci_remakes_its_own_venv_in_place(tmp_path):
    venv = _fake_venv(tmp_path / "v-0.33.0", tmp_path / "probed", version="0.32.0")
    assert _pick_venv(tmp_path, tmp_path / "v") == (str(venv), "", "", "")
    assert venv.is_dir() and not any(venv.iterdir())  # emptied, for `python3 -m venv`
    assert _pick_venv(tmp_path, tmp_path / "w") == (str(tmp_path / "w-0.33.0"), "", "", "")
    assert (tmp_path / "w-0.33.0").is_dir()


def _writable_file_inside(venv, tmp_path):
    (venv / "lib").mkdir(mode=0o755)
    os.chmod(venv / "lib", 0o755)
    (venv / "lib" / "evil.pth").write_text("import os\n")
    os.chmod(venv / "lib" / "evil.pth", 0o666)
    return f"{venv / 'lib' / 'evil.pth'} is writable by its group or others (mode 666)"


def _group_writable_venv(venv, tmp_path):
    os.chmod(venv, 0o775)
    return f"{venv} is writable by its group or others (mode 775)"


def _interpreter_in_a_writable_folder(venv, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (venv / "bin" / "python").rename(shared / "python")
    (venv / "bin" / "python").symlink_to(shared / "python")
    return f"{shared} is writable by its group or others (mode 777)"


def _another_users_venv(venv, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a folder another user's takes root")
    for folder, dirs, files in os.walk(venv):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            os.chown(name, 65534, -1)  # nobody, as the audit's squatter
    os.chmod(venv, 0o777)
    return f"{venv} is owned by "


@posix_tools
@pytest.mark.parametrize("make", [_writable_file_inside, _group_writable_venv, _interpreter_in_a_writable_folder,
                                  _another_users_venv])
def test_ci_never_runs_writes_or_removes_a_venv_another_user_can_write(tmp_path, make):
    venv = _fake_venv(tmp_path / "v-0.33.0", tmp_path / "probed")
    says = make(venv, tmp_path)
    before = sorted(str(p) for p in venv.rglob("*"))
    got, reused, scratch, said = _pick_venv(tmp_path, tmp_path / "v")
    assert not (tmp_path / "probed").exists()  # its bin/python never ran
    assert sorted(str(p) for p in venv.rglob("*")) == before  # nor was it touched
    assert reused == "" and got == scratch and Path(scratch).parent == tmp_path / "tmpdir"
    st = os.stat(scratch)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700 and not os.listdir(scratch)
    assert said.startswith(f"ci: not using {venv} ({says}") and said.endswith(
        f"a fresh venv in {scratch}, removed after its tests"), said


# ---------------------------------------------------------------------------------------
# bench/gpu_env.sh: where python3 imports swa_backends from
# ---------------------------------------------------------------------------------------

@posix_tools
def test_gpu_env_asks_where_the_pack_imports_from_in_a_private_folder(tmp_path):
    """Sourced with ``python3`` a stand-in that records where each ``-c`` ran (``-m pip``: done),
    and ``TMPDIR`` a folder anyone can write holding a planted ``swa_backends/``."""
    shared = tmp_path / "shared"
    _plant(shared, "swa_backends", tmp_path / "planted_ran")
    os.chmod(shared, 0o1777)
    stub = tmp_path / "bin"
    stub.mkdir()
    log = tmp_path / "calls"
    (stub / "python3").write_text(
        "#!/bin/sh\n"
        f'[ "$1" = -m ] && [ "$2" = pip ] && exit 0\n'
        f'printf "%s %s %s\\n" "$(stat -c \'%u %a\' .)" "$PWD" "$2" >> {shlex.quote(str(log))}\n'
        f'exec {shlex.quote(sys.executable)} "$@"\n')
    os.chmod(stub / "python3", 0o755)
    env = dict(os.environ, PATH=f"{stub}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(shared), OUT=str(tmp_path),
               SWA_COMMIT="test")
    res = subprocess.run(["bash", "-c", ". bench/gpu_env.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "planted_ran").exists()
    checks = [line.split(" ", 3) for line in log.read_text().splitlines() if "swa_backends" in line]
    assert len(checks) >= 2  # after the install, and in machine.txt
    for uid, mode, cwd, _ in checks:
        assert (int(uid), mode, Path(cwd).parent) == (os.geteuid(), "700", shared), checks
        assert not Path(cwd).exists()  # removed when the script is done
    pack = subprocess.run([sys.executable, "-c", "import os, swa_backends; "
                           "print(os.path.dirname(os.path.realpath(swa_backends.__file__)))"],
                          cwd=tmp_path / "bin", capture_output=True, text=True, timeout=120).stdout.strip()
    assert f"swa_backends: {pack}" in (tmp_path / "machine.txt").read_text()
