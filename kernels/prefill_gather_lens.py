"""``prefill_gather_lens`` (SPEC §2.5) in Triton: one lane per request.

A validated call runs ``prefill_gather_lens_checked``: every program first tests every value the
validator tests (``query_start_loc`` from at least 0 and non-decreasing; ``seq_lens`` at least the
query length and in ``[0, MAX_POSITION]``; ``replay_start`` in ``[0, MAX_POSITION]``), stores
nothing when one fails and leaves the verdict in the call's word (``_verdict.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.ops.prefill_gather_lens import quick_check
from ..common.types import INDEX_DTYPE, MAX_POSITION
from ._device import CHECK, batch_bad, verdict
from ._launch import Kernel, contiguous, jit
from ._verdict import open_verdict

BLOCK = 256
#: the most requests the checked kernel takes (every program reads them all)
CHECKED_MAX = 16384


@triton.jit
def _lens(qsl_ptr, seq_ptr, rs_ptr, out_ptr, B, W, BLOCK: tl.constexpr):
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = b < B
    start = tl.load(qsl_ptr + b, mask=m, other=0).to(tl.int64)
    end = tl.load(qsl_ptr + b + 1, mask=m, other=0).to(tl.int64)
    seq = tl.load(seq_ptr + b, mask=m, other=0).to(tl.int64)
    R = tl.load(rs_ptr + b, mask=m, other=0).to(tl.int64)
    q = end - start
    R = tl.where(R <= seq - q, R, 0)  # a stale replay start (above the first position) replays nothing
    back = tl.minimum(tl.maximum(seq - q - R, 0), W - 1)
    tl.store(out_ptr + b, (q + back).to(tl.int32), mask=m)


@jit
def _prefill_gather_lens(qsl_ptr, seq_ptr, rs_ptr, out_ptr, B, W, BLOCK: tl.constexpr):
    _lens(qsl_ptr, seq_ptr, rs_ptr, out_ptr, B, W, BLOCK)


@jit
def _prefill_gather_lens_checked(qsl_ptr, seq_ptr, rs_ptr, out_ptr, flag_ptr, B, W, max_p, BLOCK: tl.constexpr,
                                 CHECK: tl.constexpr):
    bad = batch_bad(qsl_ptr, seq_ptr, rs_ptr, B, -1, max_p, False, True, True, CHECK)
    verdict(flag_ptr, bad)
    if bad == 0:
        _lens(qsl_ptr, seq_ptr, rs_ptr, out_ptr, B, W, BLOCK)


_K = Kernel(_prefill_gather_lens)
_K_CHECKED = Kernel(_prefill_gather_lens_checked)
_KEY = ()


def prefill_gather_lens(query_start_loc, seq_lens, replay_start, W, *, out=None) -> torch.Tensor:
    """int32 [B]: ``q + min(max(prefix - R, 0), W - 1)`` (a stale ``R > prefix`` counts as 0);
    the chunk gathers window KV of positions ``[seq_len - gather_len, seq_len)``. One launch."""
    B = query_start_loc.shape[0] - 1
    if out is None:
        out = torch.empty(max(B, 0), dtype=INDEX_DTYPE, device=query_start_loc.device)
    if B > 0:
        _K(_KEY, ((B + BLOCK - 1) // BLOCK, 1, 1),
           contiguous(query_start_loc), contiguous(seq_lens), contiguous(replay_start), out, B, W, BLOCK)
    return out


def prefill_gather_lens_checked(home, query_start_loc, seq_lens, replay_start, W, *, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(out, Verdict)``, or None for a call it does not take (no request; past
    :data:`CHECKED_MAX` requests)."""
    try:
        facts = quick_check(query_start_loc, seq_lens, replay_start, W, out=out)
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    if facts is None:
        return None
    dev, B = facts
    if B <= 0 or B > CHECKED_MAX or (home is not None and dev != home):
        return None
    if out is None:
        out = torch.empty(B, dtype=INDEX_DTYPE, device=dev)
    verdict = open_verdict(dev)
    # (the quick check passed: every tensor is contiguous)
    _K_CHECKED(_KEY, ((B + BLOCK - 1) // BLOCK, 1, 1), query_start_loc, seq_lens, replay_start, out, verdict.word, B, W,
               MAX_POSITION, BLOCK, CHECK)
    return out, verdict
