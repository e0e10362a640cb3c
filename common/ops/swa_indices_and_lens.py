"""``swa_indices_and_lens`` (SPEC §2.4): clamped window indices per token."""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, MAX_POSITION, MAX_WINDOW, PAD, swa_lo
from ..validation import INT32_MAX, check_int, check_out, check_tensor, defer, fail, value_checks_enabled
from ._batch import live_replay_start, nonempty_table, resolve_num_tokens, token_view
from ._checks import (
    check_batch,
    check_block_table,
    check_block_table_covers,
    check_extents,
    check_window,
)
from ._quick import pair_out, plain
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep

NAME = "swa_indices_and_lens"


def validate(query_start_loc, seq_lens, block_table, block_size, W, replay_start, *,
             index_width=None, valid=None, num_tokens=None, token_offset=None, out=None) -> None:
    check_tensor(NAME, "query_start_loc", query_start_loc, dtypes=INDEX_DTYPE, ndim=1)
    dev = query_start_loc.device
    check_window(NAME, "W", W)
    check_window(NAME, "block_size", block_size)
    if num_tokens is not None:
        check_int(NAME, "num_tokens", num_tokens, min_value=0, max_value=MAX_POSITION, why="MAX_POSITION")
    if token_offset is not None:
        check_int(NAME, "token_offset", token_offset, min_value=0)
    if valid is not None:
        check_tensor(NAME, "valid", valid, dtypes=torch.bool, ndim=1, device=dev)
        check_extents(NAME, "valid", valid)
        if num_tokens is not None and valid.shape[0] != num_tokens:
            fail(NAME, "valid", valid, f"shape [{num_tokens}] (num_tokens)")
    if index_width is not None:
        check_int(NAME, "index_width", index_width, min_value=W, max_value=MAX_WINDOW, why="MAX_WINDOW")
    T = resolve_num_tokens(query_start_loc, num_tokens, valid) if num_tokens is not None or valid is not None else None
    # with token_offset the rows are a window of the batch's tokens (e.g. its decode rows):
    # the batch may extend past it
    B = check_batch(NAME, query_start_loc, seq_lens, replay_start, num_tokens=T if token_offset is None else None)
    if T is None and value_checks_enabled() and B > 0:  # the op reads T off query_start_loc, as here
        def test(qsl):
            if int(qsl[-1]) - (token_offset or 0) > MAX_POSITION:
                fail(NAME, "query_start_loc", f"query_start_loc[-1]={int(qsl[-1])}",
                     f"at most MAX_POSITION={MAX_POSITION} tokens from token_offset on (the rows the op writes)")

        defer(NAME, (("query_start_loc", query_start_loc),), test)
    check_block_table(NAME, block_table, B, dev)
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 2:
            fail(NAME, "out", out, "a tuple (indices, lens)")
        if T is None:
            fail(NAME, "num_tokens", None, "an int when out= is given (the buffers fix T)")
        width = W if index_width is None else index_width
        check_out(NAME, "out[0]", out[0], shape=(T, width), dtype=INDEX_DTYPE, device=dev)
        check_out(NAME, "out[1]", out[1], shape=(T,), dtype=INDEX_DTYPE, device=dev)
    check_block_table_covers(NAME, block_table, seq_lens, block_size)


_BOOL = (torch.bool,)
_TENSOR = torch.Tensor
_STRIDED = torch.strided


def _small_int(v, low: int, high: int) -> bool:
    return v.__class__ is int and low <= v <= high


def quick_check(query_start_loc, seq_lens, block_table, block_size, W, replay_start, *,
                index_width=None, valid=None, num_tokens=None, token_offset=None, out=None) -> tuple | None:
    """``validate``'s host checks and ``check_writes`` for plain tensors (``OpSpec.quick_check``;
    the block table may be a slice of a wider one), written out, each tensor's facts read once;
    answered as the facts the launch takes, ``(device, B, table stride0, table stride1, table
    columns)``, or None."""
    q, s, r, bt = query_start_loc, seq_lens, replay_start, block_table
    if q.__class__ is not _TENSOR or s.__class__ is not _TENSOR or r.__class__ is not _TENSOR or bt.__class__ is not _TENSOR:
        return None
    if (q.dtype is not INDEX_DTYPE or s.dtype is not INDEX_DTYPE or r.dtype is not INDEX_DTYPE
            or bt.dtype is not INDEX_DTYPE or q.ndim != 1 or s.ndim != 1 or r.ndim != 1 or bt.ndim != 2):
        return None
    dev = q.device
    if s.device != dev or r.device != dev or bt.device != dev:
        return None
    if (bt.layout is not _STRIDED or not q.is_contiguous() or not s.is_contiguous() or not r.is_contiguous()
            or q.is_neg() or s.is_neg() or r.is_neg() or bt.is_neg()):
        return None
    if not (_small_int(W, 1, MAX_WINDOW) and _small_int(block_size, 1, MAX_WINDOW)
            and (num_tokens is None or _small_int(num_tokens, 0, MAX_POSITION))
            and (token_offset is None or _small_int(token_offset, 0, INT32_MAX))
            and (index_width is None or _small_int(index_width, W, MAX_WINDOW))):
        return None
    if valid is not None and (not plain(valid, _BOOL, 1, dev)
                              or (num_tokens is not None and valid.shape[0] != num_tokens)):
        return None
    B = q.numel() - 1
    if B < 0 or B >= MAX_POSITION or s.numel() != B or r.numel() != B:
        return None
    # a tensor of one element may carry any stride (the kernels never read it): the validator
    # bounds it all the same
    if (B < 1 and q.stride(0) > INT32_MAX) or (B < 2 and (s.stride(0) > INT32_MAX or r.stride(0) > INT32_MAX)):
        return None
    (n, m), (s0, s1) = bt.shape, bt.stride()
    if not (B <= n <= MAX_POSITION and m <= MAX_POSITION and s0 <= INT32_MAX and s1 <= INT32_MAX
            and (n == 0 or m == 0 or ((s1 == 1 or m == 1) and (s0 >= m or n == 1)))):
        return None
    if out is not None:
        T = num_tokens if num_tokens is not None else (valid.shape[0] if valid is not None else None)
        if T is None:
            return None  # the validator refuses out= without num_tokens; valid alone fixes T there too
        inputs = (q, s, bt, r) + ((valid,) if valid is not None else ())
        if not pair_out(out, dev, (T, W if index_width is None else index_width), T, *inputs):
            return None
    return dev, B, s0, s1, m


