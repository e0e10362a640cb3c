"""The pieces vendor wrappers share (``backends/adapters.py``): exact against the reference
on random rows (PAD anywhere, lengths anywhere), never only on zeros."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swa_backends.backends import adapters
from swa_backends.testing.conformance import sparse_mla_case
from swa_backends.common.ops.sparse_mla import reference


def _rows(seed, T, K):
    rng = np.random.default_rng(seed)
    idx = torch.tensor(rng.integers(0, 50, size=(T, K)), dtype=torch.int32)
    idx[torch.tensor(rng.random((T, K)) < 0.3)] = -1
    lens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=torch.int32)
    return idx, lens


@settings(max_examples=40)
@given(seed=st.integers(0, 10**6), T=st.integers(0, 9), K=st.integers(0, 40))
def test_compact_rows_keeps_valid_entries_in_order(seed, T, K):
    idx, lens = _rows(seed, T, K)
    rows, counts = adapters.compact_rows(idx, lens)
    assert rows.shape == (T, K) and rows.dtype == torch.int32 and counts.dtype == torch.int32
    for t in range(T):
        kept = [int(v) for j, v in enumerate(idx[t]) if j < lens[t] and v != -1]
        assert int(counts[t]) == len(kept)
        assert rows[t, : len(kept)].tolist() == kept and bool((rows[t, len(kept):] == -1).all())


@settings(max_examples=25)
@given(seed=st.integers(0, 10**6))
def test_lse_from_indices_equals_the_reference_lse(seed):
    rng = np.random.default_rng(seed)
    (q, kv, idx, lens, scale, d_v), kw = sparse_mla_case(rng, "cpu")
    want = reference(q, kv, idx, lens, scale, d_v)[1]
    got = adapters.lse_from_indices(q, kv, idx, lens, scale)
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    fin = torch.isfinite(want)
    assert torch.allclose(got[fin], want[fin], atol=1e-4, rtol=1e-5)


def test_zero_empty_rows_and_pad_heads():
    idx = torch.tensor([[3, -1], [-1, -1], [5, 6]], dtype=torch.int32)
    lens = torch.tensor([2, 2, 0], dtype=torch.int32)
    out = torch.full((3, 2, 4), 9.0)
    lse = torch.full((3, 2), float("inf"))
    o, l = adapters.zero_empty_rows(out, lse, idx, lens)
    assert bool((o[0] == 9).all()) and not o[1:].any()
    assert bool(torch.isposinf(l[0]).all()) and bool(torch.isneginf(l[1:]).all())
    q = torch.randn(2, 3, 4)
    sink = torch.randn(3)
    qp, sp = adapters.pad_heads(q, sink, 8)
    assert torch.equal(qp[:, :3], q) and not qp[:, 3:].any()
    assert torch.equal(sp[:3], sink) and bool(torch.isneginf(sp[3:]).all())
    assert adapters.pad_heads(q, None, 3) == (q, None)
    assert adapters.round_up(129, 128) == 256 and adapters.round_up(128, 128) == 128
