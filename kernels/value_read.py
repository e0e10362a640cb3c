"""A validated call's value reads as one device pass: the reader ``common/validation.py``'s
``to_host`` takes from the dispatcher on a CUDA or ROCm device.

A validated call reads what its value checks test with one device->host transfer: small
tensors whole (``query_start_loc``, per-request lengths), large ones as a min and max
(:class:`~swa_backends.common.validation.Reduced`: positions, slots, a block table's entries
the requests read). Done with torch, each reduction is its own op (``aminmax``, a ``where``
for PAD or for a block table's unread entries) and the pieces are joined by a ``cat`` before the
copy: several launches and their host work per call. Here one kernel writes every piece into
one int64 buffer -- a whole tensor element by element, a reduction as a min and max per
program (the host reduces those few) -- and one copy brings the buffer to a pinned host word
array. Each launch takes up to :data:`SLOTS` pieces (more: more launches into the same
buffer, still one copy). The kernel is compiled once: a piece is passed as its address with its
dtype and kind as runtime values (:data:`CODES`), so no mix of pieces a serving step makes is a
specialisation ``Backend.warmup`` (one read of a reduced piece) did not launch.

Integers travel as int64, floating values as float64 bit patterns (exact for every dtype the
checks read); a NaN anywhere in a reduced piece makes both its min and max NaN (as
``torch.aminmax``), which the hardware's min and max would drop.
"""

from __future__ import annotations

import threading

import numpy as np
import torch
import triton.language as tl

from ..common.validation import Reduced, numpy_dtype
from ._launch import Kernel, cdiv, jit

#: pieces per launch
SLOTS = 4
#: elements per program step; a reduced piece gets at most MAX_PROGRAMS programs (each walks
#: its chunk in steps of BLOCK), so its partial minima and maxima stay a few KB
BLOCK = 1024
MAX_PROGRAMS = 512

#: a whole tensor read whole by the kernel up to this many bytes (a larger one, which only an
#: error's explanation reads whole, goes the torch way)
COPY_BYTES = 1 << 18

#: piece kinds, the kernel's ``kind`` bits (its code spells them as numbers: Triton reads no
#: plain global): the low two bits COPY (a whole copy), MINMAX, MASKED (a min/max over a block
#: table's read entries: column c of row r counts when c * step < limit[r], the others read as
#: 0); FLOAT (4): a floating dtype; PAD (8): -1 reads as the piece's ``pad`` value
COPY, MINMAX, MASKED, FLOAT, PAD = 1, 2, 3, 4, 8

#: the dtypes the kernel reads, by the code it branches on (any other: the read is declined).
#: A piece reaches the kernel as its address, an int, and its dtype and kind as runtime ints, so
#: one compiled kernel reads every read a validated call makes: which pieces a call reduces
#: follows its tensors' sizes (``validation.RAW_BYTES``), and a kernel specialised on the pieces'
#: dtypes and kinds compiled a new variant for a serving step's mix that no warmup made.
CODES = {torch.bool: 0, torch.uint8: 1, torch.int8: 2, torch.int16: 3, torch.int32: 4, torch.int64: 5,
         torch.float16: 6, torch.bfloat16: 7, torch.float32: 8, torch.float64: 9}
#: the dtypes a block table's limits (its requests' lengths) may have: int32 (code 0), int64 (1)
LIMIT_CODES = {torch.int32: 0, torch.int64: 1}


@jit
def _at(i, n, cols, s_r, s_c):
    """Where elements ``i`` (flat, in order) of a ``[rows, cols]`` piece are: ``(in range, row,
    column, element offset)``."""
    m = i < n
    r = i // cols
    c = i - r * cols
    return m, r, c, r * s_r + c * s_c


