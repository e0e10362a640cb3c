"""testing/interpreter.py's ``fast_reductions`` (installed by tests/conftest.py): a ``tl.reduce``
whose combine function is a kernel's own ``a + b`` or ``tl.maximum(a, b)`` gives, bit for bit,
what the interpreter's element-at-a-time fold gives (same order, same dtype; NaN, inf, -0 and
int32 wrap-around included), along either axis, with and without ``keep_dims``, down to a
scalar; other combine functions and dtypes keep the interpreter's own path. The sparse-MLA
kernel's reductions are the ones it recognises."""

from __future__ import annotations

import os

import pytest
import torch

from _tritons import NO_TRITON

pytestmark = pytest.mark.skipif(NO_TRITON is not None or os.environ.get("TRITON_INTERPRET") != "1",
                                reason=str(NO_TRITON or "the interpreter's reductions: a CPU-only process"))

if NO_TRITON is None:
    import triton
    import triton.language as tl

    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _max(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _mul(a, b):
        return a * b

    @triton.jit
    def _add_one_more(a, b):
        return a + b + 1

    @triton.jit
    def _reduce(X, OUT, M: tl.constexpr, N: tl.constexpr, KIND: tl.constexpr, AXIS: tl.constexpr,
                KEEP: tl.constexpr):
        offs_m = tl.arange(0, M)
        offs_n = tl.arange(0, N)
        x = tl.load(X + offs_m[:, None] * N + offs_n[None, :])
        if KIND == 0:
            r = tl.reduce(x, AXIS, _add, keep_dims=KEEP)
        elif KIND == 1:
            r = tl.reduce(x, AXIS, _max, keep_dims=KEEP)
        elif KIND == 2:
            r = tl.reduce(x, AXIS, _mul, keep_dims=KEEP)
        else:
            r = tl.reduce(x, AXIS, _add_one_more, keep_dims=KEEP)
        if AXIS == 0:
            if KEEP:
                tl.store(OUT + tl.arange(0, 1)[:, None] * N + offs_n[None, :], r)
            else:
                tl.store(OUT + offs_n, r)
        else:
            if KEEP:
                tl.store(OUT + offs_m[:, None] + tl.arange(0, 1)[None, :], r)
            else:
                tl.store(OUT + offs_m, r)

    @triton.jit
    def _to_scalar(X, OUT, N: tl.constexpr, KIND: tl.constexpr):
        x = tl.load(X + tl.arange(0, N))
        if KIND == 0:
            tl.store(OUT, tl.reduce(x, 0, _add))
        else:
            tl.store(OUT, tl.reduce(x, 0, _max))

KINDS = {"add": 0, "max": 1, "mul": 2, "add_one_more": 3}


def _data(dtype: torch.dtype, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if dtype == torch.int32:  # sums that wrap around
        return torch.randint(-2**31, 2**31 - 1, (16, 32), generator=g, dtype=torch.int32)
    # magnitudes over 2^-20 .. 2^20 (fp16: 2^-6 .. 2^6): the fold's order shows in the low bits
    e = 20 if dtype == torch.float32 else 6
    x = torch.randn(16, 32, generator=g) * torch.exp2(torch.randint(-e, e, (16, 32), generator=g).float())
    if kind == "max":
        x[0, :4] = float("nan")
        x[:, 1] = float("nan")  # a whole column of NaN
        x[3, 5:9] = float("inf")
        x[:, 10] = -0.0
        x[2, 11] = float("-inf")
    if kind == "mul":
        x = 1 + x.clamp(-0.5, 0.5) / 64
    return x.to(dtype)


def _run(x: torch.Tensor, kind: str, axis: int, keep: bool) -> torch.Tensor:
    out = torch.empty(x.shape[1 - axis], dtype=x.dtype)
    _reduce[(1,)](x, out, x.shape[0], x.shape[1], KINDS[kind], axis, keep)
    return out


def _generic(monkeypatch):
    """The interpreter's own path for every reduction, for the call that follows."""
    from swa_backends.testing import interpreter

    monkeypatch.setattr(interpreter, "_combine_kind", lambda fn: None)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        return torch.equal(a.view(torch.int32 if a.dtype == torch.float32 else torch.int16),
                           b.view(torch.int32 if b.dtype == torch.float32 else torch.int16))
    return torch.equal(a, b)


@pytest.mark.parametrize("keep", [False, True], ids=["flat", "keep_dims"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype, kind", [(torch.float32, "add"), (torch.float32, "max"), (torch.int32, "add"),
                                         (torch.int32, "max"), (torch.float16, "add"), (torch.float32, "mul"),
                                         (torch.float32, "add_one_more")],
                         ids=["fp32-add", "fp32-max", "i32-add", "i32-max", "fp16-add", "fp32-mul", "fp32-add_one_more"])
def test_the_fast_fold_is_the_interpreters_fold_bit_for_bit(monkeypatch, dtype, kind, axis, keep):
    x = _data(dtype, kind)
    fast = _run(x, kind, axis, keep)
    with monkeypatch.context() as m:
        _generic(m)
        slow = _run(x, kind, axis, keep)
    assert _bits_equal(fast, slow), (fast, slow)
    if dtype == torch.float32 and kind == "add":
        # teeth: the same sum in the other order differs in its bits (so an order change would show)
        other = _run(x.flip(axis), kind, axis, keep)
        assert not _bits_equal(fast, other)


@pytest.mark.parametrize("kind", ["add", "max"])
def test_a_vector_down_to_a_scalar(monkeypatch, kind):
    x = _data(torch.float32, kind)[4]
    fast, slow = torch.empty(1), torch.empty(1)
    _to_scalar[(1,)](x, fast, x.shape[0], KINDS[kind])
    with monkeypatch.context() as m:
        _generic(m)
        _to_scalar[(1,)](x, slow, x.shape[0], KINDS[kind])
    assert _bits_equal(fast, slow)


def test_which_combine_functions_are_recognised():
    import triton.runtime.interpreter as interp

    from swa_backends.kernels import sparse_mla
    from swa_backends.testing.interpreter import _combine_kind, fast_reductions

    assert interp.ReduceOps.apply_impl._swa_fast and fast_reductions() is False  # conftest installed it, once

    assert _combine_kind(sparse_mla._sum_fn) == "add" and _combine_kind(sparse_mla._max_fn) == "max"
    assert _combine_kind(_add) == "add" and _combine_kind(_max) == "max"
    assert _combine_kind(_mul) is None and _combine_kind(_add_one_more) is None
    assert _combine_kind(lambda a, b: a + b) is None  # no jit function
