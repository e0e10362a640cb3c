"""``indices_to_csr`` in Triton: padded index rows to CSR with every PAD dropped.

Three launches, no host synchronisation: per-row counts into ``indptr[1:]``, one program
scanning ``indptr`` in place (a running carry over blocks of 1024 rows), then the
compaction (row ``t``'s kept entries at ``indptr[t] + rank``; every element of ``values``
at or past ``indptr[T]`` is set to PAD by the program owning that position, so each
element of ``values`` is written exactly once).

A validated call runs ``indices_to_csr_checked``: checker programs in front of the counts' test
every value the validator tests (``lens`` in ``[0, K]``, every index PAD or at least 0), the counts'
programs compute their rows' counts and store them once the checkers pass (``range_check.py``), the
last checker leaves the verdict in the call's word (``_verdict.py``); the scan and the compaction
read the word first and compute nothing on a ``FAIL`` (``GATED``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.ops.indices_to_csr import quick_check
from ..common.types import INDEX_DTYPE
from ._device import FAIL, INT32_MAX, PAD
from ._launch import Kernel, contiguous, jit
from .range_check import (BLOCK_C, BLOCK_R, CHECK, GATE, flat_bad, flat_tiles, groups, open_checked, passed,
                          rows_bad, settle, tiles_of)

BLOCK_T = 16
BLOCK_K = 128
SCAN_BLOCK = 4096


@triton.jit
def _counts(idx_ptr, s0, s1, lens_ptr, indptr_ptr, T, K, tt, scratch_ptr, epoch, BLOCK_T: tl.constexpr,
            BLOCK_K: tl.constexpr, GATED: tl.constexpr, GATE: tl.constexpr, NAP: tl.constexpr):
    """Rows ``tt * BLOCK_T + [0, BLOCK_T)``. ``GATED`` (a validated call's worker): the counts are
    computed, then stored only once the checkers passed them (``range_check.passed``). Computing
    first is sound: every address read is inside the tensors whatever the values (the lengths only
    mask), so the wait overlaps the loads."""
    t = tt * BLOCK_T + tl.arange(0, BLOCK_T)
    m = t < T
    n = tl.load(lens_ptr + t, mask=m, other=0)
    count = tl.zeros([BLOCK_T], tl.int32)
    for k0 in range(0, K, BLOCK_K):
        j = k0 + tl.arange(0, BLOCK_K)[None, :]
        v = tl.load(idx_ptr + t.to(tl.int64)[:, None] * s0 + j.to(tl.int64) * s1, mask=m[:, None] & (j < K),
                    other=PAD)
        keep = (j < n[:, None]) & (v != PAD)
        count += tl.sum(keep.to(tl.int32), axis=1)
    if GATED:
        if passed(scratch_ptr, epoch, GATE, NAP):
            tl.store(indptr_ptr + 1 + t, count, mask=m)
    else:
        tl.store(indptr_ptr + 1 + t, count, mask=m)


@jit
def _csr_counts(idx_ptr, s0, s1, lens_ptr, indptr_ptr, T, K, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    _counts(idx_ptr, s0, s1, lens_ptr, indptr_ptr, T, K, tl.program_id(0), lens_ptr, 0, BLOCK_T, BLOCK_K, False, 0, 0)


@jit
def _csr_counts_checked(idx_ptr, s0, s1, lens_ptr, indptr_ptr, flag_ptr, scratch_ptr, T, K, P, P_L, epoch,
                        BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, CHECK: tl.constexpr, CHECK_R: tl.constexpr,
                        CHECK_C: tl.constexpr, GATE: tl.constexpr, NAP: tl.constexpr):
    """A validated call's counts: ``P`` checker programs test what the validator tests (``lens`` in
    ``[0, K]``, every index PAD or at least 0), the others count rows block ``pid - P`` and store
    the counts once they pass (``range_check.py``). The lengths and the index rows have checkers of
    their own (``range_check.groups``: ``P_L`` for the lengths, the rest for the rows): the rows are
    ``T x K`` values, which every program testing every value (as the lengths alone were) would
    read once per program."""
    pid = tl.program_id(0)
    if pid < P:
        if pid < P_L:
            bad = flat_bad(lens_ptr, T, 0, K, pid, P_L, CHECK)
        else:
            bad = rows_bad(idx_ptr, T, K, s0, s1, PAD, INT32_MAX, pid - P_L, P - P_L, CHECK_R, CHECK_C)
        settle(bad, P, flag_ptr, scratch_ptr, epoch, GATE)
    else:
        _counts(idx_ptr, s0, s1, lens_ptr, indptr_ptr, T, K, pid - P, scratch_ptr, epoch, BLOCK_T, BLOCK_K, True, GATE,
                NAP)


@triton.jit
def _failed(flag_ptr, GATED: tl.constexpr):
    """A gated kernel's verdict word says FAIL (the counts stored nothing)."""
    if GATED:
        return tl.load(flag_ptr) == FAIL
    return False


