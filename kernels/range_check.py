"""Checker programs: the value checks of a validated call inside the op's own launch.

For the ops whose validators test large tensors (``plain_indices``', ``mixed_indices``' and
``indices_to_csr``'s index rows, ``gather_rows`` / ``scatter_rows``' row ids, ``gather_replay_batch``'s positions, ``prepare_replay_step``'s positions
and block table), a kernel of the small ops' kind, where every program tests every value before it
stores, would read the tensors once per program. Here the op's checked kernel has ``P`` *checker*
programs in front of its workers, in one 1-D grid (the range checks below are the shared part; an
op's checkers run its own per-request checks too):

* checker ``p < P`` tests its share of the values (every ``P``-th tile of each tensor, or of one
  tensor where each tensor has checkers of its own, :func:`groups`) and counts
  itself done, and whether one of its values is out of range, with one atomic add to the call's
  count word; the checker that counts last (the add's old value holds every other checker's
  outcome) leaves ``PASS`` or ``FAIL`` in the call's verdict word (the host's, ``_verdict.Verdict``)
  and in the *gate* word, tagged with the call's epoch, and zeroes the count for the next call;
* every other program waits until the gate word carries this call's epoch and then does its part
  of the op's work, or nothing on ``FAIL``.

Why this cannot hang: a worker waits only for checkers, which wait for nothing and have the lowest
program ids. GPUs start a grid's programs in the order of their linear id (what single-pass scans'
decoupled look-back relies on), so every checker is running or done before any worker can hold the
last free slot; Triton's interpreter runs programs one by one in that order. The epoch (a counter
of the thread's calls on that stream, kept with its verdict word) spares a reset of the gate: a
worker never reads the verdict of the call before, and two calls never share scratch words while
one runs (one set per thread, device and stream; the stream runs them in turn).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._device import CHECK, FAIL, INTERPRETED, PASS, publish
from ._verdict import Verdict, open_verdict

#: values one checker tests per tile: 1-D, ``CHECK`` in a row (the self-checking kernels' step);
#: index rows, ``BLOCK_R x BLOCK_C`` (rows x columns), or as many in a row where the rows are one run
BLOCK_R, BLOCK_C = 16, 256
#: at most this many checker programs (more values: more tiles per checker). The host waits for the
#: last checker, so a checker takes one tile where it can: each further tile is one more memory round
#: trip before the verdict (bench/README.md, 2026-12-04 afternoon, "The checker programs' wait grows with the
#: grid"). (Any count is safe: checkers wait for nothing.)
MAX_CHECKERS = 1024
#: the scratch words: [0] the count (checkers done, and above :data:`FAILED` those that failed),
#: [GATE] the gate (its own 128 bytes: the workers' polling stays off the line the checkers' atomics use)
SCRATCH, GATE = 64, 32
#: a failed checker's weight in the count word: above every count of checkers (MAX_CHECKERS and an
#: op's own counts stay below it; MAX_CHECKERS failures times it stay an int32)
FAILED = tl.constexpr(1 << 16)
#: epochs run 1 .. EPOCHS, then wrap (``epoch * 4 + verdict`` stays an int32)
EPOCHS = 2**28
#: the longest a worker sleeps between two reads of the gate on an NVIDIA GPU, ns (PTX ``nanosleep``,
#: from 32 ns doubling; 0: it spins). Spinning workers take issue slots from the checkers that share
#: their SMs, and the host waits for the last checker (bench/README.md, 2026-12-04 evening).
#: Elsewhere (ROCm, the interpreter) workers spin.
NAP_NS = 2048


@triton.jit
def flat_bad(ptr, n, low, high, pid, P, CHECK: tl.constexpr):
    """Checker ``pid`` of ``P``: some value of its chunks (every ``P``-th of ``CHECK``) of the
    contiguous ``ptr[0:n]`` outside ``[low, high]`` (``high`` inclusive)."""
    k = tl.arange(0, CHECK)
    bad = tl.zeros([CHECK], tl.int32)
    for s in range(pid * CHECK, n, P * CHECK):
        i = s + k
        v = tl.load(ptr + i, mask=i < n, other=low)
        bad |= ((v < low) | (v > high)).to(tl.int32)
    return tl.max(bad, axis=0)


@triton.jit
def rows_bad(ptr, R, C, s0, s1, low, high, pid, P, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Checker ``pid`` of ``P``: some value of its tiles (every ``P``-th) of the ``R x C`` values
    ``ptr + r * s0 + c * s1`` outside ``[low, high]``. Rows that are one run (``s1 == 1``, ``s0 ==
    C``: index rows as allocated) are tiled as one array of ``R * C`` values, ``BLOCK_R * BLOCK_C``
    in a row; others row-major in ``BLOCK_R x BLOCK_C`` tiles (``rows_tiles``)."""
    if (s1 == 1) & (s0 == C):
        n = R.to(tl.int64) * C
        k = tl.arange(0, BLOCK_R * BLOCK_C)
        flat = tl.zeros([BLOCK_R * BLOCK_C], tl.int32)
        for s in range(pid * (BLOCK_R * BLOCK_C), n, P * (BLOCK_R * BLOCK_C)):
            i = s + k
            v = tl.load(ptr + i, mask=i < n, other=low)
            flat |= ((v < low) | (v > high)).to(tl.int32)
        bad = tl.max(flat, axis=0)
    else:
        c_tiles = (C + BLOCK_C - 1) // BLOCK_C
        tiles = ((R + BLOCK_R - 1) // BLOCK_R) * c_tiles
        tile = tl.zeros([BLOCK_R, BLOCK_C], tl.int32)
        for i in range(pid, tiles, P):
            r = (i // c_tiles) * BLOCK_R + tl.arange(0, BLOCK_R)
            c = (i % c_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
            m = (r < R)[:, None] & (c < C)[None, :]
            v = tl.load(ptr + r.to(tl.int64)[:, None] * s0 + c.to(tl.int64)[None, :] * s1, mask=m, other=low)
            tile |= ((v < low) | (v > high)).to(tl.int32)
        bad = tl.max(tl.max(tile, axis=1), axis=0)
    return bad


@triton.jit
def settle(bad, P, flag_ptr, scratch_ptr, epoch, GATE: tl.constexpr):
    """A checker done (``bad``: it found a value out of range): one atomic add counts it in the
    count word's low bits and its failure above them (:data:`FAILED`), so the add's old value tells
    the last of the ``P`` every checker's outcome: no flag word, no ordering between two words, so
    no fence (``relaxed``). The last leaves the verdict in the host's word first (what the host waits
    for), then, tagged ``epoch``, in the gate, then zeroes the count for the next call (which runs
    after this kernel on the stream)."""
    failing = (bad > 0).to(tl.int32)
    old = tl.atomic_add(scratch_ptr, 1 + failing * FAILED, sem="relaxed")
    if (old & (FAILED - 1)) == P - 1:  # the last checker: every outcome is in old
        code = tl.where((old >= FAILED) | (failing > 0), FAIL, PASS)
        publish(flag_ptr, code)
        tl.atomic_xchg(scratch_ptr + GATE, epoch * 4 + code, sem="relaxed")
        tl.atomic_xchg(scratch_ptr, 0, sem="relaxed")


@triton.jit
def _nap(ns):
    """Sleeps about ``ns`` ns (PTX ``nanosleep``; NVIDIA only)."""
    tl.inline_asm_elementwise("nanosleep.u32 $1;\n\tmov.b32 $0, 0;", "=r,r", [ns], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def passed(scratch_ptr, epoch, GATE: tl.constexpr, NAP: tl.constexpr):
    """A worker: waits for this call's verdict in the gate; True on ``PASS``. Between two reads
    it sleeps (``NAP`` > 0) 32 ns, then twice as long each time up to ``NAP`` ns: a gate that
    opens soon is seen soon, a long wait polls seldom. (Volatile loads: each one reads the word
    again; nothing the checkers wrote but the word is read after it.)"""
    g = tl.load(scratch_ptr + GATE, volatile=True)
    ns = tl.full([], 32, tl.int32)
    while (g >> 2) != epoch:
        if NAP > 0:
            _nap(ns)
            ns = tl.minimum(ns * 2, NAP)
        g = tl.load(scratch_ptr + GATE, volatile=True)
    return (g & 3) == PASS


def checkers(tiles: int) -> int:
    """Checker programs for a call whose largest tensor has ``tiles`` tiles (at least one)."""
    return max(1, min(tiles, MAX_CHECKERS))


def groups(tiles: tuple[int, ...]) -> tuple[int, ...]:
    """Checker programs per tensor for a call whose tensors have ``tiles`` tiles each, every tensor
    checked by programs of its own: one tile a checker where the call's tiles fit
    :data:`MAX_CHECKERS`, else shares in proportion to the tiles (at least one a tensor with a
    tile; the sum may pass the cap by one a tensor). A checker given two tensors' tiles would load
    them one after the other (each tensor's loop its own memory round trip), and the host waits
    for the last checker."""
    total = sum(tiles)
    if total <= MAX_CHECKERS:
        return tuple(tiles)
    return tuple(max(1, n * MAX_CHECKERS // total) if n else 0 for n in tiles)


def flat_tiles(n: int) -> int:
    return -(-n // CHECK)


def rows_tiles(t: torch.Tensor) -> int:
    """:func:`rows_bad`'s tiles of the 2-D ``t``."""
    (R, C), (s0, s1) = t.shape, t.stride()
    return tiles_of(R, C, s0, s1)


def tiles_of(R: int, C: int, s0: int, s1: int) -> int:
    """:func:`rows_tiles` of ``R x C`` values at strides ``(s0, s1)``."""
    if s1 == 1 and s0 == C:
        return -(-(R * C) // (BLOCK_R * BLOCK_C))
    return -(-R // BLOCK_R) * -(-C // BLOCK_C)


def naps(device: torch.device) -> bool:
    """Whether workers on ``device`` sleep between reads of the gate (:data:`NAP_NS`): NVIDIA GPUs,
    in compiled mode."""
    return device.type == "cuda" and torch.version.hip is None and not INTERPRETED


def open_checked(device: torch.device) -> tuple[Verdict, torch.Tensor, int, int]:
    """The call's verdict (this thread's word for ``device`` and its current stream, zeroed), its
    scratch words, its epoch and its workers' nap between reads of the gate (a constexpr: the
    caller puts it into the launch key)."""
    v = open_verdict(device, per_stream=True)
    if v.scratch is None:  # zeroed once; the last checker of every call zeroes its pair again
        v.scratch = torch.zeros(SCRATCH, dtype=torch.int32, device=device)
        v.napping = naps(device)
    v.epoch = v.epoch % EPOCHS + 1
    return v, v.scratch, v.epoch, NAP_NS if v.napping else 0
