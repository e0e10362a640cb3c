"""The pack's CUDA kernels under NVIDIA's compute-sanitizer (memcheck: out-of-bounds and
misaligned accesses; racecheck: shared-memory hazards), 0 errors required. Runs
tests/kernels/sanitize_kernels.py in a child process under each tool; skipped where there is no GPU
or no compute-sanitizer (it ships in CUDA toolkits and the nvidia-cuda-sanitizer-api wheel).

racecheck orders shared-memory accesses by CTA barriers only; it does not model mbarrier
arrive/wait. The persistent warp-specialised kernel (``gluon_ws``) hands data between its
warpgroups through mbarriers, so racecheck reports every such hand-off (and the same class of
reports for vLLM's FlashMLA, whose warpgroups do the same; H200, compute-sanitizer of CUDA 13,
2026-12-01). Those two (the ws kernel with both gather widths) run under memcheck here and are
left out of racecheck; every other kernel must come out of racecheck clean.

PyTorch's caching allocator is off in the child (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``): with it
on, an access past a tensor that stays inside PyTorch's cached segment is invisible to memcheck.
memcheck also runs the huge-stride cases (views whose elements lie 2**31 or more elements apart,
up to 16 GiB a case); racecheck, which looks at shared memory only, leaves them out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


#: the device memory one huge-stride case may keep (its views, up to 16 GiB): under memcheck with the
#: caching allocator off it stays allocated until the process ends (seen on the H200), so a process
#: runs as many cases as three quarters of the GPU's memory holds: six on an H200, three on an H100,
#: where six ran out of memory (the failed allocation is itself a memcheck error)
HUGE_CASE_BYTES = 16 * 2**30 + 2**20


def huge_per_process(total_bytes: int) -> int:
    return max(1, total_bytes * 3 // 4 // HUGE_CASE_BYTES)


def _sanitize(exe: str, tool: str, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    proc = subprocess.run([exe, "--tool", tool, "--error-exitcode", "1", sys.executable,
                           str(HERE / "sanitize_kernels.py"), *args], capture_output=True, text=True, env=env,
                          timeout=3600)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    # memcheck ends with "ERROR SUMMARY: 0 errors"; racecheck with "RACECHECK SUMMARY: 0 hazards displayed
    # (0 errors, 0 warnings)" (compute-sanitizer of CUDA 13)
    summary = "ERROR SUMMARY: 0 errors" if tool == "memcheck" else "RACECHECK SUMMARY: 0 hazards displayed (0 errors"
    assert summary in proc.stdout + proc.stderr, tail
    assert "wrong results: 0" in proc.stdout, tail


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_kernels_under_compute_sanitizer(tool):
    exe = shutil.which("compute-sanitizer") or next(
        (str(p) for p in Path("/usr/local/cuda/bin").glob("compute-sanitizer")), None)
    if exe is None:
        pytest.skip("compute-sanitizer is not on PATH")
    if tool == "racecheck":
        _sanitize(exe, tool, "--skip", "gluon_ws,gluon_ws_wide,flashmla", "--no-huge")
        return
    _sanitize(exe, tool, "--no-huge-strides")
    sys.path.insert(0, str(HERE))
    import huge_strides

    import torch

    assert huge_strides.MAX_BYTES <= HUGE_CASE_BYTES
    n = len(list(huge_strides.names("cuda")))
    per = huge_per_process(torch.cuda.get_device_properties(0).total_memory)
    for start in range(0, n, per):
        _sanitize(exe, tool, "--huge-only", f"{start}:{min(start + per, n)}")


def test_huge_stride_cases_per_process_fit_the_gpu():
    """Six a process on an H200 (as measured there), three on an H100, one on a small card."""
    assert huge_per_process(143771 * 2**20) == 6
    assert huge_per_process(81559 * 2**20) == 3
    assert huge_per_process(24 * 2**30) == 1