@jit
def _load_int(addr, off, m, code):
    """An integer piece's elements at ``off`` (address ``addr``, dtype ``code``) as int64."""
    if code == 5:
        v = tl.load(addr.to(tl.pointer_type(tl.int64)) + off, mask=m, other=0)
    elif code == 4:
        v = tl.load(addr.to(tl.pointer_type(tl.int32)) + off, mask=m, other=0).to(tl.int64)
    elif code == 3:
        v = tl.load(addr.to(tl.pointer_type(tl.int16)) + off, mask=m, other=0).to(tl.int64)
    elif code == 2:
        v = tl.load(addr.to(tl.pointer_type(tl.int8)) + off, mask=m, other=0).to(tl.int64)
    else:  # bool (one byte, 0 or 1) and uint8: zero-extended
        v = tl.load(addr.to(tl.pointer_type(tl.uint8)) + off, mask=m, other=0).to(tl.int64)
    return v


@jit
def _load_float(addr, off, m, code):
    """A floating piece's elements at ``off`` (address ``addr``, dtype ``code``) as float64."""
    if code == 9:
        v = tl.load(addr.to(tl.pointer_type(tl.float64)) + off, mask=m, other=0.0)
    elif code == 8:
        v = tl.load(addr.to(tl.pointer_type(tl.float32)) + off, mask=m, other=0.0).to(tl.float64)
    elif code == 7:
        v = tl.load(addr.to(tl.pointer_type(tl.bfloat16)) + off, mask=m, other=0.0).to(tl.float32).to(tl.float64)
    else:
        v = tl.load(addr.to(tl.pointer_type(tl.float16)) + off, mask=m, other=0.0).to(tl.float32).to(tl.float64)
    return v


@jit
def _piece(out_ptr, q, addr, code, rows, cols, s_r, s_c, pad, lim, lim64, s_l, step, o, chunk, kind,
           BLOCK: tl.constexpr):
    n = rows.to(tl.int64) * cols
    start = q.to(tl.int64) * chunk
    lane = tl.arange(0, BLOCK).to(tl.int64)
    if (kind & 3) == 1:  # COPY
        for k in range(0, chunk, BLOCK):
            i = start + k + lane
            m, r, c, off = _at(i, n, cols, s_r, s_c)
            if (kind & 4) != 0:  # FLOAT
                w = _load_float(addr, off, m, code).to(tl.int64, bitcast=True)
            else:
                w = _load_int(addr, off, m, code)
            tl.store(out_ptr + o + i, w, mask=m)
    elif (kind & 4) != 0:  # FLOAT: min and max, NaN in both when there is one
        flo = tl.full((BLOCK,), float("inf"), tl.float64)
        fhi = tl.full((BLOCK,), float("-inf"), tl.float64)
        isnan = tl.zeros((BLOCK,), tl.int32)
        for k in range(0, chunk, BLOCK):
            i = start + k + lane
            m, r, c, off = _at(i, n, cols, s_r, s_c)
            fv = _load_float(addr, off, m, code)
            isnan = tl.maximum(isnan, ((fv != fv) & m).to(tl.int32))
            flo = tl.where(m & (fv < flo), fv, flo)
            fhi = tl.where(m & (fv > fhi), fv, fhi)
        bad = tl.max(isnan, axis=0) > 0
        flo_s = tl.where(bad, float("nan"), tl.min(flo, axis=0))
        fhi_s = tl.where(bad, float("nan"), tl.max(fhi, axis=0))
        tl.store(out_ptr + o + 2 * q, flo_s.to(tl.int64, bitcast=True))
        tl.store(out_ptr + o + 2 * q + 1, fhi_s.to(tl.int64, bitcast=True))
    else:
        lo = tl.full((BLOCK,), 9223372036854775807, tl.int64)
        hi = tl.full((BLOCK,), -9223372036854775808, tl.int64)
        for k in range(0, chunk, BLOCK):
            i = start + k + lane
            m, r, c, off = _at(i, n, cols, s_r, s_c)
            v = _load_int(addr, off, m, code)
            if (kind & 3) == 3:  # MASKED
                if lim64 != 0:
                    limit = tl.load(lim.to(tl.pointer_type(tl.int64)) + r * s_l, mask=m, other=0)
                else:
                    limit = tl.load(lim.to(tl.pointer_type(tl.int32)) + r * s_l, mask=m, other=0).to(tl.int64)
                v = tl.where(c * step < limit, v, 0)
            if (kind & 8) != 0:  # PAD
                v = tl.where(v == -1, pad, v)
            lo = tl.where(m, tl.minimum(lo, v), lo)
            hi = tl.where(m, tl.maximum(hi, v), hi)
        tl.store(out_ptr + o + 2 * q, tl.min(lo, axis=0))
        tl.store(out_ptr + o + 2 * q + 1, tl.max(hi, axis=0))


