"""The pack's launch shortcut (``kernels/_launch.py``) without a GPU: what the generated
fast launcher hands Triton's compiled launcher, when pointers go as integers and when they
do not, launch hooks, the profiling stub; and the host-path profiler and the benchmark
script's CPU smoke mode, each in its own process (compiled mode / interpreter mode).

On the GPU the same path runs for real: tests/test_triton_gpu.py checks that the shortcut
and Triton's own launch path give the same results, with and without integer pointers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swa_backends.common.registry import probe

pytestmark = pytest.mark.skipif(probe("triton") is not None, reason=f"{probe('triton')}")

ROOT = Path(__file__).resolve().parents[1]


class FakeCompiled:
    """What ``Kernel`` keeps of a compiled kernel; ``run`` records the launcher calls."""

    function = 1234
    packed_metadata = (4, 1, 0)

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)

    def launch_metadata(self, grid, stream, *args):
        return ("meta", grid, stream)


class FakeJit:
    """A stand-in for a ``triton.jit`` function: parameters, and ``fn[grid](*args)``
    (Triton's own launch path) returning the compiled kernel."""

    def __init__(self, names, ck):
        self.params = [SimpleNamespace(name=n) for n in names]
        self.ck = ck
        self.slow_launches = []
        self.fn = self  # Kernel names itself after fn.fn

    def __getitem__(self, grid):
        def launch(*args):
            self.slow_launches.append((grid, args))
            return self.ck

        return launch


@pytest.fixture
def kernel(monkeypatch):
    from swa_backends.kernels import _launch

    monkeypatch.setattr(_launch, "FAST", True)
    monkeypatch.setattr(_launch, "CHECK_KEYS", False)
    monkeypatch.setattr(_launch, "PTR_INTS", True)
    ck = FakeCompiled()
    names = ["x_ptr", "n", "y_ptr", "z_ptr", "BLOCK"]
    jit = FakeJit(names, ck)
    k = _launch.Kernel(jit, name="test_launch.fake")
    hooks = SimpleNamespace(launch_enter_hook=SimpleNamespace(calls=[]), launch_exit_hook=None)
    # what _bind_runtime would bind on a GPU
    k._get_device, k._get_stream, k._hooks = (lambda: 0), (lambda dev: 777), hooks
    yield k, jit, ck, hooks
    _launch.KERNELS.pop("test_launch.fake", None)


def test_first_launch_takes_tritons_path_then_the_shortcut(kernel):
    k, jit, ck, _ = kernel
    x, y = torch.arange(4), torch.ones(3)
    k(("key",), (5, 1, 1), x, 10, y, None, 64)
    assert len(jit.slow_launches) == 1 and ck.calls == []
    k(("key",), (6, 2, 1), x, 11, y, None, 64)
    assert len(jit.slow_launches) == 1
    # Triton's launcher layout: grid, stream, function, packed metadata, launch metadata,
    # hooks, then every argument (constexprs included); pointers as integers, None kept
    assert ck.calls == [(6, 2, 1, 777, 1234, (4, 1, 0), None, None, None, x.data_ptr(), 11, y.data_ptr(), None, 64)]
    assert k.launches == 2


def test_pointer_that_was_none_may_become_a_tensor_but_not_the_reverse(kernel):
    k, _, ck, _ = kernel
    x, y, z = torch.arange(4), torch.ones(3), torch.zeros(2)
    k(("key",), (1, 1, 1), x, 1, y, None, 64)
    k(("key",), (1, 1, 1), x, 1, y, z, 64)
    assert ck.calls[-1][-2] == z.data_ptr()
    with pytest.raises(AttributeError):  # a key's tensor argument became None: loud, not a null pointer
        k(("key",), (1, 1, 1), x, 1, None, z, 64)


def test_tensor_pointers_when_integers_are_off(kernel):
    from swa_backends.kernels import _launch

    k, _, ck, _ = kernel
    x, y = torch.arange(4), torch.ones(3)
    previous = _launch.set_pointer_ints(False)
    try:
        k(("key",), (1, 1, 1), x, 1, y, None, 64)
        k(("key",), (1, 1, 1), x, 2, y, None, 64)
        assert ck.calls[-1][9:] == (x, 2, y, None, 64)
    finally:
        _launch.set_pointer_ints(previous)


def test_arguments_off_the_naming_convention_pass_unchanged(kernel):
    k, _, ck, _ = kernel
    x = torch.arange(4)
    k(("other",), (1, 1, 1), x, x, x, None, 64)  # a tensor where an int parameter is
    k(("other",), (1, 1, 1), x, x, x, None, 64)
    assert ck.calls[-1][9:] == (x, x, x, None, 64)


def test_launch_hooks_get_launch_metadata(kernel):
    k, _, ck, hooks = kernel
    x, y = torch.arange(4), torch.ones(3)
    k(("key",), (1, 1, 1), x, 1, y, None, 64)
    hooks.launch_enter_hook.calls.append(print)
    k(("key",), (3, 1, 1), x, 1, y, None, 64)
    call = ck.calls[-1]
    assert call[6] == ("meta", (3, 1, 1), 777) and call[7] is hooks.launch_enter_hook and call[9] is x


def test_launcher_stub_replaces_only_the_launcher(kernel):
    from swa_backends.kernels import _launch

    k, jit, ck, _ = kernel
    x, y = torch.arange(4), torch.ones(3)
    seen = []
    _launch.set_launcher_stub(lambda *args: seen.append(args))
    try:
        k(("key",), (1, 1, 1), x, 1, y, None, 64)  # Triton's path (real), installs a stubbed entry
        k(("key",), (2, 1, 1), x, 1, y, None, 64)
        assert ck.calls == [] and seen[-1][:6] == (2, 1, 1, 777, 1234, (4, 1, 0))
    finally:
        _launch.set_launcher_stub(None)
    k(("key",), (1, 1, 1), x, 1, y, None, 64)
    k(("key",), (1, 1, 1), x, 1, y, None, 64)
    assert len(ck.calls) == 1 and len(jit.slow_launches) == 2


def _run(args, **kw):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, **kw)


