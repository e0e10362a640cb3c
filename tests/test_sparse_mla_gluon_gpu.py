"""The Gluon (Hopper) sparse-MLA kernel on an sm90 GPU (``-m gpu``), against the fp32 torch
reference: random data (never zeros), PAD holes inside the length, whole PAD tiles, lens 0,
short rows, odd T, H 64 / 96 / 128, with and without sink, bf16 and fp16, poisoned outputs,
every swept config; and the dispatch: which calls take the Gluon kernel, which keep the tl
kernel, and why.

    python -m pytest -q -m gpu tests/test_sparse_mla_gluon_gpu.py
"""

from __future__ import annotations

import importlib

import pytest
import torch

from swa_backends import select
from swa_backends.common.device import current_device
from swa_backends.dispatch import variant

from _sparse_mla_cases import D, cache, capture, case, check  # noqa: F401  (cache: a fixture)

pytestmark = pytest.mark.gpu



def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.fixture(scope="module")
def kmod():
    if not _sm90():
        pytest.skip("needs an sm90 (Hopper) GPU")
    select(prefer={"sparse_mla": "triton"})
    variant("sparse_mla", "triton").load(current_device())
    return importlib.import_module("swa_backends.kernels.sparse_mla")


@pytest.fixture(scope="module")
def gmod(kmod):
    G = kmod._gluon_module()
    if isinstance(G, str):
        pytest.skip(G)
    return G


