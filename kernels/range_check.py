"""The range checks of a validated call as one device pass that leaves its verdict in a word.

For the ops whose validators test large tensors for ranges only (``plain_indices``' index rows,
``gather_rows`` / ``scatter_rows``' row ids), a kernel of its own would have to read all of them in
every program to know the call's verdict before it stores (what the self-checking kernels of the
small ops do). Instead one pass tests every value of up to :data:`ITEMS` tensors, a tile per
program; each program that finds a value outside its range sets a flag in a scratch pair of device
words, counts itself done there, and the program that counts last leaves ``PASS`` or ``FAIL`` in
the call's verdict word (``_verdict.Verdict``) and zeroes the pair for the next call. The host waits
for that word, then launches the op's plain kernel only on ``PASS``: nothing is written on a bad
value. (Atomics order the flags before the count: the last program sees every flag.)
"""

from __future__ import annotations

import threading

import torch
import triton
import triton.language as tl

from ._device import FAIL, PASS
from ._launch import Kernel, jit
from ._verdict import Verdict, open_verdict

#: tensors one pass tests; a tile of BLOCK_R x BLOCK_C values per program
ITEMS, BLOCK_R, BLOCK_C = 4, 8, 256


@triton.jit
def _tile_bad(ptr, R, C, S, low, high, i, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Tile ``i`` (row-major over ``cdiv(R, BLOCK_R) x cdiv(C, BLOCK_C)``) of rows ``ptr + r * S``
    of ``C`` values has a value outside ``[low, high]``."""
    c_tiles = (C + BLOCK_C - 1) // BLOCK_C
    r = (i // c_tiles) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = (i % c_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
    m = (r < R)[:, None] & (c < C)[None, :]
    v = tl.load(ptr + r.to(tl.int64)[:, None] * S + c[None, :], mask=m, other=low)
    return tl.max(tl.max(((v < low) | (v > high)).to(tl.int32), axis=1), axis=0)


@jit
def _range_check(p0, R0, C0, S0, lo0, hi0, p1, R1, C1, S1, lo1, hi1, p2, R2, C2, S2, lo2, hi2, p3, R3, C3, S3, lo3, hi3,
                 flag_ptr, scratch_ptr, n_programs, N_ITEMS: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_C: tl.constexpr):
    i = tl.program_id(0)
    item = tl.program_id(1)
    bad = 0
    if item == 0:
        bad = _tile_bad(p0, R0, C0, S0, lo0, hi0, i, BLOCK_R, BLOCK_C)
    if N_ITEMS > 1:
        if item == 1:
            bad = _tile_bad(p1, R1, C1, S1, lo1, hi1, i, BLOCK_R, BLOCK_C)
    if N_ITEMS > 2:
        if item == 2:
            bad = _tile_bad(p2, R2, C2, S2, lo2, hi2, i, BLOCK_R, BLOCK_C)
    if N_ITEMS > 3:
        if item == 3:
            bad = _tile_bad(p3, R3, C3, S3, lo3, hi3, i, BLOCK_R, BLOCK_C)
    if bad > 0:
        tl.atomic_or(scratch_ptr + 1, 1)
    if tl.atomic_add(scratch_ptr, 1) == n_programs - 1:  # the last program: every flag is in
        failed = tl.atomic_xchg(scratch_ptr + 1, 0)
        tl.atomic_xchg(scratch_ptr, 0)
        tl.store(flag_ptr, tl.where(failed > 0, FAIL, PASS))


_K = Kernel(_range_check)
_local = threading.local()  # each thread's scratch pair per device (its passes are waited for in turn)
_I32 = 2**31 - 1


def _rows_of(t: torch.Tensor) -> tuple[int, int, int]:
    """``(R, C, S)``: a 1-D tensor as rows of ``BLOCK_C`` values (contiguous), a 2-D one as its
    rows (``stride(1) == 1``)."""
    if t.dim() == 1:
        return 1, t.shape[0], t.shape[0]
    return t.shape[0], t.shape[1], t.stride(0)


def check_ranges(device: torch.device, items) -> Verdict | None:
    """Launch the pass over ``items`` (``(tensor, low, high)``: a contiguous 1-D tensor, or a 2-D
    one whose rows are contiguous, of an integer dtype; ``high`` inclusive; at most :data:`ITEMS`)
    and return the call's verdict (its word written by the pass's last program); None when no
    item has a value (nothing to test)."""
    items = [it for it in items if it[0].numel()]
    if not items:
        return None
    args, tiles = [], 1
    for t, low, high in items:
        R, C, S = _rows_of(t)
        if max(R, C, S, abs(low), abs(high)) > _I32:  # every size and bound a 32-bit argument (the launch key)
            raise ValueError(f"check_ranges: sizes {(R, C, S)} and range [{low}, {high}]: expected 32-bit values")
        tiles = max(tiles, ((R + BLOCK_R - 1) // BLOCK_R) * ((C + BLOCK_C - 1) // BLOCK_C))
        args += [t, R, C, S, low, high]
    for _ in range(ITEMS - len(items)):  # unused slots: never read (N_ITEMS)
        args += [items[0][0], 0, 0, 0, 0, 0]
    scratches = getattr(_local, "scratch", None)
    if scratches is None:
        scratches = _local.scratch = {}
    scratch = scratches.get(device)
    if scratch is None:  # zeroed again by the last program of every pass
        scratch = scratches[device] = torch.zeros(2, dtype=torch.int32, device=device)
    verdict = open_verdict(device)
    n = len(items)
    key = (n,) + tuple(a.dtype for a in args[::6])
    _K(key, (tiles, n, 1), *args, verdict.word, scratch, tiles * n, n, BLOCK_R, BLOCK_C)
    return verdict
