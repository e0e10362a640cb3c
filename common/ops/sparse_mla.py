"""``sparse_mla`` (SPEC §2.7): MQA over a shared latent KV, read through index lists.

The clamp never enters the kernel: it lives in ``indices``/``lens`` (built by the pack's
clamping index builders).

KV comes as rows (``kv_format="rows"``: ``kv [S, D_qk]`` of q's dtype, an index is a row) or as
one layer's paged DeepSeek-V4/V4.1 record cache as vLLM stores it (``kv_format`` one of
``v4_fp8`` / ``v41_mxfp8`` / ``v41_nvfp4``: ``kv`` the uint8 view ``[num_blocks, block_size,
record_bytes]``, an index is a slot ``block * block_size + offset``, ``fp8`` the cache's FP8
flavour), with the same index / length / PAD / sink contract; layouts and the dequant in
``_records.py``. ``return_lse=False`` returns ``(out, None)``: nothing computes a log-sum-exp
nobody reads (wrappers of kernels that return none skip their extra pass).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..types import INDEX_DTYPE, PAD
from ..validation import check_finite, check_int, check_range, check_tensor, fail
from . import _records
from ._records import HEAD_DIM, KV_FORMATS, ROWS
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw

NAME = "sparse_mla"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Reference works in chunks of tokens so the gathered [chunk, K, D] fp32 block stays small.
_CHUNK_BYTES = 256 * 2**20


#: The kernels take ``sm_scale * log2(e)`` as an fp32 number (base-2 softmax) and the reference
#: scales fp32 scores: a scale must stay a normal fp32 number through both (1e39 is a finite
#: Python float and inf in fp32).
LOG2E = 1.4426950408889634
SCALE_MIN = 2.0**-126
SCALE_MAX = float(torch.finfo(torch.float32).max) / LOG2E


def check_scale(sm_scale) -> None:
    """``sm_scale`` a Python int or float in ``[SCALE_MIN, SCALE_MAX]``."""
    ok = isinstance(sm_scale, (int, float)) and not isinstance(sm_scale, bool)
    if ok:
        try:
            ok = SCALE_MIN <= float(sm_scale) <= SCALE_MAX  # NaN compares False
        except OverflowError:  # an int past any float
            ok = False
    if not ok:
        fail(NAME, "sm_scale", sm_scale, f"a float in [{SCALE_MIN:.4g}, {SCALE_MAX:.4g}] (> 0 and, times log2(e), "
                                         "a normal fp32 number: the kernels scale in fp32)")


def validate(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format=ROWS, fp8=None, return_lse=True) -> None:
    fmt = _records.check_format(NAME, kv_format, fp8)
    if not isinstance(return_lse, bool):
        fail(NAME, "return_lse", return_lse, "a bool")
    if fmt is not None and isinstance(q, torch.Tensor) and q.dtype != torch.bfloat16:
        fail(NAME, "q", q, f"dtype bfloat16 with kv_format={kv_format!r} (records dequantize to bf16, as in vLLM)")
    check_tensor(NAME, "q", q, dtypes=DTYPES, ndim=3)
    T, H, D = q.shape
    dev = q.device
    if fmt is None:
        if isinstance(kv, torch.Tensor) and kv.dtype == torch.uint8 and kv.dim() == 3:
            fail(NAME, "kv", kv, f"rows [S, {D}] of {q.dtype} with kv_format='rows' (a uint8 record cache needs "
                                 f"kv_format in {KV_FORMATS[1:]} and its fp8 flavour)")
        check_tensor(NAME, "kv", kv, dtypes=q.dtype, ndim=2, device=dev)
        if kv.shape[1] != D:
            fail(NAME, "kv", kv, f"shape [S, {D}] (D_qk of q)")
        num_rows = kv.shape[0]
    else:
        if D != HEAD_DIM:
            fail(NAME, "q", q, f"head dim {HEAD_DIM} (D_qk of a {kv_format} record) in shape [T, H, {HEAD_DIM}]")
        _records.check_cache(NAME, kv, fmt, dev)
        num_rows = _records.num_slots(kv)
    check_tensor(NAME, "indices", indices, dtypes=INDEX_DTYPE, ndim=2, device=dev)
    if indices.shape[0] != T:
        fail(NAME, "indices", indices, f"{T} rows (one per query token)")
    check_tensor(NAME, "lens", lens, dtypes=INDEX_DTYPE, shape=(T,), device=dev)
    check_scale(sm_scale)
    check_int(NAME, "d_v", d_v, min_value=1)
    if fmt is not None and d_v != HEAD_DIM:
        fail(NAME, "d_v", d_v, f"{HEAD_DIM} for kv_format={kv_format!r} (value = the whole dequantized record)")
    if d_v > D:
        fail(NAME, "d_v", d_v, f"<= D_qk={D} (value = first d_v columns of kv)")
    if sink is not None:
        check_tensor(NAME, "sink", sink, dtypes=torch.float32, shape=(H,), device=dev)
        # -inf: a head without a sink (padded heads); +inf or NaN would make every row 0 or NaN
        check_finite(NAME, "sink", sink, allow_neg_inf=True)
    check_range(NAME, "lens", lens, low=0, high=indices.shape[1] + 1)
    check_range(NAME, "indices", indices, low=0, high=num_rows, allow_pad=True)


def reference(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format=ROWS, fp8=None,
              return_lse=True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(out [T, H, d_v] q.dtype, lse [T, H] fp32)``; ``lse`` is None with ``return_lse=False``.

    For token ``t``: scores ``s_j = sm_scale * q[t] . kv[indices[t, j]]`` over valid ``j``
    (``j < lens[t]`` and not PAD), in fp32; ``lse = log(sum_j exp(s_j))`` (natural log,
    sink excluded); ``out = sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink[h]))`` with
    ``v_j = kv[indices[t, j], :d_v]`` (no sink: plain softmax). No valid index: zeros and
    ``lse = -inf``. Record formats: ``kv[i]`` is slot ``i``'s record dequantized to bf16 as
    vLLM does (``_records.dequantize``).
    """
    T, H, D = q.shape
    K = indices.shape[1]
    out = torch.empty(T, H, d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    if T == 0:
        return out, (lse if return_lse else None)
    rows_of = _row_reader(kv, D, kv_format, fp8)
    chunk = max(1, _CHUNK_BYTES // max(1, K * D * 4))
    j = torch.arange(K, device=q.device)
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        idx = indices[s:e].to(torch.int64)
        ok = (j[None, :] < lens[s:e, None]) & (idx != PAD)
        if rows_of is None:  # nothing to read (validation: every entry is PAD or past lens)
            rows = torch.zeros(e - s, K, D, dtype=torch.float32, device=q.device)
        else:
            rows = rows_of(torch.where(ok, idx, 0).reshape(-1)).reshape(e - s, K, D).float()
            # rows a token does not read become exact zeros, so a NaN in an unread row (row 0
            # above) cannot leak through 0 * NaN; no host synchronisation
            rows = torch.where(ok[..., None], rows, 0.0)
        scores = torch.einsum("thd,tkd->thk", q[s:e].float(), rows) * sm_scale
        scores = scores.masked_fill(~ok[:, None, :], float("-inf"))
        l = torch.logsumexp(scores, dim=-1)  # -inf when nothing is valid
        denom = l if sink is None else torch.logaddexp(l, sink[None, :].float())
        p = torch.exp(scores - torch.where(torch.isfinite(denom), denom, 0.0)[..., None])
        p = p.masked_fill(~ok[:, None, :], 0.0)
        out[s:e] = torch.einsum("thk,tkd->thd", p, rows[..., :d_v]).to(q.dtype)
        lse[s:e] = l
    return out, (lse if return_lse else None)


def _row_reader(kv, D: int, kv_format: str, fp8):
    """``rows(ids) -> [N, D]`` reading rows or dequantizing records; None when ``kv`` holds none."""
    if kv_format == ROWS:
        return (lambda ids: kv.index_select(0, ids)) if kv.shape[0] else None
    if _records.num_slots(kv) == 0:
        return None
    return lambda ids: _records.dequantize(kv, ids, kv_format, fp8)


class _SparseMlaResults(Results):
    """``lse`` is optional in Python (``return_lse=False`` -> None); a custom op's schema returns
    a tensor there: an empty ``[0]`` fp32 one, turned back into None for the Python caller."""

    def from_python(self, result, names):
        out, lse = result
        return out, (lse if lse is not None else out.new_empty(0, dtype=torch.float32))


def _shapes(a):
    T, H = a["q"].shape[:2]
    lse = (T, H) if a.get("return_lse", True) is not False else (0,)
    return {"out": ((T, H, a["d_v"]), a["q"].dtype), "lse": (lse, torch.float32)}


RESULTS = _SparseMlaResults(
    ("out", "lse"), _shapes, out=None,
    pack=lambda t, a: (t["out"], t["lse"] if a.get("return_lse", True) is not False else None))


# ---------------------------------------------------------------------------------------
# the op's test inputs and its comparison
# ---------------------------------------------------------------------------------------


def rows_case(rng: np.random.Generator, dev, *, T: int | None = None, H: int | None = None, D: int | None = None,
              d_v: int | None = None, K: int | None = None, S: int | None = None,
              dtype: torch.dtype | None = None) -> Call:
    """A call on KV rows: random q/kv (never zeros), indices with PAD holes inside and past the
    length, tokens with nothing to read, optional sink."""
    T = T if T is not None else int(rng.integers(0, 12))
    H = H if H is not None else int(rng.choice([1, 2, 3, 8]))
    D = D if D is not None else int(rng.choice([16, 32, 48, 64]))
    d_v = d_v if d_v is not None else int(rng.choice([d for d in (16, 32, D) if d <= D]))
    K = K if K is not None else int(rng.integers(1, 70))
    S = S if S is not None else int(rng.integers(1, 300))
    dtype = dtype if dtype is not None else (torch.bfloat16 if rng.random() < 0.6 else torch.float16)
    g = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    q = torch.randn(T, H, D, generator=g).to(dtype).to(dev)
    kv = torch.randn(S, D, generator=g).to(dtype).to(dev)
    idx = torch.tensor(rng.integers(0, S, size=(T, K)), dtype=INDEX_DTYPE)
    idx[torch.tensor(rng.random((T, K)) < 0.15)] = PAD
    lens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=INDEX_DTYPE)
    if T:
        lens[torch.tensor(rng.random(T) < 0.1)] = 0
    kw = {}
    if rng.random() < 0.4:
        kw["sink"] = torch.randn(H, generator=g).to(dev)
    return (q, kv, idx.to(dev), lens.to(dev), float(1.0 / math.sqrt(D)), d_v), kw


#: How ``moving_max_case`` scales a token's KV rows by their position in its index list, tile by tile
#: (``tile`` rows): where the online softmax's running row max moves and by how much.
MOVING_MAX_PATTERNS = ("grow", "shrink", "odd_tiles_high", "even_tiles_high", "spiky")


def moving_max_case(pattern: str, dev, *, T: int, H: int, K: int, D: int = HEAD_DIM, d_v: int | None = None,
                    tile: int = 64, dtype: torch.dtype = torch.bfloat16, sink: bool = True, seed: int = 0) -> Call:
    """A call whose scores' running max moves far between tiles of ``tile`` index entries, the
    corners of an online softmax's rescaling that random data rarely reaches: every token reads
    rows ``[0, K)`` in order, row ``j`` scaled by a gain of its tile ``j // tile``:

    * ``grow``: each tile's gain 4 above the one before (the max jumps at every tile);
    * ``shrink``: the same, falling (the first tile holds the max; later ones underflow);
    * ``odd_tiles_high`` / ``even_tiles_high``: the odd (even) tiles high and rising, the others
      at 1 (the max moves within a pair of tiles, by its second (first) tile);
    * ``spiky``: one row in twenty at gain 12.

    Heads are scaled apart (0.25-1.75), so rows of a tile disagree on where their max lies;
    every 13th token reads the rows in reverse order (the max falling instead), every 7th stops
    at a random length, token 3 reads nothing and every 11th has PAD over entries
    ``[tile, 2 * tile + 2)``. ``sink``: a random sink per head."""
    if pattern not in MOVING_MAX_PATTERNS:
        raise ValueError(f"moving_max_case: pattern is {pattern!r}; expected one of {list(MOVING_MAX_PATTERNS)}")
    for name, value, least in (("T", T, 1), ("H", H, 1), ("K", K, 1), ("D", D, 1), ("tile", tile, 1)):
        if not isinstance(value, int) or value < least:
            raise ValueError(f"moving_max_case: {name} is {value!r}; expected an int >= {least}")
    if d_v is not None and not (isinstance(d_v, int) and 1 <= d_v <= D):
        raise ValueError(f"moving_max_case: d_v is {d_v!r}; expected an int in [1, D={D}]")
    d_v = D if d_v is None else d_v
    g = torch.Generator().manual_seed(seed)
    n = torch.arange(K) // tile
    if pattern == "grow":
        gain = 1.0 + 4.0 * n
    elif pattern == "shrink":
        gain = 1.0 + 4.0 * (n.max() - n)
    elif pattern == "odd_tiles_high":
        gain = torch.where(n % 2 == 1, 2.0 + 3.0 * n, 1.0)
    elif pattern == "even_tiles_high":
        gain = torch.where(n % 2 == 0, 2.0 + 3.0 * n, 1.0)
    else:
        gain = torch.where(torch.rand(K, generator=g) < 0.05, 12.0, 1.0)
    kv = (torch.randn(K, D, generator=g) * gain[:, None]).to(dtype)
    q = (torch.randn(T, H, D, generator=g) * (0.25 + 1.5 * torch.rand(1, H, 1, generator=g))).to(dtype)
    idx = torch.arange(K, dtype=INDEX_DTYPE).repeat(T, 1)
    idx[::13] = idx[::13].flip(1)
    idx[5::11, tile:2 * tile + 2] = PAD
    lens = torch.full((T,), K, dtype=INDEX_DTYPE)
    lens[1::7] = torch.randint(0, K + 1, (len(range(1, T, 7)),), generator=g, dtype=INDEX_DTYPE)
    if T > 3:
        lens[3] = 0
    kw = {"sink": torch.randn(H, generator=g).to(dev)} if sink else {}
    return (q.to(dev), kv.to(dev), idx.to(dev), lens.to(dev), float(1.0 / math.sqrt(D)), d_v), kw


def records_case(rng: np.random.Generator, dev, *, kv_format: str | None = None, fp8: str | None = None,
                 T: int | None = None, H: int | None = None, K: int | None = None, block_size: int | None = None,
                 num_blocks: int | None = None, block_stride: int | None = None, sink: bool | None = None,
                 scale: float = 1.0) -> Call:
    """A ``sparse_mla`` call on a paged record cache (``_records``): random rows written as
    ``kv_format`` records with vLLM's quantizer into a cache whose every other byte is random
    garbage (page padding, block stride past the page), indices of slots with PAD holes inside
    and past the length, tokens with nothing to read, optional sink. D_qk = d_v = 512, q bf16."""
    fmt = _records.FORMATS[kv_format if kv_format is not None else str(rng.choice(list(_records.FORMATS)))]
    fp8 = fp8 if fp8 is not None else str(rng.choice(fmt.fp8_flavours))
    T = T if T is not None else int(rng.integers(0, 6))
    H = H if H is not None else int(rng.choice([1, 2, 3, 8]))
    K = K if K is not None else int(rng.integers(1, 50))
    bs = block_size if block_size is not None else int(rng.choice([1, 4, 16, 64]))
    nb = num_blocks if num_blocks is not None else int(rng.integers(1, 5)) + 64 // bs
    page = bs * fmt.record_bytes
    stride = block_stride if block_stride is not None else page + int(rng.choice([0, 0, 64, 576, 1000]))
    g = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    buf = torch.randint(0, 256, (nb, stride), generator=g, dtype=torch.uint8)  # garbage, not zeros
    kv = buf.as_strided((nb, bs, fmt.record_bytes), (stride, fmt.record_bytes, 1))
    S = nb * bs
    rows = (torch.randn(S, HEAD_DIM, generator=g) * scale).to(torch.bfloat16)
    _records.write(kv, rows, torch.arange(S), fmt.name, fp8)
    q = torch.randn(T, H, HEAD_DIM, generator=g).to(torch.bfloat16)
    idx = torch.tensor(rng.integers(0, S, size=(T, K)), dtype=INDEX_DTYPE)
    idx[torch.tensor(rng.random((T, K)) < 0.15)] = PAD
    lens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=INDEX_DTYPE)
    if T:
        lens[torch.tensor(rng.random(T) < 0.1)] = 0
    kw: dict = {"kv_format": fmt.name}
    if not fmt.fp8_fixed or rng.random() < 0.5:
        kw["fp8"] = fp8
    if sink if sink is not None else rng.random() < 0.4:
        kw["sink"] = torch.randn(H, generator=g).to(dev)
    buf = buf.to(dev)
    kv = buf.as_strided((nb, bs, fmt.record_bytes), (stride, fmt.record_bytes, 1))
    return (q.to(dev), kv, idx.to(dev), lens.to(dev), float(1.0 / math.sqrt(HEAD_DIM)),
            HEAD_DIM), kw


