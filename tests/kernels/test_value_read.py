"""kernels/value_read.py, a validated call's value reads as one device pass, against torch: random
pieces (whole tensors and min/max reductions of every dtype and layout the value checks read,
PAD substitution, a block table's read entries), in calls of more pieces than one launch takes,
with the reader's buffers poisoned; what it declines; and the validated ops giving the same
outcome through it as through torch on every fuzz case (SPEC §5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _tritons import NO_TRITON
from swa_backends.common import validation
from swa_backends.common.validation import Reduced

pytestmark = pytest.mark.skipif(NO_TRITON is not None, reason=str(NO_TRITON))

DEV = "cuda" if torch.cuda.is_available() else "cpu"
INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.uint8, torch.bool)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _vr():
    from swa_backends.kernels import value_read

    return value_read


def _want(item) -> np.ndarray:
    """torch's answer: a whole tensor's values, a Reduced one's ``[min, max]`` (torch.aminmax)."""
    t = item.on_device() if isinstance(item, Reduced) else item
    return validation._host_values(t.cpu())


def _poison() -> None:
    """Every word of the reader's reused buffers set to garbage: a read must write what it reads."""
    for dev_buf, host_buf in getattr(_vr()._local, "buffers", {}).values():
        dev_buf.fill_(-0x5A5A5A5A5A5A5A5A)
        host_buf.fill_(0x3C3C3C3C3C3C3C3C)


