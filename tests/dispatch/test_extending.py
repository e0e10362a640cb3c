"""Extending the pack the way a maintainer would: a platform is one declared object, an op owns its
facts. A toy platform registered at run time (its ``Platform`` and one registration call, what a
folder under ``backends/`` and its line in ``backends.PLATFORMS`` give a real one) and a toy op
(its module's ``OpSpec`` and one registration call) appear everywhere the built-in ones do."""

from __future__ import annotations

import contextlib
import importlib.resources
import inspect
import sys
import types

import numpy as np
import pytest
import torch
import yaml

import swa_backends as sb
from swa_backends import dispatch
from swa_backends.common.device import known_archs, platform_names
from swa_backends.common.matrix import parse_matrix
from swa_backends.common.ops import OPS, Ops, register_op, unregister_op
from swa_backends.common.ops._results import Results
from swa_backends.common.ops._spec import OpSpec
from swa_backends.common.platforms import Ahead, Platform, platforms, register_platform, unregister_platform
from swa_backends.common.registry import Variant
from swa_backends.common.validation import check_int, check_out, check_range, check_tensor, fail
from swa_backends.kernels import PORTABLE
from swa_backends.testing.conformance import case_for, check_backend, mismatch

ME = __name__


# ---------------------------------------------------------------------------------------
# a toy platform: what backends/toy/__init__.py would export
# ---------------------------------------------------------------------------------------

CALLS: list[str] = []


def toy_gather_rows(x, rows, *, out=None):
    """The toy platform's vendor gather (a torch gather that records its calls)."""
    CALLS.append("toy_rows")
    got = x.index_select(0, rows.to(torch.int64))
    return got if out is None else out.copy_(got)


def toy_rows_input_check(x, rows, *, out=None) -> list[str]:
    """Per-call reasons: the toy kernel copies float rows only."""
    return [] if x.is_floating_point() else [f"toy_rows copies float rows, the call has {x.dtype}"]


def toy_reference_first(x, rows, *, out=None) -> str | None:
    """A single row runs the reference first (measured faster on no device: a toy)."""
    return "one row" if rows.shape[0] == 1 else None


def toy_platform_check(device, x, rows, *, out=None) -> None:
    """The toy device takes no float64 (valid elsewhere)."""
    if x.dtype == torch.float64:
        fail("gather_rows", "x", f"a {x.dtype} tensor", f"no float64 on {device.spec}")


def toy_detect(index):
    return "a toy accelerator (this machine has none)"


TOY_ROWS = Variant(op="gather_rows", name="toy_rows", impl=f"{ME}:toy_gather_rows",
                   input_check=f"{ME}:toy_rows_input_check", description="the toy platform's vendor gather")

TOY = Platform(
    name="toy", archs=("t1", "t2"), label="toy accelerator", example_arch="t1", torch_types=("toyt",),
    detect=toy_detect,
    variants=(*PORTABLE, TOY_ROWS),
    priority={"gather_rows": ("toy_rows", "triton", "reference"), "*": ("triton", "reference")},
    ahead={"gather_rows": (Ahead("reference", "toy_rows", f"{ME}:toy_reference_first"),)},
    input_checks={"gather_rows": f"{ME}:toy_platform_check"},
    emulation="swa_test_toy_emulation",
)

ENTERED: list[str] = []


@contextlib.contextmanager
def toy_contract_doubles(device=None):
    ENTERED.append(device.spec)
    yield


def _toy_matrix():
    """The shipped matrix.yaml plus the toy platform's row (what its matrix.yaml lines would say)."""
    data = yaml.safe_load(importlib.resources.files("swa_backends").joinpath("matrix.yaml").read_text())
    data["rows"].append({"platform": "toy", "arch": "t1", "name": "toy accelerator",
                         "variants": {"*": ["reference"], "gather_rows": ["toy_rows", "triton", "reference"]},
                         "verified": {"reference": "emulated", "toy_rows": "emulated"},
                         "encoder_replay": {"enabled": True, "because": "toy: the reference attention"},
                         "decoder_replay": {"enabled": True, "because": "toy: the reference gathers"}})
    return parse_matrix(data, "toy.yaml", dispatch.all_variants())


