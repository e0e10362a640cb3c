"""``sparse_mla`` on paged DeepSeek-V4 / V4.1 record caches (``kv_format``), and ``return_lse``.

* the torch reader and writer (``common/ops/_records.py``) on hand-made bytes: where each dim
  lives, what a byte means in each FP8 flavour, UE8M0 scales, NVFP4 nibble order; the writer's
  records read back within the format's error and re-quantize to the same bytes;
* the Triton kernel (the interpreter here, compiled on a GPU) against the reference for every
  format x flavour, with and without a sink, PAD holes inside the length, empty rows, odd block
  sizes, padded block strides, a cache that is a strided view of a bigger buffer, every launch
  shape (one pass, split-K, skip-empty, split S), poisoned outputs; the kernel's dequant equals
  the reference's bit for bit, the FNUZ bytes that mean something else in OCP included;
* validation: the pack's ValueError naming argument, value and expectation, before any launch;
* dispatch: variants state the formats they read; rows-only variants give a reason and the
  chain goes on; an implementation written before the keywords gets a reason, never a TypeError;
* ``return_lse=False``: ``(out, None)`` everywhere, and the vendor wrappers that recompute the
  lse skip that pass;
* encoder replay on faked gfx942 / gfx950: a prompt's KV written as V4 records; after a prefix
  hit (the blocks below the replay start hold garbage), the replayed window's attention through
  the pack's clamped indices equals the cold run's attention over the same clamped window;
* the record configs compile offline for sm90, gfx942 and gfx950 (own process, compiled mode;
  marked ``compile``: CI's compile stage, ``pytest -m compile``).

The GPU test of the compiled kernel is ``test_records_on_gpu`` (``-m gpu``).
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swa_backends as sb
from swa_backends import OPS, PAD, SelectionError, select, validation
from swa_backends.common.ops import _records as R
from swa_backends.common.registry import Variant
from swa_backends.dispatch import variant
from swa_backends.testing.conformance import mismatch, poisoning_empty, sparse_mla_record_case

if __name__ == "__main__":  # run as a script (--aot, below): the shared helpers, as tests/conftest.py adds them
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from _tritons import NO_TRITON, ids, pythons, run_compile_script  # noqa: E402

REF = OPS["sparse_mla"].reference
I32 = torch.int32
ON_GPU = torch.cuda.is_available()
DEV = "cuda" if ON_GPU else "cpu"
SCALE = 1.0 / math.sqrt(512)
# every (format, flavour) a cache can carry
COMBOS = [(f.name, fl) for f in R.FORMATS.values() for fl in f.fp8_flavours]
COMBO_IDS = [f"{f}-{fl}" for f, fl in COMBOS]


@pytest.fixture(scope="module")
def kmod():
    if NO_TRITON is not None:
        pytest.skip(NO_TRITON)
    try:
        select("cpu" if not ON_GPU else None, prefer={"sparse_mla": "triton"})
    except SelectionError as exc:
        pytest.skip(str(exc))
    variant("sparse_mla", "triton").load()
    return importlib.import_module("swa_backends.kernels.sparse_mla")


@pytest.fixture(scope="module")
def backend(kmod):
    return select("cpu" if not ON_GPU else None, prefer={"sparse_mla": "triton"})


def _check(got, args, kw):
    cpu = lambda x: x.cpu() if isinstance(x, torch.Tensor) else x  # noqa: E731
    want = REF(*[cpu(a) for a in args], **{k: cpu(v) for k, v in kw.items()})
    why = mismatch("sparse_mla", got, want)
    assert why is None, why
    out, lse = got
    assert out.dtype == args[0].dtype and out.shape == (args[0].shape[0], args[0].shape[1], args[5])
    if kw.get("return_lse", True):
        assert lse.dtype == torch.float32 and lse.shape == args[0].shape[:2]
    else:
        assert lse is None


def _record_batch(fmt, fp8, *, with_sink, bs=16, extra_stride=576, T=9, H=3, K=37, seed=0, scale=1.0):
    """Every PAD pattern of tests/kernels/test_sparse_mla_triton.py, on a record cache whose block stride
    is past the page and whose every unwritten byte is garbage."""
    rng = np.random.default_rng(seed)
    args, kw = sparse_mla_record_case(rng, "cpu", kv_format=fmt, fp8=fp8, T=T, H=H, K=K, block_size=bs,
                                      num_blocks=max(2, 200 // bs), block_stride=bs * R.FORMATS[fmt].record_bytes
                                      + extra_stride, sink=with_sink, scale=scale)
    q, kv, idx, lens = args[:4]
    S = R.num_slots(kv)
    idx = torch.randint(0, S, (T, K), generator=torch.Generator().manual_seed(seed), dtype=I32)
    lens = torch.full((T,), K, dtype=I32)
    idx[1, ::3] = PAD  # PAD inside the active length
    idx[2, :] = PAD  # all PAD
    lens[3] = 0  # nothing to read behind real slots
    lens[4] = K // 2
    idx[5, :-1] = PAD
    idx[6, 0] = PAD
    lens[7] = 1
    idx[8, 16:32] = PAD  # a whole 16-row tile of PAD inside the length
    kw["fp8"] = fp8
    return (q, kv, idx, lens, *args[4:]), kw


def _to(args, kw):
    mv = lambda x: x.to(DEV) if isinstance(x, torch.Tensor) else x  # noqa: E731
    if not ON_GPU:
        return args, kw
    a = list(args)
    kv = a[1]
    buf = torch.empty(kv.untyped_storage().nbytes(), dtype=torch.uint8)
    buf.untyped_storage().copy_(kv.untyped_storage())
    a[1] = buf.to(DEV).as_strided(kv.shape, kv.stride(), kv.storage_offset())  # keep the block stride
    return tuple(mv(x) for x in a), {k: mv(v) for k, v in kw.items()}


# ---------------------------------------------------------------------------------------
# the torch reader and writer on hand-made bytes
# ---------------------------------------------------------------------------------------


def test_v4_page_layout_and_flavours():
    """V4: data regions first (448 e4m3 + 64 bf16 per token), then the page's scale codes; a
    token's record is not ``kv[b, o]``; one byte means half as much in FNUZ."""
    bs = 4
    kv = R.new_cache(2, bs, "v4_fp8", block_stride=bs * 584 + 64)
    assert kv.stride() == (bs * 584 + 64, 584, 1)
    pv = R.pages(kv)
    blk, off = 1, 2
    data = off * 576
    pv[blk, data: data + 448] = 0x38  # e4m3fn 1.0 / e4m3fnuz 0.5
    pv[blk, data + 64] = 0x40  # OCP 2.0 at dim 64
    rope = torch.arange(64, dtype=torch.float32).to(torch.bfloat16)
    pv[blk, data + 448: data + 576] = rope.view(torch.uint8)
    codes = bs * 576 + off * 8
    pv[blk, codes: codes + 7] = torch.tensor([127, 128, 126, 127, 127, 127, 130], dtype=torch.uint8)
    slot = torch.tensor([blk * bs + off])
    ocp = R.dequantize(kv, slot, "v4_fp8", "e4m3fn")[0].float()
    fnuz = R.dequantize(kv, slot, "v4_fp8", "e4m3fnuz")[0].float()
    want = torch.ones(448)
    want[64:128] = 2.0
    want[128:192] = 0.5
    want[384:448] = 8.0
    want[64] = 4.0
    assert torch.equal(ocp[:448], want) and torch.equal(fnuz[:448], want / 2)
    assert torch.equal(ocp[448:], rope.float()) and torch.equal(fnuz[448:], rope.float())


