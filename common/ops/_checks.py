"""Validation pieces several ops share (kept here so variants never copy them)."""

from __future__ import annotations

import numpy as np
import torch

from ..types import INDEX_DTYPE, MAX_POSITION, MAX_WINDOW, SLOT_DTYPE
from ..validation import (
    INT32_MAX,
    Reduced,
    first_true,
    check_int,
    check_query_start_loc,
    check_range,
    check_tensor,
    checked_before,
    defer,
    fail,
    host_range,
    readable,
    reads_whole,
    to_host,
    value_checks_enabled,
)


def check_extents(op: str, name: str, t: torch.Tensor) -> None:
    """Every size of ``t`` at most ``MAX_POSITION`` and every stride at most ``INT32_MAX``
    elements (SPEC §0 Limits). The Triton kernels take both as 32-bit launch arguments (from
    2**31 on Triton types an argument i64, which the compiled kernel cached for the op's
    launch key, ``kernels/_launch.py``, does not take) and walk a dimension in 32-bit lane
    indices ``program * BLOCK + lane``, which must not wrap past its end. An offset inside a
    tensor may pass 2**31: the kernels compute index times stride in int64."""
    if max(t.shape, default=0) > MAX_POSITION or max(t.stride(), default=0) > INT32_MAX:
        fail(op, name, f"sizes {tuple(t.shape)}, strides {tuple(t.stride())}",
             f"sizes <= MAX_POSITION={MAX_POSITION} and strides <= {INT32_MAX} elements (32-bit kernel arguments)")


def check_index_rows(op: str, name: str, t: torch.Tensor) -> None:
    """Index rows ``[T, width]``: sizes and strides as :func:`check_extents`, a width of at
    most ``MAX_WINDOW`` (SPEC §0 Limits: index widths)."""
    check_extents(op, name, t)
    if t.shape[1] > MAX_WINDOW:
        fail(op, name, t, f"at most MAX_WINDOW={MAX_WINDOW} columns (an index width)")


def check_slab_fits(op: str, slab_stride: int, window_offset: int, longest) -> None:
    """A combined-layout slab holds its request's window part: ``window_offset`` plus the
    largest gather length (``longest``, SPEC §2.5) at most ``slab_stride`` columns."""
    need = int(longest) + window_offset
    if need > slab_stride:
        fail(op, "slab_stride", slab_stride, f">= window_offset + the largest gather length = {need}")


#: check_batch's default for an argument its op does not take (a None the caller passed is refused)
_NOT_TAKEN = object()


def check_batch(op: str, query_start_loc, seq_lens=_NOT_TAKEN, replay_start=_NOT_TAKEN, *,
                num_tokens: int | None = None, from_zero: bool = True) -> int:
    """``query_start_loc`` int32 [B+1] (+ ``seq_lens``/``replay_start`` int32 [B] on its device,
    where the op takes them: passed, each must be a tensor, None included).
    ``from_zero=False``: ``query_start_loc`` may start above 0 (see :func:`check_query_start_loc`).

    Returns B. Value checks: monotonic ``query_start_loc`` ending at most at ``num_tokens``,
    ``seq_lens >= q`` (a request's KV includes its own queries), ``replay_start >= 0``.
    """
    check_tensor(op, "query_start_loc", query_start_loc, dtypes=INDEX_DTYPE, ndim=1)
    check_extents(op, "query_start_loc", query_start_loc)
    B = query_start_loc.shape[0] - 1
    if B < 0:
        fail(op, "query_start_loc", query_start_loc, "shape [B+1] (at least one element)")
    dev = query_start_loc.device
    if seq_lens is _NOT_TAKEN:
        seq_lens = None
    else:
        check_tensor(op, "seq_lens", seq_lens, dtypes=INDEX_DTYPE, shape=(B,), device=dev)
    if replay_start is _NOT_TAKEN:
        replay_start = None
    else:
        check_tensor(op, "replay_start", replay_start, dtypes=INDEX_DTYPE, shape=(B,), device=dev)
    check_query_start_loc(op, query_start_loc, num_tokens=num_tokens, from_zero=from_zero)
    if value_checks_enabled() and B > 0 and (seq_lens is not None or replay_start is not None):
        reads = [("query_start_loc", query_start_loc)]
        reads += [("seq_lens", seq_lens)] if seq_lens is not None else []
        reads += [("replay_start", replay_start)] if replay_start is not None else []

        def test(qsl: np.ndarray, *rest: np.ndarray) -> None:
            if seq_lens is not None:
                seq, q = rest[0].astype(np.int64), np.diff(qsl.astype(np.int64))
                short = seq < q
                if short.any():
                    i = first_true(short)
                    fail(op, "seq_lens", f"seq_lens[{i}]={int(seq[i])}", f">= the query length {int(q[i])} of request {i}")
                host_range(op, "seq_lens", seq, low=0, high=MAX_POSITION + 1)
            if replay_start is not None:
                host_range(op, "replay_start", rest[-1], low=0, high=MAX_POSITION + 1)

        defer(op, reads, test)
    return B