@jit
def _value_read(out_ptr,
                a0: tl.int64, d0, r0, c0, sr0, sc0, pad0, l0: tl.int64, w0, sl0, st0, o0, ch0, k0,
                a1: tl.int64, d1, r1, c1, sr1, sc1, pad1, l1: tl.int64, w1, sl1, st1, o1, ch1, k1, g1,
                a2: tl.int64, d2, r2, c2, sr2, sc2, pad2, l2: tl.int64, w2, sl2, st2, o2, ch2, k2, g2,
                a3: tl.int64, d3, r3, c3, sr3, sc3, pad3, l3: tl.int64, w3, sl3, st3, o3, ch3, k3, g3,
                BLOCK: tl.constexpr):
    # programs [g_i, g_{i+1}) read piece i (g_0 = 0); an unused slot has none
    pid = tl.program_id(0)
    if pid < g1:
        _piece(out_ptr, pid, a0, d0, r0, c0, sr0, sc0, pad0, l0, w0, sl0, st0, o0, ch0, k0, BLOCK)
    elif pid < g2:
        _piece(out_ptr, pid - g1, a1, d1, r1, c1, sr1, sc1, pad1, l1, w1, sl1, st1, o1, ch1, k1, BLOCK)
    elif pid < g3:
        _piece(out_ptr, pid - g2, a2, d2, r2, c2, sr2, sc2, pad2, l2, w2, sl2, st2, o2, ch2, k2, BLOCK)
    else:
        _piece(out_ptr, pid - g3, a3, d3, r3, c3, sr3, sc3, pad3, l3, w3, sl3, st3, o3, ch3, k3, BLOCK)


_K = Kernel(_value_read)
#: the kernel's one launch key: nothing it is passed changes what Triton compiles (the addresses are
#: typed int64 by their annotations whatever their values, the other ints fit 32 bits; see :data:`CODES`)
KEY = ()

#: an int the kernel takes in 32 bits (``kernels/_launch.py``: every int argument is i32)
_I32 = 2**31 - 1


def _as_2d(t: torch.Tensor):
    """``(rows, cols, row stride, column stride)`` of ``t``'s elements in order, or None when its
    layout is not two strided dims (the caller reads it the torch way)."""
    if t.dim() <= 1:
        return 1, t.numel(), 0, (t.stride(0) if t.dim() else 0)
    if t.dim() == 2:
        return t.shape[0], t.shape[1], t.stride(0), t.stride(1)
    try:
        v = t.view(t.shape[0], -1)
    except RuntimeError:
        return None
    return v.shape[0], v.shape[1], v.stride(0), v.stride(1)


class _Plan:
    """The pieces of one read: each item's slot arguments, kind, output offset and programs."""

    __slots__ = ("pieces", "size")

    def __init__(self):
        self.pieces: list = []
        self.size = 0

    def add(self, t: torch.Tensor, kind: int, pad: int = 0, lim=None, step: int = 0) -> bool:
        shape = _as_2d(t)
        if shape is None:
            return False
        rows, cols, s_r, s_c = shape
        n = rows * cols
        if n == 0 or max(rows, cols, abs(s_r), abs(s_c), abs(pad), abs(step)) > _I32:
            return False
        if t.dtype not in CODES or lim is not None and lim.dtype not in LIMIT_CODES:
            return False
        if t.dtype.is_floating_point:
            kind |= FLOAT
        if kind & 3 == COPY:
            chunk, progs, words = BLOCK, cdiv(n, BLOCK), n
        else:
            chunk = BLOCK * cdiv(cdiv(n, BLOCK), MAX_PROGRAMS)
            progs = cdiv(n, chunk)
            words = 2 * progs
        s_l = lim.stride(0) if lim is not None and lim.dim() else 0
        if self.size + words > _I32:
            return False
        self.pieces.append((t, rows, cols, s_r, s_c, pad, lim, s_l, step, self.size, chunk, progs, kind))
        self.size += words
        return True