def test_v41_records_interleaved_scales_and_nibbles():
    kv = R.new_cache(3, 2, "v41_mxfp8")
    pv = R.pages(kv)
    rec = 1 * 528
    pv[2, rec: rec + 512] = 0x38
    pv[2, rec + 512: rec + 528] = torch.arange(120, 136, dtype=torch.uint8)  # code j scales dims [32j, 32j+32)
    got = R.dequantize(kv, torch.tensor([5]), "v41_mxfp8", "e4m3fn")[0].float()
    assert torch.equal(got, torch.exp2(torch.arange(120, 136).float() - 127).repeat_interleave(32))
    assert torch.equal(R.dequantize(kv, torch.tensor([5]), "v41_mxfp8", "e4m3fnuz")[0].float(), got / 2)
    kv = R.new_cache(1, 3, "v41_nvfp4")
    pv = R.pages(kv)
    rec = 2 * 288
    pv[0, rec: rec + 256] = 0x9B  # element 2i: low nibble 0xB = -1.5, element 2i+1: high 0x9 = -0.5
    pv[0, rec + 256: rec + 288] = torch.tensor(2.0).to(torch.float8_e4m3fn).view(torch.uint8)
    pv[0, rec + 256 + 3] = torch.tensor(0.25).to(torch.float8_e4m3fn).view(torch.uint8)  # dims 48..63
    got = R.dequantize(kv, torch.tensor([2]), "v41_nvfp4")[0].float()
    want = torch.tensor([-3.0, -1.0]).repeat(256)
    want[48:64] /= 8
    assert torch.equal(got, want)


@pytest.mark.parametrize("fmt, fp8", COMBOS, ids=COMBO_IDS)
def test_writer_round_trip(fmt, fp8):
    """Rows of every magnitude (and zero tiles) read back within the format's step; what was
    read back re-quantizes to the very same bytes (the writer is vLLM's rounding, exactly
    representable values are kept)."""
    g = torch.Generator().manual_seed(3)
    # (NVFP4 has no global scale: magnitudes past 6 * 448 saturate, as in vLLM)
    x = torch.randn(40, 512, generator=g) * torch.exp2(torch.randint(-12, 8, (40, 1), generator=g).float())
    x[3, :64] = 0  # a zero tile: the 1e-4 floor keeps its scale finite
    x[4] *= 1e-30  # tiny rows
    rows = x.to(torch.bfloat16)
    kv = R.new_cache(3, 16, fmt, fill=0xAB)
    slots = torch.randperm(48)[:40]
    R.write(kv, rows, slots, fmt, fp8)
    back = R.dequantize(kv, slots, fmt, fp8)
    assert torch.isfinite(back.float()).all()
    # relative to the row's largest value (e4m3: 3 mantissa bits; e2m1 with an e4m3 scale), plus
    # what the smallest scale cannot hold (vLLM's floors: amax 1e-4, NVFP4 scale 2^-9)
    tol, atol = {"v4_fp8": (0.07, 1e-9), "v41_mxfp8": (0.07, 1e-9), "v41_nvfp4": (0.35, 1e-3)}[fmt]
    big = rows.float().abs().amax(dim=1, keepdim=True)
    assert ((back.float() - rows.float()).abs() <= tol * big + atol).all()
    if fmt != "v41_nvfp4":  # UE8M0 formats: what was read back is kept exactly
        kv2 = R.new_cache(3, 16, fmt, fill=0xAB)
        R.write(kv2, back, slots, fmt, fp8)
        assert torch.equal(R.dequantize(kv2, slots, fmt, fp8), back)


def test_writer_scales_match_vllm_rules():
    """UE8M0: ``code = ceil(log2(max(amax, 1e-4) / MAX)) + 127`` with MAX 448 (OCP) or 224
    (FNUZ); NVFP4: an e4m3 scale ``amax / 6``, clamped to [2^-9, 448]."""
    rows = torch.zeros(1, 512, dtype=torch.bfloat16)
    rows[0, 0] = 448.0
    rows[0, 64] = 500.0
    _, codes = R.quantize(rows, "v4_fp8", "e4m3fn")
    assert codes[0].tolist() == [127, 128] + [105] * 5 + [0]
    _, codes = R.quantize(rows, "v4_fp8", "e4m3fnuz")
    assert codes[0].tolist()[:3] == [128, 129, 106]
    _, sf = R.quantize(rows, "v41_nvfp4")
    sf = sf.view(torch.float8_e4m3fn).float()[0]
    assert sf[0] == 448.0 / 6 or abs(float(sf[0]) - 448 / 6) / (448 / 6) < 0.07
    assert sf[1] == 2.0**-9


# ---------------------------------------------------------------------------------------
# the Triton kernel against the reference
# ---------------------------------------------------------------------------------------

LAUNCHES = {
    "default": None,
    "split3": dict(block_h=16, block_n=16, num_stages=1, splits=3),
    "skip": dict(block_h=16, block_n=16, skip_empty=True, splits=1),
    "split_s": dict(block_h=16, block_n=32, split_s=True, splits=2),
    "prefetch": dict(block_h=16, block_n=16, prefetch=True, splits=1),
    "prefetch_split": dict(block_h=16, block_n=16, prefetch=True, splits=3),
}


# Each format and flavour once, the sink alternating: the sink joins after the tile is
# dequantized (the same code for every format); every format also runs with a sink in
# test_launch_shapes and both ways in test_odd_shapes_and_strides.
@pytest.mark.parametrize("fmt, fp8, with_sink", [(f, fl, i % 2 == 1) for i, (f, fl) in enumerate(COMBOS)],
                         ids=[f"{c}-{'sink' if i % 2 else 'nosink'}" for i, c in enumerate(COMBO_IDS)])
