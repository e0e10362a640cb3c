"""The pack's C launcher (``kernels/_claunch.c``) without a GPU: it builds, packs every
argument kind the way the kernel's parameter list needs it (checked through the module's
recording launch function), refuses bad arguments before any launch, reports a missing
CUDA context instead of launching, and ``kinds`` refuses what it cannot pack (every pack
kernel compiled offline for sm_90a is typed by it: tests/test_triton_compile.py). The launcher layout it assumes (non-constexpr
arguments in order, then two scratch pointers) is checked against the installed Triton's
driver source. On the GPU, tests/test_triton_gpu.py runs every kernel through it and
compares with Triton's own launch path."""

from __future__ import annotations

import inspect
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swa_backends.common.registry import probe

pytestmark = pytest.mark.skipif(probe("triton") is not None, reason=f"{probe('triton')}")


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    from swa_backends.kernels import _claunch

    m = _claunch.load()
    if m is None and _claunch._compiler() is None:
        pytest.skip(f"no C compiler on this machine: {_claunch.reason()}")
    assert m is not None, _claunch.reason()
    return m


def _u64(v: int) -> int:
    return v & (2**64 - 1)


def test_packs_every_kind_in_parameter_order(mod):
    record, ctx, _ = mod.test_doubles()
    launcher = mod.Launcher(4321, record, ctx, 256, 1024, b"pxnzibhlILfdn", 2)
    x, y = torch.arange(5), torch.ones(3)
    out = launcher((7, 2, 3), 99, x, 123, None, None, -5, -2, 300, -(2**40), 2**32 - 1, 2**64 - 1, 1.5, -0.25, y)
    assert out is None
    rec = mod.last_launch()
    assert rec["function"] == 4321 and rec["grid"] == (7, 2, 3) and rec["block"] == (256, 1, 1)
    assert rec["shared"] == 1024 and rec["stream"] == 99
    f32 = struct.unpack("<I", struct.pack("<f", 1.5))[0]
    f64 = struct.unpack("<Q", struct.pack("<d", -0.25))[0]
    expect = (x.data_ptr(),  # p; the constexpr (x) and the constexpr None (z) are not parameters
              0,  # n: None -> null
              _u64(-5) & 0xFFFFFFFF,  # i: int32, the slot's upper half zero
              _u64(-2) & 0xFF, _u64(300) & 0xFFFF, _u64(-(2**40)), 2**32 - 1, 2**64 - 1, f32, f64,
              y.data_ptr(),
              0, 0)  # global and profile scratch
    assert rec["params"] == expect


def test_launch_ex_gets_the_same_launch(mod):
    """``ex=True``: the same grid, block, shared memory, stream and parameters reach a
    function with cuLaunchKernelEx's signature (through its config struct)."""
    _, ctx, record_ex = mod.test_doubles()
    launcher = mod.Launcher(99, record_ex, ctx, 128, 512, b"pxi", 2, True)
    x = torch.arange(4)
    launcher((3, 4, 5), 42, x, 7, -1)
    rec = mod.last_launch()
    assert (rec["function"], rec["grid"], rec["block"], rec["shared"], rec["stream"]) == \
        (99, (3, 4, 5), (128, 1, 1), 512, 42)
    assert rec["params"] == (x.data_ptr(), 0xFFFFFFFF, 0, 0)


def test_integer_pointers_pass_through(mod):
    record, ctx, _ = mod.test_doubles()
    launcher = mod.Launcher(1, record, ctx, 32, 0, b"pn", 0)
    launcher((1, 1, 1), 0, 0xDEAD0000, 0xBEEF0000)
    assert mod.last_launch()["params"] == (0xDEAD0000, 0xBEEF0000)


@pytest.mark.parametrize("args, err, match", [
    ((None, 1), TypeError, "argument 0 is a pointer; got None"),
    (("abc", 1), TypeError, "argument 0 must be a tensor or an int pointer"),
    ((torch.ones(1), 2**31), OverflowError, "argument 1 does not fit in int32"),
    ((torch.ones(1), 1.5), TypeError, "integer"),
    ((torch.ones(1), 1, torch.ones(1)), TypeError, "argument 2 was None when this kernel was compiled"),
])
def test_bad_arguments_raise_before_the_launch(mod, args, err, match):
    record, ctx, _ = mod.test_doubles()
    launcher = mod.Launcher(1, record, ctx, 32, 0, b"piz", 2)
    calls = mod.last_launch()["calls"]
    full = args + (None,) * (3 - len(args))
    with pytest.raises(err, match=match):
        launcher((1, 1, 1), 0, *full)
    assert mod.last_launch()["calls"] == calls


def test_argument_count_grid_and_constructor_are_checked(mod):
    record, ctx, _ = mod.test_doubles()
    launcher = mod.Launcher(1, record, ctx, 32, 0, b"pi", 2)
    with pytest.raises(TypeError, match="takes \\(grid, stream, 2 kernel arguments\\)"):
        launcher((1, 1, 1), 0, torch.ones(1))
    with pytest.raises(TypeError, match="grid must be a tuple of 3 ints"):
        launcher((1, 1), 0, torch.ones(1), 1)
    with pytest.raises(ValueError, match="kinds\\[1\\] = q"):
        mod.Launcher(1, record, ctx, 32, 0, b"pq", 2)
    with pytest.raises(ValueError, match="launch must be the address"):
        mod.Launcher(1, 0, ctx, 32, 0, b"p", 2)
    with pytest.raises(ValueError, match="block_x = 2048"):
        mod.Launcher(1, record, ctx, 2048, 0, b"p", 2)


