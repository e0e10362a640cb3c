"""Sparse-MLA GPU cases shared by tests/kernels/test_sparse_mla_gpu.py (tl kernel) and
tests/kernels/test_sparse_mla_gluon_gpu.py (Gluon kernel): a random latent cache, random queries (never
zeros) and index lists with every PAD pattern the contract allows, and the check against the fp32
torch reference."""

from __future__ import annotations

import math

import pytest
import torch

from swa_backends import OPS
from swa_backends.testing.conformance import mismatch

REF = OPS["sparse_mla"].reference
D = 512
S = 200_000


@pytest.fixture(scope="module")
def cache():
    g = torch.Generator(device="cuda").manual_seed(0)
    return torch.randn(S, D, generator=g, device="cuda")


def case(cache, T, H, K, dtype, sink, seed, pads=True):
    """``(args, kwargs)`` of one ``sparse_mla`` call. ``pads``: PAD holes inside the length,
    random lengths (every 5th full, some 0, 1 and 33: one row into a second 32-row tile), rows of
    nothing but PAD, and for wide K whole 32- and 64-row tiles of PAD inside the length."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(T, H, D, generator=g, device="cuda").to(dtype)
    kv = cache.to(dtype)
    idx = torch.randint(0, S, (T, K), generator=g, device="cuda", dtype=torch.int32)
    lens = torch.full((T,), K, dtype=torch.int32, device="cuda")
    if pads:
        idx = torch.where(torch.rand(T, K, generator=g, device="cuda") < 0.15, -1, idx)
        lens = torch.randint(0, K + 1, (T,), generator=g, device="cuda", dtype=torch.int32)
        lens[::5] = K
        lens[2::9] = 0  # nothing to read: zeros, lse -inf
        lens[6::13] = 1
        lens[7::13] = min(33, K)  # one row into the second 32-row tile
        idx[3::7] = -1  # all PAD inside the length
        if K > 160:
            idx[4::11, 16:160] = -1  # whole tiles of PAD inside the length (64- and 32-row)
        elif K > 80:
            idx[4::11, 16:80] = -1  # a whole 64-row tile of PAD inside the length
    kw = {"sink": torch.randn(H, generator=g, device="cuda")} if sink else {}
    return (q, kv, idx, lens, 1.0 / math.sqrt(D), D), kw


def check(got, args, kw):
    why = mismatch("sparse_mla", got, REF(*args, **kw))
    assert why is None, why


def capture(fn):
    """``fn()`` once on a side stream (as torch recommends before a capture), then captured in a
    CUDA graph: ``(graph, the captured call's outputs)``; ``graph.replay()`` reruns it."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        got = fn()
    return graph, got
