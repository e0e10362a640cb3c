"""``batch_replay_start`` (SPEC §2.1) in Triton: one lane per batch row."""

from __future__ import annotations

import torch
import triton.language as tl

from ..common.types import INDEX_DTYPE
from ._launch import Kernel, contiguous, jit

BLOCK = 256


@jit
def _batch_replay_start(r_ptr, idx_ptr, pre_ptr, out_ptr, B, BLOCK: tl.constexpr):
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = b < B
    i = tl.load(idx_ptr + b, mask=m, other=0).to(tl.int64)
    pre = tl.load(pre_ptr + b, mask=m, other=0) != 0
    r = tl.load(r_ptr + i, mask=m & pre, other=0)
    tl.store(out_ptr + b, tl.where(pre, r, 0).to(tl.int32), mask=m)


_K = Kernel(_batch_replay_start)


def batch_replay_start(R_per_request, idx_mapping, is_prefilling, *, out=None) -> torch.Tensor:
    """``out[b] = R_per_request[idx_mapping[b]]`` for prefilling rows, else 0 (int32 [B]).

    Pass a persistent ``out`` so a captured graph reads a stable address."""
    B = idx_mapping.shape[0]
    if out is None:
        out = torch.empty(B, dtype=INDEX_DTYPE, device=R_per_request.device)
    if B:
        _K((R_per_request.dtype, idx_mapping.dtype), ((B + BLOCK - 1) // BLOCK, 1, 1),
           contiguous(R_per_request), contiguous(idx_mapping), contiguous(is_prefilling), out, B, BLOCK)
    return out

