"""``torch.ops.swa_backends``: every op's schema, fake implementation and dispatch.

``torch.library.opcheck`` (schema/mutation claims, fake tensors, autograd registration,
AOT dispatch with dynamic shapes) runs on random serving-like cases from
``common/conformance.py`` -- functional and ``out=`` forms, poisoned buffers -- and every
result is compared with the torch reference. The CUDA variant of the same checks is marked
``gpu`` (``python -m pytest -m gpu tests/entry_points/test_torch_ops.py`` on the H200).
"""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch

from swa_backends import OPS, plan_replay_batch, select
from swa_backends.testing.conformance import case_for, mismatch, to_device
from swa_backends.common.types import ReplayBatch

torch_ops = pytest.importorskip("swa_backends.torch_ops")  # defines the ops in this process
ns = torch.ops.swa_backends

# ops whose Python form takes out= (and so have an _out custom op)
OUT_OPS = sorted(set(OPS) - {"pad_replayed_slots", "sparse_mla", "prepare_replay_step"})
# prepare_replay_step (where the build has it): with/without a plan, functional/out
PREPARE_FORMS = {"prepare_replay_step", "prepare_replay_step_plan", "prepare_replay_step_out",
                 "prepare_replay_step_plan_out"} if "prepare_replay_step" in OPS else set()
CASES = 6  # per op and device; half with poisoned out= buffers


def _op_and_args(op: str, args: tuple, kwargs: dict):
    """The custom op and its arguments for a conformance case (what torch_ops.call runs)."""
    fn, a, k, _ = torch_ops.lower(op, *args, **kwargs)
    return fn, a, k


def _check_op(op: str, device: str, seed: int) -> None:
    rng = np.random.default_rng([seed, list(OPS).index(op)])
    for i in range(CASES):
        args, kwargs = case_for(op, rng, "cpu", poison=bool(i % 2))
        # (a ReplayPlan stays on the host: the op copies what it needs to the device)
        args, kwargs = to_device(args, device), to_device(kwargs, device)
        # opcheck runs the op several times on its own copy (it writes the out= buffers)
        fn, a, k = _op_and_args(op, *copy.deepcopy((args, kwargs)))
        torch.library.opcheck(fn, a, k)
        want = OPS[op].reference(*to_device(args, "cpu"), **to_device(kwargs, "cpu"))
        got = torch_ops.call(op, *args, **kwargs)
        why = mismatch(op, got, want)
        assert why is None, f"{op} case {i} on {device}: {why}"


@pytest.mark.parametrize("op", list(OPS))
def test_opcheck_and_reference_cpu(op):
    _check_op(op, "cpu", seed=11)


#: conformance.ODD_BATCHES' corners that opcheck runs on (each of its runs is slow)
OPCHECK_ODD = ("no request", "one decode", "window and block 1", "wide window, one group")


@pytest.mark.parametrize("op", list(OPS))
def test_odd_batches_cpu(op):
    """The custom ops on odd steps (no request: T = 0; one decode; window and block 1; a window wider
    than a tile), ``out=`` poisoned or not: opcheck on the first of each, every result the
    reference's. (The random cases above are serving-like; these are the corners.)"""
    import zlib

    from swa_backends.testing.conformance import ODD_BATCHES, random_batch

    for name in OPCHECK_ODD:
        knobs = ODD_BATCHES[name]
        rng = np.random.default_rng(zlib.crc32(f"torch_ops/{op}/{name}".encode()))
        for i in range(2):
            args, kwargs = case_for(op, rng, "cpu", batch=random_batch(rng, **knobs), poison=bool(i))
            if i == 0:
                fn, a, k = _op_and_args(op, *copy.deepcopy((args, kwargs)))
                torch.library.opcheck(fn, a, k)
            want = OPS[op].reference(*to_device(args, "cpu"), **to_device(kwargs, "cpu"))
            why = mismatch(op, torch_ops.call(op, *args, **kwargs), want)
            assert why is None, f"{op} {name} case {i}: {why}"


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(OPS))
def test_opcheck_and_reference_cuda(op):
    _check_op(op, "cuda", seed=12)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_cuda_dispatch_uses_the_cuda_backend():
    b = torch_ops.backend_for(torch.device("cuda", torch.cuda.current_device()))
    assert b.device.platform in ("cuda", "rocm")
    assert b is torch_ops.backend_for("cuda")


