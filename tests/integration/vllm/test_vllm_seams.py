"""The release's seam table against the installed vLLM, and a drifted seam at install time (needs vLLM).

* the table of the installed vLLM's release (``integrations/vllm/v0_33/seams.py``) is that release's: every seam on
  both platforms, read from the files (what ``install()`` reads in a process that has not
  imported them), from the live objects (what it reads where they are imported) and through
  the unchanged-file fast path; the cost of each, printed (``-s``) and bounded;
* a ``0.33.x`` that changed one seam (simulated: one method replaced by another) is left
  untouched: ``install()`` registers nothing, with one log line naming the seam.
"""

from __future__ import annotations

import importlib
import logging
import time

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

from swa_backends.integrations import vllm as integration  # noqa: E402
from swa_backends.integrations.vllm import seams  # noqa: E402
from _release import installed  # noqa: E402

release = installed()  # the installed vLLM's release subpackage (skips this module where there is none)
FILES, RELEASE, SEAMS = release.seams.FILES, release.seams.RELEASE, release.seams.SEAMS

pytestmark = pytest.mark.usefixtures("clean_integration")


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def test_the_table_is_the_installed_release():
    assert integration.vllm_version() == RELEASE, "the table was taken from another release than the installed one"
    assert seams.file_hashes(SEAMS) == FILES
    everywhere = SEAMS  # both platforms, both scopes
    for scope in ("serve", "cli"):
        problems, parsed = _timed(lambda: seams.check(everywhere, scope=scope, live=False))
        assert problems == [], problems
        problems, fast = _timed(lambda: seams.check(everywhere, files=FILES, scope=scope, live=False))
        assert problems == [], problems
        print(f"\n{scope} seams: {len(seams.selected(everywhere, scope=scope))}; parsed from the files {parsed:.3f} s, "
              f"through the unchanged files {fast:.4f} s")
        assert fast < 0.5
    # the live objects (every module that imports without an AMD GPU) read as the files do
    for module in dict.fromkeys(s.module for s in SEAMS if s.platform != "rocm"):
        importlib.import_module(module)
    live = [s for s in SEAMS if s.platform != "rocm"]
    problems, took = _timed(lambda: seams.check(live, live=True) + seams.check(live, live=True, scope="cli"))
    assert problems == [], problems
    _, fast = _timed(lambda: seams.check(live, files=FILES, platform="cuda"))
    print(f"live objects: {took:.3f} s read, {fast:.4f} s through the unchanged files")


#: the methods whose bodies the integration reproduces, on every platform (0.33: the model state's
#: ``_kept_input_batch``, the replay layers' ``_run``)
REPRODUCED = [s.target for s in SEAMS if s.kind == "def" and s.platform is None and s.qualname.count(".") == 1
              and "its body reproduced" in s.why]


@pytest.mark.parametrize("target", REPRODUCED)
def test_a_changed_seam_leaves_vllm_untouched_with_one_line(monkeypatch, caplog, tmp_path, target):
    """A release that changed one seam: simulated by replacing the method with one of the same
    signature and another body (defined in a module of its own). ``install()`` (forced past
    the CPU platform check) registers nothing and logs one line naming the seam; the same
    process with the original method installs."""
    import inspect

    from vllm.model_executor.models.registry import ModelRegistry

    module, qualname = target.split(":")
    cls_name, attr = qualname.split(".")
    cls = getattr(importlib.import_module(module), cls_name)
    original = vars(cls)[attr]
    sig = inspect.signature(original)
    empty = inspect.Parameter.empty
    signature = sig.replace(parameters=[p.replace(annotation=empty) for p in sig.parameters.values()],
                            return_annotation=empty)
    name = f"drifted_{cls_name}_{attr.strip('_')}"
    (tmp_path / f"{name}.py").write_text(f"def {attr}{signature}:\n    return None  # another body\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    drifted = getattr(importlib.import_module(name), attr)
    before = ModelRegistry.models[integration.ARCH]
    monkeypatch.setenv(integration.ENV, "force")
    monkeypatch.setattr(cls, attr, drifted)
    st = integration.install()
    assert not st.installed and len(st.seams) == 1, st
    assert st.seams[0].startswith(f"{target}: source changed"), st.seams
    assert ModelRegistry.models[integration.ARCH] is before
    lines = [r.getMessage() for r in caplog.records if r.name == "vllm.swa_backends"]
    assert len(lines) == 1 and target in lines[0] and "vLLM is left untouched" in lines[0], lines
    assert [r.levelno for r in caplog.records if r.name == "vllm.swa_backends"] == [logging.WARNING]

    monkeypatch.setattr(cls, attr, original)
    integration._reset_for_tests()
    try:
        st = integration.install()
        assert st.installed and st.seams == () and st.seam_check_s is not None, st
        print(f"\ninstall()'s seam check: {st.seam_check_s * 1e3:.1f} ms")
    finally:
        ModelRegistry.models[integration.ARCH] = before
