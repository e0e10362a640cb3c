"""Bad input an audit found past validation (SPEC §5: a ``ValueError`` naming the argument, the
value and the expectation, before anything is written), on the reference and the Triton backends
(the kernels in Triton's interpreter on a CPU).

* A sparse (COO, CSR) or nested tensor in place of any tensor argument reached torch or a kernel:
  a ``RuntimeError`` ("Sparse CSR tensors do not have strides", "NestedTensorImpl doesn't support
  sizes"), and a sparse COO index table with one column passed the self-checked ops' quick checks
  (its strides are all 0) into a kernel (``NotImplementedError``: no storage). The index layout
  converters (``compact_indices``, ``mixed_to_plain``, ``csr_to_plain``) check their writes' overlaps
  first, by address: a ``RuntimeError`` there.
* An ``out=`` buffer that requires grad (an ``nn.Parameter``): the reference wrote into it through a
  byte view, the Triton ``scatter_rows`` raised torch's ``RuntimeError`` from its zero fill, the
  self-checked kernels stored into it; torch's own ``out=`` ops refuse it.
* The custom ops (``torch.ops.swa_backends``): a call mixing meta and real tensors ran the op's fake
  kernel (torch's dispatcher picks the Meta kernel for it) and returned uninitialised host memory as
  its results, or wrote no ``out_`` buffer; None for the first tensor argument (torch hands a Python
  kernel None for a ``Tensor`` passed as None) was an ``AttributeError``.
* A plan built field by field whose ``kept`` is not a 1-D tensor (None, a list, a 0-dim tensor) or
  whose ``num_rows_padded`` is not an int: ``gather_replay_batch`` and ``prepare_replay_step`` read
  the plan's B and sizes before checking them (``AttributeError``, ``IndexError``, ``TypeError``).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch

import swa_backends as sb
from swa_backends.common.ops import OPS
from swa_backends.common.types import ReplayPlan
from swa_backends.testing.conformance import case_for

from _tritons import NO_TRITON


def _backends():
    return ["reference"] + ([] if NO_TRITON is not None else ["triton"])


def _backend(prefer: str):
    return sb.select("cpu", prefer=prefer)


def _calls(op: str, seed: int = 3):
    """The bound arguments of a valid call, and the call's tensor arguments by path (an ``out=``
    tuple's entries as ``("out", i)``)."""
    args, kwargs = case_for(op, np.random.default_rng(seed), "cpu", poison=True, exact_out=True)
    bound = OPS[op].signature.bind(*args, **kwargs).arguments
    tensors = []
    for name, v in bound.items():
        if isinstance(v, torch.Tensor):
            tensors.append(((name,), v))
        elif name == "out" and isinstance(v, tuple):
            tensors += [((name, i), x) for i, x in enumerate(v) if isinstance(x, torch.Tensor)]
    return bound, tensors


def _rebind(op: str, bound: dict):
    params = OPS[op].signature.parameters
    args = tuple(v for n, v in bound.items() if params[n].kind == params[n].POSITIONAL_OR_KEYWORD)
    return args, {n: v for n, v in bound.items() if params[n].kind == params[n].KEYWORD_ONLY}


def _layouts(t: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (sparse CSR and nested tensors are beta / prototype)
        yield "sparse_coo", t.to_sparse()
        if t.dim() == 2:
            yield "sparse_csr", t.to_sparse_csr()
        if t.dim() >= 2 and t.shape[0]:
            yield "nested", torch.nested.nested_tensor(list(t.unbind(0)))


@pytest.mark.parametrize("prefer", _backends())
@pytest.mark.parametrize("op", list(OPS))
def test_sparse_and_nested_tensors_are_refused(op, prefer):
    be = _backend(prefer)
    bound, tensors = _calls(op)
    tried = 0
    for path, t in tensors:
        for label, bad in _layouts(t):
            b = dict(bound)
            if len(path) == 1:
                b[path[0]] = bad
            else:
                b[path[0]] = tuple(bad if i == path[1] else x for i, x in enumerate(b[path[0]]))
            args, kwargs = _rebind(op, b)
            dense = [(n, v.clone()) for n, v in b.items()
                     if isinstance(v, torch.Tensor) and v.layout is torch.strided and not v.is_nested]
            name = path[0] if len(path) == 1 else rf"{path[0]}\[{path[1]}\]"
            with pytest.raises(ValueError, match=rf"^{op}: .*{name}.*=.*expected a dense \(strided\) tensor"):
                getattr(be, op)(*args, **kwargs)
            for n, before in dense:  # nothing written
                assert torch.equal(b[n], before), (op, label, n)
            tried += 1
    assert tried


@pytest.mark.parametrize("op", ["compact_indices", "mixed_to_plain", "csr_to_plain"])
def test_layout_converters_refuse_sparse_and_nested_tensors(op):
    import inspect
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from fuzz_cases import host_case

    args, kwargs = host_case(op, np.random.default_rng(1))
    fn = getattr(sb, op)
    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs).arguments
    tried = 0
    for name, v in bound.items():
        for i, t in ([(None, v)] if isinstance(v, torch.Tensor) else list(enumerate(v)) if name == "out" else []):
            for label, bad in _layouts(t):
                new = bad if i is None else tuple(bad if j == i else x for j, x in enumerate(v))
                b = {**bound, name: new}
                args = [b[n] for n in b if sig.parameters[n].kind == sig.parameters[n].POSITIONAL_OR_KEYWORD]
                kw = {n: b[n] for n in b if sig.parameters[n].kind == sig.parameters[n].KEYWORD_ONLY}
                with pytest.raises(ValueError, match=r"expected a dense \(strided\) tensor"):
                    fn(*args, **kw)
                tried += 1
    assert tried