def test_every_op_is_registered_with_its_forms():
    names = set(torch_ops.OP_NAMES)
    assert set(OPS) <= names
    assert {f"{op}_out" for op in OUT_OPS} <= names
    assert names == set(OPS) | {f"{op}_out" for op in OUT_OPS} | PREPARE_FORMS
    for name in names:
        schema = getattr(ns, name).default._schema
        mutable = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        if name == "pad_replayed_slots":
            assert mutable == {"slot_mappings"} and not schema.returns
        elif name in PREPARE_FORMS:  # pads slot_mappings in place; out forms also write their buffers
            assert "slot_mappings" in mutable and all(m == "slot_mappings" or m.startswith("out_") for m in mutable)
            assert bool(schema.returns) is not name.endswith("_out")
        elif name.endswith("_out"):
            assert mutable and all(m.startswith("out") for m in mutable) and not schema.returns, name
        else:
            assert not mutable, name


def test_dynamic_token_count_traces():
    """Without num_tokens or valid, T is a value (query_start_loc[-1]): the fake kernel
    returns an unbacked size and opcheck's dynamic AOT trace still passes."""
    rng = np.random.default_rng(3)
    for _ in range(3):
        args, kwargs = case_for("swa_indices_and_lens", rng, "cpu", poison=False)
        kwargs.pop("num_tokens")
        kwargs.pop("valid", None)
        torch.library.opcheck(ns.swa_indices_and_lens, args, kwargs)
        got = ns.swa_indices_and_lens(*args, **kwargs)
        assert mismatch("swa_indices_and_lens", got, OPS["swa_indices_and_lens"].reference(*args, **kwargs)) is None


def test_ops_are_not_differentiable():
    """Each op has an Autograd kernel that runs it below autograd: with inputs that require
    grad, opcheck (autograd registration included) passes and no output requires grad or
    carries a grad_fn from the reference's internals (sparse_mla's did)."""
    rng = np.random.default_rng(2)
    args, kwargs = case_for("sparse_mla", rng, "cpu")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, generator=g)
    cases = [
        (ns.sparse_mla, (args[0].clone().requires_grad_(True), *args[1:]), kwargs),
        (ns.sparse_mla, (args[0], args[1].clone().requires_grad_(True), *args[2:]), kwargs),
        (ns.gather_rows, (x.clone().requires_grad_(True), torch.tensor([0, 4, 5])), {}),
        (ns.scatter_rows, (x[:2].clone().requires_grad_(True), torch.tensor([1, 3]), 5), {}),
    ]
    for fn, a, k in cases:
        torch.library.opcheck(fn, a, k)
        torch.library.opcheck(fn, a, k, test_utils=("test_autograd_registration",))
        outs = fn(*a, **k)
        for out in outs if isinstance(outs, tuple) else (outs,):
            assert not out.requires_grad and out.grad_fn is None, fn
    # the values are the ones computed without grad
    assert torch.equal(ns.gather_rows(x.clone().requires_grad_(True), torch.tensor([0, 4])), x[[0, 4]])


def test_in_place_pad_matches_reference():
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(20):
        args, kwargs = case_for("pad_replayed_slots", rng, "cpu")
        mine = args[0].clone()
        ns.pad_replayed_slots(mine, *args[1:], **kwargs)
        want = OPS["pad_replayed_slots"].reference(args[0].clone(), *args[1:], **kwargs)
        assert torch.equal(mine, want)
        hits += int(not torch.equal(mine, args[0]))
    assert hits > 0, "no case padded anything: the generator lost its replaying requests"


def test_validation_errors_pass_through_torch_ops():
    x = torch.randn(5, 3)
    with pytest.raises(ValueError, match=r"gather_rows: rows=9: expected values in \[0, 5\)"):
        ns.gather_rows(x, torch.tensor([0, 9]))
    with pytest.raises(ValueError, match="scatter_rows"):
        ns.scatter_rows(x, torch.tensor([0, 1], dtype=torch.int32), 4)


def test_real_kernel_dispatches_to_the_selected_backend(monkeypatch):
    """The real implementation asks backend_for(tensor.device) -> select(), cached per device."""
    torch_ops.clear_backends()
    assert torch_ops.backend_for("cpu") is torch_ops.backend_for(torch.device("cpu"))
    real = select("cpu")
    seen = []

    class Spy:
        def __getattr__(self, name):
            def fn(*args, **kwargs):
                seen.append((name, args[0].device.type))
                return getattr(real, name)(*args, **kwargs)

            return fn

    monkeypatch.setattr(torch_ops, "backend_for", lambda device: Spy())
    x = torch.arange(12.0).view(6, 2)
    rows = torch.tensor([1, 4])
    assert torch.equal(ns.gather_rows(x, rows), x[rows])
    assert seen == [("gather_rows", "cpu")]
    monkeypatch.undo()
    torch_ops.clear_backends()


