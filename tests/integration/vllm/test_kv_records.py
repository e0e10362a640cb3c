"""The pack's reading of DeepSeek-V4 / V4.1 paged KV records against vLLM's own code.

vLLM 0.33's writers quantize bf16 rows into records (the SWA writer
``quantize_and_insert_k_cache`` and the compressed-cache writer ``rope_quant_insert``, both
Triton), the pack's reference dequantizes them (``common/ops/_records.py``), and vLLM's own
gathers (``dequantize_and_gather_k_cache_triton``: the per-block kernel CUDA runs, the one-pass
kernel ROCm runs, the MXFP8 and NVFP4 kernels) dequantize the same bytes: every row must be
bit-identical, for every format and FP8 flavour (FNUZ through the writers' ``use_fnuz`` kernels,
as gfx942's SWA cache is written). Then ``sparse_mla`` on the records (reference and the Triton
kernel) equals ``sparse_mla`` on vLLM's gathered rows. NVFP4's writer is PTX inline assembly (no
CPU run): the pack's writer produces those records.

The pack's own writer is compared with vLLM's too: scale codes and RoPE bytes must be equal, and
every e4m3 byte vLLM wrote must be one of the two e4m3 neighbours of the value the pack's formula
scales (the pack's byte is the nearest-even one). Not byte equality, because Triton's interpreter,
which runs vLLM's writers here, converts fp32 to fp8 unlike the hardware's round-to-nearest-even:
ties go away from zero, subnormal results are truncated, and a round-up whose mantissa carries
into an odd exponent loses the carry (31.4 -> 16.0, allowed explicitly). Triton 3.8's interpreter
also writes a negative value that underflows FNUZ as 0x80 (FNUZ's NaN; the hardware writes 0x00,
Triton 3.9's interpreter too): those bytes are set to 0x00 after vLLM's FNUZ writer (counted).
On a GPU vLLM's writers round to nearest even, as the pack's writer does.

Runs on the CPU with Triton's interpreter (``CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1``, set by
this directory's conftest before vLLM is imported) in the CI stage whose venv has vLLM; skipped,
saying so, where vLLM is not importable.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM (the main CI venv has none; the vLLM CI stage runs "
                                   "tests/integration/vllm with each supported vLLM, CUDA_VISIBLE_DEVICES= "
                                   "TRITON_INTERPRET=1)")

cu = pytest.importorskip("vllm.models.deepseek_v41.common.ops.cache_utils",
                         reason="this vLLM has no DeepSeek-V4.1 cache_utils (vLLM 0.33 has)")
fc = pytest.importorskip("vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache",
                         reason="this vLLM has no DeepSeek-V4.1 fused_compress_quant_cache (vLLM 0.33 has)")

from swa_backends import OPS, select  # noqa: E402
from swa_backends.common.ops import _records as R  # noqa: E402
from swa_backends.testing.conformance import mismatch  # noqa: E402

REF = OPS["sparse_mla"].reference
DEV = "cuda" if torch.cuda.is_available() else "cpu"
BS, NB = 16, 6  # records per page, pages
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
FNUZ_MAX = 224.0  # vLLM's get_fp8_min_max() on an FNUZ platform (not torch's 240)


def _rows(seed: int, n: int) -> torch.Tensor:
    """bf16 rows whose 64-dim tiles span 2^-12 .. 2^10, with zero and tiny tiles (the 1e-4 floor)."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-12, 10, (n, 16), generator=g).float()).repeat_interleave(32, dim=1)
    x = torch.randn(n, 512, generator=g) * mag
    x[1, :64] = 0
    x[2, 64:128] *= 1e-6
    return x.to(torch.bfloat16).to(DEV)


def _cache(fmt: str) -> torch.Tensor:
    f = R.FORMATS[fmt]
    return R.new_cache(NB, BS, fmt, block_stride=BS * f.record_bytes + 576, device=DEV)