def test_pad_patterns_every_format(kmod, fmt, fp8, with_sink):
    args, kw = _to(*_record_batch(fmt, fp8, with_sink=with_sink, seed=len(fmt) + with_sink))
    out, lse = kmod.launch(*args, **kw)
    _check((out, lse), args, kw)
    for t in (2, 3):  # nothing valid: zeros, lse -inf exactly
        assert torch.isneginf(lse[t]).all() and (out[t] == 0).all()
    assert torch.isfinite(lse[[0, 1, 4, 5, 6, 7, 8]]).all()


def test_random_record_calls_through_dispatch(backend, kmod, monkeypatch):
    """Hypothesis-drawn record calls (``records_case``: every format and flavour, block sizes 1-64,
    block strides past the page, garbage between records, PAD holes, empty tokens, a sink or not,
    ``T`` 0-5), with and without the lse, through dispatch, every buffer the kernel allocates
    poisoned, against the reference. (The fixed batches above pin each pattern; this draws them.)"""
    monkeypatch.setattr(kmod, "_empty", poisoning_empty(torch.empty))

    @settings(max_examples=16)
    @given(seed=st.integers(0, 2**32 - 1), lse=st.booleans())
    def run(seed, lse):
        args, kw = _to(*sparse_mla_record_case(np.random.default_rng(seed), "cpu"))
        if not lse:
            kw["return_lse"] = False
        assert backend.variant_for("sparse_mla", *args, **kw) == "triton"
        _check(backend.sparse_mla(*args, **kw), args, kw)

    run()


@pytest.mark.parametrize("fmt, fp8, launch", [
    *[("v4_fp8", "e4m3fnuz", launch) for launch in sorted(LAUNCHES)],
    ("v41_mxfp8", "e4m3fn", "default"), ("v41_mxfp8", "e4m3fn", "split3"), ("v41_mxfp8", "e4m3fn", "skip"),
    ("v41_nvfp4", "e4m3fn", "default"), ("v41_nvfp4", "e4m3fn", "split_s"),
    ("v41_mxfp8", "e4m3fn", "prefetch"), ("v41_nvfp4", "e4m3fn", "prefetch_split"),
])
def test_launch_shapes(kmod, monkeypatch, fmt, fp8, launch):
    """One pass, split-K (partial + combine), skip-empty tiles, S split across warpgroups; every
    buffer poisoned (unwritten outputs or partials would show)."""
    monkeypatch.setattr(kmod, "_empty", poisoning_empty(torch.empty))
    args, kw = _to(*_record_batch(fmt, fp8, with_sink=True, seed=5))
    cfg = None if LAUNCHES[launch] is None else kmod.Config(**LAUNCHES[launch])
    _check(kmod.launch(*args, **kw, config=cfg), args, kw)