def reference(query_start_loc, seq_lens, block_table, block_size, W, replay_start, *,
              index_width=None, valid=None, num_tokens=None, token_offset=None,
              out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices int32 [T, index_width], lens int32 [T])``.

    Token at position ``p``: ``lens = p - lo(p) + 1`` with ``lo(p) = max(p - W + 1, 0, R)``
    (a stale ``R``, above the request's first position ``seq_len - q``, counts as 0: SPEC §0),
    ``indices[t, j] = slot(lo(p) + j)`` for ``j < lens`` through the block table
    (``block_table[b, pos // bs] * bs + pos % bs``), PAD after. Invalid tokens (past
    ``query_start_loc[B]`` or ``valid[t]`` False): ``lens = 0``, row all PAD.
    Row ``t`` is token ``token_offset + t`` of the batch (default 0; ``valid`` is indexed by
    row). T is ``num_tokens``, else ``len(valid)``, else ``query_start_loc[-1] -
    token_offset`` (a host read).
    """
    off = token_offset or 0
    T = resolve_num_tokens(query_start_loc, num_tokens, valid, off)
    width = W if index_width is None else index_width
    dev = query_start_loc.device
    table = nonempty_table(block_table)
    view = token_view(query_start_loc, seq_lens, T, valid=valid, token_offset=off)
    R = view.take(live_replay_start(query_start_loc, seq_lens, replay_start))
    lo = swa_lo(view.pos, W, R)
    lens = torch.where(view.valid, view.pos - lo + 1, torch.zeros_like(lo))
    j = torch.arange(width, device=dev, dtype=torch.int64)
    p = lo[:, None] + j[None, :]
    live = j[None, :] < lens[:, None]
    col = torch.div(p, block_size, rounding_mode="floor").clamp(0, table.shape[1] - 1)
    slot = table[view.req[:, None], col] * block_size + p % block_size
    indices = torch.where(live, slot, torch.full_like(slot, PAD)).to(INDEX_DTYPE)
    if out is None:
        return indices, lens.to(INDEX_DTYPE)
    out[0].copy_(indices)
    out[1].copy_(lens)
    return out


def _tokens(a) -> int | None:
    """T from the metadata: num_tokens, else len(valid), else unknown (query_start_loc[-1])."""
    if a.get("num_tokens") is not None:
        return a["num_tokens"]
    return a["valid"].shape[0] if a.get("valid") is not None else None


RESULTS = Results(("indices", "lens"), lambda a: {
    "indices": ((_tokens(a), a["W"] if a.get("index_width") is None else a["index_width"]), INDEX_DTYPE),
    "lens": ((_tokens(a),), INDEX_DTYPE)})


def case(d: CaseDraw) -> Call:
    """Index widths past W, a window of the batch's tokens, a valid mask, each at times."""
    b, t, rng = d.batch, d.tensors, d.rng
    width = b.W + int(rng.integers(0, 3))
    n_tok = b.T + b.num_padded
    kw: dict = {"index_width": width, "num_tokens": n_tok}
    if rng.random() < 0.3:  # a window of the batch's tokens (vLLM's decode or prefill rows)
        off = int(rng.integers(0, n_tok + 1))
        n_tok -= off
        kw.update(num_tokens=n_tok, token_offset=off)
    if rng.random() < 0.3:
        kw["valid"] = torch.tensor(rng.random(n_tok) < 0.8, device=d.device)
    if d.poison:
        kw["out"] = (d.out((n_tok, width), INDEX_DTYPE), d.out((n_tok,), INDEX_DTYPE))
    return (t["query_start_loc"], t["seq_lens"], t["block_table"], b.block_size, b.W, t["replay_start"]), kw


def warmup(s: WarmupStep):
    """With and without a valid mask."""
    for valid in (None, s.valid):
        yield ((s.qsl, s.seq, s.block_table, s.block_size, s.W, s.R),
               dict(index_width=s.width, num_tokens=s.T_pad, valid=valid))



def case_window(d: CaseDraw) -> tuple[torch.Tensor, torch.Tensor]:
    """The window indices and lengths of a case's batch (the reference's): the input the layout
    ops (``plain_indices``, ``mixed_indices``) are drawn on."""
    b, t = d.batch, d.tensors
    return reference(t["query_start_loc"], t["seq_lens"], t["block_table"], b.block_size, b.W, t["replay_start"],
                     num_tokens=b.T)


def step_window(s: WarmupStep) -> tuple[torch.Tensor, torch.Tensor]:
    """The warmup step's window indices and lengths (the reference's): the layout ops' and
    ``indices_to_csr``'s warmup input."""
    return reference(s.qsl, s.seq, s.block_table, s.block_size, s.W, s.R, index_width=s.width, num_tokens=s.T)

OP = OpSpec(NAME, reference, validate, RESULTS, short="swa_idx",
            scalars={"block_size": "int", "W": "int", "index_width": "int", "num_tokens": "int",
                     "token_offset": "int"},
            case=case, warmup=warmup, quick_check=quick_check)