@pytest.fixture
def toy_platform(monkeypatch):
    emu = types.ModuleType("swa_test_toy_emulation")
    emu.contract_doubles = toy_contract_doubles
    monkeypatch.setitem(sys.modules, "swa_test_toy_emulation", emu)
    register_platform(TOY)
    dispatch.clear_backends()
    try:
        yield TOY
    finally:
        unregister_platform("toy")
        dispatch.clear_backends()
        CALLS.clear()
        ENTERED.clear()


def test_a_registered_platform_is_a_device_kind(toy_platform):
    assert "toy" in platform_names() and known_archs()["toy"] == ("t1", "t2")
    d = sb.parse_device("toy:t1")
    assert (d.platform, d.arch, d.fake, d.spec) == ("toy", "t1", True, "toy:t1")
    with pytest.raises(ValueError, match="0 is a device index, not an arch: a real toy accelerator is toyt:0"):
        sb.parse_device("toy:0")
    with pytest.raises(ValueError, match="toy:<arch> for a fake one"):
        sb.parse_device("toyt:t1")
    with pytest.raises(ValueError, match=r"device='toyt:0': expected a toy accelerator \(this machine has none\)"):
        sb.select("toyt:0")  # a real toy device: its own detection says why there is none
    with sb.fake_device("toy:t2"):
        assert sb.select().device.spec == "toy:t2"
    from swa_backends.cli import _known_devices

    assert "toy:t1, toy:t2" in _known_devices()


def test_a_registered_platform_dispatches_by_its_declaration(toy_platform):
    # no matrix row: the reference, with the reason
    assert sb.select("toy:t1").capabilities.fallback.startswith("no row for toy:t1")
    m = _toy_matrix()
    # the portable kernels it registers now run on it too (by declaration; the probes decide here)
    assert dispatch.variant("gather_rows", "triton").platforms == ("cuda", "rocm", "toy")
    be = sb.select("toy:t1", matrix=m)
    assert be.variants["gather_rows"] == ("toy_rows", "reference")  # triton: not compiled in this process
    assert be.variants["swa_indices_and_lens"] == ("reference",)
    text = str(be.explain())
    assert "toy_rows (per-call)" in text and "requires platform in" not in text.split("every variant:")[0]
    e = be.explain()
    row = next(c for c in e.table if c.op == "gather_rows" and c.variant == "reference")
    assert row.ahead and "runs before toy_rows" in row.ahead[0] and "toy_reference_first" in row.ahead[0]
    toy = next(c for c in e.table if c.op == "gather_rows" and c.variant == "toy_rows")
    assert toy.checks == (f"takes a call where {ME}:toy_rows_input_check gives no reason",)
    assert e.input_checks == {"gather_rows": f"{ME}:toy_platform_check"} and f"gather_rows: {ME}:toy_platform_check" in text
    caps = sb.capabilities("toy:t1", matrix=m)
    assert caps.row == "toy:t1" and caps.encoder_replay.enabled and caps.decoder_replay.enabled

    x = torch.randn(7, 3)
    rows = torch.tensor([4, 0, 6], dtype=torch.int64)
    assert torch.equal(be.gather_rows(x, rows), x[rows]) and CALLS == ["toy_rows"]
    assert be.variant_for("gather_rows", x, rows[:1]) == "reference"  # its Ahead rule
    assert be.variant_for("gather_rows", x.to(torch.int32), rows) == "reference"  # its variant's input check
    with pytest.raises(ValueError, match="gather_rows: x=.*no float64 on toy:t1"):  # its platform check
        be.gather_rows(x.double(), rows)


def test_the_runner_emulates_a_registered_platform_with_its_doubles(toy_platform):
    from swa_backends.testing.matrix_runner import run_matrix

    rep = run_matrix(matrix=_toy_matrix(), rows=["toy:t1"], ops=["gather_rows"], cases=2, in_process=True)
    by = {r.variant: r for r in rep.results}
    assert by["toy_rows"].mode == "doubles" and ENTERED == ["toy:t1"]
    assert by["toy_rows"].passed + by["toy_rows"].rejected == 2 and not by["toy_rows"].failed
    assert by["reference"].status == "emulated" and rep.exit_code == 0


def test_unregistering_a_platform_forgets_it(toy_platform):
    unregister_platform("toy")
    try:
        assert "toy" not in platform_names()
        assert dispatch.variant("gather_rows", "triton").platforms == ("cuda", "rocm")
        with pytest.raises(ValueError, match="platform in"):
            sb.parse_device("toy:t1")
    finally:
        register_platform(TOY)  # the fixture removes it


