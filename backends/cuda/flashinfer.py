"""``sparse_mla`` through FlashInfer's DeepSeek-V4 sparse-MLA decode (SM10x and SM12x).

Vendor call (``flashinfer.mla.trtllm_batch_decode_sparse_mla_dsv4``, flashinfer-python with
the SM120 sparse path; earlier builds have the SM10x arguments only)::

    trtllm_batch_decode_sparse_mla_dsv4(query, swa_kv_cache, workspace_buffer, sparse_indices,
        compressed_kv_cache=None, sparse_topk_lens=None, seq_lens=None, out=None,
        bmm1_scale=1.0, bmm2_scale=1.0, sinks=None, kv_layout="HND", cum_seq_lens_q=None,
        max_q_len=None, enable_pdl=None, swa_topk_lens=None, extra_sparse_indices=None,
        extra_sparse_topk_lens=None) -> out (bf16)

Facts: head dim 512 for query and both pools; query heads in {8, 16, 32, 64, 128}; output
bf16 and **no LSE**. SM100/SM103 (TRTLLM-GEN): one index matrix ``[sum_q, cap]``, ``cap >= 128``
and ``cap % 4 == 0``; the first 128 columns index ``swa_kv_cache``, the rest
``compressed_kv_cache``; ``sparse_topk_lens`` is the total active length and includes the 128
window columns (>= 128); ``seq_lens`` per request sets the valid length of the window tile as
``min(seq_lens[b] - q_len[b] + q_idx + 1, 128)``. SM120/SM121 (sparse backend): the window
segment (``sparse_indices`` + ``swa_topk_lens``) and the compressed segment
(``extra_sparse_indices`` + ``extra_sparse_topk_lens``) are separate.

Adaptation (the index matrix is the pack's *mixed* layout: 128 window columns then the top-k
part padded to 4; both segments index the same ``kv``, passed as both pools):
* SM10x: each token is its own request (``cum_seq_lens_q = 0..T``, ``max_q_len = 1``) with
  ``seq_lens = 128``, so the whole window tile is eligible and the clamp comes only from the
  indices: clamped rows carry PAD holes inside the tile, which the kernel must skip. vLLM's
  own encoder-replay path relies on the same thing (its tile length ``min(p + 1, 128)`` covers
  the PAD tail of every clamped row); not verified on SM100 hardware here;
* SM12x: both segments are compacted (valid entries first) and their counts passed as
  ``swa_topk_lens`` / ``extra_sparse_topk_lens``, so no PAD lies inside an active length;
* entries at ``j >= lens`` are set to PAD and the active length raised to >= 128, so any
  ``lens`` (even < 128) keeps the reference meaning;
* ``kv [S, 512]`` is viewed as S pages of one token (``[S, 1, 1, 512]``): a page split of a
  contiguous pool addresses the same memory, index = slot;
* heads are zero-padded to the next supported count; the LSE the kernel does not return is
  recomputed (:func:`swa_backends.backends.adapters.lse_from_indices`, an extra q.k pass) only
  with ``return_lse=True``; the serving path passes False and gets ``(out, None)``;
* the wrapper hands FlashInfer bf16 rows (``kv`` viewed as one-token pages): the variants read
  ``kv_format="rows"`` (the registry default); record caches go to the next variant.
"""

from __future__ import annotations

import torch

from ...common.types import PAD
from ..adapters import compact_rows, lse_from_indices, no_tokens, pad_heads, zero_empty_rows
from .probes import find_flashinfer_dsv4

HEADS = (8, 16, 32, 64, 128)
HEAD_DIM = 512
SWA_COLUMNS = 128  # the window tile of the DSv4 kernel
TOPK_MULTIPLE = 4
DTYPES = (torch.bfloat16,)
# vLLM's DSv4 FlashInfer backend allocates 128 MiB per device; zeroed before first use.
WORKSPACE_BYTES = 128 * 2**20
_workspaces: dict[str, torch.Tensor] = {}


def workspace(device: torch.device) -> torch.Tensor:
    key = str(device)
    ws = _workspaces.get(key)
    if ws is None:
        ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _workspaces[key] = ws
    return ws