def _serving_step(t: dict, plan_args: tuple, W: int, Wr: int, q, kv, hidden):
    """One encoder + decoder step through the custom ops only (what a model would call)."""
    swa = torch.ops.swa_backends
    R = swa.batch_replay_start(t["replay_start"], t["idx"], t["is_prefilling"])
    slots = t["slot_mappings"].clone()
    swa.pad_replayed_slots(slots, t["cacheable_groups"], t["query_start_loc"], t["positions"][: t["T"]], R, Wr)
    idx, lens = swa.swa_indices_and_lens(t["query_start_loc"], t["seq_lens"], t["block_table"], t["block_size"], W, R,
                                         num_tokens=t["T"])
    pidx, plens = swa.plain_indices(idx, lens)
    out, lse = swa.sparse_mla(q, kv, pidx, plens, 0.125, 16)
    rows, qsl, pos, sub_slots, kv_start = swa.gather_replay_batch(
        *plan_args, t["query_start_loc"], t["seq_lens"], R, t["positions"], slots, W)
    sub = swa.gather_rows(hidden, rows[: plan_args[3]])
    back = swa.scatter_rows(sub * 2, rows[: plan_args[3]], hidden.shape[0])
    return slots, out, lse, kv_start, back


def test_torch_compile_traces_a_serving_step():
    """fullgraph torch.compile (aot_eager: fake kernels + functionalisation of the in-place
    op) gives the eager result."""
    from swa_backends.testing.conformance import random_batch

    rng = np.random.default_rng(8)
    b = random_batch(rng, long_prefill=True, W=16, block_size=16)
    t = b.tensors("cpu")
    T = b.T
    t.update(T=T, block_size=b.block_size, idx=torch.arange(b.B, dtype=torch.int32))
    t["positions"] = t["positions"][:T]
    t["slot_mappings"] = t["slot_mappings"][:, :T].contiguous()
    plan = plan_replay_batch(b.qsl, b.prefilling, np.zeros(b.B, bool), b.W, trim_threshold=0)
    assert plan is not None
    g = torch.Generator().manual_seed(0)
    S = int(t["block_table"].max().item() + 1) * b.block_size
    q = torch.randn(T, 2, 32, generator=g)
    kv = torch.randn(S, 32, generator=g)
    hidden = torch.randn(T, 8, generator=g)
    args = (t, torch_ops.plan_arguments(plan), b.W, b.Wr, q, kv, hidden)
    eager = _serving_step(*args)
    compiled = torch.compile(_serving_step, backend="aot_eager", fullgraph=True)(*args)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c) if e.dtype != torch.float32 else torch.allclose(e, c, equal_nan=True)
    # and the eager path is the reference
    R = OPS["batch_replay_start"].reference(t["replay_start"], t["idx"], t["is_prefilling"])
    want = OPS["pad_replayed_slots"].reference(t["slot_mappings"].clone(), t["cacheable_groups"],
                                               t["query_start_loc"], t["positions"], R, b.Wr)
    assert torch.equal(eager[0], want)
    batch = OPS["gather_replay_batch"].reference(plan, t["query_start_loc"], t["seq_lens"], R, t["positions"], want, b.W)
    assert torch.equal(eager[3], batch.kv_start)