@pytest.mark.parametrize("bs, extra, T, H, K", [
    (1, 0, 3, 1, 5),  # one record per page, pages packed
    (3, 7, 4, 5, 19),  # an odd block size and an odd block stride (MXFP8 / NVFP4; V4 needs even)
    (48, 1000, 2, 2, 70),  # crosses tiles (and splits); a block stride far past the page
    (64, 0, 5, 2, 33),
])
@pytest.mark.parametrize("fmt, fp8", [("v4_fp8", "e4m3fn"), ("v41_mxfp8", "e4m3fnuz"), ("v41_nvfp4", "e4m3fn")])
def test_odd_shapes_and_strides(backend, fmt, fp8, bs, extra, T, H, K):
    if fmt == "v4_fp8" and extra % 2:
        extra += 1
    rng = np.random.default_rng(bs * 100 + K)
    args, kw = _to(*sparse_mla_record_case(rng, "cpu", kv_format=fmt, fp8=fp8, T=T, H=H, K=K, block_size=bs,
                                           num_blocks=max(2, 96 // bs), sink=bool(bs % 2),
                                           block_stride=bs * R.FORMATS[fmt].record_bytes + extra))
    assert backend.variant_for("sparse_mla", *args, **kw) == "triton"
    _check(backend.sparse_mla(*args, **kw), args, kw)


def test_cache_is_a_view_into_a_bigger_buffer(backend):
    """vLLM packs several layers' pages in one block: the cache is a view with a storage offset
    and a block stride of the whole block; the kernel reads it in place."""
    bs, fmt = 8, "v4_fp8"
    page = bs * 584
    block = torch.randint(0, 256, (6, 3 * page + 128), dtype=torch.uint8)  # three layers + padding
    layer = block[:, page + 64: 2 * page + 64].unflatten(1, (bs, 584))  # the second layer
    assert layer.stride() == (3 * page + 128, 584, 1) and layer.storage_offset() == page + 64
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(48, 512, generator=g).to(torch.bfloat16)
    R.write(layer, rows, torch.arange(48), fmt, "e4m3fnuz")
    q = torch.randn(3, 4, 512, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 48, (3, 20), generator=g, dtype=I32)
    lens = torch.tensor([20, 7, 0], dtype=I32)
    args, kw = _to((q, layer, idx, lens, SCALE, 512), {"kv_format": fmt, "fp8": "e4m3fnuz"})
    _check(backend.sparse_mla(*args, **kw), args, kw)
    # the same rows as a plain cache give the same result: records are the rows dequantized
    deq = R.dequantize(layer, torch.arange(48), fmt, "e4m3fnuz")
    out_rows, _ = REF(q, deq, idx, lens, SCALE, 512)
    assert torch.equal(REF(q, layer, idx, lens, SCALE, 512, **kw)[0], out_rows)


def _every_byte_cache(fmt):
    """Tokens 0-3: every byte value but the three the flavours read as NaN (0x7F, 0xFF in OCP;
    0x80 in FNUZ), token 4 with 0x7F / 0xFF (FNUZ +-240), token 5 with 0x80 (OCP -0); scale codes
    from 100 to 150; V4 RoPE dims distinct bf16 values."""
    f = R.FORMATS[fmt]
    n = 512 if fmt != "v4_fp8" else 448
    d = torch.arange(n)
    data = torch.stack([(t * 131 + d) % 256 for t in range(4)])
    data[(data == 0x7F) | (data == 0xFF) | (data == 0x80)] = 0x38
    special = torch.where(d % 2 == 0, 0x7F, 0xFF)[None].expand(1, n) * (d % 3 != 0) + (d % 3 == 0) * 0x41
    zero = torch.where(d % 2 == 0, 0x80, 0x45)[None]
    data = torch.cat([data, special, zero]).to(torch.uint8)
    kv = R.new_cache(2, 4, fmt, block_stride=4 * f.record_bytes + 64)
    pv = R.pages(kv)
    for t in range(6):
        blk, o = divmod(t, 4)
        if fmt == "v4_fp8":
            pv[blk, o * 576: o * 576 + 448] = data[t]
            pv[blk, o * 576 + 448: o * 576 + 576] = (torch.arange(64) * (t + 1) - 50.0).to(torch.bfloat16).view(torch.uint8)
            pv[blk, 4 * 576 + o * 8: 4 * 576 + o * 8 + 7] = torch.tensor([127, 110, 140, 127, 100, 127, 150])
        else:
            pv[blk, o * f.record_bytes: o * f.record_bytes + 512] = data[t]
            pv[blk, o * f.record_bytes + 512: (o + 1) * f.record_bytes] = torch.arange(100, 148, 3)
    return kv


@pytest.mark.parametrize("native", [False, True], ids=["fnuz-via-ocp", "fnuz-native"])
@pytest.mark.parametrize("fmt", ["v4_fp8", "v41_mxfp8"])
def test_kernel_dequant_is_the_reference_bit_for_bit(kmod, monkeypatch, fmt, native):
    """Every byte value, in both flavours: with q = 0 and one slot per token the output is that
    slot's dequantized row exactly. FNUZ is converted natively on AMD and through the OCP bits on
    NVIDIA (fixing 0x80 and +-0x7F); the interpreter runs both. A token whose record holds a NaN
    (0x7F / 0xFF in OCP, 0x80 in FNUZ) has an unspecified result (SPEC 2.7): not compared."""
    monkeypatch.setitem(kmod.FNUZ_NATIVE, "cpu", native)
    monkeypatch.setattr(kmod, "_FITTED", {})
    kv = _every_byte_cache(fmt)
    for fp8 in ("e4m3fn", "e4m3fnuz"):
        want = R.dequantize(kv, torch.arange(6), fmt, fp8).float()
        q = torch.zeros(6, 1, 512, dtype=torch.bfloat16)
        idx = torch.arange(6, dtype=I32)[:, None]
        args, kw = _to((q, kv, idx, torch.ones(6, dtype=I32), SCALE, 512), {"kv_format": fmt, "fp8": fp8})
        got = kmod.launch(*args, **kw)[0][:, 0].float().cpu()
        finite = torch.isfinite(want).all(dim=1)
        assert finite.tolist() == ([True] * 4 + ([False, True] if fp8 == "e4m3fn" else [True, False]))
        assert torch.equal(got[finite], want[finite]), fp8


# ---------------------------------------------------------------------------------------
# return_lse
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("launch", ["default", "split3"])
@pytest.mark.parametrize("records", [False, True], ids=["rows", "v4"])
def test_return_lse_false_gives_none_and_the_same_out(kmod, monkeypatch, records, launch):
    monkeypatch.setattr(kmod, "_empty", poisoning_empty(torch.empty))
    if records:
        args, kw = _record_batch("v4_fp8", "e4m3fn", with_sink=True, seed=9)
    else:
        from swa_backends.testing.conformance import sparse_mla_case

        args, kw = sparse_mla_case(np.random.default_rng(9), "cpu", T=9, H=3, D=48, d_v=32, K=37)
    args, kw = _to(args, kw)
    cfg = None if LAUNCHES[launch] is None else kmod.Config(**LAUNCHES[launch])
    out, lse = kmod.launch(*args, **kw, config=cfg)
    out2, none = kmod.launch(*args, **kw, config=cfg, return_lse=False)
    assert none is None and torch.equal(out, out2)
    _check((out2, None), args, {**kw, "return_lse": False})  # the reference without lse: out only


def test_return_lse_through_dispatch(backend):
    args, kw = _to(*_record_batch("v41_mxfp8", "e4m3fn", with_sink=False, seed=2))
    out, lse = backend.sparse_mla(*args, **kw, return_lse=False)
    assert lse is None
    assert torch.equal(out, backend.sparse_mla(*args, **kw)[0])
    ref = select("cpu")
    cpu_args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
    assert ref.sparse_mla(*cpu_args, **kw, return_lse=False)[1] is None


def _no_lse_pass(monkeypatch, *modules):
    def boom(*a, **k):
        raise AssertionError("lse_from_indices ran although return_lse=False")

    for m in modules:
        monkeypatch.setattr(m, "lse_from_indices", boom)


def test_vendor_wrappers_skip_the_lse_pass(monkeypatch):
    """AITER OPUS and FlashInfer's DSv4 decode return no lse: with ``return_lse=False`` their
    wrappers skip the extra q.k pass and return ``(out, None)``; the out is unchanged. Ascend's
    op is asked for no lse (``return_softmax_lse``)."""
    from platform_helpers import vendor_case

    from swa_backends.backends.ascend import npu_attention
    from swa_backends.backends.cuda import flashinfer
    from swa_backends.backends.rocm import aiter_opus
    from swa_backends.testing.emulation import ascend as ascend_em
    from swa_backends.testing.emulation import cuda as cuda_em
    from swa_backends.testing.emulation import rocm as rocm_em

    args, kw = vendor_case(3, T=5, K=136, heads=(8,), sink=True)
    cases = [(rocm_em.contract_doubles("rocm:gfx950"), aiter_opus.sparse_mla),
             (cuda_em.contract_doubles("cuda:sm100"), flashinfer.sparse_mla_sm10x),
             (cuda_em.contract_doubles("cuda:sm120"), flashinfer.sparse_mla_sm12x),
             (ascend_em.contract_doubles("ascend:910b"), npu_attention.sparse_mla)]
    for doubles, fn in cases:
        with doubles:
            want_out, want_lse = fn(*args, **kw)
            with monkeypatch.context() as m:
                _no_lse_pass(m, aiter_opus, flashinfer)
                out, lse = fn(*args, **kw, return_lse=False)
        assert lse is None and torch.equal(out, want_out), fn
        assert mismatch("sparse_mla", (want_out, want_lse), REF(*args, **kw)) is None
    # an empty batch keeps the convention too
    q0 = args[0][:0]
    with rocm_em.contract_doubles("rocm:gfx950"):
        assert aiter_opus.sparse_mla(q0, *args[1:], return_lse=False)[1] is None


# ---------------------------------------------------------------------------------------
# validation: the pack's ValueError, before any launch
# ---------------------------------------------------------------------------------------


def _bad_calls():
    args, kw = _record_batch("v4_fp8", "e4m3fnuz", with_sink=False, T=9, seed=4)
    q, kv, idx, lens, scale, d_v = args
    S = R.num_slots(kv)
    bad_idx = idx.clone()
    bad_idx[0, 1] = S
    buf = kv.as_strided((kv.shape[0], kv.stride(0)), (kv.stride(0), 1))
    mx = R.new_cache(4, 16, "v41_mxfp8")
    overlap = buf.as_strided(kv.shape, (kv.shape[1] * 584 - 8, 584, 1))
    rows = torch.randn(S, 512).to(torch.bfloat16)
    odd = torch.empty(kv.numel() + 1, dtype=torch.uint8)[1:].view(kv.shape)
    return [
        ("kv: wrong dtype", (q, kv.float(), idx, lens, scale, d_v), kw, r"kv=.*expected a uint8 record cache"),
        ("bytes per record", (q, kv, idx, lens, scale, d_v), {**kw, "kv_format": "v41_mxfp8"},
         r"kv=.*expected 528 bytes per record.*584 bytes is kv_format='v4_fp8'"),
        ("not a record size", (q, mx[:, :, :500], idx, lens, scale, d_v), kw, r"kv=.*expected 584 bytes per record"),
        ("pages overlap", (q, overlap, idx, lens, scale, d_v), kw, r"kv=.*block stride.*expected a block stride >= "),
        ("records not packed", (q, kv.transpose(0, 1), idx, lens, scale, d_v), kw, r"kv=.*expected stride\(2\) == 1 "
                                                                                     r"and stride\(1\) == 584"),
        ("odd address", (q, odd, idx, lens, scale, d_v), kw, r"kv=.*expected an even start address"),
        ("slot outside the cache", (q, kv, bad_idx, lens, scale, d_v), kw,
         rf"indices={S}: expected values in \[0, {S}\) or PAD"),
        ("no flavour", (q, kv, idx, lens, scale, d_v), {"kv_format": "v4_fp8"},
         r"fp8=None: expected one of \('e4m3fn', 'e4m3fnuz'\) for kv_format='v4_fp8'"),
        ("flavour of another format", (q, R.new_cache(4, 16, "v41_nvfp4"), idx.clamp(max=63), lens, scale, d_v),
         {"kv_format": "v41_nvfp4", "fp8": "e4m3fnuz"}, r"fp8='e4m3fnuz': expected one of \('e4m3fn',\)"),
        ("unknown flavour", (q, kv, idx, lens, scale, d_v), {**kw, "fp8": "fnuz"}, r"fp8='fnuz': expected None or one of"),
        ("flavour with rows", (q, rows, idx, lens, scale, d_v), {"fp8": "e4m3fn"},
         r"fp8='e4m3fn': expected None with kv_format='rows'"),
        ("unknown format", (q, kv, idx, lens, scale, d_v), {**kw, "kv_format": "fp8_ds_mla"},
         r"kv_format='fp8_ds_mla': expected one of \('rows', 'v4_fp8'"),
        ("records as rows", (q, kv, idx, lens, scale, d_v), {}, r"kv=.*a uint8 record cache needs kv_format in"),
        ("q not bf16", (q.half(), kv, idx, lens, scale, d_v), kw, r"q=.*expected dtype bfloat16 with kv_format='v4_fp8'"),
        ("q head dim", (q[..., :256].contiguous(), kv, idx, lens, scale, 256), kw, r"q=.*expected head dim 512"),
        ("d_v", (q, kv, idx, lens, scale, 448), kw, r"d_v=448: expected 512 for kv_format='v4_fp8'"),
        ("return_lse", (q, kv, idx, lens, scale, d_v), {**kw, "return_lse": 0}, r"return_lse=0: expected a bool"),
        ("cache device", (q.to("meta"), kv, idx, lens, scale, d_v), kw, r"kv=.*expected device meta"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_calls())), ids=[c[0] for c in _bad_calls()])