_local = threading.local()
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _buffers(device: torch.device, words: int):
    """This thread's device and pinned host word buffers for ``device``, at least ``words``
    long (reused: a read waits for its copy before it returns)."""
    cache = getattr(_local, "buffers", None)
    if cache is None:
        cache = _local.buffers = {}
    got = cache.get(device)
    if got is None or got[0].numel() < words:
        n = 1 << max(10, (words - 1).bit_length())
        got = cache[device] = (torch.empty(n, dtype=torch.int64, device=device),
                               torch.empty(n, dtype=torch.int64, pin_memory=device.type == "cuda"))
    return got


def read(items) -> list[np.ndarray] | None:
    """numpy values of ``items`` (tensors read whole, :class:`Reduced` pieces as ``[min, max]``),
    all on one device, by one pass of this kernel and one copy; None (the caller reads them the
    torch way) when none is a reduction (torch's copy of whole tensors launches no more than this)
    or an item is not for it (a tensor over :data:`COPY_BYTES` read whole, a layout of more than two
    strided dims, an int past 32 bits, a dtype not in :data:`CODES`)."""
    device = items[0].device
    if device.type == "cuda" and device.index != _current_device():
        return None  # the kernel launches on the current device
    for it in items:
        if isinstance(it, Reduced):
            break
    else:  # whole tensors alone: torch's way is one copy (and a cat), no fewer launches than this
        return None
    plan = plan_of(items)
    if plan is None:
        return None
    dev_buf, host_buf = _buffers(device, plan.size)
    pieces = plan.pieces
    for at in range(0, len(pieces), SLOTS):
        _launch(dev_buf, pieces[at:at + SLOTS])
    host = host_buf[:plan.size]
    host.copy_(dev_buf[:plan.size])  # waits for the copy (and so for the kernel before it on this stream)
    words = host.numpy()
    out = []
    for it, (t, *_, o, _chunk, progs, kind) in zip(items, pieces):
        dtype = numpy_dtype(t.dtype)
        if kind & 3 == COPY:
            n = t.numel()
            raw = words[o:o + n]
            vals = raw.view(np.float64) if kind & FLOAT else raw
            out.append(vals.astype(dtype).reshape(t.shape))
        else:
            part = words[o:o + 2 * progs]
            if kind & FLOAT:
                part = part.view(np.float64)
            out.append(np.array([part[0::2].min(), part[1::2].max()]).astype(dtype))
    return out


def plan_of(items) -> _Plan | None:
    """The pieces of one read of ``items`` (tensors read whole, :class:`Reduced` pieces), or None
    when one is not for this kernel (a tensor over :data:`COPY_BYTES` read whole, a layout of more
    than two strided dims, an int past 32 bits, a dtype not in :data:`CODES`)."""
    plan = _Plan()
    for it in items:
        if isinstance(it, Reduced):
            ok = plan.add(it.t, MASKED if it.limit is not None else MINMAX | (PAD if it.pad_as is not None else 0),
                          it.pad_as or 0, it.limit, it.step)
        else:
            ok = it.numel() * it.element_size() <= COPY_BYTES and plan.add(it, COPY)
        if not ok:
            return None
    return plan


def _launch(buf: torch.Tensor, pieces: list) -> None:
    args: list = [buf]
    start = 0
    for slot in range(SLOTS):
        if slot < len(pieces):
            t, rows, cols, s_r, s_c, pad, lim, s_l, step, o, chunk, progs, kind = pieces[slot]
            lim_at, lim64 = (lim.data_ptr(), LIMIT_CODES[lim.dtype]) if lim is not None else (t.data_ptr(), 0)
            args += [t.data_ptr(), CODES[t.dtype], rows, cols, s_r, s_c, pad, lim_at, lim64, s_l, step, o, chunk, kind]
        else:  # no programs: never read
            progs = 0
            args += [buf.data_ptr(), 5, 0, 0, 0, 0, 0, buf.data_ptr(), 0, 0, 0, 0, BLOCK, 0]
        if slot:
            args.append(start)
        start += progs
    _K(KEY, (start, 1, 1), *args, BLOCK)
