"""The Triton sparse-MLA kernel against the torch reference.

On a CPU-only host the kernel runs in Triton's interpreter (small odd shapes, kept fast);
on a CUDA/ROCm host the same tests run the compiled kernel. Real-shape GPU tests live in
``test_sparse_mla_gpu.py`` (``-m gpu``).
"""

from __future__ import annotations

import importlib
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swa_backends import OPS, PAD, KernelUnavailable, SelectionError, select, validation
from swa_backends.testing.conformance import (MOVING_MAX_PATTERNS, POISON_INT, mismatch, poisoned_allocations,
                                              poisoning_empty, sparse_mla_case, sparse_mla_moving_max_case)
from swa_backends.common.device import resolve_device
from swa_backends.dispatch import variant

REF = OPS["sparse_mla"].reference
I32 = torch.int32
ON_GPU = torch.cuda.is_available()
DEV = "cuda" if ON_GPU else "cpu"


@pytest.fixture(scope="module")
def backend():
    try:
        return select("cpu" if not ON_GPU else None, prefer={"sparse_mla": "triton"})
    except SelectionError as exc:  # e.g. triton not installed: the variant's own reasons
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def kmod(backend):
    """The kernel module, imported the way dispatch imports it (interpreter set up first)."""
    variant("sparse_mla", "triton").load()
    return importlib.import_module("swa_backends.kernels.sparse_mla")


def _check(got, args, kw):
    want = REF(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args],
               **{k: v.cpu() for k, v in kw.items()})
    why = mismatch("sparse_mla", got, want)
    assert why is None, why
    out, lse = got
    assert out.dtype == args[0].dtype and lse.dtype == torch.float32


def _to(args, kw):
    return tuple(a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args), {k: v.to(DEV) for k, v in kw.items()}


# ---------------------------------------------------------------------------------------
# random data (never zeros), through dispatch
# ---------------------------------------------------------------------------------------


def test_random_cases_match_reference(backend, kmod, monkeypatch):
    """Hypothesis-drawn calls on KV rows through dispatch, every buffer the kernel allocates
    poisoned (an element of out, lse or a split's partials left unwritten shows)."""
    monkeypatch.setattr(kmod, "_empty", poisoning_empty(torch.empty))

    @settings(max_examples=20)
    @given(seed=st.integers(0, 2**32 - 1))
    def run(seed):
        args, kw = _to(*sparse_mla_case(np.random.default_rng(seed), "cpu"))
        assert backend.variant_for("sparse_mla", *args, **kw) == "triton"
        _check(backend.sparse_mla(*args, **kw), args, kw)

    run()


# ---------------------------------------------------------------------------------------
# every PAD pattern in one batch, for each dtype, sink and launch shape
# ---------------------------------------------------------------------------------------