def test_validation_names_argument_value_expectation(kmod, backend, monkeypatch, i):
    label, args, kw, pattern = _bad_calls()[i]

    def no_launch(*a, **k):
        raise AssertionError("a kernel launched before validation failed")

    monkeypatch.setattr(kmod, "_run", no_launch)
    for b in (select("cpu"), backend):
        with pytest.raises(ValueError, match="sparse_mla: " + pattern):
            b.sparse_mla(*args, **kw)


# ---------------------------------------------------------------------------------------
# dispatch: declared formats, reasons, implementations written before the keywords
# ---------------------------------------------------------------------------------------


def test_variants_declare_what_they_read():
    assert variant("sparse_mla", "triton").kv_formats == ("rows", "v4_fp8", "v41_mxfp8", "v41_nvfp4")
    assert variant("sparse_mla", "gluon").kv_formats == ("rows",)
    assert variant("sparse_mla", "reference").reads_every_kv_format
    args, kw = _record_batch("v4_fp8", "e4m3fn", with_sink=False, seed=1)
    for name in ("gluon", "gluon_ws", "aiter_opus", "flashinfer", "npu_sparse_flash_mla"):
        why = variant("sparse_mla", name).input_reasons(args, kw)
        assert why == ["reads KV rows only (kv_format='rows'), the call has kv_format='v4_fp8/e4m3fn'"], (name, why)
    assert variant("sparse_mla", "triton").input_reasons(args, kw) == []
    one = Variant(op="sparse_mla", name="x", impl="swa_backends.kernels.sparse_mla:sparse_mla", platforms=("cpu",),
                  kv_formats=("rows", "v4_fp8/e4m3fnuz"))
    assert one.input_reasons(args, kw) == ["reads kv_format in (rows, v4_fp8/e4m3fnuz), the call has 'v4_fp8/e4m3fn'"]
    assert one.input_reasons(args, {**kw, "fp8": "e4m3fnuz"}) == []


def _old_sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None):
    return REF(q, kv, indices, lens, sm_scale, d_v, sink=sink)


def _old_check(q, kv, indices, lens, sm_scale, d_v, *, sink=None):
    return []


def test_an_implementation_written_before_the_keywords_gets_a_reason():
    """A vendor wrapper not yet taking kv_format / fp8 / return_lse is never called with them
    (a TypeError inside dispatch): it gets a reason and the next variant runs. Its input check,
    when it takes fewer keywords than its implementation, sees only those it takes."""
    old = Variant(op="sparse_mla", name="old", impl=f"{__name__}:_old_sparse_mla", platforms=("cpu",),
                  input_check=f"{__name__}:_old_check")
    from swa_backends.testing.conformance import sparse_mla_case

    args, kw = sparse_mla_case(np.random.default_rng(0), "cpu", T=2, D=32, d_v=32)
    assert old.per_call and old.input_reasons(args, kw) == []
    assert old.input_reasons(args, {**kw, "return_lse": False}) == [
        f"its implementation {__name__}:_old_sparse_mla takes no return_lse keyword (written before sparse_mla had it)"]
    new = Variant(op="sparse_mla", name="new", impl="swa_backends.backends.rocm.aiter_opus:sparse_mla",
                  platforms=("cpu",), input_check=f"{__name__}:_old_check")
    assert new.input_reasons(args, {**kw, "return_lse": False, "kv_format": "rows"}) == []


