"""The vLLM release seam: the map from release series to subpackage, what every subpackage
holds for the core, and a subpackage for the installed vLLM. Runs in the main suite (every
supported release) and in the vLLM stage (the installed one)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import _release
from swa_backends.integrations import vllm as integration
from swa_backends.testing import vllm_kernels as vk

REPO = Path(__file__).resolve().parents[3]

#: part -> the names the core (and swa_backends.testing) read from it
READ_BY_THE_CORE = {
    "seams": ("SEAMS", "FILES", "RELEASE"),
    "patches": ("PATCHES", "apply", "route", "routes", "status", "restore", "pin", "failed"),
    "model": ("model_class", "ModelMixin", "Route"),
    "config": ("MEGA_MOE_BACKENDS", "DRAFTER_KINDS", "OTHER_DRAFTERS", "MIRRORS", "PACK_TURNS_ROCM_ENCODER_ON",
               "model_runner", "sequence_parallel_moe", "rocm_replay_off"),
    "target": ("v2_model_runner", "graph_mode", "async_scheduling", "prefix_caching"),
    "kernels": (*vk.FROM_RELEASE, "INSTALLED_KERNELS", "INSTALLED_LAUNCHERS", "SOURCE_LAUNCHERS", "LAUNCH_PRELUDE"),
}


def test_the_release_map_is_the_one_place_releases_are_declared():
    assert integration.SUPPORTED_VLLM == tuple(integration.RELEASES)
    packages = (REPO / "pyproject.toml").read_text()
    for series, name in integration.RELEASES.items():
        assert re.fullmatch(r"\d+\.\d+", series), series
        assert name == f"swa_backends.integrations.vllm.v{series.replace('.', '_')}", name
        assert f'"{name}"' in packages, f"pyproject.toml's packages do not list {name}"
    tested = integration.release_module(integration.TESTED_VLLM)
    assert tested.RELEASE == integration.TESTED_VLLM, "TESTED_VLLM is not the release its subpackage was pinned from"


def test_ci_installs_every_supported_release():
    """``.ci/run`` reads the releases to install (one venv each) from this package: its line, run
    here. TESTED_VLLM is among them."""
    (line,) = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if ln.startswith("VLLM_RELEASES=$(")]
    line = line.replace("$(python ", f"$({sys.executable} ", 1)
    res = subprocess.run(["bash", "-c", f'{line}; printf %s "$VLLM_RELEASES"'], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    want = [integration.release_module(s).RELEASE for s in integration.RELEASES]
    assert res.returncode == 0 and res.stdout.split() == want, (line, res.stdout, res.stderr)
    assert integration.TESTED_VLLM in want


def test_a_release_holds_every_part_the_core_reads(release):
    series = next(s for s, name in integration.RELEASES.items() if name == release.__name__)
    assert release.RELEASE.startswith(series + "."), release.RELEASE
    here = Path(release.__file__).parent
    for part, names in READ_BY_THE_CORE.items():
        module = getattr(release, part)
        # the release's own file, or the module of the earlier release SHARED_PARTS names (0.34's model is 0.33's)
        owner = release.SHARED_PARTS.get(part)
        if owner is None:
            assert module.__name__ == f"{release.__name__}.{part}", module.__name__
        else:
            assert f"{integration.__name__}.{owner}" in integration.RELEASES.values(), owner
            assert module.__name__ == f"{integration.__name__}.{owner}.{part}", module.__name__
            assert module.__name__ < release.__name__, "a release shares an earlier release's part"
        # no file of a shared part's name in the release: one place for each module
        assert (here / f"{part}.py").exists() == (owner is None), (release.__name__, part)
        missing = [n for n in names if not hasattr(module, n)]
        assert not missing, f"{module.__name__} lacks {missing}"
    assert set(READ_BY_THE_CORE) == set(integration.RELEASE_PARTS)
    assert set(release.SHARED_PARTS) <= set(integration.RELEASE_PARTS) - {"seams", "config"}
    assert release.seams.RELEASE == release.RELEASE
    module, cls = integration.model_class_path(release).split(":")
    # the module that is the release's model part, which vLLM's registry imports by name
    assert module == release.model.__name__ and cls == integration.ARCH
    assert importlib.import_module(module) is release.model
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        release.nonsense


def test_a_releases_kernel_tables_agree(release):
    """The loader's four kernels (``VllmKernels``' fields) in every table, from files the table lists."""
    k = release.kernels
    four = {"pad", "gather", "swa", "prefill"}
    assert set(k.KERNELS) == set(k.INSTALLED_KERNELS) == set(k.INSTALLED_LAUNCHERS) == set(k.SOURCE_LAUNCHERS) == four
    assert {f for f, _ in k.KERNELS.values()} | {f for f, _ in k.LAUNCH_SOURCES} <= set(k.FILES)
    defined = {q for _, q in k.LAUNCH_SOURCES}
    assert {name for name, _ in k.SOURCE_LAUNCHERS.values()} <= defined
    for target in (*k.INSTALLED_KERNELS.values(), *k.INSTALLED_LAUNCHERS.values()):
        assert target.startswith("vllm.") and ":" in target, target


def test_every_patched_global_is_a_seam(release):
    """``install()`` checks the seam table before anything is patched: each global a patch
    replaces is pinned there (a release that changed one is left untouched)."""
    seams = {s.target for s in release.seams.SEAMS}
    names = [p.name for p in release.patches.PATCHES]
    assert len(names) == len(set(names))
    for p in release.patches.PATCHES:
        assert f"{p.module}:{p.attr}" in seams, p.target


def test_a_releases_parts_import_no_vllm(release):
    code = (f"import sys, importlib; r = importlib.import_module({release.__name__!r}); "
            f"[getattr(r, p) for p in {integration.RELEASE_PARTS!r}]; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'); print(bad); assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_version_without_a_subpackage(monkeypatch):
    with pytest.raises(integration.UnsupportedRelease, match=r"vLLM 0\.99\.1 is not a supported release \(supported: "
                                                          r"0\.33\.x"):
        integration.release_module("0.99.1")
    with pytest.raises(integration.UnsupportedRelease):
        integration.release_module("garbage")
    assert integration.release_module("0.33.7").__name__ == integration.RELEASES["0.33"]
    # the facts of an unsupported vLLM are the newest supported release's (install() never falls back)
    monkeypatch.setattr(integration, "_version_read", ["0.99.1"])
    assert integration.current_release() is integration.release_module(integration.TESTED_VLLM)


def test_the_installed_vllm_has_a_release_subpackage():
    version = _release.installed_version()
    if version is None:
        pytest.skip("vLLM is not installed")
    assert integration.supported(version), _release.missing(version)
    assert _release.installed().__name__ == integration.RELEASES[integration.release_series(version)]


def test_a_new_release_is_a_subpackage_and_a_map_entry(tmp_path, monkeypatch):
    """A toy release 0.99 -- a subpackage written here whose config names a speculative method
    0.33 does not know -- and its RELEASES entry: an installed vLLM 0.99.x selects it, and the
    core's config mapping reads its facts (0.33's stay as they are)."""
    from types import SimpleNamespace

    from swa_backends.integrations.vllm import config as icfg

    pkg = tmp_path / "toy_release_v0_99"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('RELEASE = "0.99.0"\n')
    (pkg / "config.py").write_text("from swa_backends.integrations.vllm.v0_33.config import *  # noqa: F403\n"
                                   "DRAFTER_KINDS = {**DRAFTER_KINDS, 'medusa': 'eagle'}  # noqa: F405\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(integration.RELEASES, "0.99", "toy_release_v0_99")
    spec = SimpleNamespace(speculative_config=SimpleNamespace(method="medusa"))
    assert icfg.drafter(spec) == "other"  # 0.33's facts: an unknown method
    try:
        import toy_release_v0_99.config  # noqa: F401 - the part the core reads, as the subpackage's attribute

        monkeypatch.setattr(integration, "_version_read", ["0.99.1"])
        assert integration.supported("0.99.1") and integration.current_release().__name__ == "toy_release_v0_99"
        assert icfg.drafter(spec) == "eagle"
    finally:
        for name in ("toy_release_v0_99.config", "toy_release_v0_99"):
            sys.modules.pop(name, None)


def test_ci_installs_a_release_with_its_own_requirements(tmp_path):
    """``.ci/install_vllm.py`` installs a release's own requirements (those without an extra),
    relaxing only the exact pins it names, each to a lower bound."""
    import importlib.util
    import zipfile

    spec = importlib.util.spec_from_file_location("install_vllm", REPO / ".ci" / "install_vllm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    wheel = tmp_path / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm-0.34.0.dist-info/METADATA", "\n".join([
            "Metadata-Version: 2.4", "Name: vllm", "Version: 0.34.0",
            "Requires-Dist: torch==2.14.0", "Requires-Dist: flashinfer-python==0.7.3",
            'Requires-Dist: tokenspeed-mla==2.0.3; platform_system == "Linux"',
            'Requires-Dist: pytest; extra == "test"', "", "long description"]))
    assert mod.requirements(wheel) == ["torch==2.14.0", "flashinfer-python>=0.7.3",
                                       'tokenspeed-mla==2.0.3; platform_system == "Linux"']
    assert set(mod.RELAXED) == {"flashinfer-python"}