def test_a_platform_declaration_is_checked():
    with pytest.raises(ValueError, match="register_platform: platform.name='cuda'"):
        register_platform(Platform(name="cuda", archs=("x",), label="x", priority={"*": ("reference",)}))
    with pytest.raises(ValueError, match=r"toy2.priority=.*'\*' entry"):
        register_platform(Platform(name="toy2", archs=("x",), label="x", priority={"gather_rows": ("reference",)}))
    with pytest.raises(ValueError, match="toy2.ahead"):
        register_platform(Platform(name="toy2", archs=("x",), label="x", priority={"*": ("reference",)},
                                   ahead={"gather_rows": (Ahead("reference", "nope", f"{ME}:toy_reference_first"),)}))
    with pytest.raises(ValueError, match="unregister_platform: name='cuda'"):
        unregister_platform("cuda")
    assert list(platforms()) == ["cpu", "cuda", "rocm", "ascend"]


# ---------------------------------------------------------------------------------------
# a toy op: what common/ops/toy_scale.py would hold
# ---------------------------------------------------------------------------------------

NAME = "toy_scale"


def validate(x, factor, *, out=None) -> None:
    check_tensor(NAME, "x", x, dtypes=(torch.int32, torch.int64), ndim=1)
    check_int(NAME, "factor", factor, min_value=-1000, max_value=1000)
    check_range(NAME, "x", x, low=-(2**20), high=2**20)  # factor x fits int32 (and a meta x has no values)
    if out is not None:
        check_out(NAME, "out", out, shape=tuple(x.shape), dtype=x.dtype, device=x.device)


def reference(x, factor, *, out=None) -> torch.Tensor:
    """``y = factor x`` (a toy op)."""
    y = x * factor
    return y if out is None else out.copy_(y)


def case(d):
    x = torch.tensor(d.rng.integers(-50, 50, size=int(d.rng.integers(0, 20))), dtype=torch.int32, device=d.device)
    kw = {"out": d.out(tuple(x.shape), x.dtype)} if d.poison else {}
    return (x, int(d.rng.integers(-5, 6))), kw


def warmup(s):
    for dtype in s.index_dtypes:
        yield (s.qsl.to(dtype), 3), {}


RESULTS = Results(("y",), lambda a: {"y": (tuple(a["x"].shape), a["x"].dtype)}, out="tensor")
OP = OpSpec(NAME, reference, validate, RESULTS, short="toy", scalars={"factor": "int"}, case=case, warmup=warmup)


@pytest.fixture(scope="module")
def toy_op():
    import swa_backends.torch_ops as torch_ops

    register_op(OP)
    made = torch_ops.define_ops()
    try:
        assert made == [NAME, f"{NAME}_out"]
        yield OP
    finally:
        unregister_op(NAME)
        # the custom ops stay defined in torch (a library cannot drop one); the pack's lists forget them
        for form in [n for n in torch_ops.FORMS if n.startswith(NAME)]:
            del torch_ops.FORMS[form]
            torch_ops.OP_NAMES.remove(form)
        dispatch.clear_backends()


def test_a_registered_op_is_dispatched_and_explained(toy_op):
    assert list(OPS)[-1] == NAME
    be = sb.select("cpu")
    x = torch.tensor([1, -2, 3], dtype=torch.int32)
    assert be.toy_scale(x, 4).tolist() == [4, -8, 12] and be.variants[NAME] == ("reference",)
    assert be.toy_scale.__doc__ == reference.__doc__ and inspect.signature(be.toy_scale) == inspect.signature(reference)
    with pytest.raises(ValueError, match="toy_scale: factor="):
        be.toy_scale(x, 2.5)
    assert any(c.op == NAME and c.status == "chosen" for c in sb.explain("rocm:gfx950").table)


def test_a_registered_op_is_in_the_conformance_and_the_runner(toy_op):
    from swa_backends.testing.matrix_runner import run_matrix

    rng = np.random.default_rng(0)
    args, kw = case_for(NAME, rng, "cpu", poison=True)
    assert kw["out"].shape == args[0].shape and mismatch(NAME, reference(*args), reference(*args)) is None
    (res,) = check_backend(sb.select("cpu"), device="cpu", ops=[NAME], cases=5)
    assert res.ok and res.passed == 5
    rep = run_matrix(rows=["cpu", "rocm:gfx942"], ops=[NAME], cases=2, in_process=True)
    assert {(r.row, r.variant, r.status) for r in rep.results} == {("cpu", "reference", "pass"),
                                                                 ("rocm:gfx942", "reference", "emulated")}
    assert rep.table().splitlines()[0].split()[-1] == "toy"  # its short label


