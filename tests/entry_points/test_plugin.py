"""Registration into serving engines, tested the way they load it.

A wheel is built from this checkout (``pip wheel --no-deps``) and installed into a *fresh*
virtual environment (reusing this interpreter's torch through a ``.pth``). There, a script loads the
``vllm.general_plugins`` entry points exactly as vLLM's ``load_plugins_by_group`` does
(``importlib.metadata.entry_points(group=...)``, the ``VLLM_PLUGINS`` comma-list filter,
unset = all, empty = none), calls each loaded function twice and runs ops through
``torch.ops.swa_backends`` against the torch reference.

vLLM's own loader runs against a real vLLM in the CI stage that installs it
(tests/integration/vllm/test_vllm_plugin.py); this file downloads nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from swa_backends import OPS

REPO = Path(__file__).resolve().parents[2]
VENDOR_MODULES = ("vllm", "vllm_ascend", "torch_npu", "triton", "flashinfer", "aiter", "flash_mla")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("timeout", 600)
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise AssertionError(f"{cmd} exited {res.returncode}\nstdout:\n{res.stdout[-4000:]}\nstderr:\n{res.stderr[-4000:]}")
    return res


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _make_venv(path: Path, wheels: list[Path]) -> Path:
    """A fresh venv that reuses this interpreter's torch, numpy and PyYAML but has no
    swa_backends install: ``python -m venv`` (no system site-packages, so nothing else
    leaks in), plus a ``.pth`` naming the directories that hold those three packages. Lines
    of a ``.pth`` are plain sys.path entries placed *after* the venv's own site-packages,
    so the wheel installed there is found first even where such a directory also holds an
    install of this pack (CI's .venv); the scripts assert where they imported it from.
    ``wheels`` are installed (``--no-deps``) before the ``.pth`` exists, so pip cannot take
    that other install for this one."""
    import numpy
    import torch
    import yaml

    _run([sys.executable, "-m", "venv", str(path)])
    py = _venv_python(path)
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", *map(str, wheels)])
    dirs = sorted({str(Path(m.__file__).resolve().parent.parent) for m in (torch, numpy, yaml)})
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "_swa_test_deps.pth").write_text("\n".join(dirs) + "\n")
    same = _run([str(py), "-c", "import torch; print(torch.__file__)"]).stdout.strip()
    assert Path(same).resolve() == Path(torch.__file__).resolve()
    return py


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel --no-deps .`` of a copy of this checkout (keeps build/ out of the tree)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    # No build isolation where this interpreter has the build backend (offline machines);
    # otherwise pip fetches setuptools>=77 into an isolated build environment.
    try:
        from importlib.metadata import version

        isolation = [] if int(version("setuptools").split(".")[0]) < 77 else ["--no-build-isolation"]
    except Exception:  # noqa: BLE001
        isolation = []
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, str(src), "-w", str(root / "dist")])
    wheels = list((root / "dist").glob("swa_backends-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    path = tmp_path_factory.mktemp("venv") / "env"
    py = _make_venv(path, [wheel])
    yield py
    shutil.rmtree(path, ignore_errors=True)


def test_wheel_ships_the_package_and_the_entry_point(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        ep_file = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = zf.read(ep_file).decode()
    for f in ("swa_backends/__init__.py", "swa_backends/plugin.py", "swa_backends/torch_ops.py",
              "swa_backends/matrix.yaml", "swa_backends/common/ops/gather_replay_batch.py",
              "swa_backends/testing/matrix_runner.py"):
        assert f in names, f
    assert not any(n.startswith("swa_backends/tests/") for n in names)
    assert "[vllm.general_plugins]\nswa_backends = swa_backends.plugin:register" in entry_points
    assert "vllm.platform_plugins" not in entry_points  # a kernel pack is never a platform


# The loader, as vLLM's vllm/plugins/__init__.py does it (facts, re-implemented):
# entry_points(group="vllm.general_plugins"); VLLM_PLUGINS unset -> every plugin,
# set -> its comma-separated names; each allowed entry point is ep.load()-ed and called.
LOADER = textwrap.dedent('''
    import importlib.metadata, json, os, sys, time
    import torch  # a serving engine has torch imported long before its plugins
    env = os.environ.get("VLLM_PLUGINS")
    allowed = None if env is None else env.split(",")
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    report = {"discovered": sorted(ep.name for ep in eps), "loaded": [], "calls": []}
    before = set(sys.modules)
    t0 = time.perf_counter()
    funcs = {}
    for ep in eps:
        if allowed is None or ep.name in allowed:
            funcs[ep.name] = ep.load()
            report["loaded"].append(ep.name)
            report["dist_path"] = str(ep.dist.locate_file(""))
    for _ in range(2):  # vLLM may call a plugin in every process, and tests call it twice
        for name, fn in funcs.items():
            report["calls"].append(list(fn()))
    report["register_s"] = time.perf_counter() - t0
    report["vendor_modules"] = sorted(m for m in set(sys.modules) - before
                                      if m.split(".")[0] in %(vendor)r)
    report["has_ops"] = hasattr(torch.ops.swa_backends, "gather_rows")
    if report["has_ops"]:
        import numpy as np
        import swa_backends
        from swa_backends import OPS, torch_ops
        from swa_backends.testing.conformance import case_for, mismatch
        report["module_file"] = swa_backends.__file__
        rng = np.random.default_rng(0)
        checked = []
        for op in OPS:
            for i in range(2):
                args, kwargs = case_for(op, rng, "cpu", poison=bool(i))
                import copy
                want = OPS[op].reference(*copy.deepcopy(args), **copy.deepcopy(kwargs))
                got = torch_ops.call(op, *args, **kwargs)
                why = mismatch(op, got, want)
                assert why is None, (op, why)
            checked.append(op)
        # a direct torch.ops call, no helper in between
        x = torch.arange(12.0).view(6, 2)
        rows = torch.tensor([5, 0, 3])
        assert torch.equal(torch.ops.swa_backends.gather_rows(x, rows), x[rows])
        report["checked"] = checked
    print("REPORT " + json.dumps(report))
''' % {"vendor": VENDOR_MODULES})


def _report(res: subprocess.CompletedProcess) -> dict:
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


def _env(vllm_plugins: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "PYTHONPATH", "SWA_BACKENDS_VLLM")}
    if vllm_plugins is not None:
        env["VLLM_PLUGINS"] = vllm_plugins
    return env


@pytest.mark.parametrize("vllm_plugins,loads", [
    (None, True),                 # unset: vLLM loads every general plugin
    ("swa_backends", True),
    ("ascend,swa_backends", True),  # next to vllm-ascend's platform plugin name
    ("", False),                  # set and empty: none
    ("some_other_plugin", False),
])
def test_entry_point_loads_like_vllm_in_a_fresh_venv(venv, tmp_path, vllm_plugins, loads):
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    rep = _report(_run([str(venv), str(script)], env=_env(vllm_plugins), cwd=tmp_path))
    assert "swa_backends" in rep["discovered"]
    assert rep["has_ops"] is loads
    if not loads:
        assert rep["loaded"] == [] or "swa_backends" not in rep["loaded"]
        return
    assert rep["loaded"] == ["swa_backends"]
    venv_root = str(venv.parent.parent)
    assert rep["module_file"].startswith(venv_root), "swa_backends was not imported from the wheel"
    assert rep["dist_path"].startswith(venv_root)
    first, second = rep["calls"]
    assert first == second and "swa_backends::gather_rows" in first and "swa_backends::pad_replayed_slots" in first
    assert len(first) == len(set(first)) >= 24
    assert rep["vendor_modules"] == [], "register() imported a vendor package"
    assert rep["register_s"] < 5.0
    assert rep["checked"] == list(OPS)


def test_switched_off_the_plugin_defines_nothing(venv, tmp_path):
    """``SWA_BACKENDS_VLLM=0``: vLLM still loads and calls the entry point, which defines no op
    (``torch.ops.swa_backends`` stays empty) and returns no name, on every call."""
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    env = _env(None)
    env["SWA_BACKENDS_VLLM"] = "0"
    rep = _report(_run([str(venv), str(script)], env=env, cwd=tmp_path))
    assert rep["loaded"] == ["swa_backends"] and rep["calls"] == [[], []]
    assert rep["has_ops"] is False and rep["vendor_modules"] == []


def test_register_is_idempotent_in_process():
    from swa_backends import plugin

    first = plugin.register()
    assert plugin.registered()
    assert plugin.register() == first and plugin.register() is first
    import torch

    assert first and all(hasattr(torch.ops.swa_backends, n.split("::")[1]) for n in first)


# vLLM's own loader (``vllm.plugins.load_general_plugins()``) runs in the CI stage that installs
# vllm==0.33.0 (tests/integration/vllm/test_vllm_plugin.py): the default test command downloads
# nothing.
