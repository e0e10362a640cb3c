"""An index value below PAD (-1) is bad input for ``indices_to_csr`` and ``mixed_indices`` (SPEC §5:
"slots in range or PAD", every entry of an index tensor, those past a token's length included).

Both ops once took such a value and passed it on: ``indices_to_csr`` kept a -2 among the values it
hands AITER (which faults on any negative index: the op exists to strip every PAD before it), and
``mixed_indices`` copied it into its rows. Here, on the CPU (the kernels in Triton's interpreter):
the reference validator refuses it with a ``ValueError`` naming the argument and writes nothing; the
self-checked kernel form (``Variant.self_checked``) refuses it and writes nothing, wherever the value
lies (inside or past a length, in any checker's share, in index rows sliced from a wider buffer);
the validated Triton backend raises the validator's error; PAD and the values at the bounds pass,
and the conformance cases draw only valid index values.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import swa_backends as sb
from swa_backends.common.ops import OPS
from swa_backends.common.registry import load_attr
from swa_backends.common.types import PAD
from swa_backends.testing.conformance import case_for, mismatch

pytest.importorskip("triton")
from swa_backends.kernels import SELF_CHECKED, _launch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_self_checked import _poisoned_call, agrees  # noqa: E402

I32 = torch.int32
INT32_MAX = 2**31 - 1
#: values below PAD: just below it, further, and int32's least
BELOW_PAD = (-2, -7, -(2**31))
EXPECT = "expected values in [0, 2147483648) or PAD (-1)"


def _csr_call(T: int = 6, K: int = 9, seed: int = 0, wide: bool = False):
    """Valid ``indices_to_csr`` arguments: indices with PAD inside and past the lengths (``wide``:
    the rows a column slice of a wider buffer, so the checkers tile them row by row)."""
    rng = np.random.default_rng(seed)
    idx = torch.tensor(rng.integers(0, 5000, size=(T, K)), dtype=I32)
    idx[torch.tensor(rng.random((T, K)) < 0.3)] = PAD
    if wide:
        buf = torch.full((T, K + 5), 7, dtype=I32)
        buf[:, 2:K + 2] = idx
        idx = buf[:, 2:K + 2]
    lens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=I32)
    return {"indices": idx, "lens": lens}


def _mixed_call(T: int = 6, SW: int = 8, K: int = 5, seed: int = 0, wide: bool = False):
    rng = np.random.default_rng(seed)
    swa = torch.tensor(rng.integers(-1, 5000, size=(T, SW)), dtype=I32)
    topk = torch.tensor(rng.integers(-1, 5000, size=(T, K)), dtype=I32)
    if wide:
        swa = torch.cat([swa, torch.zeros(T, 3, dtype=I32)], dim=1)[:, :SW]
        topk = torch.cat([torch.zeros(T, 4, dtype=I32), topk], dim=1)[:, 4:]
    topk_lens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=I32)
    return {"swa_indices": swa, "topk_slots": topk, "topk_lens": topk_lens}


CALLS = {"indices_to_csr": _csr_call, "mixed_indices": _mixed_call}
#: (op, index argument, the argument holding its rows' lengths: None where every entry is copied)
TARGETS = (("indices_to_csr", "indices", "lens"), ("mixed_indices", "swa_indices", None),
           ("mixed_indices", "topk_slots", "topk_lens"))


def _args(op: str, call: dict) -> tuple:
    return tuple(call[n] for n in OPS[op].signature.parameters if n in call)


def _out(op: str, call: dict) -> tuple:
    """``out=`` buffers of the call's result shapes, filled with a value no output keeps."""
    return tuple(torch.full_like(t, 12345) for t in OPS[op].reference(*_args(op, call)))


def _poison(call: dict, name: str, lens: str | None, value: int, past: bool) -> tuple[int, int]:
    """Sets one entry of ``call[name]`` to ``value``: inside its row's length, or past it (``past``;
    the length is 0 or the row's last column is past it). Returns the entry."""
    t = call[name]
    T, C = t.shape
    r = T // 2
    if lens is None:  # mixed_indices' window rows: no length of their own, every entry copied
        c = C - 1 if past else 0
    elif past:
        call[lens][r] = min(int(call[lens][r]), C - 1)
        c = C - 1
    else:
        call[lens][r] = max(int(call[lens][r]), 1)
        c = 0
    t[r, c] = value
    return r, c