@st.composite
def pieces(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    items = []
    for _ in range(draw(st.integers(1, 9))):
        dtype = draw(st.sampled_from(INT_DTYPES + FLOAT_DTYPES))
        rows, cols = draw(st.integers(1, 40)), draw(st.integers(1, 3000 if draw(st.booleans()) else 40))
        if dtype.is_floating_point:
            t = torch.from_numpy(rng.standard_normal((rows, cols)) * 1e3).to(dtype)
            if draw(st.booleans()):
                t.view(-1)[int(rng.integers(t.numel()))] = draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]))
        elif dtype == torch.bool:
            t = torch.from_numpy(rng.random((rows, cols)) < 0.5)
        else:
            info = torch.iinfo(dtype)
            lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
            t = torch.from_numpy(rng.integers(lo, hi, (rows, cols), endpoint=True)).to(dtype)
        t = t.to(DEV)
        layout = draw(st.sampled_from(["2d", "1d", "transposed", "columns", "row", "scalar"]))
        if layout == "1d":
            t = t.reshape(-1)
        elif layout == "transposed":
            t = t.t()
        elif layout == "columns":
            t = t[:, ::2]
        elif layout == "row":
            t = t[rows // 2]
        elif layout == "scalar":
            t = t[0, 0]
        if t.numel() == 0:
            continue
        kind = draw(st.sampled_from(["whole", "minmax", "pad", "masked"]))
        if kind == "whole" and t.numel() * t.element_size() <= _vr().COPY_BYTES:
            items.append(t)
        elif kind == "pad" and not dtype.is_floating_point and dtype != torch.bool and -1 >= torch.iinfo(dtype).min:
            t = t.clone()  # (its layout kept)
            t[torch.from_numpy(np.asarray(rng.random(tuple(t.shape)) < 0.3)).to(DEV)] = -1
            items.append(Reduced(t, pad_as=draw(st.integers(0, 100))))
        elif kind == "masked" and t.dim() == 2 and dtype in (torch.int32, torch.int64):
            step = draw(st.integers(0, 64))
            limit = torch.from_numpy(rng.integers(0, t.shape[1] * max(step, 1) + 2, t.shape[0])).to(torch.int32).to(DEV)
            items.append(Reduced(t, limit=limit, step=step))
        else:
            items.append(Reduced(t))
    return items


@settings(max_examples=25)
@given(pieces())
def test_one_pass_reads_what_torch_reads(items):
    """Every piece's values (whole) or ``[min, max]`` (reduced) equal torch's, dtype and shape
    included, in calls of up to nine pieces (three launches), the buffers poisoned first; a call
    with no reduction is declined."""
    if not any(isinstance(it, Reduced) for it in items):
        assert _vr().read(items) is None if items else True  # whole tensors alone: torch's way
        return
    _poison()
    got = _vr().read(items)
    assert got is not None
    assert len(got) == len(items)
    for g, it in zip(got, items):
        want = _want(it)
        assert g.dtype == want.dtype and g.shape == want.shape, (it, g.dtype, want.dtype, g.shape, want.shape)
        assert np.array_equal(g, want, equal_nan=True), (g, want)


def test_reductions_span_many_programs():
    """A piece past one program's chunk (several programs, each its min and max; the host joins
    them) and one past MAX_PROGRAMS chunks of BLOCK (a program walks several blocks)."""
    vr = _vr()
    for n in (vr.BLOCK * 3 + 5, vr.BLOCK * vr.MAX_PROGRAMS * 2 + 17):
        t = torch.arange(n, dtype=torch.int64, device=DEV) - n // 2
        t[n - 1] = -(2**62)
        t[1] = 2**62
        lo, hi = vr.read([Reduced(t)])[0]
        assert (int(lo), int(hi)) == (-(2**62), 2**62)


def test_declines_what_it_does_not_take():
    """None (the caller reads the torch way) for a whole tensor over COPY_BYTES and a layout that
    is not two strided dims; the pieces it takes beside them are not read either."""
    vr = _vr()
    big = torch.zeros(vr.COPY_BYTES // 4 + 1, dtype=torch.int32, device=DEV)
    odd = torch.zeros(4, 6, 5, dtype=torch.int32, device=DEV)[:, :, ::2]  # three dims, no 2-D view
    small = torch.ones(3, dtype=torch.int32, device=DEV)
    assert vr.read([small, big, Reduced(small)]) is None
    assert vr.read([Reduced(odd), small]) is None
    assert vr.read([small, small]) is None  # whole tensors alone: torch's copy
    assert [v.tolist() for v in vr.read([small, Reduced(small)])] == [[1, 1, 1], [1, 1]]
    three_d = torch.arange(60, dtype=torch.int32, device=DEV).view(3, 4, 5)  # viewable as [3, 20]
    assert vr.read([Reduced(three_d)])[0].tolist() == [0, 59]


def test_declines_dtypes_it_has_no_code_for():
    """A piece (or a block table's limits) of a dtype outside ``CODES`` (``LIMIT_CODES``): the read is
    the torch way's, the other pieces not read either."""
    vr = _vr()
    small = torch.ones(3, dtype=torch.int32, device=DEV)
    for dtype in (torch.uint16, torch.uint32, torch.float8_e4m3fn):
        assert dtype not in vr.CODES
        odd = torch.zeros(5, device=DEV).to(dtype)
        assert vr.read([small, Reduced(odd)]) is None
        assert vr.read([Reduced(small), odd]) is None
    table = torch.zeros(2, 4, dtype=torch.int32, device=DEV)
    assert vr.read([Reduced(table, limit=torch.ones(2, dtype=torch.int16, device=DEV), step=1)]) is None


@settings(max_examples=10)
@given(pieces(), pieces())
def test_every_read_launches_the_one_key(a, b):
    """Whatever its pieces' dtypes, kinds, layouts and sizes, a read launches the kernel under its one
    key (``KEY``): once one read has run (``Backend.warmup``), a validated call's read compiles nothing,
    whichever of its tensors its size makes a reduction. (The GPU warmup test's failure of 2026-12-05:
    a serving step's mix of whole and reduced pieces was a specialisation no warmup had made.)"""
    from swa_backends.kernels import _launch

    vr = _vr()
    for items in (a, b):
        if any(isinstance(it, Reduced) for it in items):
            assert vr.read(items) is not None
    assert {key for name, key in _launch.LAUNCHED if name == vr._K.name} <= {vr.KEY}


@pytest.mark.skipif(DEV != "cpu", reason="the reader pointed at the host tensors (Triton's interpreter)")
def test_backend_warmup_launches_the_readers_key(monkeypatch):
    """A validating backend's ``warmup`` reads one reduced piece through its value reader (not when
    ``validated=False``, nor when no hook ran); a backend without a reader warms none."""
    from swa_backends import dispatch
    from swa_backends.dispatch import select
    from swa_backends.kernels import _launch

    kw = dict(W=8, block_size=16, num_groups=1, hidden_sizes=(8,), hidden_dtypes=(torch.float32,))
    plain = select("cpu", prefer="triton")
    assert not any(r.startswith("value reader") for r in plain.warmup(ops=("gather_rows",), **kw))
    calls = []

    def reader(device):
        return lambda items: calls.append(items) or _vr().read(items)

    monkeypatch.setattr(dispatch, "_value_reader", reader)
    monkeypatch.setattr(_launch, "LAUNCHED", set())
    be = select("cpu", prefer="triton")
    assert be.warmup(ops=()) == [] and not calls
    assert not any(r.startswith("value reader") for r in be.warmup(ops=("gather_rows",), validated=False, **kw))
    assert not calls
    ran = be.warmup(ops=("gather_rows",), validated=True, **kw)
    assert ran[-1].startswith("value reader")
    assert len(calls) == 1 and isinstance(calls[0][0], Reduced)
    assert (_vr()._K.name, _vr().KEY) in _launch.LAUNCHED


def _fuzz_cases():
    import fuzz_module

    return fuzz_module.load("fuzz_cases_for_value_read")


@pytest.mark.skipif(DEV != "cpu", reason="the fuzz cases' tensors are host tensors (the reader runs on the host "
                                         "in Triton's interpreter)")
def test_validated_ops_give_the_same_outcome_through_the_reader(monkeypatch):
    """Every fuzz case of the reference backend's first valid call of each op, its value checks
    read by torch and by this kernel (pointed at the host tensors), every tensor a value check
    reads reduced unless the check reads it whole by design (the reader takes a read that holds a
    reduction): the same outcome, the same message."""
    from swa_backends import dispatch
    from swa_backends.common.ops import OPS, _checks
    from swa_backends.dispatch import select

    fuzz = _fuzz_cases()
    cases = [c for c in fuzz.all_cases(0, 1) if c[0] in OPS]
    for module in (validation, _checks):
        monkeypatch.setattr(module, "reads_whole", lambda t: False)
    plain = select("cpu")
    monkeypatch.setattr(dispatch, "_value_reader", lambda device: lambda items: _vr().read(items))
    monkeypatch.setattr(validation, "_for_reader", lambda device: True)
    reading = select("cpu")
    taken = []
    real_read = _vr().read
    monkeypatch.setattr(_vr(), "read", lambda items: (got := real_read(items)) is not None and taken.append(1) or got)

    def outcomes(be):
        return [fuzz.run_case(op, getattr(be, op), args, kwargs, expect, None) for op, _, args, kwargs, expect in cases]

    torch_way = outcomes(plain)
    one_pass = outcomes(reading)
    assert len(taken) > 300
    assert sum(r["outcome"] == "clear" for r in torch_way) > 300
    diff = [(c[:2], a, b) for c, a, b in zip(cases, torch_way, one_pass) if a != b]
    assert not diff, diff[:5]
