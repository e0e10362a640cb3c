"""Triton kernels that bound a launch from below: the empty kernel (any launch's floor) and the
calibration kernels of ``gather_replay_batch`` (one memory round trip, two dependent ones, and
``same_io``: that op's tensors and traffic without its logic).

Imports Triton: a ``--smoke`` script imports this after :func:`lib.smoke.use_interpreter`. The
kernels are decorated on first use, after the backend fixed Triton's mode.
"""

from __future__ import annotations

import triton
import triton.language as tl


def empty_body(x_ptr, n, BLOCK: tl.constexpr):
    pass


def _cal_one_body(src_ptr, dst_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    off = tl.program_id(0) * BLOCK + r
    tl.store(dst_ptr + off, tl.load(src_ptr + off))


def _cal_two_body(idx_ptr, src_ptr, dst_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    pid = tl.program_id(0)
    start = tl.load(idx_ptr + pid)  # the second load's address depends on this one
    tl.store(dst_ptr + pid * BLOCK + r, tl.load(src_ptr + start + r))


def _cal_same_io_body(qsl_ptr, drop_ptr, trim_ptr, seq_ptr, rs_ptr, pos_ptr, slot_ptr, rows_ptr, oqsl_ptr, opos_ptr,
                      oslot_ptr, kv_ptr, n_pad, BLOCK: tl.constexpr, GB: tl.constexpr):
    """``gather_replay_batch``'s memory traffic without its logic: the same 12 tensors,
    one round of 5 scalar loads, one dependent round of the [BLOCK] positions and the
    [GB, BLOCK] slot tile, the same stores; addresses as plain as they get."""
    r = tl.arange(0, BLOCK)
    g = tl.arange(0, GB)
    pid = tl.program_id(0)
    x = (tl.load(qsl_ptr + pid) + tl.load(drop_ptr + pid) + tl.load(seq_ptr + pid) + tl.load(rs_ptr + pid)
         + tl.load(trim_ptr + pid).to(tl.int32))  # all zero: the second round's offset
    o = pid * BLOCK + x + r
    p = tl.load(pos_ptr + o)
    sl = tl.load(slot_ptr + g[:, None] * n_pad + o[None, :])
    tl.store(rows_ptr + o, o.to(tl.int64))
    tl.store(opos_ptr + o, p)
    tl.store(oslot_ptr + g[:, None] * n_pad + o[None, :], sl)
    tl.store(oqsl_ptr + pid, x)
    tl.store(kv_ptr + pid, x)


_JIT: dict = {}


def empty_kernel():
    """The empty Triton kernel (``kernel[(1,)](x, n, BLOCK=...)``)."""
    if "empty" not in _JIT:
        _JIT["empty"] = triton.jit(empty_body)
    return _JIT["empty"]


def calibration_kernels() -> dict:
    """``{"one": ..., "two": ..., "same_io": ...}``: one memory round trip (load, store), two
    dependent ones (load an offset, load from it, store), and ``same_io``."""
    if "one" not in _JIT:
        _JIT["one"] = triton.jit(_cal_one_body)
        _JIT["two"] = triton.jit(_cal_two_body)
        _JIT["same_io"] = triton.jit(_cal_same_io_body)
    return {k: _JIT[k] for k in ("one", "two", "same_io")}
