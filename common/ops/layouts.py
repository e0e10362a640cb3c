"""Converters between the sparse-MLA index layouts of SPEC §2.6, so any index builder can
feed a *plain*-layout consumer (the pack's Triton kernel and the torch reference:
``indices int32 [T, K]`` of KV rows, ``lens int32 [T]``, PAD skipped wherever it sits).

What each layout needs before a plain consumer reads it:

* **combined** (FlashMLA-style prefill, :func:`~swa_backends.common.ops.combined_indices`):
  its entries are rows of a per-request *workspace* (``b * M + column``), not cache rows.
  Either attend over the workspace itself -- ``kv`` = the gathered workspace ``[B * M, D]``;
  the combined rows and lens are then already plain -- or translate them to cache rows with
  :func:`combined_to_plain` and a ``workspace_rows`` map (the KV row each workspace row holds,
  PAD where it holds nothing), built from the block tables by :func:`combined_workspace_rows`;
  then no workspace is materialised. Top-k entries that fell outside the slab are PAD
  *inside* the active length; the plain consumer skips them.
* **mixed** (FlashInfer-style, :func:`~swa_backends.common.ops.mixed_indices`): entries
  already are cache slots, and the clamped window part keeps PAD holes inside the active
  length (``lens = SWA_W + topk_len``). A consumer that skips PAD inside the length (the
  pack's) reads it unchanged. :func:`mixed_to_plain` adds per-part row offsets (window and
  compressed caches placed in one ``kv`` tensor) and by default compacts each row (valid
  entries first, in order; ``lens`` = their count), so the kernel never visits a tile of
  pure PAD and a consumer that trusts ``lens`` sees no holes.
* **csr** (AITER-style ragged rows, PAD dropped, :func:`~swa_backends.common.ops.indices_to_csr`):
  :func:`csr_to_plain` rebuilds fixed-width rows (``lens`` = row length, PAD after).

Every converter validates like an op (``ValueError`` naming argument, value and
expectation; value checks only when validation is on and no graph is being captured),
has fixed output shapes, no host synchronisation of its own, and takes ``out=``.
"""

from __future__ import annotations

import numpy as np
import torch

from ._batch import nonempty_table
from ._checks import check_batch, check_block_table, check_block_table_covers, check_slab_fits, check_window
from .prefill_gather_lens import reference as _gather_lens
from ..types import INDEX_DTYPE, PAD
from ..validation import (
    check_int,
    check_out,
    check_range,
    check_tensor,
    checks_writes,
    defer,
    fail,
    first_true,
    host_range,
    one_read,
    to_host,
    value_checks_enabled,
)

__all__ = ["combined_to_plain", "combined_workspace_rows", "compact_indices", "compact_rows", "csr_to_plain",
           "mixed_to_plain", "valid_mask"]

_INT32_MAX = 2**31 - 1


def _check_rows(op: str, indices, lens) -> tuple[int, int]:
    check_tensor(op, "indices", indices, dtypes=INDEX_DTYPE, ndim=2)
    T, K = indices.shape
    check_tensor(op, "lens", lens, dtypes=INDEX_DTYPE, shape=(T,), device=indices.device)
    return T, K


def _check_out_pair(op: str, out, T: int, K: int, device) -> None:
    if out is None:
        return
    if not isinstance(out, tuple) or len(out) != 2:
        fail(op, "out", out, "a tuple (indices, lens)")
    check_out(op, "out[0]", out[0], shape=(T, K), dtype=INDEX_DTYPE, device=device)
    check_out(op, "out[1]", out[1], shape=(T,), dtype=INDEX_DTYPE, device=device)


def _check_entries(op: str, indices) -> None:
    """Every entry a row (``>= 0``) or PAD, those past a token's length included (SPEC §5, as the
    index-building ops check theirs): a value below PAD is neither, and an offset added to it
    would make it a row."""
    check_range(op, "indices", indices, low=0, high=_INT32_MAX + 1, allow_pad=True)


def _finish(indices: torch.Tensor, lens: torch.Tensor, out):
    indices = indices.to(INDEX_DTYPE)
    lens = lens.to(INDEX_DTYPE)
    if out is None:
        return indices, lens
    out[0].copy_(indices)
    out[1].copy_(lens)
    return out