def _poisoned(T, H, dtype):
    out = torch.full((T, H, D), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((T, H), float("nan"), dtype=torch.float32, device="cuda")
    return out, lse


def _gluon(G, cfg, args, kw):
    """Run the Gluon kernel directly into NaN-poisoned outputs."""
    q, kv, idx, lens, scale, d_v = args
    out, lse = _poisoned(q.shape[0], q.shape[1], q.dtype)
    G.launch(q, kv, idx, lens, scale, d_v, kw.get("sink"), out, lse, config=cfg)
    torch.cuda.synchronize()
    return out, lse


@pytest.mark.parametrize("H", [64, 128, 96])
@pytest.mark.parametrize("K", [640, 1152, 128, 77])
@pytest.mark.parametrize("which", ["n64b2l0", "ws"])
def test_shipped_configs(gmod, cache, H, K, which):
    """Both shipped kernels (ws: the default; n64b2l0: its fallback) on every
    head count, odd index widths (77: one pair, the second tile partly past the length; 128: one
    pair exactly) and both sink settings."""
    cfg = gmod.parse_env(which)
    for sink in (False, True):
        args, kw = case(cache, 301, H, K, torch.bfloat16, sink=sink, seed=H * 7 + K + sink)
        check(_gluon(gmod, cfg, args, kw), args, kw)


@pytest.mark.parametrize("cfg", ["n64b2l0", "n64b2l0s", "n32b4l0", "n32b3l0", "n32b4", "n64b2l0d", "n32b4l0d",
                                 "n32b4l0dp", "n32b3l0dp", "ws"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_swept_configs(gmod, cache, cfg, dtype):
    c = gmod.parse_env(cfg)
    for H in (64, 128):
        args, kw = case(cache, 257, H, 640, dtype, sink=True, seed=H + len(cfg))
        check(_gluon(gmod, c, args, kw), args, kw)


def test_every_sweep_entry_runs(gmod, cache):
    args, kw = case(cache, 133, 64, 640, torch.bfloat16, sink=True, seed=3)
    for cfg in gmod.SWEEP:
        check(_gluon(gmod, cfg, args, kw), args, kw)


@pytest.mark.parametrize("which", ["n64b2l0", "ws"])
def test_all_valid_long_rows(gmod, cache, which):
    args, kw = case(cache, 517, 64, 1152, torch.bfloat16, sink=False, seed=1, pads=False)
    check(_gluon(gmod, gmod.parse_env(which), args, kw), args, kw)


@pytest.mark.parametrize("H", [64, 128])
def test_ws_many_tokens_with_runs_of_empty_ones(gmod, cache, H):
    """The persistent ws kernel over many more (token, head block) items than SMs (many items
    per program): runs of empty items (no pairs: Q freed at once, the row sums' alternate
    slots), lengths that end inside a pair or on its edge; and every item empty."""
    args, kw = case(cache, 1500, H, 640, torch.bfloat16, sink=True, seed=H + 11)
    g = torch.Generator(device="cuda").manual_seed(H)
    choices = torch.tensor([0, 1, 63, 64, 65, 128, 129, 640], device="cuda", dtype=torch.int32)
    lens = choices[torch.randint(0, len(choices), (1500,), generator=g, device="cuda")]
    lens[200:700] = 0  # several empty items in a row for every program
    args = args[:3] + (lens,) + args[4:]
    cfg = gmod.parse_env("ws")
    check(_gluon(gmod, cfg, args, kw), args, kw)
    empty = args[:3] + (torch.zeros_like(lens),) + args[4:]
    out, lse = _gluon(gmod, cfg, empty, kw)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


@pytest.mark.parametrize("which", ["n64b2l0", "ws"])
def test_large_scores_and_all_empty(gmod, cache, which):
    """Scores far from 0 (the online max moves a lot) and a batch where nothing is valid."""
    cfg = gmod.parse_env(which)
    args, kw = case(cache, 200, 64, 640, torch.bfloat16, sink=True, seed=5)
    q = args[0] * 8
    args = (q,) + args[1:]
    check(_gluon(gmod, cfg, args, kw), args, kw)
    empty = (args[0], args[1], torch.full_like(args[2], -1), args[3], args[4], args[5])
    out, lse = _gluon(gmod, cfg, empty, kw)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


@pytest.mark.parametrize("H,config", [(64, "gluon-ws"), (96, "gluon-ws"), (128, "gluon-ws")])
def test_dispatch_takes_gluon_for_prefill(kmod, gmod, cache, monkeypatch, H, config):
    monkeypatch.delenv("SWA_SPARSE_MLA_GLUON", raising=False)
    backend = select(prefer={"sparse_mla": "triton"})
    args, kw = case(cache, 300, H, 640, torch.bfloat16, sink=True, seed=11)
    info = kmod.dispatch_info(args[0], args[1], args[2], D)
    assert info["kernel"] == "gluon" and info["config"] == config, info
    calls = []
    real = gmod.launch
    monkeypatch.setattr(gmod, "launch", lambda *a, **k: calls.append(k.get("warmup", False)) or real(*a, **k))
    check(backend.sparse_mla(*args, **kw), args, kw)
    assert False in calls  # a real launch of the Gluon kernel


def test_dispatch_keeps_tl_with_reasons(kmod, gmod, cache, monkeypatch):
    monkeypatch.delenv("SWA_SPARSE_MLA_GLUON", raising=False)
    args, _ = case(cache, 300, 64, 640, torch.bfloat16, sink=False, seed=12)
    q, kv, idx = args[0], args[1], args[2]
    cases = {
        "decode-sized": (q[:4], kv, idx[:4], D),
        "H=32": (q[:, :32].contiguous(), kv, idx, D),
        "dtype": (q.float(), kv.float(), idx, D),
        "d_v=256": (q, kv, idx, 256),
    }
    for name, c in cases.items():
        info = kmod.dispatch_info(*c)
        assert info["kernel"] == "tl" and info["why"], (name, info)
    monkeypatch.setenv("SWA_SPARSE_MLA_GLUON", "0")
    info = kmod.dispatch_info(q, kv, idx, D)
    assert info["kernel"] == "tl" and "SWA_SPARSE_MLA_GLUON" in info["why"]
    monkeypatch.setenv("SWA_SPARSE_MLA_GLUON", "n32b4l0")
    assert kmod.dispatch_info(q, kv, idx, D)["config"] == "gluon-n32b4l0"


@pytest.mark.parametrize("H", [64, 128])
def test_cuda_graph_capture(kmod, gmod, cache, monkeypatch, H):
    monkeypatch.delenv("SWA_SPARSE_MLA_GLUON", raising=False)
    backend = select(prefer={"sparse_mla": "triton"})
    args, kw = case(cache, 264, H, 640, torch.bfloat16, sink=True, seed=9)
    assert kmod.dispatch_info(args[0], args[1], args[2], D)["kernel"] == "gluon"
    want = backend.sparse_mla(*args, **kw)
    g, got = capture(lambda: backend.sparse_mla(*args, **kw))
    args[0].mul_(0.5)
    g.replay()
    torch.cuda.synchronize()
    check(got, args, kw)
    assert not torch.equal(got[0], want[0])


@pytest.mark.parametrize("H", [64, 128])
def test_warmup_compiles_the_gluon_kernel(kmod, gmod, cache, monkeypatch, H):
    monkeypatch.delenv("SWA_SPARSE_MLA_GLUON", raising=False)
    backend = select(prefer={"sparse_mla": "triton"})
    kmod.warmup(backend, num_heads=(H,), attn_dtypes=(torch.bfloat16,), attn_sink=(True,))
    fn = gmod.kernel_for(gmod.default_for(H))
    before = sum(len(c[0]) for c in fn.device_caches.values())
    assert before >= 1
    for T, K in ((300, 128), (2048, 640)):
        args, kw = case(cache, T, H, K, torch.bfloat16, sink=True, seed=T)
        backend.sparse_mla(*args, **kw)
    assert sum(len(c[0]) for c in fn.device_caches.values()) == before


def test_ws_compile_failure_falls_back_to_n64b2l0(kmod, gmod, cache, monkeypatch):
    """A ws kernel that does not compile: one warning, the same call runs n64b2l0 (correct
    result), and the dispatch remembers it."""
    monkeypatch.delenv("SWA_SPARSE_MLA_GLUON", raising=False)
    monkeypatch.setattr(kmod, "_GLUON_FAILED", {})
    ws = gmod._ws_module()

    def broken(*a, **k):
        raise RuntimeError("PassManager::run failed (injected by the test)")

    monkeypatch.setattr(ws, "launch_meta", broken)
    backend = select(prefer={"sparse_mla": "triton"})
    args, kw = case(cache, 300, 128, 640, torch.bfloat16, sink=True, seed=21)
    assert kmod.dispatch_info(args[0], args[1], args[2], D)["config"] == "gluon-ws"
    with pytest.warns(RuntimeWarning, match=r"gluon-ws\) does not compile"):
        got = backend.sparse_mla(*args, **kw)
    check(got, args, kw)
    assert kmod.dispatch_info(args[0], args[1], args[2], D)["config"] == "gluon-n64b2l0"