def case(d: CaseDraw) -> Call:
    """One call in four reads a paged record cache (every format and flavour), one in five asks
    for no lse."""
    rng = d.rng
    if rng.random() < 0.25:
        args, kw = records_case(rng, d.device)
    else:
        args, kw = rows_case(rng, d.device)
    if rng.random() < 0.2:
        kw["return_lse"] = False
    return args, kw


def compare(got, want, rtol: float = 1e-2) -> str | None:
    """None when ``got`` matches the reference's ``want``: ``||out - want|| / ||want|| <= rtol``,
    lse within ``10 rtol`` where finite and ``-inf`` at the same tokens, no NaN."""
    (o, l), (wo, wl) = got, want
    if wl is None or l is None:  # return_lse=False: (out, None)
        if l is not None or wl is not None:
            return f"lse {'None' if l is None else 'a tensor'}, expected {'None' if wl is None else 'a tensor'}"
        l, wl = torch.zeros(o.shape[:2]), torch.zeros(wo.shape[:2])
    o, l = o.float().cpu(), l.float().cpu()
    wo, wl = wo.float().cpu(), wl.float().cpu()
    if o.shape != wo.shape or l.shape != wl.shape:
        return f"shape {tuple(o.shape)}/{tuple(l.shape)} != {tuple(wo.shape)}/{tuple(wl.shape)}"
    if torch.isnan(o).any() or torch.isnan(l).any():
        return "NaN in the output"
    if not torch.equal(torch.isneginf(l), torch.isneginf(wl)):
        return "lse = -inf at different tokens"
    fin = torch.isfinite(wl)
    err_o = (o - wo).norm() / wo.norm().clamp_min(1e-6)
    err_l = (l[fin] - wl[fin]).abs().max().item() if fin.any() else 0.0
    if err_o > rtol or err_l > rtol * 10:
        return f"relative error {float(err_o):.3g} (out), max |dlse| {err_l:.3g}"
    return None


# its kernels compile in their own warmup hooks (``Variant.warmup``): nothing per call here
OP = OpSpec(NAME, reference, validate, RESULTS, scalars={"sm_scale": "float", "d_v": "int", "kv_format": "str",
                                                         "fp8": "str", "return_lse": "bool"},
            case=case, compare=compare, index_layout="plain",
            gate="swa_backends.kernels.sparse_mla_check:gate")