def test_sm90_chain_sends_records_to_the_tl_kernel():
    """On sm90 the Gluon kernels (rows only) give the format reason; the tl kernel takes the call."""
    from swa_backends.common.registry import override_probe, clear_probes

    args, kw = _record_batch("v4_fp8", "e4m3fn", with_sink=True, seed=3)
    for name in ("triton", "gluon", "gluon_ws"):
        override_probe(name, None)
    try:
        b = select("cuda:sm90")
        assert b.variants["sparse_mla"][-2:] == ("triton", "reference")
        assert b.variant_for("sparse_mla", *args, **kw) == "triton"
        rows = (args[0], R.dequantize(args[1], torch.arange(R.num_slots(args[1])), "v4_fp8", "e4m3fn"), *args[2:])
        assert b.variant_for("sparse_mla", *rows) in ("gluon_ws", "gluon", "triton", "flashmla")
    finally:
        clear_probes()


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_rocm_records_go_to_triton_and_aiter_says_why(arch):
    from swa_backends.testing.emulation.rocm import contract_doubles

    args, kw = _record_batch("v4_fp8", "e4m3fnuz" if arch == "gfx942" else "e4m3fn", with_sink=True, T=9)
    big = (args[0][:1].expand(1024, -1, -1).contiguous(), args[1], args[2].repeat(114, 1)[:1024],
           args[3].repeat(114)[:1024], *args[4:])
    with contract_doubles(f"rocm:{arch}"):
        b = select(f"rocm:{arch}")
        assert b.variant_for("sparse_mla", *big, **kw) == "triton"
        if arch == "gfx950":
            assert variant("sparse_mla", "aiter_opus").input_reasons(big, kw) == [
                "reads KV rows only (kv_format='rows'), the call has kv_format='v4_fp8/e4m3fn'"]
        assert b.capabilities.encoder_replay.enabled


# ---------------------------------------------------------------------------------------
# encoder replay on faked gfx942 / gfx950 with V4 records
# ---------------------------------------------------------------------------------------