def _every_poison(test):
    """``test(op, name, lens, past, value)`` for every index argument, inside and past its length,
    every value below PAD."""
    for mark in (pytest.mark.parametrize("op,name,lens", TARGETS, ids=[f"{t[0]}-{t[1]}" for t in TARGETS]),
                 pytest.mark.parametrize("past", [False, True], ids=["inside", "past-length"]),
                 pytest.mark.parametrize("value", BELOW_PAD)):
        test = mark(test)
    return test


def _poisoned(op: str, name: str, lens: str, past: bool, value: int):
    """The op's call with ``value`` at one entry of ``name``: its arguments and its ``out=`` buffers."""
    call = CALLS[op]()
    _poison(call, name, lens, value, past)
    return _args(op, call), _out(op, call)


@_every_poison
def test_the_validator_refuses_a_value_below_pad_and_writes_nothing(op, name, lens, past, value):
    args, out = _poisoned(op, name, lens, past, value)
    with pytest.raises(ValueError) as err:
        OPS[op].validate(*args)
    assert str(err.value) == f"{op}: {name}={value}: {EXPECT}"
    before = [o.clone() for o in out]
    with pytest.raises(ValueError, match=f"^{op}: {name}={value}: "):
        getattr(sb.select("cpu"), op)(*args, out=out)  # the reference backend, validated
    assert all(torch.equal(o, b) for o, b in zip(out, before)), "a refused call wrote"


def _form(op: str):
    """The op's self-checked form, called as dispatch calls it on the host (``home`` None: any device)."""
    return functools.partial(load_attr(f"swa_backends.kernels.{SELF_CHECKED[op]}"), None)


@_every_poison
def test_the_self_checked_form_refuses_a_value_below_pad_and_writes_nothing(op, name, lens, past, value):
    args, out = _poisoned(op, name, lens, past, value)
    before = [o.clone() for o in out]
    done = _form(op)(*args, out=out)
    assert done is not None, "the form declined a call it takes"
    assert done[1].failed(), "the kernel passed a value below PAD"
    assert all(torch.equal(o, b) for o, b in zip(out, before)), "a refused call wrote"
    assert agrees(op, args, {"out": tuple(o.clone() for o in before)}) == "bad"


