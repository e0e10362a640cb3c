"""``prefill_gather_lens`` (SPEC §2.5) in Triton: one lane per request."""

from __future__ import annotations

import torch
import triton.language as tl

from ..common.types import INDEX_DTYPE
from ._launch import Kernel, contiguous, jit

BLOCK = 256


@jit
def _prefill_gather_lens(qsl_ptr, seq_ptr, rs_ptr, out_ptr, B, W, BLOCK: tl.constexpr):
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


_K = Kernel(_prefill_gather_lens)
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