def test_empty_grid_launches_nothing(mod):
    record, ctx, _ = mod.test_doubles()
    launcher = mod.Launcher(1, record, ctx, 32, 0, b"p", 2)
    calls = mod.last_launch()["calls"]
    assert launcher((0, 1, 1), 0, torch.ones(1)) is None
    assert mod.last_launch()["calls"] == calls


def test_no_current_context_returns_false_without_launching(mod):
    record, ctx, _ = mod.test_doubles(0)
    try:
        launcher = mod.Launcher(1, record, ctx, 32, 0, b"p", 2)
        calls = mod.last_launch()["calls"]
        assert launcher((1, 1, 1), 0, torch.ones(1)) is False
        assert mod.last_launch()["calls"] == calls
    finally:
        mod.test_doubles(1)


def test_driver_error_raises(mod):
    record, ctx, _ = mod.test_doubles(1, 700)
    try:
        launcher = mod.Launcher(1, record, ctx, 32, 0, b"p", 2)
        with pytest.raises(RuntimeError, match="CUresult 700"):
            launcher((1, 1, 1), 0, torch.ones(1))
    finally:
        mod.test_doubles(1, 0)


def test_kernel_falls_back_to_tritons_path_without_a_context(mod, monkeypatch):
    """``Kernel`` with a C launcher that finds no context: the launch goes through
    Triton's path (which makes the context current), not nowhere."""
    from swa_backends.kernels import _launch

    monkeypatch.setattr(_launch, "FAST", True)
    monkeypatch.setattr(_launch, "CHECK_KEYS", False)
    slow = []

    class Jit:
        params = [SimpleNamespace(name="x_ptr")]
        fn = None

        def __getitem__(self, grid):
            return lambda *a: slow.append(a)

    k = _launch.Kernel(Jit(), name="test_claunch.fake")
    try:
        record, ctx, _ = mod.test_doubles(0)
        k._get_device, k._get_stream = (lambda: 0), (lambda dev: 5)
        k._hooks = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
        k._fast[(0, ())] = (mod.Launcher(1, record, ctx, 32, 0, b"p", 2), None)
        t = torch.ones(1)
        k((), (1, 1, 1), t)
        assert slow == [(t,)]
        mod.test_doubles(1)
        k((), (1, 1, 1), t)
        assert slow == [(t,)] and mod.last_launch()["params"] == (t.data_ptr(), 0, 0)
    finally:
        mod.test_doubles(1)
        _launch.KERNELS.pop("test_claunch.fake", None)


def test_kinds_refuse_what_the_launcher_cannot_pack():
    from swa_backends.kernels._claunch import kinds

    assert kinds({"a_ptr": "*fp16", "s": "fp16"}, ["a_ptr", "s"], (1, 1.0)) is None
    assert kinds({"a_ptr": "tensordesc<fp16[64]>"}, ["a_ptr"], (1,)) is None
    assert kinds({"a_ptr": "*i32"}, ["a_ptr", "b"], (1, 2)) is None  # a name Triton did not type
    assert kinds({"n": "u8"}, ["n"], (200,)) is None  # no unsigned 8/16-bit kind: Triton's launcher
    assert kinds({"a_ptr": "constexpr", "n": "i64"}, ["a_ptr", "n"], (None, 5)) == b"zl"


@pytest.mark.parametrize("env, reason", [
    ({"CC": "/nonexistent/cc"}, "no C compiler found"),
    ({"CC": "false"}, "failed"),  # a compiler that exits 1: nothing half-written is left behind
    ({"SWA_TRITON_C_LAUNCH": "0"}, "turned off"),
])
def test_a_launcher_that_cannot_be_built_is_a_reason(tmp_path, env, reason):
    """No compiler, a failing build or the switch: ``load()`` gives None and says why (the
    launches then keep Triton's launcher); the cache folder holds no partial file."""
    code = ("from swa_backends.kernels import _claunch; m = _claunch.load(); "
            "print(m is None); print(_claunch.reason())")
    full = dict(os.environ, SWA_CACHE_DIR=str(tmp_path / "cache"), **env)
    full.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "True" and reason in lines[1], out.stdout
    cache = tmp_path / "cache"
    assert not cache.exists() or not list(cache.iterdir())


def test_launcher_layout_matches_the_installed_triton():
    """The C launcher passes every non-constexpr argument, then exactly two null
    pointers: what this Triton's CUDA launcher appends (global and profile scratch)."""
    import triton

    from swa_backends.kernels import _claunch

    drv = pytest.importorskip("triton.backends.nvidia.driver")
    if not triton.__version__.startswith(_claunch.KNOWN_TRITONS):
        pytest.skip(f"Triton {triton.__version__}: the C launcher is off for it (not a known layout)")
    src = inspect.getsource(drv)
    c_src = Path(drv.__file__).with_name("driver.c")
    if 'params.append("&global_scratch")' in src:  # 3.6: the launcher is generated per kernel
        assert src.count('params.append("&') == 2 and 'params.append("&profile_scratch")' in src
        assert 'params = [f"&arg{i}" for i, ty in signature.items() if ty != "constexpr"]' in src
    else:  # 3.9: one generic launcher in driver.c
        text = c_src.read_text()
        assert "+ 2 for global & profile scratch" in text
        assert "global_scratch_obj" in text and "profile_scratch_obj" in text