@pytest.mark.parametrize("wide", [False, True], ids=["rows-one-run", "rows-sliced"])
@pytest.mark.parametrize("op,name,lens", TARGETS, ids=[f"{t[0]}-{t[1]}" for t in TARGETS])
def test_every_checker_finds_a_value_below_pad_in_its_own_share(op, name, lens, wide):
    """Rows long enough for several checkers (one-run rows: 4096 values a tile; sliced rows: 16
    rows a tile): a -2 at the first entry, in the middle and at the last, each refused."""
    T = 300
    make = (lambda **kw: _csr_call(T=T, K=70, **kw)) if op == "indices_to_csr" else \
        (lambda **kw: _mixed_call(T=T, SW=40, K=33, **kw))
    for flat in (0, None, -1):
        call = make(wide=wide, seed=3)
        t = call[name]
        i = t.numel() // 2 if flat is None else flat % t.numel()
        t[i // t.shape[1], i % t.shape[1]] = -2
        args = _args(op, call)
        out = _out(op, call)
        before = [o.clone() for o in out]
        done = _form(op)(*args, out=out)
        assert done is not None and done[1].failed(), (flat, wide)
        assert all(torch.equal(o, b) for o, b in zip(out, before)), f"entry {i}: a refused call wrote"
    # the same rows, unpoisoned: passed, the reference's result
    call = make(wide=wide, seed=3)
    args = _args(op, call)
    done = _form(op)(*args)
    assert done is not None and not done[1].failed()
    assert mismatch(op, done[0], OPS[op].reference(*args)) is None


def _checked_launches(op: str) -> int:
    module = SELF_CHECKED[op].partition(":")[0]
    return sum(k.launches for n, k in _launch.KERNELS.items() if n.startswith(f"{module}.") and n.endswith("_checked"))


@pytest.mark.parametrize("value", BELOW_PAD)
@pytest.mark.parametrize("op,name,lens", TARGETS, ids=[f"{t[0]}-{t[1]}" for t in TARGETS])
def test_the_validated_triton_backend_raises_the_validators_error(op, name, lens, value):
    """Through the self-checked path (plain tensors: the kernel refuses, the validator names the
    value) and through the host validator (a column-strided view the quick check leaves to it)."""
    be = sb.select("cpu", prefer="triton")
    assert be.variants[op][0] == "triton"
    call = CALLS[op]()
    _poison(call, name, lens, value, past=True)
    args = _args(op, call)
    out = _out(op, call)
    before = [o.clone() for o in out]
    n = _checked_launches(op)
    with pytest.raises(ValueError) as err:
        getattr(be, op)(*args, out=out)
    assert str(err.value) == f"{op}: {name}={value}: {EXPECT}"
    assert _checked_launches(op) == n + 1, "the call took the self-checked path"
    assert all(torch.equal(o, b) for o, b in zip(out, before)), "a refused call wrote"
    strided = dict(call, **{name: call[name].t().contiguous().t()})
    assert not OPS[op].quick_check(*_args(op, strided))
    with pytest.raises(ValueError, match=f"^{op}: {name}={value}: "):
        getattr(be, op)(*_args(op, strided))
    assert _checked_launches(op) == n + 1


@pytest.mark.parametrize("op", sorted(CALLS))
def test_pad_and_the_values_at_the_bounds_still_pass(op):
    """PAD inside and past the lengths, 0 and INT32_MAX: every path gives the reference's result."""
    call = CALLS[op](seed=5)
    for name, lens in ((n, ln) for o, n, ln in TARGETS if o == op):
        t = call[name]
        t[0, :] = PAD
        t[1, 0], t[1, -1], t[2, 0] = 0, INT32_MAX, PAD
        if lens is not None:  # row 1 whole (its 0 and INT32_MAX kept), row 2's PAD inside its length
            call[lens][1], call[lens][2] = t.shape[1], max(int(call[lens][2]), 1)
    args = _args(op, call)
    OPS[op].validate(*args)
    want = OPS[op].reference(*args)
    if op == "indices_to_csr":  # every PAD dropped, the bounds kept
        kept = want[1][: int(want[0][-1])]
        assert int(kept.min()) == 0 and int(kept.max()) == INT32_MAX
    done = _form(op)(*args)
    assert done is not None and not done[1].failed()
    assert mismatch(op, done[0], want) is None
    assert agrees(op, args, {}) == "good"
    be = sb.select("cpu", prefer="triton")
    n = _checked_launches(op)
    assert mismatch(op, getattr(be, op)(*args), want) is None
    assert _checked_launches(op) == n + 1
    assert mismatch(op, getattr(sb.select("cpu"), op)(*args), want) is None


@pytest.mark.parametrize("op", sorted(CALLS))
def test_the_conformance_cases_draw_only_valid_index_values(op):
    """The good cases every backend is compared on (``OpSpec.case``, plain and with poisoned
    ``out=`` buffers) hold index values >= PAD and pass the validator, values included."""
    names = {"indices_to_csr": ("indices",), "mixed_indices": ("swa_indices", "topk_slots")}[op]
    for seed in range(40):
        args, kwargs = case_for(op, np.random.default_rng([seed, 91]), "cpu", poison=bool(seed % 2))
        bound = OPS[op].signature.bind(*args, **kwargs).arguments
        for name in names:
            t = bound[name]
            assert t.numel() == 0 or int(t.min()) >= PAD, (seed, name)
        OPS[op].validate(*args, **kwargs)


@pytest.mark.parametrize("op", sorted(CALLS))
def test_a_poison_below_pad_anywhere_is_refused_by_both(op):
    """``test_self_checked``'s poisoned calls with the poison below PAD (any integer argument, any
    entry): the validator and the self-checked form both refuse every one they take."""
    seen = []
    for seed in range(24):
        seen.append(agrees(op, *_poisoned_call(op, seed, 1, (-2, -(2**31))[seed % 2], seed % 3 == 0)))
    assert set(seen) <= {"bad", "declined"} and seen.count("bad") >= 18, seen