@jit
def _csr_scan(indptr_ptr, flag_ptr, T, BLOCK: tl.constexpr, GATED: tl.constexpr):
    if _failed(flag_ptr, GATED):
        return
    carry = tl.zeros([1], tl.int32)
    tl.store(indptr_ptr + tl.arange(0, 1), carry)
    for t0 in range(0, T, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        m = t < T
        c = tl.load(indptr_ptr + 1 + t, mask=m, other=0)
        s = tl.cumsum(c, axis=0) + carry
        tl.store(indptr_ptr + 1 + t, s, mask=m)
        carry += tl.sum(c, axis=0)


@jit
def _csr_compact(idx_ptr, s0, s1, lens_ptr, indptr_ptr, values_ptr, flag_ptr, T, K,
                 BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr):
    if _failed(flag_ptr, GATED):
        return
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    m = t < T
    n = tl.load(lens_ptr + t, mask=m, other=0)
    dest = tl.load(indptr_ptr + t, mask=m, other=0).to(tl.int64)
    total = tl.load(indptr_ptr + T).to(tl.int64)
    t64 = t.to(tl.int64)[:, None]
    for k0 in range(0, K, BLOCK_K):
        j = k0 + tl.arange(0, BLOCK_K)[None, :]
        inside = m[:, None] & (j < K)
        v = tl.load(idx_ptr + t64 * s0 + j.to(tl.int64) * s1, mask=inside, other=PAD)
        keep = (j < n[:, None]) & (v != PAD) & inside
        k32 = keep.to(tl.int32)
        rank = tl.cumsum(k32, axis=1) - 1
        tl.store(values_ptr + dest[:, None] + rank, v, mask=keep)
        dest += tl.sum(k32, axis=1)
        flat = t64 * K + j  # this program's own share of values[]: PAD past the kept total
        tl.store(values_ptr + flat, tl.full([BLOCK_T, BLOCK_K], PAD, tl.int32), mask=inside & (flat >= total))


_COUNTS = Kernel(_csr_counts)
_COUNTS_CHECKED = Kernel(_csr_counts_checked)
_SCAN = Kernel(_csr_scan)
_COMPACT = Kernel(_csr_compact)
_KEY = ()


def _launch(indices, lens, out, checked=None) -> tuple[torch.Tensor, torch.Tensor]:
    T, K = indices.shape
    dev = indices.device
    if out is None:
        out = (torch.empty(T + 1, dtype=INDEX_DTYPE, device=dev), torch.empty(T * K, dtype=INDEX_DTYPE, device=dev))
    indptr, values = out
    if T == 0 or K == 0:
        indptr.zero_()
        return out
    lens = contiguous(lens)
    t_tiles = (T + BLOCK_T - 1) // BLOCK_T
    grid = (t_tiles, 1, 1)
    s0, s1 = indices.stride(0), indices.stride(1)
    gated = checked is not None
    if gated:
        verdict, scratch, epoch, nap = checked
        flag = verdict.word
        shares = groups((flat_tiles(T), tiles_of(T, K, s0, s1)))
        P = sum(shares)
        _COUNTS_CHECKED((nap,), (P + t_tiles, 1, 1), indices, s0, s1, lens, indptr, flag, scratch, T, K, P, shares[0],
                        epoch, BLOCK_T, BLOCK_K, CHECK, BLOCK_R, BLOCK_C, GATE, nap)
    else:
        flag = indptr  # not read
        _COUNTS(_KEY, grid, indices, s0, s1, lens, indptr, T, K, BLOCK_T, BLOCK_K)
    _SCAN((gated,), (1, 1, 1), indptr, flag, T, SCAN_BLOCK, gated)
    _COMPACT((gated,), grid, indices, s0, s1, lens, indptr, values, flag, T, K, BLOCK_T, BLOCK_K, gated)
    return out


def indices_to_csr(indices, lens, *, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indptr int32 [T+1], values int32 [T*K])``: row ``t``'s kept entries (``j < lens[t]``
    and not PAD, in order) are ``values[indptr[t]:indptr[t+1]]``. ``values`` has the fixed
    upper-bound size ``T*K`` (graph-safe); entries from ``indptr[T]`` on are PAD.
    Three launches (counts, scan, compaction), no host synchronisation.
    """
    return _launch(indices, lens, out)


def indices_to_csr_checked(home, indices, lens, *, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(out, Verdict)``, whose counts' checker programs test every value the validator tests (the
    scan and the compaction behind them compute nothing on a ``FAIL``), or None for a call it does
    not take (no row or column)."""
    try:
        if not quick_check(indices, lens, out=out):
            return None
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    T, K = indices.shape
    dev = indices.device
    if T == 0 or K == 0 or (home is not None and dev != home):
        return None
    checked = open_checked(dev)
    return _launch(indices, lens, out, checked), checked[0]