def valid_mask(indices: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """``bool [T, K]``: entry ``j`` of row ``t`` is read (``j < lens[t]`` and not PAD)."""
    j = torch.arange(indices.shape[1], device=indices.device)
    return (j[None, :] < lens.to(torch.int64)[:, None]) & (indices != PAD)


def _compact(values: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable partition per row: kept values first (in order), PAD after; and the counts."""
    T, K = values.shape
    dest = torch.where(keep, keep.to(torch.int64).cumsum(dim=1) - 1, K)  # dropped -> spare column K
    packed = torch.full((T, K + 1), PAD, dtype=torch.int64, device=values.device)
    packed.scatter_(1, dest, torch.where(keep, values.to(torch.int64), PAD))
    return packed[:, :K], keep.sum(dim=1)


def compact_rows(indices: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows int32 [T, K], counts int32 [T])``: each row's readable entries first, in their
    order, then PAD; no validation, no host synchronisation. The building block of
    :func:`compact_indices`, and of vendor wrappers whose kernels read ``indices[t, :n[t]]``
    and may not meet a PAD inside that prefix."""
    packed, count = _compact(indices, valid_mask(indices, lens))
    return packed.to(INDEX_DTYPE), count.to(INDEX_DTYPE)


# ---------------------------------------------------------------------------------------
# plain -> plain (compaction)
# ---------------------------------------------------------------------------------------


@checks_writes
def compact_indices(indices, lens, *, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, lens)`` with each row's readable entries (``j < lens``, not PAD) moved to
    the front in order, PAD after, ``lens`` = their count. Attention over the result equals
    attention over the input; fully-PAD tiles disappear from the active length."""
    op = "compact_indices"
    T, K = _check_rows(op, indices, lens)
    _check_out_pair(op, out, T, K, indices.device)
    with one_read():
        check_range(op, "lens", lens, low=0, high=K + 1)
        _check_entries(op, indices)
    packed, count = compact_rows(indices, lens)
    return _finish(packed, count, out)


# ---------------------------------------------------------------------------------------
# combined -> plain
# ---------------------------------------------------------------------------------------


@checks_writes
def combined_to_plain(indices, lens, workspace_rows, *, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Combined-layout rows (workspace rows ``b * M + column``) -> plain rows of the KV
    tensor the workspace was gathered from.

    ``workspace_rows`` int32/int64 ``[B * M]``: the KV row each workspace row holds, PAD
    where it holds nothing (see :func:`combined_workspace_rows`). Entry ``j`` of token ``t``
    becomes ``workspace_rows[indices[t, j]]`` when ``j < lens[t]`` and it is not PAD, PAD
    otherwise; ``lens`` is unchanged (holes stay inside it, as in the combined layout).
    """
    op = "combined_to_plain"
    T, K = _check_rows(op, indices, lens)
    dev = indices.device
    check_tensor(op, "workspace_rows", workspace_rows, dtypes=(torch.int32, torch.int64), ndim=1, device=dev)
    _check_out_pair(op, out, T, K, dev)
    with one_read():
        check_range(op, "lens", lens, low=0, high=K + 1)
        if value_checks_enabled() and T and K:
            read = torch.where(valid_mask(indices, lens), indices, PAD)
            check_range(op, "indices", read, low=0, high=workspace_rows.shape[0], allow_pad=True)
            check_range(op, "workspace_rows", workspace_rows, low=0, high=_INT32_MAX + 1, allow_pad=True)
    keep = valid_mask(indices, lens)
    if workspace_rows.shape[0] == 0:
        rows = torch.full((T, K), PAD, dtype=torch.int64, device=dev)
    else:
        rows = workspace_rows.to(torch.int64)[torch.where(keep, indices, 0).to(torch.int64)]
    return _finish(torch.where(keep, rows, PAD), lens, out)


@checks_writes
def combined_workspace_rows(query_start_loc, seq_lens, replay_start, W, slab_stride, window_offset,
                            block_table, block_size, *, compressed_block_table=None, ratio=0,
                            window_base=0, compressed_base=0, out=None) -> torch.Tensor:
    """int32 ``[B * M]``: the KV row held by each workspace row of the combined layout.

    Request ``b``'s slab (stride ``M = slab_stride``, window part from ``N = window_offset``):
    column ``c < N`` is compressed entry ``c`` when ``ratio > 0`` and ``c < seq_len // ratio``
    (written entries only): ``compressed_base + cbt[b, c // bs_c] * bs_c + c % bs_c`` with
    ``bs_c = block_size // ratio`` (the compressed slot of SPEC §2.3); column ``N + i`` for
    ``i < gather_len`` is the window position ``gather_start + i`` (``gather_start =
    seq_len - gather_len``, SPEC §2.5): ``window_base + block_table[b, pos // block_size] *
    block_size + pos % block_size``. Everything else is PAD. The bases place the window and
    compressed caches in one ``kv`` tensor (as ``plain_indices``' offsets do).
    """
    op = "combined_workspace_rows"
    check_tensor(op, "query_start_loc", query_start_loc, dtypes=INDEX_DTYPE, ndim=1)
    dev = query_start_loc.device
    for name, t in (("seq_lens", seq_lens), ("replay_start", replay_start)):  # required here
        check_tensor(op, name, t, dtypes=INDEX_DTYPE, ndim=1, device=dev)
    check_window(op, "W", W)
    check_int(op, "window_offset", window_offset, min_value=0)
    check_int(op, "slab_stride", slab_stride, min_value=window_offset + 1)
    check_window(op, "block_size", block_size)
    check_int(op, "ratio", ratio, min_value=0, max_value=block_size, why="block_size")
    check_int(op, "window_base", window_base, min_value=0)
    check_int(op, "compressed_base", compressed_base, min_value=0)
    with one_read():  # every value check below, and the rows' range, read at once before out= is written
        rows = _workspace_rows(op, query_start_loc, seq_lens, replay_start, W, slab_stride, window_offset,
                               block_table, block_size, compressed_block_table, ratio, window_base, compressed_base,
                               out, dev)
    rows = rows.reshape(-1).to(INDEX_DTYPE)
    if out is None:
        return rows
    return out.copy_(rows)


def _workspace_rows(op, query_start_loc, seq_lens, replay_start, W, slab_stride, window_offset, block_table, block_size,
                    compressed_block_table, ratio, window_base, compressed_base, out, dev) -> torch.Tensor:
    """:func:`combined_workspace_rows`' checks and rows (int64 ``[B, M]``), before anything is written."""
    B = check_batch(op, query_start_loc, seq_lens, replay_start)
    check_block_table(op, block_table, B, dev)
    if ratio > 0:
        if compressed_block_table is None:
            fail(op, "compressed_block_table", None, f"a block table when ratio={ratio} > 0")
        check_block_table(op, compressed_block_table, B, dev)
        if block_size % ratio:
            fail(op, "ratio", ratio, f"a divisor of block_size={block_size}")
    if B * slab_stride > _INT32_MAX:
        fail(op, "slab_stride", slab_stride, f"B * slab_stride <= 2**31 - 1 (int32 rows; B={B})")
    if out is not None:
        check_out(op, "out", out, shape=(B * slab_stride,), dtype=INDEX_DTYPE, device=dev)
    check_block_table_covers(op, block_table, seq_lens, block_size)
    if ratio > 0 and value_checks_enabled() and B:
        # the compressed entries the slab reads (c < min(N, seq_len // ratio)) have columns, and each
        # block id they read is >= 0 with slots that fit in int32: a negative id would make rows that
        # point before the compressed cache -- into the window cache when both share one kv tensor
        bs_c = block_size // ratio
        entries_read = torch.clamp(seq_lens.to(torch.int64) // ratio, max=window_offset)
        check_block_table_covers(op, compressed_block_table, entries_read, bs_c, slots_per_block=bs_c,
                                 name="compressed_block_table",
                                 covers="the {n} compressed entries a slab reads (min(seq_len // ratio, window_offset)) "
                                        "at {bs} a block")
    M, N = slab_stride, window_offset
    col = torch.arange(M, device=dev, dtype=torch.int64)[None, :]
    seq = seq_lens.to(torch.int64)[:, None]
    rows = torch.full((B, M), PAD, dtype=torch.int64, device=dev)
    if B:
        gl = _gather_lens(query_start_loc, seq_lens, replay_start, W).to(torch.int64)[:, None]
        if value_checks_enabled():  # the window part fits the slab: no position is dropped
            defer(op, (("slab_stride", gl.max()),), lambda longest: check_slab_fits(op, slab_stride, N, longest))
        i = col - N
        in_win = (i >= 0) & (i < gl)
        pos = (seq - gl + i).clamp(min=0)
        table = nonempty_table(block_table)
        blk = table.gather(1, (pos // block_size).clamp(max=table.shape[1] - 1))
        rows = torch.where(in_win, window_base + blk * block_size + pos % block_size, rows)
        if ratio > 0:
            bs_c = block_size // ratio
            ctable = nonempty_table(compressed_block_table)
            in_cmp = (col < N) & (col < seq // ratio)
            cblk = ctable.gather(1, (col // bs_c).clamp(max=ctable.shape[1] - 1).expand(B, M))
            rows = torch.where(in_cmp, compressed_base + cblk * bs_c + col % bs_c, rows)
    if value_checks_enabled() and B:
        def fits(top):
            if int(top) > _INT32_MAX:
                fail(op, "window_base, compressed_base", (window_base, compressed_base),
                     "bases with base + slot <= 2**31 - 1 (int32 rows)")

        defer(op, (("window_base, compressed_base", rows.max()),), fits)
    return rows


# ---------------------------------------------------------------------------------------
# mixed -> plain
# ---------------------------------------------------------------------------------------


@checks_writes
def mixed_to_plain(indices, lens, swa_width, *, window_offset=0, topk_offset=0, compact=True,
                   out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixed-layout rows (``swa_width`` window columns with PAD holes, then top-k) -> plain.

    Readable entries (``j < lens``, not PAD) get ``window_offset`` (``j < swa_width``) or
    ``topk_offset`` added; everything else is PAD. ``compact=True`` moves them to the front
    in order and sets ``lens`` to their count; ``compact=False`` keeps positions and lens.
    """
    op = "mixed_to_plain"
    T, K = _check_rows(op, indices, lens)
    check_int(op, "swa_width", swa_width, min_value=0)
    if swa_width > K:
        fail(op, "swa_width", swa_width, f"<= the index width {K}")
    check_int(op, "window_offset", window_offset, min_value=0)
    check_int(op, "topk_offset", topk_offset, min_value=0)
    if not isinstance(compact, bool):
        fail(op, "compact", compact, "a bool")
    _check_out_pair(op, out, T, K, indices.device)
    with one_read():
        check_range(op, "lens", lens, low=0, high=K + 1)
        _check_entries(op, indices)
        keep = valid_mask(indices, lens)
        j = torch.arange(K, device=indices.device)[None, :]
        shifted = indices.to(torch.int64) + torch.where(j < swa_width, window_offset, topk_offset)
        if value_checks_enabled() and T and K:
            def fits(top):
                if int(top) > _INT32_MAX:
                    fail(op, "window_offset, topk_offset", (window_offset, topk_offset),
                         "offsets with offset + slot <= 2**31 - 1 (int32 rows)")

            defer(op, (("indices", torch.where(keep, shifted, 0).max()),), fits)
    if compact:
        packed, count = _compact(shifted, keep)
        return _finish(packed, count, out)
    return _finish(torch.where(keep, shifted, PAD), lens, out)


# ---------------------------------------------------------------------------------------
# csr -> plain
# ---------------------------------------------------------------------------------------


@checks_writes
def csr_to_plain(indptr, values, width, *, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR ``(indptr int32 [T+1], values int32 [nnz_max])`` -> ``(indices int32 [T, width],
    lens int32 [T])``: row ``t`` is ``values[indptr[t]:indptr[t+1]]`` then PAD, ``lens`` its
    length. Inverse of ``indices_to_csr`` up to compaction (PAD dropped, order kept)."""
    op = "csr_to_plain"
    check_tensor(op, "indptr", indptr, dtypes=INDEX_DTYPE, ndim=1)
    dev = indptr.device
    if indptr.shape[0] < 1:
        fail(op, "indptr", indptr, "shape [T+1] (at least one element)")
    T = indptr.shape[0] - 1
    check_tensor(op, "values", values, dtypes=INDEX_DTYPE, ndim=1, device=dev)
    check_window(op, "width", width, min_value=0)  # an index width: the [T, width] rows are allocated
    _check_out_pair(op, out, T, width, dev)
    start = indptr[:-1].to(torch.int64)
    count = indptr[1:].to(torch.int64) - start
    if value_checks_enabled() and T >= 0:
        # the values a row reads (below indptr[-1], known on the host only after the read)
        live = torch.where(torch.arange(values.shape[0], device=dev) < indptr[-1], values, 0)
        lowest = live.min() if values.numel() else indptr[:0]

        def test(ptr, lo):
            ptr = ptr.astype(np.int64)
            first = int(ptr[0])
            if first != 0:
                fail(op, "indptr", f"indptr[0]={first}", "0")
            n = np.diff(ptr)
            if T and (n < 0).any():
                t = first_true(n < 0)
                fail(op, "indptr", f"indptr[{t}:{t + 2}]={ptr[t:t + 2].tolist()}", "non-decreasing values")
            if T and (n > width).any():
                t = first_true(n > width)
                fail(op, "width", width, f">= every row length (row {t} has {int(n[t])})")
            end = int(ptr[-1])
            if end > values.shape[0]:
                fail(op, "indptr", f"indptr[-1]={end}", f"<= values.numel()={values.shape[0]}")
            if lo.size and int(lo) < -1:  # PAD is the one value allowed below 0
                host_range(op, "values", to_host([values[:end]])[0], low=0, high=None, allow_pad=True)

        defer(op, (("indptr", indptr), ("values", lowest)), test)
    j = torch.arange(width, device=dev, dtype=torch.int64)[None, :]
    inside = j < count[:, None]
    if values.shape[0] == 0 or width == 0:
        rows = torch.full((T, width), PAD, dtype=torch.int64, device=dev)
    else:
        src = (start[:, None] + j).clamp(max=values.shape[0] - 1)
        rows = torch.where(inside, values.to(torch.int64)[src], PAD)
    return _finish(rows, count.clamp(min=0), out)