def _count_graphs(fn):
    """``fn`` compiled (fullgraph, dynamic=True, aot_eager) and the list its graphs append to."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def fw(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    return torch.compile(fn, backend=aot_autograd(fw_compiler=fw), fullgraph=True, dynamic=True), graphs


def test_sizes_taken_from_a_shape_stay_dynamic(monkeypatch):
    """Integer scalars are SymInt in the schemas: a size read from a dynamic dimension
    (``hidden.shape[0]`` as scatter_rows' num_rows, ``positions.shape[0]`` as num_tokens) is
    traced symbolically -- one graph for every size, the eager result -- while the real
    kernel still gets plain Python ints (the pack's validation asks ``x.__class__ is int``)."""
    from swa_backends.testing.conformance import random_batch

    real = select("cpu")
    scalars = []

    class Spy:  # records the class of every non-tensor argument the backend is called with
        def __getattr__(self, name):
            def fn(*args, **kwargs):
                scalars.extend(type(v) for v in (*args, *kwargs.values())
                               if v is not None and not isinstance(v, (torch.Tensor, dict, tuple)))
                return getattr(real, name)(*args, **kwargs)

            return fn

    monkeypatch.setattr(torch_ops, "backend_for", lambda device: Spy())

    def scatter(y, rows, hidden):
        return ns.scatter_rows(y, rows, hidden.shape[0]) + hidden

    g = torch.Generator().manual_seed(0)
    y, rows = torch.randn(3, 4, generator=g), torch.tensor([0, 2, 5])
    compiled, graphs = _count_graphs(scatter)
    for n in (8, 11, 13, 17):
        hidden = torch.randn(n, 4, generator=g)
        assert torch.equal(compiled(y, rows, hidden), scatter(y, rows, hidden)), n
    assert len(graphs) == 1, f"scatter_rows: {len(graphs)} graphs for 4 sizes of num_rows"

    def indices(qsl, seq, bt, R, positions, block_size, W):
        return ns.swa_indices_and_lens(qsl, seq, bt, block_size, W, R, num_tokens=positions.shape[0])

    b = random_batch(np.random.default_rng(4), W=8, block_size=16, max_padded=0)
    t = b.tensors("cpu")
    compiled, graphs = _count_graphs(indices)
    for pad in range(4):  # the same batch with 0..3 graph-padding token columns
        a = (t["query_start_loc"], t["seq_lens"], t["block_table"], t["replay_start"],
             torch.cat([t["positions"][: b.T], torch.zeros(pad, dtype=torch.int64)]), b.block_size, b.W)
        for got, want in zip(compiled(*a), indices(*a)):
            assert torch.equal(got, want), pad
    assert len(graphs) == 1, f"swa_indices_and_lens: {len(graphs)} graphs for 4 sizes of num_tokens"

    # eager and compiled calls alike hand the backend Python ints, never a SymInt
    assert scalars and set(scalars) <= {int, bool, float, str}, set(scalars)
    # and mark_dynamic on the dimension a size comes from is honoured, not a ConstraintViolationError
    hidden = torch.randn(9, 4, generator=g)
    torch._dynamo.mark_dynamic(hidden, 0)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(scatter, backend="aot_eager", fullgraph=True)(y, rows, hidden),
                       scatter(y, rows, hidden))


def test_call_returns_the_python_forms():
    rng = np.random.default_rng(9)
    args, kwargs = case_for("gather_replay_batch", rng, "cpu", poison=True)
    got = torch_ops.call("gather_replay_batch", *args, **kwargs)
    assert isinstance(got, ReplayBatch) and got.rows is kwargs["out"]["rows"]
    args, kwargs = case_for("gather_replay_batch", rng, "cpu", poison=False)
    got = torch_ops.call("gather_replay_batch", *args, **kwargs)
    assert mismatch("gather_replay_batch", got, OPS["gather_replay_batch"].reference(*args, **kwargs)) is None


def test_importing_the_package_defines_no_op():
    """`import swa_backends` has no side effects: the ops appear only after register()."""
    code = ("import torch, swa_backends\n"
            "assert not hasattr(torch.ops.swa_backends, 'gather_rows')\n"
            "import swa_backends.plugin as p\n"
            "p.register()\n"
            "assert hasattr(torch.ops.swa_backends, 'gather_rows')\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.skipif("prepare_replay_step" not in OPS, reason="this build has no prepare_replay_step op")
def test_out_buffers_of_results_made_on_request_may_be_left_out():
    # Results.optional_names: "their out= entries may be left out": each one's keyword defaults to None in every
    # out form's schema (kept-window results included, whose result names carry a dot), the others are required
    for name in torch_ops.OP_NAMES:
        if not name.endswith("_out"):
            continue
        spec = OPS[name.removesuffix("_out").removesuffix("_plan")]
        if spec.results.out == "tensor":
            continue
        schema = getattr(ns, name).default._schema
        optional = {"out_" + n.replace(".", "_") for n in spec.results.optional_names}
        outs = {a.name: a.has_default_value() for a in schema.arguments if a.name.startswith("out_")}
        assert optional <= set(outs), (name, optional - set(outs))
        assert {n for n, has in outs.items() if has} == optional, name
    # a direct call of a plain step passes only the buffers of the results it makes
    rng = np.random.default_rng(3)
    while True:
        args, kwargs = case_for("prepare_replay_step", rng, "cpu")
        if kwargs.get("plan") is None and not kwargs.get("kept_windows") and kwargs.get("out") is not None:
            break
    want = OPS["prepare_replay_step"].reference(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    out = kwargs.pop("out")
    kwargs.pop("plan", None)
    ns.prepare_replay_step_out(*args, **kwargs, **{f"out_{k}": v for k, v in out.items() if v is not None})
    for k in ("replay_start", "swa_indices", "swa_lens", "stale_replay"):
        assert torch.equal(out[k], getattr(want, k)), k


def test_prepare_replay_step_all_four_forms():
    """With and without a plan, functional and out=: opcheck and the reference, each form."""
    rng = np.random.default_rng(21)
    seen = set()
    for _ in range(60):
        args, kwargs = case_for("prepare_replay_step", rng, "cpu", poison=bool(rng.random() < 0.5))
        form = (kwargs.get("plan") is not None, kwargs.get("out") is not None)
        if form in seen:
            continue
        seen.add(form)
        fn, a, k = _op_and_args("prepare_replay_step", *copy.deepcopy((args, kwargs)))
        torch.library.opcheck(fn, a, k)
        want = OPS["prepare_replay_step"].reference(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        got = torch_ops.call("prepare_replay_step", *args, **kwargs)
        assert mismatch("prepare_replay_step", got, want) is None, form
        if len(seen) == 4:
            break
    assert len(seen) == 4, seen
