"""``batch_replay_start`` (SPEC §2.1) in Triton: one lane per batch row.

Two kernels: the plain one, and the one a validated call runs (``batch_replay_start_checked``),
which first tests every value the validator tests -- ``idx_mapping`` in ``[0, len(R))``,
``R_per_request`` in ``[0, MAX_POSITION]`` -- in every program (all of both arrays, so that each
program knows the whole call's verdict before it stores), writes nothing when one fails and
leaves the verdict in the call's word (``_verdict.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.ops.batch_replay_start import quick_check
from ..common.types import INDEX_DTYPE, MAX_POSITION
from ._device import CHECK, range_bad, verdict
from ._launch import Kernel, contiguous, jit
from ._verdict import open_verdict

BLOCK = 256
#: the most entries (batch rows plus requests) the checked kernel takes: every program reads them
#: all, so its work grows with their square; past this a validated call checks on the host
CHECKED_MAX = 16384


@triton.jit
def _rows(r_ptr, idx_ptr, pre_ptr, out_ptr, B, BLOCK: tl.constexpr):
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = b < B
    i = tl.load(idx_ptr + b, mask=m, other=0).to(tl.int64)
    pre = tl.load(pre_ptr + b, mask=m, other=0) != 0
    r = tl.load(r_ptr + i, mask=m & pre, other=0)
    tl.store(out_ptr + b, tl.where(pre, r, 0).to(tl.int32), mask=m)


@jit
def _batch_replay_start(r_ptr, idx_ptr, pre_ptr, out_ptr, B, BLOCK: tl.constexpr):
    _rows(r_ptr, idx_ptr, pre_ptr, out_ptr, B, BLOCK)


@jit
def _batch_replay_start_checked(r_ptr, idx_ptr, pre_ptr, out_ptr, flag_ptr, B, n_r, max_r, BLOCK: tl.constexpr,
                                CHECK: tl.constexpr):
    bad = range_bad(idx_ptr, B, 0, n_r - 1, CHECK) | range_bad(r_ptr, n_r, 0, max_r, CHECK)
    verdict(flag_ptr, bad)
    if bad == 0:
        _rows(r_ptr, idx_ptr, pre_ptr, out_ptr, B, BLOCK)


_K = Kernel(_batch_replay_start)
_K_CHECKED = Kernel(_batch_replay_start_checked)


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


def batch_replay_start_checked(home, R_per_request, idx_mapping, is_prefilling, *, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(out, Verdict)``, or None for a call it does not take (no batch row; past
    :data:`CHECKED_MAX` entries)."""
    try:
        facts = quick_check(R_per_request, idx_mapping, is_prefilling, out=out)
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    if facts is None:
        return None
    dev, B, n_r, r_dtype, i_dtype = facts
    if B == 0 or B + n_r > CHECKED_MAX or (home is not None and dev != home):
        return None
    if out is None:
        out = torch.empty(B, dtype=INDEX_DTYPE, device=dev)
    verdict = open_verdict(dev)
    # (the quick check passed: every tensor is contiguous)
    _K_CHECKED((r_dtype, i_dtype), ((B + BLOCK - 1) // BLOCK, 1, 1), R_per_request, idx_mapping, is_prefilling, out,
               verdict.word, B, n_r, MAX_POSITION, BLOCK, CHECK)
    return out, verdict