def _pad_batch(dtype, with_sink, *, H=3, D=48, d_v=32, K=37, S=211, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(9, H, D, generator=g).to(dtype)
    kv = torch.randn(S, D, generator=g).to(dtype)
    idx = torch.randint(0, S, (9, K), generator=g, dtype=I32)
    lens = torch.full((9,), K, dtype=I32)
    idx[1, ::3] = PAD  # PAD inside the active length (the mixed layout's holes)
    idx[2, :] = PAD  # all PAD, lens = K
    lens[3] = 0  # lens 0 (real indices behind it must be ignored)
    lens[4] = K // 2  # valid-looking indices past the length must be ignored
    idx[5, :-1] = PAD  # only the very last entry valid
    idx[6, 0] = PAD  # PAD first, rest valid
    lens[7] = 1  # one entry
    idx[8, 16:32] = PAD  # a whole 16-wide tile of PAD inside the length
    sink = torch.randn(H, generator=g) if with_sink else None
    return (q, kv, idx, lens, 1.0 / math.sqrt(D), d_v), ({"sink": sink} if with_sink else {})


LAUNCHES = {
    "default": None,
    "split3": dict(block_h=16, block_n=16, num_stages=1, splits=3),
    "dvsplit": dict(block_h=16, block_n=16, dv_split=2, splits=1),
    "skip": dict(block_h=16, block_n=16, skip_empty=True, splits=1),
    "split_s": dict(block_h=16, block_n=32, split_s=True, splits=2),
    "dvsplit_splitk": dict(block_h=16, block_n=16, dv_split=2, splits=2),
}


# Every launch shape with and without a sink (HAS_SINK is folded in by the one-pass kernel or,
# split, by the combine: a path per pair); the dtype only changes the loads' and the store's
# casts, the same in every launch, so each launch takes bf16 with one sink setting and fp16
# with the other: every (launch, sink), (launch, dtype) and (sink, dtype) pair runs, the full
# cross product's 24 cases in 12.
PAD_CASES = [(dtype, with_sink, launch) for i, launch in enumerate(sorted(LAUNCHES)) for with_sink in (False, True)
             for dtype in [(torch.bfloat16, torch.float16)[(i + with_sink) % 2]]]


@pytest.mark.parametrize("dtype, with_sink, launch", PAD_CASES,
                         ids=[f"{'bf16' if d == torch.bfloat16 else 'fp16'}-{'sink' if s else 'nosink'}-{la}"
                              for d, s, la in PAD_CASES])
def test_pad_patterns(kmod, dtype, with_sink, launch):
    args, kw = _to(*_pad_batch(dtype, with_sink))
    cfg = None if LAUNCHES[launch] is None else kmod.Config(**LAUNCHES[launch])
    out, lse = kmod.launch(*args, **kw, config=cfg)
    _check((out, lse), args, kw)
    # rows with nothing valid: zeros and lse = -inf exactly
    for t in (2, 3):
        assert torch.isneginf(lse[t]).all()
        assert (out[t] == 0).all()
    assert torch.isfinite(lse[[0, 1, 4, 5, 6, 7, 8]]).all()


# ---------------------------------------------------------------------------------------
# poisoned outputs: every element of out / lse (and of the split partials) is written
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("launch", ["default", "split3", "dvsplit", "split_s"])
def test_poisoned_outputs(kmod, monkeypatch, launch):
    monkeypatch.setattr(kmod, "_empty", poisoning_empty(torch.empty))
    args, kw = _to(*_pad_batch(torch.bfloat16, True, seed=3))
    cfg = None if LAUNCHES[launch] is None else kmod.Config(**LAUNCHES[launch])
    _check(kmod.launch(*args, **kw, config=cfg), args, kw)


# ---------------------------------------------------------------------------------------
# odd shapes and layouts
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("T,H,D,d_v,K", [
    (1, 1, 16, 16, 1),
    (4, 5, 24, 24, 19),  # D not a power of two
    (3, 7, 64, 16, 70),  # d_v < D, K crosses tiles
    (2, 8, 32, 32, 65),
    (6, 2, 48, 48, 129),
])
def test_odd_shapes(backend, T, H, D, d_v, K):
    args, kw = _to(*sparse_mla_case(np.random.default_rng(T * 1000 + K), "cpu", T=T, H=H, D=D, d_v=d_v, K=K))
    _check(backend.sparse_mla(*args, **kw), args, kw)


def test_split_k_up_to_the_combine_limit(kmod, monkeypatch):
    """More splits than MAX_SPLITS are clipped to it; the combine reads every split (poisoned
    partials would show) and empty splits (all PAD, or past the length) weigh nothing."""
    monkeypatch.setattr(kmod, "_empty", poisoning_empty(torch.empty))
    K = 16 * kmod.MAX_SPLITS
    args, kw = _to(*sparse_mla_case(np.random.default_rng(21), "cpu", T=3, H=4, D=16, d_v=16, K=K))
    idx, lens = args[2].clone(), args[3].clone()
    idx[0, : K // 2] = PAD  # the first half of token 0's splits read nothing
    lens[1] = 16 * 3 + 5  # token 1: 4 splits with something, the rest past its length
    args = (args[0], args[1], idx, lens, *args[4:])
    r = kmod.resolve(kmod.Config(block_h=16, block_n=16, splits=1000), 3, 4, 16, 16, K, torch.device("cpu"))
    assert r["splits"] == kmod.MAX_SPLITS
    _check(kmod.launch(*args, **kw, config=kmod.Config(block_h=16, block_n=16, num_stages=1, splits=1000)), args, kw)


def test_strided_inputs(backend):
    """q heads and kv rows with padded strides (a slice of a wider buffer) are read in place."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(4, 3, 40, generator=g).to(torch.bfloat16)[:, :, :32]
    kv = torch.randn(100, 48, generator=g).to(torch.bfloat16)[:, :32]
    idx = torch.randint(0, 100, (4, 20), generator=g, dtype=I32)
    lens = torch.tensor([20, 7, 0, 13], dtype=I32)
    args, kw = _to((q, kv, idx, lens, 0.2, 32), {})
    _check(backend.sparse_mla(*args, **kw), args, kw)


def test_large_logits_stay_finite(backend):
    """Scores of a few hundred: the online softmax must rescale, not overflow."""
    args, kw = sparse_mla_case(np.random.default_rng(11), "cpu", T=5, H=4, D=32, d_v=32, K=50, dtype=torch.float16)
    q = args[0] * 12
    args, kw = _to((q, *args[1:4], 1.0, 32), {"sink": torch.full((4,), 40.0)})
    out, lse = backend.sparse_mla(*args, **kw)
    assert torch.isfinite(out).all()
    _check((out, lse), args, kw)



@pytest.mark.parametrize("pattern", MOVING_MAX_PATTERNS)
@pytest.mark.parametrize("block_n,splits", [(16, 1), (32, 1), (16, 3)])
def test_running_max_moving_between_tiles(kmod, pattern, block_n, splits):
    """Scores whose running max jumps, falls or moves inside a pair of tiles of the kernel's
    ``BLOCK_N`` rows, per row differently (``moving_max_case``): every rescale path of the online
    softmax, and with split-K the combine of partial results whose maxima lie far apart, against
    the reference."""
    args, kw = _to(*sparse_mla_moving_max_case(pattern, "cpu", T=14, H=3, K=5 * block_n + 3, D=32, tile=block_n,
                                               seed=block_n + splits))
    got = kmod.launch(*args, **kw, config=kmod.Config(block_h=16, block_n=block_n, num_stages=1, splits=splits))
    assert torch.isfinite(got[0]).all()
    _check(got, args, kw)


def test_moving_max_case_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"pattern is 'up'; expected one of \['grow', 'shrink', "):
        sparse_mla_moving_max_case("up", "cpu", T=2, H=1, K=8)
    with pytest.raises(ValueError, match=r"moving_max_case: tile is 0; expected an int >= 1"):
        sparse_mla_moving_max_case("grow", "cpu", T=2, H=1, K=8, tile=0)
    with pytest.raises(ValueError, match=r"moving_max_case: d_v is 80; expected an int in \[1, D=64\]"):
        sparse_mla_moving_max_case("grow", "cpu", T=2, H=1, K=8, D=64, d_v=80)


def test_poisoned_allocations_show_what_is_left_unwritten_and_put_torch_empty_back():
    real = torch.empty
    f, i = poisoning_empty()(3, dtype=torch.float32), poisoning_empty()(3, dtype=torch.int32)
    assert torch.isnan(f).all() and (i == POISON_INT).all()
    assert (poisoning_empty(torch.zeros, ints=False)(3, dtype=torch.int32) == 0).all()  # integer buffers as allocated
    with pytest.raises(RuntimeError, match="inside"):
        with poisoned_allocations(ints=False):
            assert torch.empty is not real and torch.isnan(torch.empty(2, 2)).all()
            raise RuntimeError("inside")
    assert torch.empty is real


@pytest.mark.filterwarnings("ignore:overflow encountered in exp2")
@pytest.mark.parametrize("sink_value", [float("-inf"), -300.0, 300.0])
def test_extreme_sinks(backend, sink_value):
    args, kw = _to(*_pad_batch(torch.float16, False, seed=7))
    kw = {"sink": torch.full((args[0].shape[1],), sink_value, device=DEV)}
    _check(backend.sparse_mla(*args, **kw), args, kw)


def test_empty_shapes(backend):
    q = torch.randn(0, 2, 16).to(torch.bfloat16)
    kv = torch.randn(5, 16).to(torch.bfloat16)
    args, kw = _to((q, kv, torch.zeros(0, 4, dtype=I32), torch.zeros(0, dtype=I32), 0.25, 16), {})
    out, lse = backend.sparse_mla(*args, **kw)
    assert out.shape == (0, 2, 16) and lse.shape == (0, 2)
    q = torch.randn(3, 2, 16).to(torch.bfloat16)
    args, kw = _to((q, kv, torch.zeros(3, 0, dtype=I32), torch.zeros(3, dtype=I32), 0.25, 16), {})
    out, lse = backend.sparse_mla(*args, **kw)
    assert (out == 0).all() and torch.isneginf(lse).all()


# ---------------------------------------------------------------------------------------
# dispatch and validation
# ---------------------------------------------------------------------------------------


def test_forced_variant_raises_for_fp32_and_the_default_chain_falls_back(backend):
    """``prefer`` forces the variant: a call it cannot take (fp32) is a SelectionError with
    its reason, never a silent reference run; without ``prefer`` the chain falls through."""
    args, kw = _to(*sparse_mla_case(np.random.default_rng(2), "cpu", T=3, dtype=torch.bfloat16))
    assert backend.variant_for("sparse_mla", *args, **kw) == "triton"
    f32 = (args[0].float(), args[1].float(), *args[2:])
    with pytest.raises(SelectionError, match="requires dtype in"):
        backend.variant_for("sparse_mla", *f32, **kw)
    if not ON_GPU:
        return
    chain = select(backend.device)
    assert chain.variant_for("sparse_mla", *f32, **kw) == "reference"


def test_bad_input_raises_before_launch(backend):
    args, _ = _to(*sparse_mla_case(np.random.default_rng(4), "cpu", T=3, K=8, S=20))
    bad = args[2].clone()
    bad[0, 0] = 20  # == S: out of range
    with pytest.raises(ValueError, match="indices"):
        backend.sparse_mla(args[0], args[1], bad, *args[3:])
    with pytest.raises(ValueError, match="d_v"):
        backend.sparse_mla(*args[:5], args[0].shape[2] + 1)
    with validation(False):  # the hot path skips validation and still computes
        _check(backend.sparse_mla(*args), args, {})


def test_config_table_ignores_the_environment(kmod, monkeypatch):
    dev = torch.device("cuda")
    cfg = kmod.pick_config(16384, 64, 512, 512, 640, dev)
    assert cfg.block_h == 64 and cfg.split_s
    monkeypatch.setenv("SWA_SPARSE_MLA_CONFIG", "block_n=32")  # the old sweep override: no effect
    assert kmod.pick_config(16384, 64, 512, 512, 640, dev) == cfg


def test_config_that_does_not_compile_falls_back_once(kmod, monkeypatch):
    """A config this Triton cannot compile (Triton 3.6 failed a pass on configs 3.9
    compiled: H200 run 1) is replaced by a known-good one for the shape, with one warning
    naming the reason, and remembered per shape; sweeps (``fit=False``) get the error."""
    real_run = kmod._run
    compiles = []

    def run(*a, warmup=False):  # the compiler rejects split_s; everything else runs for real
        r = a[-1]
        if warmup:
            compiles.append(r["split_s"])
            if r["split_s"]:
                raise RuntimeError("PassManager::run failed")
            return []
        return real_run(*a)

    monkeypatch.setattr(kmod, "_run", run)
    monkeypatch.setattr(kmod, "_COMPILE_FIRST", True)
    monkeypatch.setattr(kmod, "_FITTED", {})
    monkeypatch.setattr(kmod, "_WARNED", set())
    args, kw = _to(*_pad_batch(torch.bfloat16, True, seed=5))
    cfg = kmod.Config(block_h=16, block_n=32, split_s=True, splits=1)
    with pytest.warns(RuntimeWarning, match=r"h16n32w8s2k1x does not compile with Triton .*PassManager::run failed"):
        got = kmod.launch(*args, **kw, config=cfg)
    _check(got, args, kw)
    assert compiles == [True, False]  # the requested config, then the first fallback
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # remembered: no second warning, no second compile
        _check(kmod.launch(*args, **kw, config=cfg), args, kw)
    assert compiles == [True, False]
    with pytest.raises(RuntimeError, match="PassManager"):
        kmod.launch(*args, **kw, config=cfg.replace(block_n=16), fit=False)


def test_nothing_compiles_raises_with_every_reason(kmod, monkeypatch):
    """Fallbacks that fail too are each tried once (no loop), then one KernelUnavailable lists
    them (dispatch then runs the next variant and shows the reason in explain())."""
    def run(*a, warmup=False):
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr(kmod, "_run", run)
    monkeypatch.setattr(kmod, "_COMPILE_FIRST", True)
    monkeypatch.setattr(kmod, "_FITTED", {})
    args, kw = _to(*_pad_batch(torch.bfloat16, True, seed=5))
    with pytest.raises(KernelUnavailable, match=r"no launch config of the tl kernel compiles.*h16n32w8s2k1x "
                                                r"does not compile.*h64n32w4s1k1 does not compile"):
        kmod.launch(*args, **kw, config=kmod.Config(block_h=16, block_n=32, split_s=True, splits=1))


def test_a_shape_that_fails_to_build_does_not_disable_the_variant(backend, kmod, monkeypatch):
    """No config compiles for one head count (injected): that call runs the next variant of
    the chain (the reference here) with one warning, the same shape again fails at once
    without a second round of compiles, and a call of another shape still runs the kernel."""
    real_run = kmod._run
    compiles = []

    def run(*a, warmup=False):
        q = a[0]
        if q.shape[1] == 3:
            compiles.append(q.shape[1])
            raise RuntimeError("PassManager::run failed (injected)")
        return real_run(*a, warmup=warmup)

    monkeypatch.setattr(kmod, "_run", run)
    monkeypatch.setattr(kmod, "_COMPILE_FIRST", True)
    monkeypatch.setattr(kmod, "_FITTED", {})
    monkeypatch.setattr(kmod, "_UNBUILDABLE", {})
    chain = (variant("sparse_mla", "triton"), variant("sparse_mla", "reference"))
    monkeypatch.setitem(backend._chains, "sparse_mla", chain)
    bad = _to(*_pad_batch(torch.bfloat16, True, H=3, seed=6))
    with pytest.warns(RuntimeWarning, match="cannot build this call"):
        _check(backend.sparse_mla(*bad[0], **bad[1]), *bad)
    n = len(compiles)
    assert n >= 1
    with pytest.raises(KernelUnavailable, match="no launch config"):
        kmod.launch(*bad[0], **bad[1])
    assert len(compiles) == n  # remembered: no second round
    assert "triton" not in backend.failures.get("sparse_mla", {})
    ok = _to(*_pad_batch(torch.bfloat16, True, H=4, seed=7))
    _check(backend.sparse_mla(*ok[0], **ok[1]), *ok)
    assert backend.variant_for("sparse_mla", *ok[0], **ok[1]) == "triton"
    assert any(k[3] == 4 for k in kmod._FITTED)  # the kernel ran for H = 4


def test_resolve_splits_only_when_grid_is_small(kmod):
    dev = torch.device("cpu")  # 4 "SMs" off-GPU
    big = kmod.resolve(kmod.Config(), 4096, 64, 512, 512, 640, dev)
    assert big["splits"] == 1 and big["same_tile"]
    small = kmod.resolve(kmod.Config(block_n=64), 1, 64, 512, 512, 640, dev)
    assert small["splits"] > 1 and small["chunk"] % 64 == 0
    assert small["splits"] * small["chunk"] >= 640 > (small["splits"] - 1) * small["chunk"]
