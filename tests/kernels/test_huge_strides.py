"""Every Triton kernel of the pack on views whose elements lie more than 2**31 elements apart
(tests/kernels/huge_strides.py), against the reference, each case crash-safe: in Triton's
interpreter on a CPU, compiled on a GPU (where the GPU-only cases join).

The cases run in one worker process that reports each finished case; a worker that dies (a
SIGSEGV from a wrapped 32-bit offset) marks the case it was running as a crash and a new
worker carries on with the next one. On a CPU the storage behind each view is reserved, not
committed: the worker's peak RSS stays small (checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _tritons import NO_TRITON

import huge_strides

HERE = Path(__file__).resolve().parent
#: the worker's peak resident memory over every case on a CPU (the views span 2-16 GiB of address space each)
MAX_RSS_MIB = 2048

pytestmark = pytest.mark.skipif(NO_TRITON is not None, reason=str(NO_TRITON))

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = huge_strides.names(DEVICE)


def run_worker(names: list[str]) -> dict[str, dict]:
    """Each case's report; a case the worker died in gets outcome "crash"."""
    rows: dict[str, dict] = {}
    start = 0
    while start < len(names):
        proc = subprocess.run([sys.executable, str(HERE / "huge_strides.py"), "--device", DEVICE, "--start", str(start),
                               *names],
                              capture_output=True, text=True, cwd=HERE, timeout=900)
        lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        for ln in lines:
            if "case" in ln:
                rows[ln["case"]] = ln
        if any("done" in ln for ln in lines):
            break
        crashed = max([ln["i"] for ln in lines if "i" in ln], default=start - 1) + 1
        tail = proc.stderr.strip().splitlines()[-1:]
        rows[names[crashed]] = {"case": names[crashed], "outcome": "crash",
                                "detail": f"worker exit {proc.returncode}: {tail}"}
        start = crashed + 1
    return rows


@pytest.fixture(scope="module")
def reports(request):
    """One worker run over the cases this session collected."""
    wanted = [item.callspec.params["name"] for item in request.session.items
              if item.module.__name__ == __name__ and hasattr(item, "callspec")]
    return run_worker(wanted)


@pytest.mark.parametrize("name", CASES)
def test_huge_stride_view_matches_reference(name, reports):
    row = reports.get(name)
    assert row is not None, f"{name}: no report"
    assert row["outcome"] == "ok", f"{name}: {row['outcome']}: {row['detail']}"
    if DEVICE == "cpu":  # a GPU's storage is real, and its results come back through host memory
        assert row["peak_rss_mib"] <= MAX_RSS_MIB, f"{name}: the worker's peak RSS {row['peak_rss_mib']} MiB"


def test_spread_puts_the_ends_2_31_elements_apart():
    import torch

    t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    for dim in (0, 1):
        v = huge_strides.spread(t, dim)
        assert torch.equal(v, t)
        assert v.stride(dim) * (t.shape[dim] - 1) >= 2**31 and v.stride(dim) < 2**31
        assert v.untyped_storage().nbytes() >= 2**31 * 4