def input_check(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None,
                return_lse=True) -> list[str]:
    why = []
    if q.shape[2] != HEAD_DIM or d_v != HEAD_DIM:
        why.append(f"FlashInfer DSv4 decode needs D_qk = d_v = {HEAD_DIM}, got {q.shape[2]} / {d_v}")
    if q.shape[1] > max(HEADS):
        why.append(f"FlashInfer DSv4 decode serves at most {max(HEADS)} heads, got {q.shape[1]}")
    K = indices.shape[1]
    if K < SWA_COLUMNS or (K - SWA_COLUMNS) % TOPK_MULTIPLE:
        why.append(f"FlashInfer DSv4 decode reads the mixed layout (128 window columns + top-k padded to "
                   f"{TOPK_MULTIPLE}), got an index width of {K}")
    return why


def _prepare(q, kv, indices, lens, sink):
    T, H, _ = q.shape
    heads = next(h for h in HEADS if H <= h)
    qp, sp = pad_heads(q, sink, heads)
    j = torch.arange(indices.shape[1], device=indices.device)
    masked = torch.where(j[None, :] < lens[:, None], indices, PAD).to(torch.int32).contiguous()
    pool = kv.view(kv.shape[0], 1, 1, kv.shape[1])
    return qp.contiguous(), sp, masked, pool


def _finish(out, q, kv, indices, lens, sm_scale, H, return_lse):
    out = out[:, :H]
    lse = lse_from_indices(q, kv, indices, lens, sm_scale) if return_lse else None
    out, lse = zero_empty_rows(out, lse, indices, lens)
    return out.to(q.dtype).contiguous(), lse


def sparse_mla_sm10x(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None,
                     return_lse=True):
    """SM100/SM103 (TRTLLM-GEN): the reference's ``(out, lse)`` (``lse`` None with
    ``return_lse=False``)."""
    T, H, _ = q.shape
    if T == 0:
        return no_tokens(q, d_v, return_lse)
    fn, why = find_flashinfer_dsv4()
    if fn is None:
        raise RuntimeError(why)
    qp, sp, masked, pool = _prepare(q, kv, indices, lens, sink)
    dev = q.device
    out = fn(qp, pool, workspace(dev), masked,
             compressed_kv_cache=pool,
             sparse_topk_lens=torch.clamp(lens, min=SWA_COLUMNS).to(torch.int32),
             seq_lens=torch.full((T,), SWA_COLUMNS, dtype=torch.int32, device=dev),
             bmm1_scale=float(sm_scale), bmm2_scale=1.0, sinks=sp, kv_layout="HND",
             cum_seq_lens_q=torch.arange(T + 1, dtype=torch.int32, device=dev), max_q_len=1)
    return _finish(out, q, kv, indices, lens, sm_scale, H, return_lse)


def sparse_mla_sm12x(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None,
                     return_lse=True):
    """SM120/SM121 (FlashInfer's sparse backend): the reference's ``(out, lse)`` (``lse`` None
    with ``return_lse=False``)."""
    T, H, _ = q.shape
    if T == 0:
        return no_tokens(q, d_v, return_lse)
    fn, why = find_flashinfer_dsv4()
    if fn is None:
        raise RuntimeError(why)
    qp, sp, masked, pool = _prepare(q, kv, indices, lens, sink)
    # Each segment is compacted (valid entries first) and its count passed as its length, so
    # no PAD lies inside an active length: nothing here relies on the kernel skipping -1.
    full = torch.full_like(lens, masked.shape[1])
    win, win_lens = compact_rows(masked[:, :SWA_COLUMNS], full)
    win = win.reshape(T, 1, SWA_COLUMNS)
    extra = extra_lens = None
    if masked.shape[1] > SWA_COLUMNS:
        extra, extra_lens = compact_rows(masked[:, SWA_COLUMNS:], full)
        extra = extra.reshape(T, 1, -1)
    # NHD [pages, page_size=1, heads=1, 512]: the same view as HND for one-token pages.
    out = fn(qp, pool, workspace(q.device), win,
             compressed_kv_cache=pool if extra is not None else None,
             bmm1_scale=float(sm_scale), bmm2_scale=1.0, sinks=sp, kv_layout="NHD",
             swa_topk_lens=win_lens, extra_sparse_indices=extra, extra_sparse_topk_lens=extra_lens)
    return _finish(out, q, kv, indices, lens, sm_scale, H, return_lse)

