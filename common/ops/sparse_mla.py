"""``sparse_mla`` (SPEC §2.7): MQA over a shared latent KV, read through index lists.

The clamp never enters the kernel: it lives in ``indices``/``lens`` (built by the pack's
clamping index builders).
"""

from __future__ import annotations

import math

import torch

from ..types import INDEX_DTYPE, PAD
from ..validation import check_finite, check_int, check_range, check_tensor, fail
from ._results import Results

NAME = "sparse_mla"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Reference works in chunks of tokens so the gathered [chunk, K, D] fp32 block stays small.
_CHUNK_BYTES = 256 * 2**20


def validate(q, kv, indices, lens, sm_scale, d_v, *, sink=None) -> None:
    check_tensor(NAME, "q", q, dtypes=DTYPES, ndim=3)
    T, H, D = q.shape
    dev = q.device
    check_tensor(NAME, "kv", kv, dtypes=q.dtype, ndim=2, device=dev)
    if kv.shape[1] != D:
        fail(NAME, "kv", kv, f"shape [S, {D}] (D_qk of q)")
    check_tensor(NAME, "indices", indices, dtypes=INDEX_DTYPE, ndim=2, device=dev)
    if indices.shape[0] != T:
        fail(NAME, "indices", indices, f"{T} rows (one per query token)")
    check_tensor(NAME, "lens", lens, dtypes=INDEX_DTYPE, shape=(T,), device=dev)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale) or sm_scale <= 0:
        fail(NAME, "sm_scale", sm_scale, "a finite float > 0")
    check_int(NAME, "d_v", d_v, min_value=1)
    if d_v > D:
        fail(NAME, "d_v", d_v, f"<= D_qk={D} (value = first d_v columns of kv)")
    if sink is not None:
        check_tensor(NAME, "sink", sink, dtypes=torch.float32, shape=(H,), device=dev)
        # -inf: a head without a sink (padded heads); +inf or NaN would make every row 0 or NaN
        check_finite(NAME, "sink", sink, allow_neg_inf=True)
    check_range(NAME, "lens", lens, low=0, high=indices.shape[1] + 1)
    check_range(NAME, "indices", indices, low=0, high=kv.shape[0], allow_pad=True)


def reference(q, kv, indices, lens, sm_scale, d_v, *, sink=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [T, H, d_v] q.dtype, lse [T, H] fp32)``.

    For token ``t``: scores ``s_j = sm_scale * q[t] . kv[indices[t, j]]`` over valid ``j``
    (``j < lens[t]`` and not PAD), in fp32; ``lse = log(sum_j exp(s_j))`` (natural log,
    sink excluded); ``out = sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink[h]))`` with
    ``v_j = kv[indices[t, j], :d_v]`` (no sink: plain softmax). No valid index: zeros and
    ``lse = -inf``.
    """
    T, H, D = q.shape
    K = indices.shape[1]
    out = torch.empty(T, H, d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    if T == 0:
        return out, lse
    chunk = max(1, _CHUNK_BYTES // max(1, K * D * 4))
    j = torch.arange(K, device=q.device)
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        idx = indices[s:e].to(torch.int64)
        ok = (j[None, :] < lens[s:e, None]) & (idx != PAD)
        if kv.shape[0] == 0:  # nothing to read (validation: every entry is PAD or past lens)
            rows = torch.zeros(e - s, K, D, dtype=torch.float32, device=q.device)
        else:
            rows = kv.index_select(0, torch.where(ok, idx, 0).reshape(-1)).reshape(e - s, K, D).float()
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
    return out, lse


RESULTS = Results(("out", "lse"), lambda a: {"out": ((*a["q"].shape[:2], a["d_v"]), a["q"].dtype),
                             "lse": (tuple(a["q"].shape[:2]), torch.float32)}, out=None)
