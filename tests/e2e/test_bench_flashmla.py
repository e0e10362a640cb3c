"""bench_flashmla without a GPU: ``--smoke`` runs one tiny cell on the CPU in a process started as
a person would start it (from the repository root, TRITON_INTERPRET unset: the script turns the
interpreter on itself, so the Gluon paths are listed with that reason); a ``--variant`` file is
imported as a sibling of the pack's kernels under a name of its own (so two copies of the ws
kernel live side by side), bad ``--variant`` / ``--skip`` values are refused before anything runs,
and the per-variant summary reads a result in the script's layout."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_flashmla.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the grid")
def test_smoke_as_started_from_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "bench_flashmla.json").read_text())
    assert res["meta"]["smoke"] is True and res["meta"]["device"] == "cpu"
    assert "TRITON_INTERPRET=1" in res["meta"]["unavailable"]["pack_gluon_ws"]
    assert set(res["meta"]["unavailable"]) == {"flashmla_direct", "pack_flashmla", "pack_gluon_ws"}
    # (the CPU default path is the reference itself; torch's CPU bf16 matmuls may sum in another order from one
    # run to the next, seen at 2.5e-4 once in 20 runs on 2 busy cores: within rounding, not 0 every time)
    assert set(res["checks"]) == {"pack_default/H16", "pack_default_validated/H16"}
    for name, got in res["checks"].items():
        assert got["ok"] and got["why"] is None and got["rel_err"] <= 2e-3, (name, got)
    (cell,) = res["cells"]
    assert (cell["H"], cell["K"], cell["T"], cell["S"]) == (16, 64, 8, 1024) and not cell["errors"]
    assert set(cell["ms"]) == {"torch", "pack_default", "pack_default_validated"}
    assert set(cell["host_us"]) == {"pack_default", "pack_default_validated"}  # the timed paths' host work
    assert all(v > 0 for v in cell["host_us"].values()) and cell["lead_cycles"] >= 1_000_000
    assert set(cell["loop_ms"]) == {"pack_default", "pack_default_validated"}
    assert "validated / unvalidated default call (call): min" in proc.stdout
    assert "validated / unvalidated default call (loop): min" in proc.stdout
    assert cell["default_variant"] == "reference"
    assert "| 16 / 64 / 8 / 1K |" in proc.stdout


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # as running the script does
    spec = importlib.util.spec_from_file_location("bench_flashmla", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variant_is_a_separate_copy(bench, tmp_path):
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    import swa_backends.kernels.sparse_mla_gluon_ws as shipped

    copy = tmp_path / "ws_copy.py"
    src = Path(shipped.__file__).read_text()
    line = next(ln for ln in src.splitlines() if ln.startswith("WORKER_REGS = "))
    copy.write_text(src.replace(line, "WORKER_REGS = (200, 56)"))
    mod = bench.load_variant("trial", copy)
    try:
        assert mod.__name__ == "swa_backends.kernels._bench_variant_trial"
        assert mod is not shipped and mod.sparse_mla is not shipped.sparse_mla
        assert mod._shared is sys.modules["swa_backends.kernels.sparse_mla_gluon"]  # its relative import
        assert mod._sparse_mla_gluon_ws_fwd is not shipped._sparse_mla_gluon_ws_fwd
        assert mod.WORKER_REGS == (200, 56) and shipped.WORKER_REGS != (200, 56)  # the copy's own code
    finally:
        sys.modules.pop(mod.__name__, None)


@pytest.mark.parametrize("argv, what", [(["--variant", "x"], "--variant: 'x'"),
                                        (["--variant", "1x=bench/bench_flashmla.py"], "LABEL an identifier"),
                                        (["--variant", "x=/nonexistent.py"], "FILE an existing file"),
                                        (["--variant", "x=bench/bench_flashmla.py", "--variant",
                                          "x=bench/bench_flashmla.py"], "not given before")])
def test_bad_variant_refused(bench, tmp_path, argv, what, monkeypatch):
    monkeypatch.chdir(ROOT)  # the FILE paths above are relative to the checkout
    with pytest.raises(ValueError, match=what):
        bench.main(["--out", str(tmp_path)] + argv)
    assert not any(tmp_path.iterdir())


def test_a_variant_diff_is_applied_strictly_before_anything_runs(bench, tmp_path):
    """A ``--variant`` given as a ``.diff`` of the kernel (a candidate of bench/experiments/candidates) that no
    longer applies is refused, naming its hunk, before any output or GPU work."""
    stale = tmp_path / "stale.diff"
    stale.write_text("--- a/kernels/sparse_mla_gluon_ws.py\n+++ b/kernels/sparse_mla_gluon_ws.py\n"
                     "@@ -1,1 +1,1 @@\n-not the kernel's first line\n+x\n")
    with pytest.raises(ValueError, match="stale.diff: the hunk at line 3 does not apply"):
        bench.main(["--out", str(tmp_path / "o"), "--variant", f"s={stale}"])
    assert not (tmp_path / "o").exists()


def test_variant_summary(bench, capsys):
    cells = [{"S": 1 << 20, "tflops": {"flashmla_direct": 400.0, "pack_gluon_ws": 360.0, "ws_a": 380.0}},
             {"S": 1 << 20, "tflops": {"flashmla_direct": 500.0, "pack_gluon_ws": 450.0, "ws_a": 400.0}},
             {"S": 1 << 14, "tflops": {"flashmla_direct": 500.0, "pack_gluon_ws": 450.0, "ws_a": 500.0}}]
    bench.print_variants({"cells": cells})
    line = capsys.readouterr().out.strip()
    assert line.startswith("ws_a: ")
    assert "/flashmla_direct 1M min 0.800 gm 0.872" in line  # sqrt(0.95 * 0.8)
    assert "/flashmla_direct 16K min 1.000 gm 1.000" in line
    assert "/pack_gluon_ws 1M min 0.889" in line


def test_validated_summary(bench, capsys):
    pair = ("pack_default", "pack_default_validated")
    cells = [{"ms": dict(zip(pair, (1.0, 1.05))), "loop_ms": dict(zip(pair, (1.0, 1.0)))},
             {"ms": dict(zip(pair, (2.0, 2.0))), "loop_ms": dict(zip(pair, (2.0, 2.02)))},
             {"ms": {"pack_default": 1.0}}]  # the validated call not timed: left out
    assert bench.validated_speeds({"cells": cells}) == {"call": [1 / 1.05, 1.0], "loop": [1.0, 2 / 2.02]}
    bench.print_validated({"cells": cells})
    call, loop = capsys.readouterr().out.strip().splitlines()
    assert call == "validated / unvalidated default call (call): min 0.952, gm 0.976, 1 of 2 cells below 0.97"
    assert loop == "validated / unvalidated default call (loop): min 0.990, gm 0.995, 0 of 2 cells below 0.97"


def test_variants_leave_the_direct_path_alone(bench, monkeypatch):
    """A variant's module never stands in for FlashMLA's in the direct path (the GPU run of 2026-12-01
    caught the direct path calling the last variant's module)."""
    from types import SimpleNamespace

    from swa_backends.backends.cuda import probes

    calls = []
    fake = SimpleNamespace(flash_mla_sparse_fwd=lambda *a, **k: calls.append("flashmla") or ("o", None, "lse"))
    monkeypatch.setattr(probes, "find_flashmla", lambda: (fake, None))
    monkeypatch.setattr(bench.smoke, "interpreted", lambda environ=None: False)  # as on the GPU: Gluon paths built
    variant = SimpleNamespace(sparse_mla=lambda *a, **k: calls.append("variant") or ("vo", "vl"))
    found, _, _ = bench.paths("cpu", {"v": variant})
    monkeypatch.undo()
    _, why, _ = bench.paths("cpu", {"v": variant})  # under Triton's interpreter: each Gluon path a reason
    assert why["pack_gluon_ws"] == bench.GLUON_INTERPRETED
    assert why["ws_v"] == bench.COPY_INTERPRETED

    class T:
        def unsqueeze(self, dim):
            return self

    assert found["flashmla_direct"](T(), T(), T(), None, 1.0, None) == ("o", "lse")
    assert found["ws_v"](None, None, None, None, 1.0, None) == ("vo", "vl")
    assert calls == ["flashmla", "variant"]


def test_cells_parsed_and_bad_ones_refused(bench, tmp_path):
    assert bench.parse_cells("") == []
    assert bench.parse_cells("128:2048:4096:1048576,64:640:16:640") == [(128, 2048, 4096, 1 << 20), (64, 640, 16, 640)]
    for bad in ("128:640:4096", "a:640:4096:1024", "0:640:4096:1024", "64:2048:16:1024", "64:-1:16:1024"):
        with pytest.raises(ValueError, match="--cells: .*expected H:K:T:ROWS"):
            bench.parse_cells(bad)
    with pytest.raises(ValueError, match="with --quick"):
        bench.main(["--out", str(tmp_path), "--quick", "--cells", "64:640:16:640"])
    assert not any(tmp_path.iterdir())
