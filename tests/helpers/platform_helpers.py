"""Helpers shared by the platform-backend tests: spying on contract doubles, random
sparse-MLA cases at vendor shapes, and the comparison with the reference."""

from __future__ import annotations

import contextlib
import functools
import sys

import numpy as np
import torch

from swa_backends.testing.conformance import mismatch, sparse_mla_case
from swa_backends.common.ops.sparse_mla import reference as sparse_mla_reference


@contextlib.contextmanager
def spy(module_name: str, attr: str, calls: list):
    """Record ``(args, kwargs)`` of every call to ``sys.modules[module_name].attr`` (a double)."""
    mod = sys.modules[module_name]
    orig = getattr(mod, attr)

    @functools.wraps(orig)  # keeps the signature the probes inspect
    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return orig(*args, **kwargs)

    setattr(mod, attr, wrapper)
    try:
        yield calls
    finally:
        setattr(mod, attr, orig)


def vendor_case(seed: int, *, D: int = 512, d_v: int = 512, heads=(1, 2, 3, 8, 16, 64), K=None, T=None,
                S=None, dtype=torch.bfloat16, sink=None):
    """A random sparse_mla case (never zeros; PAD holes inside and past the length; tokens
    with nothing to read) at a vendor's head dim."""
    rng = np.random.default_rng(seed)
    args, kw = sparse_mla_case(rng, "cpu", T=T if T is not None else int(rng.integers(1, 10)),
                               H=int(rng.choice(heads)), D=D, d_v=d_v,
                               K=K if K is not None else int(rng.integers(1, 200)),
                               S=S if S is not None else int(rng.integers(1, 400)), dtype=dtype)
    if sink is True and "sink" not in kw:
        kw["sink"] = torch.randn(args[0].shape[1])
    if sink is False:
        kw.pop("sink", None)
    return args, kw


def assert_matches_reference(fn, args, kw):
    got = fn(*args, **kw)
    want = sparse_mla_reference(*args, **kw)
    why = mismatch("sparse_mla", got, want)
    assert why is None, why
    out, lse = got
    assert out.dtype == args[0].dtype and lse.dtype == torch.float32
    assert tuple(out.shape) == (args[0].shape[0], args[0].shape[1], args[5])
    # the pack's convention for a token with nothing to read, exactly
    empty = torch.isneginf(want[1])
    assert torch.equal(torch.isneginf(lse), empty)
    rows = empty.all(dim=1)
    if rows.any():
        assert bool((out[rows] == 0).all())
    return got