@pytest.mark.parametrize("prefer", _backends())
@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
def test_an_out_buffer_that_requires_grad_is_refused(op, prefer):
    be = _backend(prefer)
    bound, _ = _calls(op)
    if bound.get("out") is None:
        data = bound["x" if op == "gather_rows" else "y"]
        n = bound["rows"].shape[0] if op == "gather_rows" else bound["num_rows"]
        bound["out"] = torch.empty((n, *data.shape[1:]), dtype=data.dtype)
    for make in (lambda t: torch.nn.Parameter(t.clone()), lambda t: t.clone().requires_grad_(True)):
        out = make(torch.full_like(bound["out"], 7.0))
        args, kwargs = _rebind(op, {**bound, "out": out})
        with pytest.raises(ValueError, match=rf"^{op}: out=.*expected a buffer that does not require grad"):
            getattr(be, op)(*args, **kwargs)
        assert bool((out.detach() == 7.0).all())  # nothing written


def _custom_calls(op: str):
    """``(fn, args, kwargs, finish, tensors)`` of a valid call of ``op``'s custom op (``_out`` form where
    the case passes ``out=``): ``tensors`` its tensor arguments by ``(position or keyword)``."""
    from swa_backends import torch_ops

    args, kwargs = case_for(op, np.random.default_rng(3), "cpu", poison=True, exact_out=True)
    fn, a, kw, finish = torch_ops.lower(op, *args, **kwargs)
    tensors = [(i, t) for i, t in enumerate(a) if isinstance(t, torch.Tensor)]
    tensors += [(k, t) for k, t in kw.items() if isinstance(t, torch.Tensor)]
    return fn, a, kw, tensors


@pytest.mark.parametrize("op", list(OPS))
def test_custom_ops_refuse_a_meta_tensor_among_real_ones(op):
    fn, a, kw, tensors = _custom_calls(op)
    for where, t in tensors:
        if t.numel() == 0:
            continue
        aa, kk = list(a), dict(kw)
        if isinstance(where, int):
            aa[where] = t.to("meta")
        else:
            kk[where] = t.to("meta")
        before = [(x, x.clone()) for _, x in tensors]
        with pytest.raises(ValueError, match=rf"^{op}: .*: expected device (cpu|meta) \(same as .*every tensor is meta"):
            fn(*aa, **kk)
        assert all(torch.equal(x, b) for x, b in before)  # nothing written
    # every tensor meta: a trace, shapes only (the fake kernel)
    meta = lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v  # noqa: E731
    if op not in ("gather_replay_batch", "prepare_replay_step"):  # (a plan's tensors stay on the host)
        fn(*[meta(x) for x in a], **{k: meta(v) for k, v in kw.items()})


@pytest.mark.parametrize("op", list(OPS))
def test_custom_ops_name_a_first_tensor_passed_as_none(op):
    from swa_backends import torch_ops

    fn, a, kw, _ = _custom_calls(op)
    form = torch_ops.FORMS[fn._qualified_op_name.split("::")[1]]
    i = next(i for i, x in enumerate(a) if isinstance(x, torch.Tensor))
    name = "plan.kept" if form.plan_required else form.data_arg  # (a required plan's tensors come first)
    with pytest.raises(ValueError, match=rf"^{op}: {name}=None: expected a torch.Tensor"):
        fn(*a[:i], None, *a[i + 1:], **kw)


@pytest.mark.parametrize("prefer", _backends() + ["torch_ops"])
@pytest.mark.parametrize("op", ["gather_replay_batch", "prepare_replay_step"])
def test_a_plans_sizes_are_checked_before_they_are_read(op, prefer):
    from swa_backends import torch_ops

    bound = next(b for seed in range(40) if (b := _calls(op, seed)[0]).get("plan") is not None)
    plan = bound["plan"]
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.init}
    fn = (lambda *a, **k: torch_ops.call(op, *a, **k)) if prefer == "torch_ops" else getattr(_backend(prefer), op)
    for field, bad in (("kept", None), ("kept", [1]), ("kept", torch.tensor(3, dtype=torch.int32)),
                       ("num_rows_padded", None), ("num_rows_padded", [1]), ("num_rows_padded", 2.5)):
        if prefer == "torch_ops" and (field != "kept" or isinstance(bad, list)):
            continue  # (the custom op's schema takes a Tensor and a SymInt there: torch's error)
        args, kwargs = _rebind(op, {**bound, "plan": ReplayPlan(**{**fields, field: bad})})
        with pytest.raises(ValueError, match=rf"^{op}: plan\.{field}="):
            fn(*args, **kwargs)