def _replay_case(fp8, *, W=16, bs=8, P=50, hit=42, H=4, seed=0):
    """A prompt's latent KV as V4 records, twice: the cold run's cache (every position written)
    and the cache after a prefix hit with replay start ``R = hit - W``: its blocks below R were
    freed and hold garbage (NaN bytes, huge scales), positions >= R rewritten (same KV)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(P, 512, generator=g).to(torch.bfloat16)
    nblk = -(-P // bs)
    pool = torch.randperm(3 * nblk, generator=g)
    bt_cold, bt_hot = pool[:nblk].to(I32)[None], pool[nblk:2 * nblk].to(I32)[None]
    stride = bs * 584 + 576
    cold = R.new_cache(3 * nblk, bs, "v4_fp8", block_stride=stride)
    hot = R.new_cache(3 * nblk, bs, "v4_fp8", block_stride=stride)
    R.pages(hot).copy_(torch.randint(0, 256, R.pages(hot).shape, generator=g, dtype=torch.uint8))
    R.pages(hot)[:, bs * 576:] = 0xFF  # garbage scale codes: 2^128 (inf) where anything reads them
    pos = torch.arange(P)

    def slots(bt, p):
        return bt[0, p // bs].to(torch.int64) * bs + p % bs

    R.write(cold, rows, slots(bt_cold, pos), "v4_fp8", fp8)
    Rs = hit - W
    R.write(hot, rows[Rs:], slots(bt_hot, pos[Rs:]), "v4_fp8", fp8)
    q = torch.randn(P - Rs, H, 512, generator=g).to(torch.bfloat16)  # the replayed chunk: positions R..P-1
    sink = torch.randn(H, generator=g)
    batch = dict(qsl=torch.tensor([0, P - Rs], dtype=I32), seq=torch.tensor([P], dtype=I32),
                 R=torch.tensor([Rs], dtype=I32), zero=torch.zeros(1, dtype=I32))
    return cold, hot, bt_cold, bt_hot, q, sink, batch, W, bs, Rs


def _attend(b, cache, bt, q, sink, batch, W, bs, R_t, fp8):
    idx, lens = b.swa_indices_and_lens(batch["qsl"], batch["seq"], bt, bs, W, R_t, num_tokens=q.shape[0])
    pidx, plens = b.plain_indices(idx, lens)
    kw = {"sink": sink, "kv_format": "v4_fp8", "fp8": fp8}
    return b.sparse_mla(q, cache, pidx, plens, SCALE, 512, **kw), b.variant_for(
        "sparse_mla", q, cache, pidx, plens, SCALE, 512, **kw)


@pytest.mark.skipif(ON_GPU, reason="emulated: the faked ROCm device runs the Triton kernel in the interpreter on "
                                   "the CPU, which a process with a GPU does not start")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the unclamped read of garbage (NaN, inf) in numpy
@pytest.mark.parametrize("arch, fp8", [("gfx942", "e4m3fnuz"), ("gfx950", "e4m3fn")])
def test_encoder_replay_on_faked_rocm_reads_v4_records(kmod, arch, fp8):
    """The SWA cache's flavour is the arch's (FNUZ on gfx942, OCP on gfx950). Through the ROCm
    backend (AITER's double installed; the Triton kernel emulated on the CPU), the Triton
    interpreter backend and the reference: replayed attention == cold attention over the same
    clamped window, bit for bit; without the clamp the replayed tokens would read the garbage."""
    from swa_backends.testing.emulation.rocm import contract_doubles

    cold, hot, bt_cold, bt_hot, q, sink, batch, W, bs, Rs = _replay_case(fp8)
    results = {}
    with sb.fake_device(f"rocm:{arch}"), contract_doubles(f"rocm:{arch}"):
        b = select(f"rocm:{arch}")
        assert b.capabilities.encoder_replay.enabled
        backends = {"rocm": b, "cpu-triton": select("cpu", prefer="triton"), "reference": select("cpu")}
        for name, be in backends.items():
            (out_hot, lse_hot), ran = _attend(be, hot, bt_hot, q, sink, batch, W, bs, batch["R"], fp8)
            (out_cold, lse_cold), _ = _attend(be, cold, bt_cold, q, sink, batch, W, bs, batch["R"], fp8)
            assert ran == ("reference" if name == "reference" else "triton"), (name, ran)
            assert torch.isfinite(out_hot.float()).all() and torch.isfinite(lse_hot).all()
            assert torch.equal(out_hot, out_cold) and torch.equal(lse_hot, lse_cold), name
            results[name] = (out_hot, lse_hot)
            if name == "cpu-triton":
                continue
            # the clamp is what makes it right: unclamped, the first W-1 replayed tokens read below R
            (out_free, _), _ = _attend(be, hot, bt_hot, q, sink, batch, W, bs, batch["zero"], fp8)
            bad = ~torch.isfinite(out_free.float()).all(dim=(1, 2)) | (out_free != out_hot).any(dim=2).any(dim=1)
            assert bool(bad[: W - 1].all()) and not bool(bad[W - 1:].any()), name
    for name in ("rocm", "cpu-triton"):
        assert mismatch("sparse_mla", results[name], results["reference"]) is None, name


# ---------------------------------------------------------------------------------------
# the record configs compile for sm90, gfx942 and gfx950 (own process: compiled mode)
# ---------------------------------------------------------------------------------------

HERE = Path(__file__).resolve().parent


def _aot_main(targets: list[str]) -> int:
    """Compile every record format's table configs (one pass and split-K decode) offline for each
    target with Triton's compiler (tests/kernels/aot_compile_sparse_mla.py's binder); one line each with
    the shared memory (and on sm90 ptxas' registers / spills); exit 1 when one does not compile
    or does not fit the target's shared memory. Spills are printed, not failed: the cuda rows
    of RECORDS_TUNED were chosen by timing them on an H200 (Triton 3.6), where the fastest
    rows spill under Triton 3.9's ptxas."""
    sys.path.insert(0, str(HERE))
    import aot_compile_sparse_mla as A  # noqa: PLC0415

    K = importlib.import_module("swa_backends.kernels.sparse_mla")
    fwd, comb = K._sparse_mla_fwd, K._sparse_mla_combine
    failures = []
    for spec in targets:
        target = A.parse_target(spec)
        arch = str(target.arch)
        platform = "cuda" if target.backend == "cuda" else "rocm"
        K.FNUZ_NATIVE["cpu"] = platform == "rocm"  # the FNUZ conversion each target compiles (host tensors)
        for fmt, fl in COMBOS:
            plan = [(f"H={H}", K.table_config(platform, 512, H, fmt).replace(splits=1), H) for H in (16, 64)]
            plan.append(("decode", K.table_config(platform, 512, 64, fmt).replace(splits=4), 64))
            plan += [("few tokens", c.replace(splits=4), 64) for p, _, _, fmts, c in K.DECODE_TUNED
                     if p == platform and fmt in fmts]
            for label, cfg, H in plan:
                def record(name, k, secs, label=label, cfg=cfg, fmt=fmt, fl=fl):
                    shared = k.metadata.shared
                    line = f"{spec} {fmt}/{fl} {name} [{label}: {cfg.short()}] smem={shared}"
                    if shared > A.SMEM_LIMIT.get(arch, 1 << 30):
                        failures.append(f"{line}: more shared memory than {arch} has")
                    if target.backend == "cuda" and name == "_sparse_mla_fwd":
                        regs, spill = _ptxas(k, A)
                        line += f" regs={regs} spill={spill}"
                    print(line, flush=True)

                K._sparse_mla_fwd = A._Offline(fwd, target, record)
                K._sparse_mla_combine = A._Offline(comb, target, record)
                T = 1 if cfg.splits > 1 else 2
                q = torch.zeros(T, H, 512, dtype=torch.bfloat16)
                kv = R.new_cache(4, 64, fmt)
                idx = torch.zeros(T, 256, dtype=I32)
                K._FITTED.clear()
                try:
                    K.launch(q, kv, idx, torch.full((T,), 256, dtype=I32), 0.04, 512, torch.zeros(H), config=cfg,
                             fit=False, kv_format=fmt, fp8=fl)
                except Exception as exc:  # a compile error is the finding
                    failures.append(f"{spec} {fmt}/{fl} [{label}: {cfg.short()}]: {type(exc).__name__}: "
                                    f"{str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}")
    K._sparse_mla_fwd, K._sparse_mla_combine = fwd, comb
    for f in failures:
        print("FAIL", f, file=sys.stderr)
    return 1 if failures else 0


def _ptxas(k, A) -> tuple[int | None, int | None]:
    import re

    v = A.ptxas_verbose(k)
    regs = re.search(r"Used (\d+) registers", v)
    spill = re.search(r"(\d+) bytes spill stores", v)
    return (int(regs.group(1)) if regs else None), (int(spill.group(1)) if spill else None)


@pytest.mark.compile
@pytest.mark.skipif(NO_TRITON is not None, reason=str(NO_TRITON))
@pytest.mark.parametrize("python", pythons(), ids=ids)
def test_record_configs_compile_for_sm90_gfx942_gfx950(python):
    """With every Triton the host has (tests/helpers/_tritons.py; checked by hand with 3.6, 3.8 and 3.9)."""
    targets = ("cuda:90", "hip:gfx942", "hip:gfx950")
    version, out = run_compile_script(python, __file__, "--aot", *targets, cwd=HERE)
    assert out.returncode == 0, f"Triton {version}: " + out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    for fmt, fl in COMBOS:
        for spec in targets:
            assert any(ln.startswith(f"{spec} {fmt}/{fl} _sparse_mla_fwd [H=64") for ln in lines), (spec, fmt, fl)
            assert any(ln.startswith(f"{spec} {fmt}/{fl} _sparse_mla_combine [decode") for ln in lines), (spec, fmt)


# ---------------------------------------------------------------------------------------
# bench/bench_sparse_mla.py --records: its section runs (here: the interpreter, tiny sizes)
# ---------------------------------------------------------------------------------------


@pytest.mark.skipif(ON_GPU, reason="on a GPU: python bench/bench_sparse_mla.py --out DIR --smoke --records")
def test_bench_records_section_on_cpu(kmod, monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(HERE.parents[1] / "bench"))  # its shared library, lib/ (alone too)
    spec = importlib.util.spec_from_file_location("bench_sparse_mla_records",
                                                  HERE.parents[1] / "bench" / "bench_sparse_mla.py")
    B = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = B  # its dataclasses look their module up
    spec.loader.exec_module(B)
    assert B.parse_records("v4_fp8,v41_mxfp8:e4m3fnuz") == [("v4_fp8", "e4m3fn"), ("v41_mxfp8", "e4m3fnuz")]
    with pytest.raises(SystemExit, match="--records"):
        B.parse_records("v41_nvfp4:e4m3fnuz")
    result = {"correctness": [], "compiled": [], "records": [], "errors": []}
    errors = []

    def err(where, exc):
        errors.append(f"{where}: {exc}")
        return str(exc)

    with validation(False):
        B.run_records("v4_fp8:e4m3fnuz,v41_nvfp4", B.RECORD_PLANS["tiny"], result, "cpu", torch.device("cpu"), kmod,
                      lambda: 0.0, 1e9, err, lambda: None)
    assert not errors, errors
    assert [c["ok"] for c in result["correctness"]] == [True, True]
    assert {(r["format"], r["kind"]) for r in result["records"]} == {
        ("v4_fp8/e4m3fnuz", "decode"), ("v4_fp8/e4m3fnuz", "prefill"), ("v41_nvfp4/e4m3fn", "decode"),
        ("v41_nvfp4/e4m3fn", "prefill")}
    assert all(r["ratio"] > 0 and r["records_splits"] >= 1 for r in result["records"])


# ---------------------------------------------------------------------------------------
# GPU: the compiled record kernel against the reference (-m gpu)
# ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("T, H, K", [(1, 64, 640), (32, 128, 640), (256, 64, 384), (2048, 128, 640), (300, 16, 129)])
@pytest.mark.parametrize("fmt, fp8", COMBOS, ids=COMBO_IDS)
def test_records_on_gpu(fmt, fp8, T, H, K):
    """Decode (split-K) and prefill shapes, the table config, PAD patterns, sink, a 64-record SWA
    block with padded block stride; return_lse both ways; then captured in a CUDA graph."""
    torch.manual_seed(T + H + K)
    bs, nb = 64, 1024
    kv = R.new_cache(nb, bs, fmt, device="cuda", block_stride=bs * R.FORMATS[fmt].record_bytes + 576)
    rows = torch.randn(nb * bs, 512, device="cuda").to(torch.bfloat16)
    R.write(kv, rows, torch.arange(nb * bs, device="cuda"), fmt, fp8)
    q = torch.randn(T, H, 512, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, nb * bs, (T, K), device="cuda", dtype=I32)
    idx = torch.where(torch.rand(T, K, device="cuda") < 0.15, -1, idx)
    lens = torch.randint(0, K + 1, (T,), device="cuda", dtype=I32)
    lens[::5] = K
    lens[2::9] = 0
    idx[3::7] = -1
    if K > 160:
        idx[4::11, 16:160] = -1
    kw = {"sink": torch.randn(H, device="cuda"), "kv_format": fmt, "fp8": fp8}
    b = select()
    assert b.variant_for("sparse_mla", q, kv, idx, lens, SCALE, 512, **kw) == "triton"
    got = b.sparse_mla(q, kv, idx, lens, SCALE, 512, **kw)
    want = REF(q, kv, idx, lens, SCALE, 512, **kw)
    assert mismatch("sparse_mla", got, want) is None
    out2, none = b.sparse_mla(q, kv, idx, lens, SCALE, 512, **kw, return_lse=False)
    assert none is None and torch.equal(out2, got[0])
    with validation(False):
        graph = torch.cuda.CUDAGraph()
        b.sparse_mla(q, kv, idx, lens, SCALE, 512, **kw)  # compiled before the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            captured = b.sparse_mla(q, kv, idx, lens, SCALE, 512, **kw)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(captured[0], got[0])


def test_calls_of_a_few_tokens_take_smaller_tiles(kmod, monkeypatch):
    """On CUDA at 64+ heads, a V4 / MXFP8 call of at most 4 items (tokens x 64-head blocks) and a
    bf16-rows call of at most 2 take DECODE_TUNED's 32-row tiles (twice the split-K parallelism);
    larger calls, 16 / 32 heads, NVFP4, D_qk 576 and other platforms keep their table rows."""
    monkeypatch.setattr(kmod, "_platform", lambda device: "rocm" if device.type == "meta" else device.type)
    cuda, rocm = torch.device("cuda"), torch.device("meta")  # (the platform of a device: patched above)
    small = {fmts: c for _, _, _, fmts, c in kmod.DECODE_TUNED}
    for fmts, few, more in ((("v4_fp8", "v41_mxfp8"), ((1, 64), (4, 64), (1, 128), (2, 128), (1, 48)),
                             ((5, 64), (3, 128), (256, 64), (1, 32), (1, 16))),
                            (("rows",), ((1, 64), (2, 64), (1, 128)), ((3, 64), (2, 128), (1, 32)))):
        for fmt in fmts:
            for T, H in few:
                assert kmod.pick_config(T, H, 512, 512, 640, cuda, fmt) == small[fmts], (fmt, T, H)
            for T, H in more:
                assert kmod.pick_config(T, H, 512, 512, 640, cuda, fmt) == kmod.table_config("cuda", 512, H, fmt)
            assert kmod.pick_config(1, 64, 512, 512, 640, rocm, fmt) == kmod.table_config("rocm", 512, 64, fmt)
    assert kmod.pick_config(1, 64, 512, 512, 640, cuda, "v41_nvfp4") == kmod.table_config("cuda", 512, 64, "v41_nvfp4")
    assert kmod.pick_config(1, 64, 576, 512, 640, cuda) == kmod.table_config("cuda", 576, 64)


def test_compile_fallback_starts_from_the_formats_own_table_row(kmod):
    """A config that does not compile falls back to the table's row for *this* record format
    (RECORDS_TUNED names formats), not to the first row any record matches."""
    for fmt in R.FORMATS:
        kvs = kmod.kv_spec(R.new_cache(1, 16, fmt), fmt, "e4m3fn", True, torch.device("cpu"))
        want = kmod.table_config("cuda", 512, 16, fmt)
        odd = want.replace(num_stages=3)
        assert kmod._fallbacks(odd, "cuda", 512, 16, kvs)[0] == want, fmt


@pytest.mark.gpu
def test_warmup_compiles_the_record_kernels(kmod):
    """``warmup(kv_records=...)`` launches the record specialisations (one pass and split-K) the
    serving path uses; a later call of that shape compiles nothing."""
    b = select()
    records = (("v4_fp8", "e4m3fn", 64), ("v41_mxfp8", "e4m3fn", 16))
    assert kmod.warmup(b, num_heads=(64,), attn_sink=(True,), kv_records=records) == ["sparse_mla"]
    compiled = lambda: sum(len(c[0]) for c in kmod._sparse_mla_fwd.device_caches.values())  # noqa: E731
    before = compiled()
    kv = R.new_cache(8, 64, "v4_fp8", device="cuda")
    for T in (1, 3, 8, 40, 300):  # DECODE_TUNED's tiles, the table's split-K, one pass
        q = torch.randn(T, 64, 512, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, 512, (T, 640), device="cuda", dtype=I32)
        b.sparse_mla(q, kv, idx, torch.full((T,), 640, device="cuda", dtype=I32), SCALE, 512,
                     sink=torch.zeros(64, device="cuda"), kv_format="v4_fp8", fp8="e4m3fn")
    assert compiled() == before


if __name__ == "__main__":
    if sys.argv[1:2] == ["--aot"]:
        if os.environ.get("TRITON_INTERPRET", "0") == "1":
            sys.exit("--aot: TRITON_INTERPRET=1 is set; kernels must be decorated in compiled mode")
        sys.exit(_aot_main(sys.argv[2:]))
    sys.exit(f"usage: python {Path(__file__).name} --aot cuda:90 hip:gfx942 hip:gfx950")
