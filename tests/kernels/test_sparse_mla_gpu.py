"""The compiled Triton sparse-MLA kernel at DeepSeek-V4.1 shapes (``-m gpu``).

D_qk = d_v = 512, H 8..128, index width 128 / 640 / 1152, T from 1 (decode, split-K) to a
few hundred, PAD inside and past the length, with and without sink, bf16 and fp16, scores whose
running max moves far between tiles, against the fp32 torch reference; every swept launch
config; CUDA-graph capture.

    python -m pytest -m gpu tests/kernels/test_sparse_mla_gpu.py
"""

from __future__ import annotations

import importlib

import pytest
import torch

from swa_backends import select
from swa_backends.dispatch import variant
from swa_backends.testing.conformance import MOVING_MAX_PATTERNS, sparse_mla_moving_max_case

from _sparse_mla_cases import D, cache, capture, case, check  # noqa: F401  (cache: a fixture)

pytestmark = pytest.mark.gpu



@pytest.fixture(scope="module")
def backend():
    return select(prefer={"sparse_mla": "triton"})


@pytest.fixture(scope="module")
def kmod(backend):
    variant("sparse_mla", "triton").load()
    return importlib.import_module("swa_backends.kernels.sparse_mla")


@pytest.mark.parametrize("K", [128, 640, 1152])
@pytest.mark.parametrize("H", [8, 16, 32, 64, 128])
def test_real_shapes(backend, cache, H, K):
    args, kw = case(cache, 300, H, K, torch.bfloat16, sink=(H + K) % 2 == 0, seed=H * 7 + K)
    assert backend.variant_for("sparse_mla", *args, **kw) == "triton"
    check(backend.sparse_mla(*args, **kw), args, kw)


@pytest.mark.parametrize("T", [1, 7, 64, 256])
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_decode_split_k(backend, cache, T, H, dtype):
    args, kw = case(cache, T, H, 640, dtype, sink=True, seed=T + H)
    check(backend.sparse_mla(*args, **kw), args, kw)


def test_all_valid_long_rows(backend, cache):
    args, kw = case(cache, 1024, 64, 1152, torch.bfloat16, sink=False, seed=1, pads=False)
    check(backend.sparse_mla(*args, **kw), args, kw)



@pytest.mark.parametrize("pattern", MOVING_MAX_PATTERNS)
@pytest.mark.parametrize("T", [1, 96])
def test_running_max_moving_between_tiles(backend, pattern, T):
    """Scores whose running max jumps, falls or moves inside a pair of 64-row tiles, per row
    differently (``moving_max_case``), prefill-sized and at T 1 (split-K, whose combine rescales
    the splits' partial results)."""
    for H, K in ((64, 640), (128, 1152)):
        args, kw = sparse_mla_moving_max_case(pattern, "cuda", T=T, H=H, K=K, tile=64, seed=H + K + T)
        assert backend.variant_for("sparse_mla", *args, **kw) == "triton"
        got = backend.sparse_mla(*args, **kw)
        assert torch.isfinite(got[0]).all()
        check(got, args, kw)


# The kernel's knobs, one config per feature (bench/bench_sparse_mla.py --sweep times more).
CONFIGS = [dict(block_h=64, block_n=64, num_warps=8, num_stages=2), dict(block_h=64, block_n=64, num_warps=8,
           num_stages=2, split_s=True), dict(block_h=64, block_n=32, num_warps=8, num_stages=5),
           dict(block_h=64, block_n=32, num_warps=8, num_stages=5, split_s=True, skip_empty=True),
           dict(block_h=64, block_n=16, num_warps=4, num_stages=3, dv_split=2)]


def test_configs_are_correct(kmod, cache):
    """Each feature of the tl kernel compiles with this Triton (fit=False: no silent fallback) and is right."""
    for H in (64, 128):
        args, kw = case(cache, 200, H, 640, torch.bfloat16, sink=True, seed=H)
        for fields in CONFIGS:
            cfg = kmod.Config(**fields)
            if cfg.block_h > H:
                continue
            for splits in (None, 3):  # T 200 > SMs: None is no split
                got = kmod.launch(*args, **kw, config=cfg.replace(splits=splits), fit=False)
                check(got, args, kw)


@pytest.mark.parametrize("H", [8, 16, 32, 64, 128])
def test_shipped_configs_need_no_fallback(kmod, cache, H):
    """The table's config for each head count compiles and fits as it is (prefill and split-K)."""
    cfg = kmod.pick_config(300, H, D, D, 640, torch.device("cuda"))
    for T in (300, 2):
        args, kw = case(cache, T, H, 640, torch.bfloat16, sink=True, seed=H + T)
        check(kmod.launch(*args, **kw, config=cfg, fit=False), args, kw)


def test_cuda_graph_capture(backend, cache):
    args, kw = case(cache, 32, 64, 640, torch.bfloat16, sink=True, seed=9)
    want = backend.sparse_mla(*args, **kw)  # compiles (and validates) outside the capture
    g, got = capture(lambda: backend.sparse_mla(*args, **kw))
    args[0].mul_(0.5)  # new data in the same buffers
    g.replay()
    torch.cuda.synchronize()
    check(got, args, kw)
    assert not torch.equal(got[0], want[0])


def _compiled(fn) -> int:
    return sum(len(c[0]) for c in fn.device_caches.values())


def test_warmup_compiles_what_serving_launches(backend, kmod, cache):
    ran = kmod.warmup(backend, num_heads=(64,), attn_dtypes=(torch.bfloat16,), attn_sink=(True,))
    assert ran == ["sparse_mla"]
    before = (_compiled(kmod._sparse_mla_fwd), _compiled(kmod._sparse_mla_combine))
    for T, K in ((1, 640), (5, 1152), (300, 128), (2048, 640)):  # decode (split-K) and prefill steps
        args, kw = case(cache, T, 64, K, torch.bfloat16, sink=True, seed=T)
        backend.sparse_mla(*args, **kw)
    assert (_compiled(kmod._sparse_mla_fwd), _compiled(kmod._sparse_mla_combine)) == before