def test_a_registered_op_is_a_custom_op(toy_op):
    import swa_backends.torch_ops as torch_ops

    assert torch_ops.define_ops() == [] and {NAME, f"{NAME}_out"} <= set(torch_ops.OP_NAMES)
    assert torch_ops.FORMS[NAME].schema() == "(Tensor x, SymInt factor) -> Tensor"  # an int scalar is SymInt
    x = torch.tensor([5, 6], dtype=torch.int32)
    assert torch.ops.swa_backends.toy_scale(x, 3).tolist() == [15, 18]
    out = torch.full_like(x, -7)
    assert torch_ops.call(NAME, x, -1, out=out) is out and out.tolist() == [-5, -6]


def test_a_registered_op_is_fuzzed(toy_op):
    import fuzz_cases

    cases = fuzz_cases.cases_for(NAME, np.random.default_rng(1), families=True)
    assert len(cases) > 10
    for backend in ("reference", "torch_ops"):  # the worker's loops: every op of OPS
        fn, ref = fuzz_cases.backend_fns(backend)[NAME]
        taken = [c for c in (fuzz_cases.for_backend(backend, NAME, *case) for case in cases) if c is not None]
        outcomes = {fuzz_cases.run_case(NAME, fn, *c, ref)["outcome"] for c in taken}
        assert outcomes <= {"clear", "ok", "schema"} and "clear" in outcomes, (backend, outcomes)


def test_a_registered_op_is_warmed_up(toy_op):
    """``Backend.warmup``'s Triton hook runs every op's declared warmup calls where the op's chosen
    chain has a Triton variant (here a stand-in backend that says so)."""
    from swa_backends.common.device import detect
    from swa_backends.kernels.warmup import warmup as triton_warmup

    seen = []

    class Stand:
        device = detect("cpu")
        variants = {NAME: ("triton",)}

        def toy_scale(self, x, factor):
            seen.append((x.dtype, factor))

    assert triton_warmup(Stand(), W=8, block_size=16, num_groups=1) == [NAME]
    assert seen == [(torch.int32, 3), (torch.int64, 3)]


def test_unregistering_an_op_forgets_it(toy_op):
    with pytest.raises(ValueError, match="unregister_op: name='gather_rows'"):
        unregister_op("gather_rows")
    with pytest.raises(ValueError, match="register_op: spec.name='gather_rows'"):
        register_op(OpSpec("gather_rows", reference, validate, RESULTS))


# ---------------------------------------------------------------------------------------
# the declared ops: typed on Backend, one fact each in its module
# ---------------------------------------------------------------------------------------


def test_backend_is_typed_by_the_declarations():
    """Type checkers see Backend subclass Ops (one typed line per op); at run time the class has
    no attribute of an op's name (each is the instance's own: the fastest attribute load)."""
    import ast

    src = inspect.getsource(dispatch)
    tree = ast.parse(src)
    guard = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    assert ast.unparse(guard.body[0]) == "_Declared = Ops"
    backend = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Backend")
    assert [ast.unparse(b) for b in backend.bases] == ["_Declared"]
    assert not any(hasattr(sb.Backend, op) for op in (*OPS, "plan_replay_batch"))


@pytest.mark.parametrize("op", [n for n, v in vars(Ops).items() if isinstance(v, OpSpec)])
def test_every_declared_op_is_a_typed_backend_attribute(op):
    spec = getattr(Ops, op)
    assert spec is OPS[op] and spec.reference.__module__.startswith("swa_backends.common.ops.")
    be = sb.select("cpu")
    assert inspect.signature(getattr(be, op)) == spec.signature and getattr(be, op).__doc__ == spec.reference.__doc__
    assert spec.case is not None and spec.short and len(spec.short) <= 12
    for arg, kind in spec.scalars.items():
        assert arg in spec.signature.parameters and kind in ("int", "int?", "float", "bool", "str")


def test_a_host_op_is_a_backend_attribute():
    be = sb.select("cpu")
    assert be.plan_replay_batch is sb.plan_replay_batch and be.pcp_partition is sb.pcp_partition
