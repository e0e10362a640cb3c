"""DeepSeek-V4 / V4.1 paged KV records, as vLLM 0.33 stores them: layouts, FP8 flavours, the
validation every ``sparse_mla`` variant gets, and the torch reader (the reference's dequant) and
writer (for tests and benchmarks).

A record cache is one layer's uint8 tensor ``kv [num_blocks, block_size, record_bytes]``, the view
vLLM binds to the layer (``k_cache``): ``stride(2) == 1``, ``stride(1) == record_bytes`` and
``stride(0)`` the *block stride* in bytes, which may exceed ``block_size * record_bytes`` (page
padding, several layers packed in one block). A slot ``s`` is token ``off = s % block_size`` of
page ``blk = s // block_size``, whose bytes start at ``kv.data_ptr() + blk * stride(0)``. Every
record is 512 dims (``D_qk = d_v = 512``: value = the whole dequantized row, RoPE dims included):

* ``v4_fp8`` (584 B, vLLM ``fp8_ds_mla``; every platform but SM100, so all of ROCm): a page holds
  all its tokens' data first, then all their scales. Data of token ``off``: ``page + off*576``,
  448 e4m3 bytes (dims 0..447) then 64 little-endian bf16 (dims 448..511, unscaled); scales:
  ``page + block_size*576 + off*8``, 7 UE8M0 codes (code ``j`` scales dims ``[64j, 64j+64)``)
  and a pad byte. ``k_cache[b, o, :]`` is *not* token ``o``'s record.
* ``v41_mxfp8`` (528 B, SM100): interleaved; ``page + off*528``: 512 e4m3 bytes, then 16 UE8M0
  codes (code ``j`` scales dims ``[32j, 32j+32)``).
* ``v41_nvfp4`` (288 B, SM100, compressed cache only): ``page + off*288``: 256 bytes of e2m1
  pairs (element ``2i`` in the low nibble of byte ``i``), then 32 OCP e4m3 scales (scale ``j``
  covers dims ``[16j, 16j+16)``); no global scale.

UE8M0 code ``c`` means ``2**(c - 127)``. The FP8 flavour of the e4m3 bytes is a property of the
*cache*, not of the arch: on gfx942 vLLM's SWA cache is FNUZ (``e4m3fnuz``, written with max 224)
while its compressed cache is OCP (``e4m3fn``, max 448) on every platform. So it is an argument of
the call (``fp8=``), never inferred. One byte means half as much in FNUZ as in OCP.

Dequant, exactly vLLM's (``dequantize_and_gather_k_cache``, ``cache_utils.py``):
``bf16(float(e4m3 byte) * 2**(code - 127))`` per dim, RoPE bf16 copied; NVFP4
``bf16(e2m1 * float(e4m3 scale))``. Every product is exact (a power of two, or a 2-bit by 3-bit
mantissa), so any order of operations gives the same bits. NaN bytes stay NaN (a token reading a
non-finite value has an unspecified result, SPEC §2.7).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..validation import check_tensor, fail

HEAD_DIM = 512  # D_qk = d_v of every record
ROWS = "rows"  # kv is [S, D_qk] rows of q's dtype (the format before records)


@dataclass(frozen=True)
class RecordFormat:
    """One paged record layout: ``name`` (the ``kv_format`` value), ``record_bytes`` (bytes per
    token, ``kv.shape[2]``), ``fp8_flavours`` (the flavours its e4m3 bytes may carry; the first is
    the only one when the format fixes it), ``alignment`` (vLLM rounds a page up to a multiple of
    it), ``code`` (the kernels' constexpr)."""

    name: str
    record_bytes: int
    fp8_flavours: tuple[str, ...]
    alignment: int
    code: int
    what: str

    @property
    def fp8_fixed(self) -> bool:
        """The format fixes its flavour (NVFP4's scales are OCP e4m3): ``fp8`` may be omitted."""
        return len(self.fp8_flavours) == 1


#: FP8 flavour name -> (torch dtype of its e4m3 bytes, the largest magnitude vLLM's writers use).
FP8_FLAVOURS: dict[str, tuple[torch.dtype, float]] = {
    "e4m3fn": (torch.float8_e4m3fn, 448.0),  # OCP (CUDA, gfx950, every compressed cache)
    "e4m3fnuz": (torch.float8_e4m3fnuz, 224.0),  # FNUZ (gfx942's SWA cache; vLLM scales to 224, not 240)
}

FORMATS: dict[str, RecordFormat] = {f.name: f for f in (
    RecordFormat("v4_fp8", 584, ("e4m3fn", "e4m3fnuz"), 576, 1,
                 "V4 fp8_ds_mla: 448 e4m3 + 64 bf16 RoPE per token, then the page's UE8M0 scales (7 per token)"),
    RecordFormat("v41_mxfp8", 528, ("e4m3fn", "e4m3fnuz"), 512, 2,
                 "V4.1 MXFP8: 512 e4m3 + 16 UE8M0 scales per token (interleaved)"),
    RecordFormat("v41_nvfp4", 288, ("e4m3fn",), 512, 3,
                 "V4.1 NVFP4: 512 e2m1 (two per byte) + 32 OCP e4m3 scales per token (interleaved)"),
)}
#: Every ``kv_format`` value ``sparse_mla`` takes.
KV_FORMATS: tuple[str, ...] = (ROWS, *FORMATS)


def check_format(op: str, kv_format, fp8) -> RecordFormat | None:
    """``kv_format`` one of :data:`KV_FORMATS`; ``fp8`` None for rows, a flavour of the format
    otherwise (required where the format has two: a wrong guess is a silent factor of 2).
    Returns the record format (None for rows)."""
    if not isinstance(kv_format, str) or kv_format not in KV_FORMATS:
        fail(op, "kv_format", kv_format, f"one of {KV_FORMATS}")
    if fp8 is not None and (not isinstance(fp8, str) or fp8 not in FP8_FLAVOURS):
        fail(op, "fp8", fp8, f"None or one of {tuple(FP8_FLAVOURS)} (the cache's FP8 flavour)")
    if kv_format == ROWS:
        if fp8 is not None:
            fail(op, "fp8", fp8, "None with kv_format='rows' (rows are not FP8; fp8 names a record cache's flavour)")
        return None
    fmt = FORMATS[kv_format]
    if fp8 is None and not fmt.fp8_fixed:
        fail(op, "fp8", fp8, f"one of {fmt.fp8_flavours} for kv_format={kv_format!r}: the flavour the cache was "
                             "written in (per cache: vLLM's gfx942 SWA cache is 'e4m3fnuz', compressed caches "
                             "'e4m3fn')")
    if fp8 is not None and fp8 not in fmt.fp8_flavours:
        fail(op, "fp8", fp8, f"one of {fmt.fp8_flavours} for kv_format={kv_format!r} ({fmt.what})")
    return fmt


def flavour(fmt: RecordFormat, fp8: str | None) -> str:
    """The flavour a call reads (``fp8``, or the one the format fixes)."""
    return fp8 if fp8 is not None else fmt.fp8_flavours[0]


def block_stride(kv: torch.Tensor) -> int:
    """Bytes from one page to the next (``stride(0)``; any value for a single page)."""
    nb, bs, R = kv.shape
    return kv.stride(0) if nb > 1 else bs * R


def num_slots(kv: torch.Tensor) -> int:
    return kv.shape[0] * kv.shape[1]


def check_cache(op: str, kv, fmt: RecordFormat, device: torch.device) -> None:
    """The record cache view: uint8 ``[num_blocks, block_size, record_bytes]`` on ``device``,
    ``record_bytes`` of the format, ``stride(2) == 1``, ``stride(1) == record_bytes``, a block
    stride of at least one page (``block_size * record_bytes``), slots that fit int32, and (V4)
    2-byte alignment of its pages (the RoPE dims are bf16). No device work."""
    R = fmt.record_bytes
    if isinstance(kv, torch.Tensor) and kv.dtype != torch.uint8:
        fail(op, "kv", kv, f"a uint8 record cache [num_blocks, block_size, {R}] for kv_format={fmt.name!r} "
                           f"(vLLM's k_cache view; dtype {kv.dtype} is not record bytes)")
    check_tensor(op, "kv", kv, dtypes=torch.uint8, ndim=3, device=device)
    nb, bs, r = kv.shape
    if r != R:
        fail(op, "kv", kv, f"{R} bytes per record (shape [num_blocks, block_size, {R}]) for kv_format={fmt.name!r}; "
                           f"{r} bytes is " + _which(r))
    if bs < 1:
        fail(op, "kv", kv, "a block size (shape[1]) >= 1")
    if kv.stride(2) != 1 or (bs > 1 and kv.stride(1) != R):
        fail(op, "kv", f"tensor with strides {tuple(kv.stride())}",
             f"stride(2) == 1 and stride(1) == {R} (each page's records packed; stride(0) is the block stride)")
    stride = block_stride(kv)
    if stride < bs * R:
        fail(op, "kv", f"tensor with block stride (stride(0)) {stride}",
             f"a block stride >= block_size * record_bytes = {bs} * {R} = {bs * R} (pages must not overlap)")
    if nb * bs > 2**31 - 1:
        fail(op, "kv", kv, f"num_blocks * block_size <= {2**31 - 1} (slots are int32)")
    if fmt.name == "v4_fp8" and kv.numel() and (kv.data_ptr() % 2 or stride % 2):
        fail(op, "kv", f"tensor at byte address {kv.data_ptr()} with block stride {stride}",
             "an even start address and block stride (each V4 record carries bf16 RoPE dims)")


def _which(r: int) -> str:
    names = [f.name for f in FORMATS.values() if f.record_bytes == r]
    return f"kv_format={names[0]!r}" if names else "no known record format"


# ---------------------------------------------------------------------------------------
# the torch reader and writer
# ---------------------------------------------------------------------------------------


def pages(kv: torch.Tensor) -> torch.Tensor:
    """``[num_blocks, block_size * record_bytes]`` uint8 view of the pages (same storage): a page's
    bytes, addressed as vLLM's kernels address them (``page + offset``)."""
    nb, bs, R = kv.shape
    return kv.as_strided((nb, bs * R), (block_stride(kv), 1))


def _bytes(page_view: torch.Tensor, blk: torch.Tensor, start: torch.Tensor, n: int) -> torch.Tensor:
    """``[N, n]``: bytes ``start .. start+n`` of pages ``blk`` (int64 [N] each)."""
    cols = start[:, None] + torch.arange(n, device=start.device)
    return page_view[blk[:, None], cols]


def _fp8(u8: torch.Tensor, fp8: str) -> torch.Tensor:
    return u8.contiguous().view(FP8_FLAVOURS[fp8][0]).float()


def _ue8m0(codes: torch.Tensor) -> torch.Tensor:
    return torch.exp2(codes.float() - 127.0)


#: e2m1 value of each 4-bit code (bit 3 the sign).
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize(kv: torch.Tensor, slots: torch.Tensor, kv_format: str, fp8: str | None = None) -> torch.Tensor:
    """``[N, 512]`` bf16: the records of ``slots`` (int [N], each in ``[0, num_blocks*block_size)``)
    dequantized exactly as vLLM's gathers do (see the module docstring)."""
    fmt = FORMATS[kv_format]
    fl = flavour(fmt, fp8)
    n = slots.numel()
    if n == 0:
        return torch.empty(0, HEAD_DIM, dtype=torch.bfloat16, device=kv.device)
    bs = kv.shape[1]
    s = slots.reshape(-1).to(torch.int64)
    blk, off = s // bs, s % bs
    pv = pages(kv)
    if fmt.name == "v4_fp8":
        data = _bytes(pv, blk, off * 576, 576)
        codes = _bytes(pv, blk, bs * 576 + off * 8, 7)
        nope = _fp8(data[:, :448], fl).view(n, 7, 64) * _ue8m0(codes)[..., None]
        rope = data[:, 448:].contiguous().view(torch.bfloat16)
        return torch.cat([nope.reshape(n, 448).to(torch.bfloat16), rope], dim=1)
    rec = _bytes(pv, blk, off * fmt.record_bytes, fmt.record_bytes)
    if fmt.name == "v41_mxfp8":
        vals = _fp8(rec[:, :512], fl).view(n, 16, 32) * _ue8m0(rec[:, 512:])[..., None]
        return vals.reshape(n, HEAD_DIM).to(torch.bfloat16)
    packed = rec[:, :256].to(torch.int64)
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(n, HEAD_DIM)  # element 2i: low nibble
    vals = torch.tensor(E2M1, device=kv.device)[codes].view(n, 32, 16)
    return (vals * _fp8(rec[:, 256:], "e4m3fn")[..., None]).reshape(n, HEAD_DIM).to(torch.bfloat16)


def _ue8m0_quant(x: torch.Tensor, tile: int, fp8: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [N, n*tile]`` fp32 -> (e4m3 bytes [N, n*tile], UE8M0 codes [N, n]): vLLM's writer,
    ``amax = max(max|x|, 1e-4)``, ``e = ceil(log2(amax / max))``, ``q = clamp(x * 2**-e, +-max)``
    (round to nearest even), ``code = e + 127`` clamped to [0, 255]."""
    dtype, top = FP8_FLAVOURS[fp8]
    N = x.shape[0]
    t = x.view(N, -1, tile)
    amax = t.abs().amax(dim=-1).clamp_min(1e-4)
    e = torch.ceil(torch.log2(amax / top))
    q = (t * torch.exp2(-e)[..., None]).clamp(-top, top).to(dtype).view(torch.uint8)
    return q.reshape(N, -1), (e + 127.0).clamp(0, 255).to(torch.uint8)


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code of each value (ties to even, saturating at 6, the sign kept): what
    ``cvt.rn.satfinite.e2m1x2.f32`` does."""
    grid = torch.tensor(E2M1[:8], device=x.device)
    a = x.abs().clamp(max=6.0)
    dist = (a[..., None] - grid).abs()
    best = dist.min(dim=-1, keepdim=True).values
    ties = dist == best
    # among equally near magnitudes prefer the even code (mantissa bit 0 clear)
    even = ties & (torch.arange(8, device=x.device) % 2 == 0)
    mag = torch.where(even.any(dim=-1), even.to(torch.int64).argmax(dim=-1), ties.to(torch.int64).argmax(dim=-1))
    return mag | (torch.signbit(x).to(torch.int64) << 3)


def quantize(rows: torch.Tensor, kv_format: str, fp8: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows [N, 512]`` (bf16) -> ``(data [N, a] uint8, scales [N, b] uint8)``, one token's record
    in two parts as vLLM's writers produce them (V4: ``a = 576`` data bytes incl. the bf16 RoPE,
    ``b = 8`` codes incl. the pad byte; V4.1: the record's two halves). NVFP4 follows vLLM's
    ``_rope_quant_insert_nvfp4_kernel``: ``scale = e4m3(clamp(amax / 6, 2**-9, 448))``,
    ``q = e2m1(x / scale)``."""
    fmt = FORMATS[kv_format]
    fl = flavour(fmt, fp8)
    x = rows.to(torch.bfloat16).float()
    N = x.shape[0]
    if fmt.name == "v4_fp8":
        q, codes = _ue8m0_quant(x[:, :448], 64, fl)
        rope = rows[:, 448:].to(torch.bfloat16).contiguous().view(torch.uint8)
        pad = torch.zeros(N, 1, dtype=torch.uint8, device=rows.device)
        return torch.cat([q, rope], dim=1), torch.cat([codes, pad], dim=1)
    if fmt.name == "v41_mxfp8":
        return _ue8m0_quant(x, 32, fl)
    t = x.view(N, 32, 16)
    scale = (t.abs().amax(dim=-1) / 6.0).clamp(2.0**-9, 448.0).to(torch.float8_e4m3fn)
    codes = _e2m1_codes(t / scale.float()[..., None]).reshape(N, HEAD_DIM)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, scale.view(torch.uint8)


def new_cache(num_blocks: int, block_size: int, kv_format: str, *, block_stride: int | None = None,
              device=None, fill: int = 0) -> torch.Tensor:
    """A zeroed (``fill``) record cache as vLLM lays one out: a ``[num_blocks, block_stride]``
    buffer viewed ``[num_blocks, block_size, record_bytes]``; ``block_stride`` defaults to one
    page rounded up to the format's alignment (vLLM's page padding)."""
    fmt = FORMATS[kv_format]
    page = block_size * fmt.record_bytes
    stride = block_stride if block_stride is not None else -(-page // fmt.alignment) * fmt.alignment
    if stride < page:
        fail("new_cache", "block_stride", stride, f">= block_size * record_bytes = {page}")
    buf = torch.full((num_blocks, stride), fill, dtype=torch.uint8, device=device)
    return buf.as_strided((num_blocks, block_size, fmt.record_bytes), (stride, fmt.record_bytes, 1))


def write(kv: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, kv_format: str, fp8: str | None = None) -> None:
    """Quantize ``rows [N, 512]`` and store them at ``slots`` (PAD -1 skipped) of the record cache
    ``kv``, in vLLM's page layout (:func:`quantize`, then the format's addresses)."""
    fmt = FORMATS[kv_format]
    s = slots.reshape(-1).to(torch.int64)
    keep = s >= 0
    s, rows = s[keep], rows[keep]
    if s.numel() == 0:
        return
    data, scales = quantize(rows, kv_format, fp8)
    bs = kv.shape[1]
    blk, off = s // bs, s % bs
    pv = pages(kv)

    def put(start, values):
        pv[blk[:, None], start[:, None] + torch.arange(values.shape[1], device=kv.device)] = values

    if fmt.name == "v4_fp8":
        put(off * 576, data)
        put(bs * 576 + off * 8, scales)
    else:
        put(off * fmt.record_bytes, torch.cat([data, scales], dim=1))
