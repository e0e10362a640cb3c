"""The pack's launch path (``kernels/_launch.py``) without a GPU: what :class:`Kernel` hands
Triton's compiled launcher after a key's first launch, and its C launcher where the launcher's
body is a known one, launch hooks, ``check_keys`` (the benchmark's CPU smoke run:
tests/e2e/test_bench_triton_ops.py).

On the GPU the same path runs for real: tests/kernels/test_triton_gpu.py checks it against Triton's
own launch path with ``check_keys``."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
from _tritons import NO_TRITON
import torch


pytestmark = pytest.mark.skipif(NO_TRITON is not None, reason=str(NO_TRITON))


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
        def launch(*args, **options):
            self.slow_launches.append((grid, args, options) if options else (grid, args))
            return self.ck

        return launch


def _hook_chain():
    """Triton's ``HookChain`` class (None where this Triton's hook knobs hold plain callables)."""
    import importlib

    return getattr(importlib.import_module("triton.knobs"), "HookChain", None)


@pytest.fixture
def kernel(monkeypatch):
    from swa_backends.kernels import _launch

    monkeypatch.setattr(_launch, "check_keys", False)
    ck = FakeCompiled()
    names = ["x_ptr", "n", "y_ptr", "z_ptr", "BLOCK"]
    jit = FakeJit(names, ck)
    k = _launch.Kernel(jit, name="test_launch.fake")
    hooks = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    # what the first real launch binds on a GPU: device and stream getters, Triton's runtime
    # knobs and its hook-chain class
    k._runtime = ((lambda: 0), (lambda dev: 777), hooks, _hook_chain())
    yield k, jit, ck, hooks
    _launch.KERNELS.pop("test_launch.fake", None)


def test_first_launch_takes_tritons_path_then_the_compiled_launcher(kernel):
    k, jit, ck, _ = kernel
    x, y = torch.arange(4), torch.ones(3)
    k(("key",), (5, 1, 1), x, 10, y, None, 64)
    assert len(jit.slow_launches) == 1 and ck.calls == []
    k(("key",), (6, 2, 1), x, 11, y, None, 64)
    assert len(jit.slow_launches) == 1
    # Triton's launcher layout: grid, stream, function, packed metadata, launch metadata,
    # hooks, then every argument (constexprs included), exactly as JITFunction.run passes them
    assert ck.calls == [(6, 2, 1, 777, 1234, (4, 1, 0), None, None, None, x, 11, y, None, 64)]
    assert k.launches == 2


def test_each_key_is_compiled_through_tritons_path_once(kernel):
    k, jit, ck, _ = kernel
    x, y = torch.arange(4), torch.ones(3)
    for key in (("a",), ("b",), ("a",), ("b",)):
        k(key, (1, 1, 1), x, 1, y, None, 64)
    assert len(jit.slow_launches) == 2 and len(ck.calls) == 2


def test_compile_options_come_from_the_key_on_its_first_launch(kernel):
    from swa_backends.kernels import _launch

    plain, jit, ck, _ = kernel
    k = _launch.Kernel(jit, name="test_launch.fake_options", options=lambda key: {"num_warps": key[-1]})
    k._runtime = plain._runtime
    try:
        x, y = torch.arange(4), torch.ones(3)
        k(("a", 2), (1, 1, 1), x, 1, y, None, 64)
        k(("a", 4), (1, 1, 1), x, 1, y, None, 64)
        k(("a", 2), (1, 1, 1), x, 1, y, None, 64)  # compiled: Triton's launcher, no options
        assert [launch[2] for launch in jit.slow_launches] == [{"num_warps": 2}, {"num_warps": 4}]
        assert len(ck.calls) == 1
    finally:
        _launch.KERNELS.pop("test_launch.fake_options", None)


def test_parameters_by_name_go_by_keyword_on_the_first_launch_and_in_order_after(kernel):
    """A Gluon kernel's constexprs (``num_warps`` among them, which Triton reads as the compile
    option only from a keyword) are passed by name when a key compiles, with the key's compile
    options; a compiled key's launcher gets them in place, as Triton's own launch binds them."""
    from swa_backends.kernels import _launch

    plain, jit, ck, _ = kernel
    k = _launch.Kernel(jit, name="test_launch.fake_by_name", options=lambda key: {"maxnreg": key[-1]},
                       by_name=("z_ptr", "BLOCK"))
    k._runtime = plain._runtime
    try:
        x, y = torch.arange(4), torch.ones(3)
        k(("a", 168), (2, 1, 1), x, 1, y, None, 64)
        k(("a", 168), (3, 1, 1), x, 5, y, None, 64)
        assert jit.slow_launches == [((2, 1, 1), (x, 1, y), {"maxnreg": 168, "z_ptr": None, "BLOCK": 64})]
        assert ck.calls == [(3, 1, 1, 777, 1234, (4, 1, 0), None, None, None, x, 5, y, None, 64)]
    finally:
        _launch.KERNELS.pop("test_launch.fake_by_name", None)


def test_launch_meta_passes_constexprs_in_order_with_defaults_and_options_from_the_meta(kernel):
    """``launch_meta(fn, grid, args, meta)``: the constexprs by name from the meta (a default
    where the meta leaves one out), the meta's other items as compile options, one key per
    meta and argument specialisation; a constexpr with no value and no default is refused
    before anything launches."""
    from swa_backends.kernels import _launch

    plain, _, ck, _ = kernel

    def f(x_ptr, n, BLOCK: "tl.constexpr", FLAG: "tl.constexpr" = 3):  # noqa: F821 - read as text
        pass

    jit = FakeJit(["x_ptr", "n", "BLOCK", "FLAG"], ck)
    jit.fn = f
    k, names, _, _ = _launch._meta_kernel(jit)
    k._runtime = plain._runtime
    try:
        x = torch.arange(4)
        _launch.launch_meta(jit, (2,), (x, 5), {"BLOCK": 64, "num_warps": 8})
        _launch.launch_meta(jit, (3,), (x, 7), {"BLOCK": 64, "num_warps": 8})
        assert names == ("BLOCK", "FLAG")
        assert jit.slow_launches == [((2, 1, 1), (x, 5), {"num_warps": 8, "BLOCK": 64, "FLAG": 3})]
        assert ck.calls == [(3, 1, 1, 777, 1234, (4, 1, 0), None, None, None, x, 7, 64, 3)]
        _launch.launch_meta(jit, (1, 2), (x, 5), {"BLOCK": 32, "num_warps": 8})  # another meta: another key
        _launch.launch_meta(jit, (1,), (x, 16), {"BLOCK": 64, "num_warps": 8})  # 16 divides n: another key
        assert [launch[0] for launch in jit.slow_launches[1:]] == [(1, 2, 1), (1, 1, 1)]
        with pytest.raises(TypeError, match="BLOCK"):
            _launch.launch_meta(jit, (1,), (x, 5), {"num_warps": 8})
        assert len(jit.slow_launches) == 3 and len(ck.calls) == 1
    finally:
        _launch.KERNELS.pop(k.name, None)
        _launch._BY_META.pop(jit, None)


def test_launch_meta_runs_a_triton_kernel_as_its_own_launch_does():
    """A real ``triton.jit`` kernel (here Triton's interpreter, on a GPU compiled) through
    ``launch_meta`` writes what ``kernel[grid](*args, **meta)`` writes, its defaulted
    constexpr included, on every launch of a key."""
    import triton
    import triton.language as tl

    from swa_backends.kernels import _launch

    @triton.jit
    def affine(x_ptr, y_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr, OFFSET: tl.constexpr = 1):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * SCALE + OFFSET, mask=i < n)

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.arange(50, dtype=torch.int32, device=dev)
    want = torch.full_like(x, -7)
    affine[(4,)](x, want, 50, SCALE=3, BLOCK=16, num_warps=4)
    try:
        for _ in range(2):
            got = torch.full_like(x, -7)
            _launch.launch_meta(affine, (4,), (x, got, 50), {"SCALE": 3, "BLOCK": 16, "num_warps": 4})
            assert torch.equal(got, want) and torch.equal(want, x * 3 + 1)
    finally:
        k = _launch._BY_META.pop(affine)[0]
        _launch.KERNELS.pop(k.name, None)


def test_a_constexpr_by_keyword_binds_in_declaration_order_and_sets_the_compile_option():
    """What ``Kernel(by_name=...)`` assumes of the Triton this runs under (the vLLM stage's 3.8
    too): a constexpr parameter given by keyword is bound in its place among the parameters, and
    one named ``num_warps`` also sets that compile option."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime import jit

    def probe(x_ptr, n, BLOCK: "tl.constexpr", num_warps: "tl.constexpr"):  # noqa: F821 - read as text
        pass

    probe = jit.JITFunction(probe)
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = jit.create_function_from_signature(probe.signature, probe.params, backend)
    x = torch.empty(1)
    bound, _, _ = binder(x, 3, BLOCK=64, num_warps=8)
    assert list(bound) == ["x_ptr", "n", "BLOCK", "num_warps"] and list(bound.values())[1:] == [3, 64, 8]
    assert backend.parse_options({"num_warps": 8, "BLOCK": 64}).num_warps == 8


def test_specialization_is_at_least_as_fine_as_tritons():
    """Two launches with one ``_launch.specialization`` key get one Triton specialisation (the
    binder of the Triton this runs under, a kernel with Triton's default specialisation): over
    tensors of each alignment and dtype, ints around 1, 16 and 2**31, floats, None."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime import jit

    from swa_backends.kernels._launch import specialization

    def probe(a_ptr, b_ptr, n, m, s):
        pass

    probe = jit.JITFunction(probe)
    binder = jit.create_function_from_signature(probe.signature, probe.params, make_backend(GPUTarget("cuda", 90, 32)))
    base = torch.zeros(64, dtype=torch.int32)
    tensors = [base, base[1:], base[4:], base.view(torch.float32)[4:], torch.zeros(8, dtype=torch.bfloat16)[3:]]
    ints = [0, 1, 2, 15, 16, 17, 32, 2**31 - 16, 2**31, 2**31 + 16, -16, -1]
    seen: dict = {}
    for a in tensors:
        for b in (tensors[0], tensors[1], None):
            for n in ints:
                for m in (1, 16, 33):
                    for s in (0.5, 1.0):
                        args = (a, b, n, m, s)
                        _, spec, _ = binder(*args)
                        triton_key = repr(spec)
                        assert seen.setdefault(specialization(args), triton_key) == triton_key, args
    assert len(set(seen.values())) > 20  # the cases do reach many of Triton's specialisations


def test_launch_hooks_get_launch_metadata(kernel):
    k, _, ck, hooks = kernel
    x, y = torch.arange(4), torch.ones(3)
    k(("key",), (1, 1, 1), x, 1, y, None, 64)
    hooks.launch_enter_hook = print
    k(("key",), (3, 1, 1), x, 1, y, None, 64)
    call = ck.calls[-1]
    assert call[6] == ("meta", (3, 1, 1), 777) and call[7] is print and call[9] is x


def test_empty_hook_chains_are_no_hooks(kernel):
    """Triton 3.9 keeps a HookChain in each launch-hook knob (never None): empty, the launcher
    gets None and no launch metadata is built; with a hook added, both reach the launcher."""
    HookChain = getattr(pytest.importorskip("triton.knobs"), "HookChain", None)
    if HookChain is None:
        pytest.skip("this Triton's launch-hook knobs hold plain callables or None")
    k, _, ck, hooks = kernel
    x, y = torch.arange(4), torch.ones(3)
    k(("key",), (1, 1, 1), x, 1, y, None, 64)
    hooks.launch_enter_hook, hooks.launch_exit_hook = HookChain(), HookChain(reversed=True)
    k(("key",), (2, 1, 1), x, 1, y, None, 64)
    assert ck.calls[-1][6:9] == (None, None, None)
    hooks.launch_enter_hook.add(print)
    k(("key",), (3, 1, 1), x, 1, y, None, 64)
    call = ck.calls[-1]
    assert call[6] == ("meta", (3, 1, 1), 777) and call[7] is hooks.launch_enter_hook and call[8] is None


def test_check_keys_sends_every_launch_through_triton_and_catches_a_missing_specialisation(kernel, monkeypatch):
    from swa_backends.kernels import _launch

    k, jit, ck, _ = kernel
    x, y = torch.arange(4), torch.ones(3)
    monkeypatch.setattr(_launch, "check_keys", True)
    k(("key",), (1, 1, 1), x, 1, y, None, 64)
    k(("key",), (1, 1, 1), x, 1, y, None, 64)
    assert len(jit.slow_launches) == 2 and ck.calls == []
    jit.ck = FakeCompiled()  # Triton compiled another kernel for the same key
    with pytest.raises(AssertionError, match="two compiled kernels"):
        k(("key",), (1, 1, 1), x, 1, y, None, 64)


class FakeLauncher:
    """A compiled kernel's ``run`` object: its C ``launch`` records the calls it gets."""

    def __init__(self, global_scratch_size=0, profile_scratch_size=0):
        self.global_scratch_size, self.profile_scratch_size = global_scratch_size, profile_scratch_size
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.launched, self.called = [], []
        self.launch = lambda *a: self.launched.append(a)

    def __call__(self, *args):
        self.called.append(args)


def _body_hash(cls) -> str:
    import hashlib
    import inspect

    return hashlib.sha256("".join(inspect.getsource(cls.__call__).split()).encode()).hexdigest()


@pytest.fixture
def direct(kernel, monkeypatch):
    """``kernel`` whose compiled kernel's ``run`` is a :class:`FakeLauncher` whose body is
    declared known."""
    from swa_backends.kernels import _launch

    k, jit, _, hooks = kernel
    ck = FakeCompiled()
    ck.run = FakeLauncher()
    jit.ck = ck
    monkeypatch.setattr(_launch, "DIRECT_LAUNCHERS", frozenset({_body_hash(FakeLauncher)}))
    monkeypatch.setattr(_launch, "_known_calls", {})
    return k, ck, hooks


def test_a_known_launcher_body_is_bypassed_for_its_c_launcher(direct):
    k, ck, _ = direct
    x, y = torch.arange(4), torch.ones(3)
    k(("key",), (5, 1, 1), x, 10, y, None, 64)
    k(("key",), (6, 2, 1), x, 11, y, None, 64)
    # what that body passes its C launcher: grid, stream, function, cooperative grid, PDL,
    # two scratch buffers (None: none declared), packed metadata, launch metadata and hooks
    # (None: no hook), then every argument, a tensor as its address
    assert ck.run.launched == [(6, 2, 1, 777, 1234, False, True, None, None, (4, 1, 0), None, None, None,
                                x.data_ptr(), 11, y.data_ptr(), None, 64)]
    assert ck.run.called == [] and k.launches == 2


@pytest.mark.parametrize("scratch", [dict(global_scratch_size=64), dict(profile_scratch_size=8)])
def test_a_kernel_with_scratch_goes_through_run(direct, scratch):
    k, ck, _ = direct
    ck.run = FakeLauncher(**scratch)
    x, y = torch.arange(4), torch.ones(3)
    for _ in range(2):
        k(("key",), (1, 1, 1), x, 1, y, None, 64)
    assert ck.run.launched == [] and ck.run.called == [(1, 1, 1, 777, 1234, (4, 1, 0), None, None, None, x, 1, y,
                                                        None, 64)]


def test_an_unknown_launcher_body_goes_through_run(direct, monkeypatch):
    from swa_backends.kernels import _launch

    k, ck, _ = direct
    monkeypatch.setattr(_launch, "DIRECT_LAUNCHERS", frozenset({"0" * 64}))
    x, y = torch.arange(4), torch.ones(3)
    for _ in range(2):
        k(("key",), (1, 1, 1), x, 1, y, None, 64)
    assert ck.run.launched == [] and len(ck.run.called) == 1


def test_a_launch_hook_sends_the_launch_through_run(direct):
    k, ck, hooks = direct
    x, y = torch.arange(4), torch.ones(3)
    k(("key",), (1, 1, 1), x, 1, y, None, 64)
    hooks.launch_exit_hook = print
    k(("key",), (2, 1, 1), x, 1, y, None, 64)
    hooks.launch_exit_hook = None
    k(("key",), (3, 1, 1), x, 1, y, None, 64)
    assert ck.run.called == [(2, 1, 1, 777, 1234, (4, 1, 0), ("meta", (2, 1, 1), 777), None, print, x, 1, y, None, 64)]
    assert [c[:3] for c in ck.run.launched] == [(3, 1, 1)]


def test_empty_hook_chains_keep_the_direct_launch(direct):
    HookChain = _hook_chain()
    if HookChain is None:
        pytest.skip("this Triton's launch-hook knobs hold plain callables or None")
    k, ck, hooks = direct
    x, y = torch.arange(4), torch.ones(3)
    k(("key",), (1, 1, 1), x, 1, y, None, 64)
    hooks.launch_enter_hook, hooks.launch_exit_hook = HookChain(), HookChain(reversed=True)
    k(("key",), (2, 1, 1), x, 1, y, None, 64)
    assert [c[:3] for c in ck.run.launched] == [(2, 1, 1)] and ck.run.called == []
    hooks.launch_enter_hook.add(print)
    k(("key",), (3, 1, 1), x, 1, y, None, 64)
    call = ck.run.called[-1]
    assert call[:3] == (3, 1, 1) and call[6] == ("meta", (3, 1, 1), 777) and call[7] is hooks.launch_enter_hook
    assert len(ck.run.launched) == 1


def _call_args(fn, attr: str) -> list[list[str]]:
    """The arguments (source text) of every ``<name>.<attr>(...)`` call in ``fn``'s source."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return [[ast.unparse(a) for a in node.args] for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr]


def test_the_compiled_launcher_is_called_as_tritons_jit_calls_it():
    """What ``Kernel`` assumes of ``CompiledKernel.run`` for a compiled key (every Triton but
    3.6 takes this path: ``_launch.launch_path``), read from the source of the Triton this runs
    under (the vLLM CI stage: vLLM 0.33's Triton 3.8): ``JITFunction.run`` launches through
    ``kernel.run(grid 0, 1, 2, stream, function, packed metadata, launch metadata, the two hook
    knobs, every bound argument)``, builds the launch metadata from ``(grid, stream, every
    bound argument)``, and binds every parameter, constexprs included, in declaration order."""
    from triton.runtime import jit

    assert _call_args(jit.JITFunction.run, "run") == [[
        "grid_0", "grid_1", "grid_2", "stream", "kernel.function", "kernel.packed_metadata", "launch_metadata",
        "knobs.runtime.launch_enter_hook", "knobs.runtime.launch_exit_hook", "*bound_args.values()"]]
    assert _call_args(jit.JITFunction.run, "launch_metadata") == [["grid", "stream", "*bound_args.values()"]]
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    def probe(x_ptr, n, BLOCK: "tl.constexpr"):  # noqa: F821 - the annotation is read as text
        pass

    # a JITFunction as the pack's jit makes it (the interpreter's decorator would give another class)
    probe = jit.JITFunction(probe, do_not_specialize=["n"], do_not_specialize_on_alignment=["x_ptr"])
    binder = jit.create_function_from_signature(probe.signature, probe.params,
                                                make_backend(GPUTarget("cuda", 90, 32)))
    bound, _, _ = binder(torch.empty(1), 3, 64)
    assert list(bound) == ["x_ptr", "n", "BLOCK"] and list(bound.values())[1:] == [3, 64]


def test_each_launcher_body_is_direct_run_or_unread():
    from swa_backends.kernels import _launch

    class Unknown:
        def __call__(self, *args):
            return args

    assert _launch.launch_path(Unknown)[0] == "unread"
    for h, name in _launch.READ_LAUNCHERS.items():
        assert h not in _launch.DIRECT_LAUNCHERS and name.startswith("Triton ")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="the Triton vLLM pins is installed with vLLM (the vLLM CI stage)")
def test_the_triton_vllm_pins_takes_a_path_someone_read():
    """The Triton installed with the supported vLLM (its torch pins it: vLLM 0.33.0 ->
    torch 2.14.0 -> triton~=3.8.0) has CUDA and HIP launcher bodies whose hash is in
    ``DIRECT_LAUNCHERS`` or ``READ_LAUNCHERS``: a Triton release that changes either fails
    here until someone reads it and says which path it takes."""
    import triton
    from triton.backends.amd.driver import HIPLauncher
    from triton.backends.nvidia.driver import CudaLauncher

    from swa_backends.kernels import _launch

    for cls in (CudaLauncher, HIPLauncher):
        path, why = _launch.launch_path(cls)
        assert path != "unread", f"Triton {triton.__version__}: {why}; read it and add its hash to _launch"
    # what README states for vLLM 0.33's stack: Triton's compiled launcher, not the 3.6 C call
    if triton.__version__.startswith("3.8."):
        assert _launch.launch_path(CudaLauncher)[0] == "run"
