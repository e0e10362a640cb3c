"""The range checks of a validated call as one device pass that leaves its verdict in a word.

For the ops whose validators test large tensors for ranges only (``plain_indices``' index rows,
``gather_rows`` / ``scatter_rows``' row ids), a kernel of its own would have to read all of them in
every program to know the call's verdict before it stores (what the self-checking kernels of the
small ops do). Instead one pass tests every value of up to :data:`ITEMS` tensors, a tile per
program; each program that finds a value outside its range sets a flag in a scratch pair of device
words, counts itself done there, and the program that counts last leaves ``PASS`` or ``FAIL`` in
the call's verdict word (``_verdict.Verdict``, per thread and stream) and zeroes the pair for the
next call. The op's kernels are launched right behind the pass and read the word first: on a
``FAIL`` they write nothing. (Atomics order the flags before the count: the last program sees every
flag.)
"""

from __future__ import annotations

import threading

import torch
import triton
import triton.language as tl

from ._device import FAIL, PASS
from ._launch import Kernel, jit
from ._verdict import Verdict, open_verdict

#: tensors one pass tests; tiles of BLOCK_R x BLOCK_C values; at most PROGRAMS programs, each taking
#: every PROGRAMS-th tile of every tensor (fewer programs count themselves done on the one scratch word)
ITEMS, BLOCK_R, BLOCK_C, PROGRAMS = 4, 8, 256, 264


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


@triton.jit
def _item_bad(ptr, R, C, S, low, high, P, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's tiles of one item (every ``P``-th, from its own id) have a value out of range."""
    tiles = ((R + BLOCK_R - 1) // BLOCK_R) * ((C + BLOCK_C - 1) // BLOCK_C)
    bad = 0
    for i in range(tl.program_id(0), tiles, P):
        bad |= _tile_bad(ptr, R, C, S, low, high, i, BLOCK_R, BLOCK_C)
    return bad


@jit
def _range_check(p0, R0, C0, S0, lo0, hi0, p1, R1, C1, S1, lo1, hi1, p2, R2, C2, S2, lo2, hi2, p3, R3, C3, S3, lo3, hi3,
                 flag_ptr, scratch_ptr, P, N_ITEMS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    bad = _item_bad(p0, R0, C0, S0, lo0, hi0, P, BLOCK_R, BLOCK_C)
    if N_ITEMS > 1:
        bad |= _item_bad(p1, R1, C1, S1, lo1, hi1, P, BLOCK_R, BLOCK_C)
    if N_ITEMS > 2:
        bad |= _item_bad(p2, R2, C2, S2, lo2, hi2, P, BLOCK_R, BLOCK_C)
    if N_ITEMS > 3:
        bad |= _item_bad(p3, R3, C3, S3, lo3, hi3, P, BLOCK_R, BLOCK_C)
    if bad > 0:
        tl.atomic_or(scratch_ptr + 1, 1)
    if tl.atomic_add(scratch_ptr, 1) == P - 1:  # the last program: every flag is in
        failed = tl.atomic_xchg(scratch_ptr + 1, 0)
        tl.atomic_xchg(scratch_ptr, 0)
        tl.store(flag_ptr, tl.where(failed > 0, FAIL, PASS))


_K = Kernel(_range_check)
_local = threading.local()  # each thread's scratch pair per device (its passes are waited for in turn)
_I32 = 2**31 - 1


def check_ranges(device: torch.device, items, per_stream: bool = False) -> Verdict | None:
    """Launch the pass over ``items`` (``(tensor, low, high)``: a contiguous 1-D tensor, or a 2-D
    one whose rows are contiguous, of an integer dtype; ``high`` inclusive; at most :data:`ITEMS`)
    and return the call's verdict (its word written by the pass's last program; per stream when
    kernels queued behind the pass read it, ``per_stream``); None when no item has a value."""
    args, tiles = [], 0
    for t, low, high in items:  # (an empty one keeps its slot: the launch key is the items' dtypes)
        if t.dim() == 1:
            R, C, S = 1, t.shape[0], t.shape[0]
        else:
            (R, C), S = t.shape, t.stride(0)
        if max(R, C, S, -low, high) > _I32:  # every size and bound a 32-bit argument (the launch key)
            raise ValueError(f"check_ranges: sizes {(R, C, S)} and range [{low}, {high}]: expected 32-bit values")
        tiles = max(tiles, -(-R // BLOCK_R) * -(-C // BLOCK_C))
        args += (t, R, C, S, low, high)
    n = len(args) // 6
    if not tiles:
        return None
    key = (n, *(args[i].dtype for i in range(0, len(args), 6)))
    args += args[:6] * (ITEMS - n)  # the unused slots: never read (N_ITEMS)
    scratches = getattr(_local, "scratch", None)
    if scratches is None:
        scratches = _local.scratch = {}
    scratch = scratches.get(device)
    if scratch is None:  # zeroed again by the last program of every pass
        scratch = scratches[device] = torch.zeros(2, dtype=torch.int32, device=device)
    verdict = open_verdict(device, per_stream)
    P = min(tiles, PROGRAMS)
    _K(key, (P, 1, 1), *args, verdict.word, scratch, P, n, BLOCK_R, BLOCK_C)
    return verdict
