"""Installing yields exactly one top-level import package, with matrix.yaml inside."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # no build isolation: the test environment already has setuptools >= 77 (.ci/run installs it)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (whl,) = out.glob("swa_backends-*.whl")
    return whl


def test_wheel_has_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"swa_backends", next(t for t in tops if t.endswith(".dist-info"))}
    assert "swa_backends/matrix.yaml" in names
    assert not any(n.endswith((".c", ".so")) for n in names)  # nothing built or compiled at run time
    for sub in ("common", "common/ops", "backends", "backends/cuda", "backends/rocm", "backends/ascend",
                "backends/reference", "kernels", "testing", "testing/emulation"):
        assert f"swa_backends/{sub}/__init__.py" in names
    assert not any(n.startswith(("swa_backends/tests/", "swa_backends/bench/")) for n in names)


def test_installed_package_resolves_subpackages():
    import swa_backends
    import swa_backends.backends.cuda as cuda
    import swa_backends.common as common

    assert pathlib.Path(common.__file__).parent.parent == pathlib.Path(swa_backends.__file__).parent
    assert cuda.__name__ == "swa_backends.backends.cuda"


def test_no_stray_top_level_packages_importable(tmp_path):
    # whichever way the package is installed (wheel or editable), `common`, `backends` and
    # `kernels` exist only under swa_backends
    code = ("import importlib.util as u, swa_backends;"
            "print([m for m in ('common', 'backends', 'kernels', 'tests') if u.find_spec(m) is not None])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_pyproject_lists_every_package_of_the_product():
    """A new folder (a platform under backends/, a subpackage) ships only once pyproject.toml lists
    it (setuptools cannot discover packages under a repository root that is itself the package):
    this says which line is missing, without building a wheel."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {"swa_backends"} | {
        "swa_backends." + ".".join(p.parent.relative_to(ROOT).parts)
        for p in ROOT.rglob("__init__.py")
        if p.parent != ROOT and p.relative_to(ROOT).parts[0] not in ("tests", "bench", "examples", "build")
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)}
    assert not on_disk - listed, f"add to pyproject.toml's [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert not listed - on_disk, f"pyproject.toml lists packages that do not exist: {sorted(listed - on_disk)}"