def test_host_path_profiler_runs(tmp_path):
    out = tmp_path / "host.json"
    proc = _run([str(ROOT / "bench" / "profile_host_path.py"), "--calls", "20", "--json", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert {r["step"] for r in res["rows"]} == {"1x1K", "16x1K+240d"}
    for r in res["rows"]:
        assert all(v > 0 for k, v in r.items() if k != "step")
    # the gather and fused kernels took the integer-pointer shortcut
    assert {n.split(".")[0] for n, _, ints in res["kernels_stubbed"] if ints} >= {"gather_replay_batch",
                                                                                  "prepare_replay_step"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the full benchmark")
def test_bench_triton_ops_smoke(tmp_path):
    proc = _run([str(ROOT / "bench" / "bench_triton_ops.py"), "--out", str(tmp_path), "--smoke"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "bench_triton_ops.json").read_text())
    assert res["meta"]["smoke"] is True
    for key in ("gather_replay_batch", "prepare_replay_step", "gather_rows", "scatter_rows"):
        assert res[key], key
    row = res["gather_replay_batch"][0]
    for k in ("triton_gpu_us_flushed", "triton_gpu_us_warm", "triton_host_us", "triton_host_us_tensor_ptrs",
              "triton_host_us_python_only", "reference_gpu_us_flushed"):
        assert row[k] > 0, k
    for key in ("swa_indices_and_lens_64k", "pad_replayed_slots_64k", "prepare_replay_step_64k"):
        assert res[key]["triton_us_flushed"] > 0 and res[key]["triton_us_warm"] > 0
    assert "gather_replay_batch" in proc.stdout and "L2-flushed" in proc.stdout


def _fake_cuda_launcher(drv, record, **overrides):
    """A real ``CudaLauncher`` object of this Triton without its compiled module: its C
    ``launch`` records what it gets. Attributes of both known layouts (3.6 and 3.9)."""
    launcher = object.__new__(drv.CudaLauncher)
    fields = dict(launch=lambda *a: record.append(a), num_ctas=1, global_scratch_size=0, global_scratch_align=1,
                  profile_scratch_size=0, profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=False)
    code = drv.CudaLauncher.__call__.__code__
    if "kernel_metadata" in code.co_varnames[:code.co_argcount]:  # 3.9's layout
        fields.update(arg_annotations=("annotations",), kernel_signature=b"signature", gsan_enabled=False)
    fields.update(overrides)
    for k, v in fields.items():
        setattr(launcher, k, v)
    return launcher


def test_direct_launch_hands_the_c_launcher_what_tritons_wrapper_does(monkeypatch):
    """The shortcut's direct call of the C ``launch`` (skipping ``CudaLauncher.__call__``)
    passes exactly the arguments Triton's own ``__call__`` passes, for this Triton's
    layout (run with every Triton the machine has: 3.6 and 3.9 differ)."""
    import triton
    from swa_backends.kernels import _launch

    drv = pytest.importorskip("triton.backends.nvidia.driver")
    monkeypatch.setattr(triton.runtime.driver, "_active", SimpleNamespace())  # no GPU driver needed
    record = []
    launcher = _fake_cuda_launcher(drv, record)
    assert _launch.direct_call(launcher) is not None, "this Triton's CudaLauncher layout is not recognised"
    ck = SimpleNamespace(run=launcher, function=4321, packed_metadata=(4, 1, 0))
    a, b = torch.arange(3), torch.arange(5)
    names = ["x_ptr", "n", "y_ptr", "opt_ptr", "m"]
    fast = _launch.fast_launcher(ck, names, (a, 7, b, None, -2))
    fast((3, 1, 1), 999, a, 7, b, None, -2)
    drv.CudaLauncher.__call__(launcher, 3, 1, 1, 999, 4321, (4, 1, 0), None, None, None,
                              a.data_ptr(), 7, b.data_ptr(), None, -2)
    assert len(record) == 2 and record[0] == record[1], record


def test_direct_launch_falls_back_where_the_wrapper_does_work(monkeypatch):
    from swa_backends.kernels import _launch

    drv = pytest.importorskip("triton.backends.nvidia.driver")
    assert _launch.direct_call(_fake_cuda_launcher(drv, [], global_scratch_size=128)) is None
    assert _launch.direct_call(_fake_cuda_launcher(drv, [], profile_scratch_size=64)) is None
    assert _launch.direct_call(FakeCompiled()) is None  # not Triton's CUDA launcher: the object is called
    ck = FakeCompiled()
    fast = _launch.fast_launcher(ck, ["x_ptr", "n"], (torch.arange(2), 1))
    t = torch.arange(4)
    fast((1, 1, 1), 5, t, 3)
    assert ck.calls == [(1, 1, 1, 5, ck.function, ck.packed_metadata, None, None, None, t.data_ptr(), 3)]
