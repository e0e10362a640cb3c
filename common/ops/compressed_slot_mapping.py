"""``compressed_slot_mapping`` (SPEC §2.3): where compressed caches (ratio > 1) write."""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, MAX_POSITION, MAX_WINDOW, PAD, SLOT_DTYPE
from ..validation import INT32_MAX, check_int, check_out, check_range, check_tensor, fail
from ._batch import nonempty_table, token_view
from ._checks import check_batch, check_block_table, check_block_table_covers, check_extents, check_window
from ._quick import apart, plain
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep

NAME = "compressed_slot_mapping"


def validate(token_slots, query_start_loc, seq_lens, block_table, block_size, ratio, *, null_block=0,
             out=None) -> None:
    check_tensor(NAME, "token_slots", token_slots, dtypes=SLOT_DTYPE, ndim=1)
    check_extents(NAME, "token_slots", token_slots)
    dev = token_slots.device
    T = token_slots.shape[0]
    check_tensor(NAME, "query_start_loc", query_start_loc, device=dev)
    B = check_batch(NAME, query_start_loc, seq_lens, num_tokens=T)
    check_block_table(NAME, block_table, B, dev)
    check_window(NAME, "block_size", block_size)
    check_int(NAME, "ratio", ratio, min_value=1, max_value=block_size, why="at most block_size")
    if block_size % ratio:
        fail(NAME, "ratio", ratio, f"a divisor of block_size={block_size} (compressed blocks hold block_size // ratio entries)")
    if null_block is not None:
        check_int(NAME, "null_block", null_block, min_value=0, max_value=INT32_MAX,
                  why="a block id, or None for an engine without a shared null block")
    if out is not None:
        check_out(NAME, "out", out, shape=(T,), dtype=SLOT_DTYPE, device=dev)
    # a token slot is a slot or PAD (SPEC §5): one below PAD is neither, yet would write a compressed entry
    # (ratio > 1: only PAD writes nothing) or be copied out as a slot (ratio 1)
    check_range(NAME, "token_slots", token_slots, low=0, high=None, allow_pad=True)
    if ratio > 1:
        check_block_table_covers(NAME, block_table, seq_lens, block_size, slots_per_block=block_size // ratio)


_SLOT = (SLOT_DTYPE,)
_TENSOR = torch.Tensor
_STRIDED = torch.strided


def quick_check(token_slots, query_start_loc, seq_lens, block_table, block_size, ratio, *, null_block=0,
                out=None) -> tuple | None:
    """``validate``'s host checks and ``check_writes`` for plain tensors (``OpSpec.quick_check``;
    the block table may be a slice of a wider one), written out, each tensor's facts read once;
    answered as the facts the launch takes, ``(device, T, B, table stride0, table stride1, table
    columns)``, or None."""
    t, q, s, bt = token_slots, query_start_loc, seq_lens, block_table
    if t.__class__ is not _TENSOR or q.__class__ is not _TENSOR or s.__class__ is not _TENSOR or bt.__class__ is not _TENSOR:
        return None
    if (t.dtype is not SLOT_DTYPE or q.dtype is not INDEX_DTYPE or s.dtype is not INDEX_DTYPE
            or bt.dtype is not INDEX_DTYPE or t.ndim != 1 or q.ndim != 1 or s.ndim != 1 or bt.ndim != 2):
        return None
    dev = t.device
    if q.device != dev or s.device != dev or bt.device != dev:
        return None
    if (bt.layout is not _STRIDED or not t.is_contiguous() or not q.is_contiguous() or not s.is_contiguous()
            or t.is_neg() or q.is_neg() or s.is_neg() or bt.is_neg()):
        return None
    T, B = t.numel(), q.numel() - 1
    if B < 0 or s.numel() != B or T > MAX_POSITION or B >= MAX_POSITION:
        return None
    # a tensor of one element may carry any stride (the kernels never read it): the validator
    # bounds it all the same
    if (T < 2 and t.stride(0) > INT32_MAX) or (B < 1 and q.stride(0) > INT32_MAX) or (B < 2 and s.stride(0) > INT32_MAX):
        return None
    (n, m), (s0, s1) = bt.shape, bt.stride()
    if not (B <= n <= MAX_POSITION and m <= MAX_POSITION and s0 <= INT32_MAX and s1 <= INT32_MAX
            and (n == 0 or m == 0 or ((s1 == 1 or m == 1) and (s0 >= m or n == 1)))):
        return None
    if (block_size.__class__ is not int or ratio.__class__ is not int or not 1 <= block_size <= MAX_WINDOW
            or not 1 <= ratio <= block_size or block_size % ratio
            or not (null_block is None or (null_block.__class__ is int and 0 <= null_block <= INT32_MAX))):
        return None
    if out is None or (plain(out, _SLOT, 1, dev) and out.shape[0] == T and apart(out, t, q, s, bt)):
        return dev, T, B, s0, s1, m
    return None


def reference(token_slots, query_start_loc, seq_lens, block_table, block_size, ratio, *, null_block=0,
              out=None) -> torch.Tensor:
    """int64 [T]: for token ``t`` at position ``p`` of request ``b``, a compressed entry is
    written only at closing positions ``(p + 1) % ratio == 0`` whose own token slot is not
    PAD (so replayed tokens inherit the padding), at
    ``block_table[b, (p // ratio) // bs_c] * bs_c + (p // ratio) % bs_c`` with
    ``bs_c = block_size // ratio``, unless that block is the engine's shared ``null_block``
    (vLLM's block 0: graph-capture dummy batches have all-zero block tables; None: no null
    block); everything else (and tokens past ``query_start_loc[B]``) is PAD. ``ratio == 1``
    copies ``token_slots``.
    """
    T = token_slots.shape[0]
    if out is None:
        out = torch.empty(T, dtype=SLOT_DTYPE, device=token_slots.device)
    if ratio == 1:
        return out.copy_(token_slots)
    table = nonempty_table(block_table)
    view = token_view(query_start_loc, seq_lens, T)
    bs_c = block_size // ratio
    cp = torch.div(view.pos, ratio, rounding_mode="floor")
    col = torch.div(cp, bs_c, rounding_mode="floor").clamp(0, table.shape[1] - 1)
    block = table[view.req, col]
    slot = block * bs_c + cp % bs_c
    writes = view.valid & ((view.pos + 1) % ratio == 0) & (token_slots != PAD)
    if null_block is not None:
        writes &= block != null_block
    return out.copy_(torch.where(writes, slot, torch.full_like(slot, PAD)))


RESULTS = Results(("slots",), lambda a: {"slots": ((a["token_slots"].shape[0],), SLOT_DTYPE)}, out="tensor")


def case(d: CaseDraw) -> Call:
    """A ratio dividing the block size; a fifth of the token slots PAD; the null block 0 (the
    default), none, or (a third each) a block of the table's first row (an engine whose null
    block is another id)."""
    b, t, rng = d.batch, d.tensors, d.rng
    T = b.T
    ratio = int(rng.choice([r for r in (1, 2, 4, 8, 16, 128) if b.block_size % r == 0]))
    tok = t["slot_mappings"][0, :T].clone()
    if T:
        tok[torch.tensor(rng.random(T) < 0.2, device=d.device)] = PAD
    kw = {"out": d.out((T,), SLOT_DTYPE)} if d.poison else {}
    null = int(rng.integers(0, 3))
    if null == 1:
        kw["null_block"] = None
    elif null == 2 and b.block_table.size:
        kw["null_block"] = int(b.block_table[0, int(rng.integers(0, b.block_table.shape[1]))])
    return (tok, t["query_start_loc"], t["seq_lens"], t["block_table"], b.block_size, ratio), kw


def warmup(s: WarmupStep):
    """Every compression ratio of the model (each its own kernel specialisation)."""
    for ratio in s.compress_ratios:
        if s.block_size % ratio == 0:
            yield (s.slots[0, : s.T].clone(), s.qsl, s.seq, s.block_table, s.block_size, ratio), {}


OP = OpSpec(NAME, reference, validate, RESULTS, short="cmp_slots",
            scalars={"block_size": "int", "ratio": "int", "null_block": "int?"}, case=case, warmup=warmup,
            quick_check=quick_check)
