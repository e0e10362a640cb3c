"""Platform code on a real CUDA device (``python -m pytest -m gpu tests/backends/test_platform_gpu.py``).

* the triton-ascend kernels compiled by a real Triton compiler (CUDA here: the kernels are
  plain Triton; this checks they compile and match the reference outside the interpreter);
* the vendor adapters on the device;
* vLLM's FlashMLA sparse prefill through the pack's wrapper, when vLLM is installed (skipped
  with the probe's reason otherwise), and FlashInfer's DSv4 decode on SM10x/SM12x likewise.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import swa_backends as sb
from swa_backends.testing.conformance import case_for, mismatch, sparse_mla_case, to_device
from swa_backends.common.ops import OPS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def dev():
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        pytest.skip("TRITON_INTERPRET=1 in this process: run the gpu tests in their own process")
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("op, module, fn", [
    ("gather_rows", "rows", "gather_rows"), ("scatter_rows", "rows", "scatter_rows"),
    ("swa_indices_and_lens", "swa_indices", "swa_indices_and_lens"),
    ("pad_replayed_slots", "pad_slots", "pad_replayed_slots")])
def test_triton_ascend_kernels_compile_and_match_on_a_gpu(dev, op, module, fn):
    import importlib

    impl = getattr(importlib.import_module(f"swa_backends.backends.ascend.kernels.{module}"), fn)
    rng = np.random.default_rng(0)
    for _ in range(20):
        args, kw = case_for(op, rng, "cpu")
        want = OPS[op].reference(*to_device(args, "cpu"), **to_device(kw, "cpu"))
        got = impl(*to_device(args, dev), **to_device(kw, dev))
        why = mismatch(op, got, want)
        assert why is None, why


def test_triton_ascend_rows_at_serving_size(dev):
    from swa_backends.backends.ascend.kernels import rows

    x = torch.randn(16384, 7168, device=dev, dtype=torch.bfloat16)
    r = torch.randperm(16384, device=dev)[:4096]
    assert torch.equal(rows.gather_rows(x, r), x[r])
    y = torch.randn(4096, 7168, device=dev, dtype=torch.bfloat16)
    want = torch.zeros_like(x).index_copy_(0, r, y)
    assert torch.equal(rows.scatter_rows(y, r, 16384), want)


def test_adapters_on_the_device(dev):
    from swa_backends.backends import adapters

    rng = np.random.default_rng(1)
    args, _ = sparse_mla_case(rng, dev, T=64, H=16, D=512, d_v=512, K=640, S=4096, dtype=torch.bfloat16)
    q, kv, idx, lens, scale, _ = args
    want = OPS["sparse_mla"].reference(*to_device(args, "cpu"))[1]
    got = adapters.lse_from_indices(q, kv, idx, lens, scale).cpu()
    fin = torch.isfinite(want)
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    assert torch.allclose(got[fin], want[fin], atol=1e-3, rtol=1e-4)
    rows, counts = adapters.compact_rows(idx, lens)
    assert int(counts.sum()) == int(adapters.valid_mask(idx, lens).sum())


@pytest.mark.parametrize("H, D", [(16, 512), (64, 512), (128, 512), (16, 576), (64, 576), (128, 576), (5, 512)])
def test_flashmla_wrapper_on_hardware(dev, H, D):
    """vLLM's FlashMLA through the pack's wrapper at real shapes: PAD holes inside the
    length, short and empty rows, a sink, K not a multiple of 128, head counts the build
    serves and one it does not (5: padded to 8). Carry FlashMLA with bench/fetch_flashmla.py."""
    from swa_backends.backends.cuda import flashmla, probes

    cap = torch.cuda.get_device_capability(dev)
    if cap not in ((9, 0), (10, 0), (10, 3)):
        pytest.skip(f"FlashMLA sparse prefill needs SM90/SM100f, device has {cap}")
    mod, why = probes.find_flashmla()
    if mod is None:
        pytest.skip(why)
    rng = np.random.default_rng(H + D)
    for T, K in ((1, 128), (77, 640), (512, 1152), (300, 200)):
        args, kw = sparse_mla_case(rng, dev, T=T, H=H, D=D, d_v=512, K=K, S=8192, dtype=torch.bfloat16)
        args[3][::5] = 0  # empty rows: zeros and lse = -inf
        kw["sink"] = torch.randn(H, device=dev)
        got = flashmla.sparse_mla(*args, **kw)
        want = OPS["sparse_mla"].reference(*to_device(args, "cpu"), **to_device(kw, "cpu"))
        why = mismatch("sparse_mla", got, want)
        assert why is None, f"T {T} K {K}: {why}"
        empty = (args[3] == 0).cpu()
        assert bool((got[0][empty.to(got[0].device)] == 0).all()) and bool(torch.isneginf(got[1].cpu()[empty]).all())
    b = sb.select(str(dev))
    assert b.variants["sparse_mla"][:2] == ("gluon_ws", "flashmla"), b.variants["sparse_mla"]


def test_flashinfer_wrapper_on_hardware(dev):
    from swa_backends.backends.cuda import flashinfer, probes

    major = torch.cuda.get_device_capability(dev)[0]
    if major not in (10, 12):
        pytest.skip(f"FlashInfer's DSv4 decode serves SM10x/SM12x, device is SM{major}x")
    fn, why = probes.find_flashinfer_dsv4()
    if fn is None:
        pytest.skip(why)
    wrapper = flashinfer.sparse_mla_sm10x if major == 10 else flashinfer.sparse_mla_sm12x
    rng = np.random.default_rng(3)
    args, kw = sparse_mla_case(rng, dev, T=64, H=64, D=512, d_v=512, K=128 + 512, S=8192, dtype=torch.bfloat16)
    got = wrapper(*args, **kw)
    want = OPS["sparse_mla"].reference(*to_device(args, "cpu"), **to_device(kw, "cpu"))
    why = mismatch("sparse_mla", got, want)
    assert why is None, why