def check_window(op: str, name: str, W, *, min_value: int = 1) -> int:
    """A window, replay length or block size: ``min_value <= W <= MAX_WINDOW``."""
    return check_int(op, name, W, min_value=min_value, max_value=MAX_WINDOW, why="MAX_WINDOW")


def check_positions(op: str, positions: torch.Tensor) -> None:
    """Token positions in ``[0, MAX_POSITION]`` (the kernels add windows to them in int32)."""
    check_range(op, "positions", positions, low=0, high=MAX_POSITION + 1)


def check_block_table(op: str, block_table, B: int, device) -> None:
    check_tensor(op, "block_table", block_table, dtypes=INDEX_DTYPE, ndim=2, device=device)
    check_extents(op, "block_table", block_table)
    if block_table.shape[0] < B:
        fail(op, "block_table", block_table, f"at least {B} rows (one per request)")


def check_block_table_covers(op: str, block_table, seq_lens, block_size: int, *, slots_per_block: int | None = None,
                             name: str = "block_table", covers: str = "seq_len {n} with block_size {bs}") -> None:
    """Every position a request may read (``< seq_len``) has a column in the block table, and
    every entry such a position reads is a block id ``>= 0`` whose slots fit in int32:
    ``entry * slots_per_block + slots_per_block - 1 <= INT32_MAX`` (``slots_per_block``:
    ``block_size``, or ``block_size // ratio`` for a compressed cache). Entries no position
    reads (past a request's length, rows past B) are not looked at. A large table travels as
    the min and max of the entries read. ``name``: the table's argument, for the errors;
    ``covers``: what a too-narrow table fails to cover (``{n}``: the longest, ``{bs}``: block_size)."""
    spb = block_size if slots_per_block is None else slots_per_block
    if (not value_checks_enabled() or seq_lens.numel() == 0
            or checked_before(op, "covers", block_table, seq_lens, block_size, spb)):
        return
    B, cols = seq_lens.shape[0], block_table.shape[1]
    top = (INT32_MAX - spb + 1) // spb  # the largest block id whose slots fit
    table = block_table[:B]
    readable(op, name, table)
    small = reads_whole(table)
    if small:
        reads = ((name, table),)
    else:
        # column c holds positions [c * block_size, ...): read by a request when c * block_size < seq_len
        reads = ((name, Reduced(table, limit=seq_lens, step=block_size)),)

    def test(seq: np.ndarray, *table_values: np.ndarray) -> None:
        need = (seq.astype(np.int64) + block_size - 1) // block_size
        if int(need.max()) > cols:
            fail(op, name, block_table, f"at least {int(need.max())} columns to cover "
                                        + covers.format(n=int(seq.max()), bs=block_size))
        if int(need.max()) <= 0:
            return
        if not small:
            lo, hi = table_values[0]
            if int(lo) >= 0 and int(hi) <= top:
                return
            table_values = (to_host([table])[0],)
        entries = table_values[0].astype(np.int64)
        bad = (np.arange(cols)[None, :] < need[:, None]) & ((entries < 0) | (entries > top))
        if bad.any():
            b, c = divmod(first_true(bad.reshape(-1)), cols)
            fail(op, name, f"{name}[{b}, {c}]={int(entries[b, c])}",
                 f"a block id >= 0 whose slots fit in int32 (id * {spb} + {spb - 1} <= {INT32_MAX})")

    defer(op, (("seq_lens", seq_lens), *reads), test)


def check_slot_mappings(op: str, slot_mappings, device, num_tokens: int) -> int:
    check_tensor(op, "slot_mappings", slot_mappings, dtypes=SLOT_DTYPE, ndim=2, device=device)
    check_extents(op, "slot_mappings", slot_mappings)
    if slot_mappings.shape[1] < num_tokens:
        fail(op, "slot_mappings", slot_mappings, f"at least {num_tokens} columns (one per token)")
    return slot_mappings.shape[0]