def _layout(seed: int):
    """One request of ``NB * BS`` positions over a permuted block table: its slots, in order."""
    g = torch.Generator().manual_seed(seed + 100)
    table = torch.randperm(NB, generator=g).to(torch.int32)
    pos = torch.arange(NB * BS)
    slots = table[pos // BS].to(torch.int64) * BS + pos % BS
    return table[None].to(DEV), slots.to(DEV)


# ---------------------------------------------------------------------------------------
# vLLM's writers and readers, launched as vLLM launches them
# ---------------------------------------------------------------------------------------


def vllm_write_swa(kv, rows, slots, fmt: str, fp8: str) -> int:
    """The SWA-cache writer: ``quantize_and_insert_k_cache`` on the 2-D page view (its
    ``block_stride`` is ``stride(0)``). FNUZ: vLLM refuses ``use_fnuz`` off an FNUZ platform, so
    the same kernels are launched with the launcher's FNUZ arguments (max 224); returns how many
    0x80 bytes (an interpreter artifact, see the module docstring) were set to 0x00."""
    pages = R.pages(kv)
    if fp8 == "e4m3fn":
        cu.quantize_and_insert_k_cache(rows, pages, slots, block_size=BS, bytes_per_token=R.FORMATS[fmt].record_bytes)
        return 0
    if DEV == "cuda" and not torch.version.hip:
        pytest.skip("NVIDIA's Triton has no FNUZ type: vLLM's FNUZ writer runs on gfx942 (or in the interpreter)")
    n = slots.shape[0]
    if fmt == "v41_mxfp8":
        cu._quantize_and_insert_k_mxfp8_kernel[(n,)](
            rows, slots, pages, n, head_dim=512, scale_dim=cu.V41_NUM_SCALES, quant_block=cu.V41_QUANT_BLOCK,
            cache_block_size=BS, block_stride=pages.stride(0), fp8_max=FNUZ_MAX, use_fnuz=True)
    else:
        cu.quantize_and_insert_k_kernel[(n,)](
            rows, slots, pages, n, input_dim=512, fp8_dim=448, bf16_dim=64, scale_dim=8, quant_block=64,
            cache_block_size=BS, token_data_size=576, block_stride=pages.stride(0), fp8_max=FNUZ_MAX,
            n_quant_blocks=8, use_fnuz=True)
    if not INTERPRETED:
        return 0
    blk, off = slots // BS, slots % BS
    start, width = (off * 576, 448) if fmt == "v4_fp8" else (off * 528, 512)
    cols = start[:, None] + torch.arange(width, device=DEV)
    data = pages[blk[:, None], cols]
    fixed = int((data == 0x80).sum())
    pages[blk[:, None], cols] = torch.where(data == 0x80, torch.zeros_like(data), data)
    return fixed


def vllm_write_compressed(kv, rows, slots) -> None:
    """The compressed-cache writer (OCP on every platform) with an identity RoPE (cos 1, sin 0)
    and ratio 1, so it stores exactly ``rows``."""
    cos_sin = torch.zeros(rows.shape[0], 64, device=DEV)
    cos_sin[:, :32] = 1.0
    fc.rope_quant_insert(rows.contiguous(), torch.arange(rows.shape[0], device=DEV), cos_sin, kv, slots, 1)


def vllm_gather(kv, table, fmt: str, fp8: str, one_pass: bool = False) -> torch.Tensor:
    """vLLM's dequantize-and-gather of the request's ``NB * BS`` positions: ``[positions, 512]``
    bf16. ``one_pass``: the V4 kernel ROCm runs instead of the per-block one CUDA runs."""
    n = NB * BS
    out = torch.full((1, n, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    seq = torch.tensor([n], dtype=torch.int32, device=DEV)
    if not one_pass:
        cu.dequantize_and_gather_k_cache_triton(out, kv, seq, None, table, BS, 0, use_fnuz=fp8 == "e4m3fnuz")
        return out[0]
    cu._dequantize_and_gather_k_one_pass_kernel[(1, 128)](
        out, out.stride(0), out.stride(1), kv, seq, table, 0, None, max_blocks_per_seq=table.shape[-1],
        fp8_dim=448, bf16_dim=64, scale_dim=8, quant_block=64, cache_block_size=BS, token_data_size=576,
        block_stride=kv.stride(0), output_dim=512, fp8_max=448.0, n_quant_blocks=7, use_fnuz=fp8 == "e4m3fnuz")
    return out[0]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


# ---------------------------------------------------------------------------------------
# the reader: bit for bit
# ---------------------------------------------------------------------------------------

SWA = [("v4_fp8", "e4m3fn"), ("v4_fp8", "e4m3fnuz"), ("v41_mxfp8", "e4m3fn"), ("v41_mxfp8", "e4m3fnuz")]


@pytest.mark.parametrize("fmt, fp8", SWA, ids=[f"{f}-{x}" for f, x in SWA])
def test_reader_equals_vllm_gather_on_vllm_written_records(fmt, fp8):
    rows = _rows(1, NB * BS)
    table, slots = _layout(1)
    kv = _cache(fmt)
    vllm_write_swa(kv, rows, slots, fmt, fp8)
    want = vllm_gather(kv, table, fmt, fp8)
    got = R.dequantize(kv, slots, fmt, fp8)
    assert torch.isfinite(want.float()).all()
    assert _same_bits(got, want), f"{int((got != want).sum())} dims differ"
    if fmt == "v4_fp8":  # the ROCm one-pass gather reads the same
        assert _same_bits(vllm_gather(kv, table, fmt, fp8, one_pass=True), want)


@pytest.mark.parametrize("fmt", ["v4_fp8", "v41_mxfp8"])
def test_reader_equals_vllm_gather_on_the_compressed_writer(fmt):
    """The compressed cache: vLLM's Triton writer (OCP everywhere, gfx942 included)."""
    rows = _rows(2, NB * BS)
    table, slots = _layout(2)
    kv = _cache(fmt)
    vllm_write_compressed(kv, rows, slots)
    want = vllm_gather(kv, table, fmt, "e4m3fn")
    assert _same_bits(R.dequantize(kv, slots, fmt, "e4m3fn"), want)
    # the two vLLM writers store the same bytes
    swa = _cache(fmt)
    vllm_write_swa(swa, rows, slots, fmt, "e4m3fn")
    assert torch.equal(R.pages(swa), R.pages(kv))


def test_reader_equals_vllm_gather_nvfp4():
    rows = _rows(3, NB * BS)
    table, slots = _layout(3)
    kv = _cache("v41_nvfp4")
    R.write(kv, rows, slots, "v41_nvfp4")
    want = vllm_gather(kv, table, "v41_nvfp4", "e4m3fn")
    assert _same_bits(R.dequantize(kv, slots, "v41_nvfp4"), want)
    # and on arbitrary bytes (every nibble, every e4m3 scale but NaN): vLLM's decode is the pack's
    g = torch.Generator().manual_seed(4)
    raw = _cache("v41_nvfp4")
    R.pages(raw).copy_(torch.randint(0, 256, R.pages(raw).shape, generator=g, dtype=torch.uint8))
    pv = R.pages(raw)
    for o in range(BS):
        sc = pv[:, o * 288 + 256: o * 288 + 288]
        sc[(sc & 0x7F) == 0x7F] = 0x38
    assert _same_bits(R.dequantize(raw, slots, "v41_nvfp4"), vllm_gather(raw, table, "v41_nvfp4", "e4m3fn"))


# ---------------------------------------------------------------------------------------
# the writer: byte for byte (modulo the interpreter's fp8 rounding)
# ---------------------------------------------------------------------------------------


def _neighbours(scaled: torch.Tensor, fp8: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The e4m3 values of the flavour just below and just above ``|scaled|`` (equal when it is one)."""
    dtype = R.FP8_FLAVOURS[fp8][0]
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    grid = torch.unique(grid[torch.isfinite(grid) & (grid >= 0)])  # sorted magnitudes
    a = scaled.abs().clamp(max=float(grid[-1]))
    i = torch.searchsorted(grid, a, right=True) - 1
    lo = grid[i]
    hi = torch.where(lo == a, lo, grid[(i + 1).clamp(max=grid.numel() - 1)])
    return lo, hi


def _unexplained(v: torch.Tensor, scaled: torch.Tensor, fp8: str) -> torch.Tensor:
    """vLLM's e4m3 values ``v`` that are neither neighbour of the pack's scaled value (sign
    kept; zero either sign) nor the interpreter's dropped carry (half a power-of-two neighbour)."""
    lo, hi = _neighbours(scaled, fp8)
    a = v.abs()
    right_sign = (torch.sign(v) == torch.sign(scaled)) | (a == 0)
    mant, _ = torch.frexp(hi)
    carry = (mant == 0.5) & (a * 2 == hi)
    return ~(right_sign & ((a == lo) | (a == hi) | carry))


@pytest.mark.parametrize("fmt, fp8", SWA, ids=[f"{f}-{x}" for f, x in SWA])
def test_writer_equals_vllm(fmt, fp8):
    rows = _rows(5, NB * BS)
    _, slots = _layout(5)
    ours, theirs = _cache(fmt), _cache(fmt)
    R.write(ours, rows, slots, fmt, fp8)
    fixed = vllm_write_swa(theirs, rows, slots, fmt, fp8)
    blk, off = slots // BS, slots % BS
    po, pt = R.pages(ours), R.pages(theirs)
    if fmt == "v4_fp8":
        def data(pv):
            return R._bytes(pv, blk, off * 576, 576)

        def codes(pv):
            return R._bytes(pv, blk, BS * 576 + off * 8, 8)

        n, tile = 448, 64
        assert torch.equal(data(po)[:, 448:], data(pt)[:, 448:]), "RoPE bytes"
    else:
        def data(pv):
            return R._bytes(pv, blk, off * 528, 512)

        def codes(pv):
            return R._bytes(pv, blk, off * 528 + 512, 16)

        n, tile = 512, 32
    assert torch.equal(codes(po), codes(pt)), "UE8M0 scale codes"
    dtype = R.FP8_FLAVOURS[fp8][0]
    vo = data(po)[:, :n].contiguous().view(dtype).float().cpu()
    vt = data(pt)[:, :n].contiguous().view(dtype).float().cpu()
    e = codes(po)[:, : n // tile].float().cpu() - 127
    scaled = (rows[:, :n].float().cpu().view(-1, n // tile, tile) * torch.exp2(-e)[..., None]).reshape(-1, n)
    top = R.FP8_FLAVOURS[fp8][1]
    assert torch.equal(vo, scaled.clamp(-top, top).to(dtype).float()), "the pack's bytes: nearest even"
    bad = _unexplained(vt, scaled, fp8)
    assert not bad.any(), (f"{int(bad.sum())} e4m3 bytes are no neighbour of the pack's scaled value, e.g. scaled "
                           f"{scaled[bad][:4].tolist()}: vLLM {vt[bad][:4].tolist()}, pack {vo[bad][:4].tolist()}")
    print(f"{fmt}/{fp8}: {int((vt != vo).sum())} of {vt.numel()} e4m3 bytes rounded otherwise by the interpreter; "
          f"{fixed} FNUZ 0x80 bytes set to 0x00")
    assert R.FORMATS[fmt].record_bytes == kv_bytes(fmt)


def kv_bytes(fmt: str) -> int:
    return {"v4_fp8": cu.V4_BYTES_PER_TOKEN, "v41_mxfp8": cu.V41_BYTES_PER_TOKEN,
            "v41_nvfp4": cu.V41_NVFP4_BYTES_PER_TOKEN}[fmt]


# ---------------------------------------------------------------------------------------
# sparse_mla on vLLM's records == sparse_mla on vLLM's gathered rows
# ---------------------------------------------------------------------------------------

ALL = SWA + [("v41_nvfp4", "e4m3fn")]


@pytest.mark.parametrize("fmt, fp8", ALL, ids=[f"{f}-{x}" for f, x in ALL])
def test_sparse_mla_on_records_equals_sparse_mla_on_vllm_rows(fmt, fp8):
    rows = _rows(6, NB * BS)
    table, slots = _layout(6)
    kv = _cache(fmt)
    if fmt == "v41_nvfp4":
        R.write(kv, rows, slots, fmt)
    else:
        vllm_write_swa(kv, rows, slots, fmt, fp8)
    gathered = vllm_gather(kv, table, fmt, fp8)  # row i = position i
    g = torch.Generator().manual_seed(7)
    T, H, K = 5, 4, 40
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16).to(DEV)
    pos = torch.randint(0, NB * BS, (T, K), generator=g).to(DEV)
    pos[0, ::4] = -1
    lens = torch.tensor([40, 33, 0, 1, 17], dtype=torch.int32, device=DEV)
    sink = torch.randn(H, generator=g).to(DEV)
    slot_idx = torch.where(pos >= 0, slots[pos.clamp(min=0)], -1).to(torch.int32)
    scale = 1.0 / math.sqrt(512)
    want = REF(q, gathered, pos.to(torch.int32), lens, scale, 512, sink=sink)
    kw = {"sink": sink, "kv_format": fmt, "fp8": fp8}
    got = REF(q, kv, slot_idx, lens, scale, 512, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    tl_backend = select(DEV if DEV != "cpu" else "cpu", prefer={"sparse_mla": "triton"})
    assert tl_backend.variant_for("sparse_mla", q, kv, slot_idx, lens, scale, 512, **kw) == "triton"
    assert mismatch("sparse_mla", tl_backend.sparse_mla(q, kv, slot_idx, lens, scale, 512, **kw), want) is None
