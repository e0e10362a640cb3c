"""``gather_replay_batch`` (SPEC §3.2) in Triton: the decoder-side sub-batch in one launch.

Request programs, then padding programs, in one 1-D grid:

* program ``b * S + s`` (``b < max(B, 1)``, ``s < S``) serves request ``b``. Its kept rows
  are the output rows ``[qsl[b] - dropped[b], qsl[b+1] - dropped[b+1])`` (the sub-batch
  ``query_start_loc``, on the *device* ``qsl``: a decode resized there keeps its device
  rows), each gathered from row ``o + dropped[b+1]``; the program takes every ``S``-th block
  of ``BLOCK`` of them (usually its only block). It also writes the request's output
  ``query_start_loc`` entry (and entry ``B`` for the last request) and its ``kv_start``;
* the padding programs write rows from the device's kept count ``qsl[B] - dropped[B]`` to
  ``n_pad``: row 0, its position, every slot PAD (at least one padding program, so rows a
  device-shrunk batch leaves below the host's count are padded too).

Every store is masked to the output buffers' ``n_pad`` rows and every gather to the batch's
``T`` rows, whatever the device ``qsl`` says: a batch outside the contract (validation off)
gets wrong rows, never a write or read outside the tensors.

Global-memory round trips per program, all independent loads of a round issued together:
one for the request's scalars (``qsl``, ``dropped`` -- trimmed where it grows --, ``seq_lens``,
``replay_start``), one for its source rows' position and every group's slot (a
``[GB, BLOCK]`` tile), then the stores. No search: a request program knows its rows from
its own two boundaries. ``S`` (programs per request) comes from the plan's longest kept
run, so a request that keeps thousands of rows (``keeps_rows``) is spread over several
programs; any ``S`` gives the same result (the loop covers the rest), which keeps a CUDA
graph captured with one plan correct when replayed with another of the same sizes.

The result equals the reference's for the batch the plan was made from (``qsl`` the
device copy of the plan's ``query_start_loc``, the op's contract): the sub-batch
``query_start_loc`` is then ``[0, cumsum(kept)]``, so the searchsorted of the reference
and the request ranges here assign every row to the same request.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from ..common.ops.gather_replay_batch import allocate_out, quick_check
from ..common.types import MAX_POSITION, ReplayBatch
from ._device import PAD, batch_bad, write_graph_padding
from ._launch import Kernel, jit
from .range_check import CHECK, GATE, checkers, flat_bad, flat_tiles, open_checked, passed, settle

BLOCK = 128  # rows per program and step
GB = 8  # slot groups per load (more groups: further [GB, BLOCK] tiles)
MAX_REQUEST_PROGRAMS = 4096  # bound on B * S (programs per request S >= 1)


@triton.jit
def _program(pid, qsl_ptr, drop_ptr, seq_ptr, rs_ptr, pos_ptr, slot_ptr, s_g, s_t, rows_ptr, oqsl_ptr, opos_ptr,
             oslot_ptr, os_g, kv_ptr, B, G, T, n_pad, W, S, req_progs, pad_progs, BLOCK: tl.constexpr,
             GB: tl.constexpr, UNIT_T: tl.constexpr):
    """Program ``pid`` of the grid the module docstring describes."""
    r = tl.arange(0, BLOCK)
    g = tl.arange(0, GB)
    if pid < req_progs:
        b = pid // S
        s = pid - b * S
        has = b < B  # False only for the single program of an empty batch (b = 0 = B)
        # round trip 1: the request's scalars (independent loads)
        q0 = tl.load(qsl_ptr + b)
        d0 = tl.load(drop_ptr + b)
        q1 = tl.load(qsl_ptr + b + 1, mask=has, other=0)
        d1 = tl.load(drop_ptr + b + 1, mask=has, other=0)
        R = tl.load(rs_ptr + b, mask=has, other=0)
        seq = tl.load(seq_ptr + b, mask=has, other=0)
        trimmed = d1 > d0  # rows dropped inside the request: kept < q
        R = tl.where(R <= seq - (q1 - q0), R, 0)  # a stale replay start (above the first position): none
        start = q0 - d0
        end = tl.where(has, q1 - d1, start)
        if s == 0:
            tl.store(oqsl_ptr + b, start)
            tl.store(oqsl_ptr + B, end, mask=has & (b == B - 1))
            kv = tl.where(trimmed, tl.maximum(R, seq - W), R)
            tl.store(kv_ptr + b, kv, mask=has)
        # round trip 2: positions and slots of the request's rows, a block at a time, never
        # past the output's n_pad rows (a device qsl longer than the plan: its rows are dropped)
        for o0 in range(tl.maximum(start, 0) + s * BLOCK, tl.minimum(end, n_pad), S * BLOCK):
            o = o0 + r
            row = (o + d1).to(tl.int64)
            m = (o < end) & (o < n_pad)
            mr = m & (row < T) & (row >= 0)  # the batch's rows only
            gr = (g[:, None] < G) & mr[None, :]
            gm = (g[:, None] < G) & m[None, :]
            p = tl.load(pos_ptr + row, mask=mr, other=0)
            if UNIT_T:  # the slot rows contiguous (usual): load and store tiles share one layout
                tok = row[None, :]
            else:
                tok = row[None, :] * s_t
            sl = tl.load(slot_ptr + g[:, None].to(tl.int64) * s_g + tok, mask=gr, other=PAD)
            tl.store(rows_ptr + o, row, mask=m)
            tl.store(opos_ptr + o, p, mask=m)
            tl.store(oslot_ptr + g[:, None].to(tl.int64) * os_g + o[None, :], sl, mask=gm)
            for g0 in range(GB, G, GB):  # more than GB groups (rare)
                gg = g0 + g
                gm = (gg[:, None] < G) & m[None, :]
                sl = tl.load(slot_ptr + gg[:, None].to(tl.int64) * s_g + tok, mask=gm & mr[None, :], other=PAD)
                tl.store(oslot_ptr + gg[:, None].to(tl.int64) * os_g + o[None, :], sl, mask=gm)
    else:
        write_graph_padding(pid - req_progs, pad_progs, qsl_ptr, drop_ptr, B, T, pos_ptr, rows_ptr, opos_ptr, oslot_ptr,
                            os_g, G, n_pad, BLOCK, GB)


@jit
def _gather_replay_batch(qsl_ptr, drop_ptr, seq_ptr, rs_ptr, pos_ptr, slot_ptr, s_g, s_t,
                         rows_ptr, oqsl_ptr, opos_ptr, oslot_ptr, os_g, kv_ptr,
                         B, G, T, n_pad, W, S, req_progs, pad_progs, BLOCK: tl.constexpr, GB: tl.constexpr,
                         UNIT_T: tl.constexpr):
    _program(tl.program_id(0), qsl_ptr, drop_ptr, seq_ptr, rs_ptr, pos_ptr, slot_ptr, s_g, s_t, rows_ptr, oqsl_ptr,
             opos_ptr, oslot_ptr, os_g, kv_ptr, B, G, T, n_pad, W, S, req_progs, pad_progs, BLOCK, GB, UNIT_T)


@triton.jit
def _plan_bad(qsl_ptr, drop_ptr, plan_ptr, B, n_rows, n_pad, CHECK: tl.constexpr):
    """``check_plan``'s value checks (B > 0): the plan's own (``kept >= 0`` adding up to
    ``n_rows``, ``dropped_before`` non-decreasing from 0, ``trimmed`` where it grows), its device
    ``dropped_before`` (``drop_ptr``, which a caller may have handed the plan) equal to the host's,
    and against the device ``query_start_loc``: no request drops more than its rows, a trimmed
    request or a prefill has the rows the plan was made for, the kept rows fit ``n_pad``.
    ``plan_ptr``: the plan's kept, trimmed and fixed (trimmed or prefilling) flags (``[3, B]``)
    then its host ``dropped_before`` (``B + 1``), int32."""
    k = tl.arange(0, CHECK)
    bad = tl.zeros([CHECK], tl.int32)
    total = tl.zeros([CHECK], tl.int64)
    for s in range(0, B, CHECK):
        b = s + k
        m = b < B
        kept = tl.load(plan_ptr + b, mask=m, other=0).to(tl.int64)
        trimmed = tl.load(plan_ptr + B + b, mask=m, other=0)
        fixed = tl.load(plan_ptr + 2 * B + b, mask=m, other=0)
        before = tl.load(drop_ptr + b, mask=m, other=0).to(tl.int64)
        inside = tl.load(drop_ptr + b + 1, mask=m, other=0).to(tl.int64) - before
        q = tl.load(qsl_ptr + b + 1, mask=m, other=0).to(tl.int64) - tl.load(qsl_ptr + b, mask=m, other=0)
        wrong = (kept < 0) | (inside < 0) | (inside > q) | ((fixed != 0) & (q != kept + inside))
        wrong |= before != tl.load(plan_ptr + 3 * B + b, mask=m, other=0)
        wrong |= (trimmed != 0) != (inside > 0)
        bad |= (m & wrong).to(tl.int32)
        total += kept
    end = tl.load(qsl_ptr + B).to(tl.int64) - tl.load(drop_ptr + B)
    out = (tl.sum(total, axis=0) != n_rows) | (tl.load(drop_ptr) != 0) | (end > n_pad)
    out |= tl.load(drop_ptr + B).to(tl.int64) != tl.load(plan_ptr + 4 * B)
    return tl.maximum(tl.max(bad, axis=0), out.to(tl.int32))


@jit
def _gather_replay_batch_checked(qsl_ptr, drop_ptr, seq_ptr, rs_ptr, pos_ptr, slot_ptr, s_g, s_t,
                                 rows_ptr, oqsl_ptr, opos_ptr, oslot_ptr, os_g, kv_ptr, plan_ptr, flag_ptr, scratch_ptr,
                                 B, G, T, n_pad, W, S, req_progs, pad_progs, n_rows, P, epoch,
                                 BLOCK: tl.constexpr, GB: tl.constexpr, UNIT_T: tl.constexpr, CHECK: tl.constexpr,
                                 MAX_POSITION: tl.constexpr, GATE: tl.constexpr, NAP: tl.constexpr):
    """A validated call: ``P`` checker programs test what the validator tests (checker 0 the
    batch and the plan, all of them the positions; ``range_check.py``), the others are the
    plain kernel's programs once they pass."""
    pid = tl.program_id(0)
    if pid < P:
        bad = flat_bad(pos_ptr, T, 0, MAX_POSITION, pid, P, CHECK)
        if pid == 0:
            bad |= batch_bad(qsl_ptr, seq_ptr, rs_ptr, B, T, MAX_POSITION, True, True, True, CHECK)
            bad |= _plan_bad(qsl_ptr, drop_ptr, plan_ptr, B, n_rows, n_pad, CHECK)
        settle(bad, P, flag_ptr, scratch_ptr, epoch, GATE)
    elif passed(scratch_ptr, epoch, GATE, NAP):
        _program(pid - P, qsl_ptr, drop_ptr, seq_ptr, rs_ptr, pos_ptr, slot_ptr, s_g, s_t, rows_ptr, oqsl_ptr,
                 opos_ptr, oslot_ptr, os_g, kv_ptr, B, G, T, n_pad, W, S, req_progs, pad_progs, BLOCK, GB, UNIT_T)


_K = Kernel(_gather_replay_batch)
_K_CHECKED = Kernel(_gather_replay_batch_checked)
_KEYS = ((False,), (True,))  # by UNIT_T


def plan_launch(plan, positions) -> tuple:
    """``(dropped_before, B, n, n_pad, S, req_progs, pad_progs, grid)``: what a
    launch takes from ``plan`` on ``positions``' device -- the plan's ``dropped_before``
    there (``plan.device_dropped_before``), its sizes, the programs per request ``S`` (from its longest
    kept run), the request and padding program counts and the gather launch's grid. Made
    once per plan and device (``plan._launch_cache``)."""
    entry = plan._launch_cache.get(positions.get_device())
    if entry is not None:
        return entry
    dropped = plan.device_dropped_before(positions.device)
    n, n_pad, B = plan.num_rows, plan.num_rows_padded, plan.num_reqs
    longest = plan.longest_kept()
    S = max(1, min(-(-longest // BLOCK), MAX_REQUEST_PROGRAMS // max(B, 1)))
    # at least one padding program: the device's kept count may fall below the host's
    req_progs, pad_progs = max(B, 1) * S, max(-(-(n_pad - n) // BLOCK), 1 if n_pad else 0)
    entry = (dropped, B, n, n_pad, S, req_progs, pad_progs, (req_progs + pad_progs, 1, 1))
    plan._launch_cache[positions.get_device()] = entry
    return entry


def gather_replay_batch(plan, query_start_loc, seq_lens, replay_start, positions, slot_mappings, W, *,
                        out=None) -> ReplayBatch:
    """The sub-batch on the *device* ``query_start_loc``: request ``i``'s kept rows are the
    output rows ``[qsl[i] - dropped_before[i], qsl[i+1] - dropped_before[i+1])``, gathered
    from the last rows before its end (a decode resized on the device keeps its device rows).
    Returns ``rows``, ``query_start_loc``, ``positions``, ``slot_mappings`` and ``kv_start``
    (``max(R, seq_len - W)`` for trimmed requests, ``R`` otherwise; a stale R counts as 0).
    Rows from the device's kept count to ``num_rows_padded`` (graph padding) gather row 0 with
    every slot PAD. One launch; no host synchronisation once the plan's device copy exists
    (``plan.device_dropped_before(device)``, made on first use).
    """
    entry = plan._launch_cache.get(positions.get_device())
    if entry is None:
        entry = plan_launch(plan, positions)
    dropped, B, n, n_pad, S, req_progs, pad_progs, grid = entry
    G = slot_mappings.shape[0]
    if out is None:
        out = allocate_out(plan, G, positions.device)
    rows, oqsl, opos, oslot, kv = (out["rows"], out["query_start_loc"], out["positions"], out["slot_mappings"],
                                   out["kv_start"])
    s_g, s_t = slot_mappings.stride()
    _K(_KEYS[s_t == 1], grid,
       query_start_loc if query_start_loc.is_contiguous() else query_start_loc.contiguous(), dropped,
       seq_lens if seq_lens.is_contiguous() else seq_lens.contiguous(),
       replay_start if replay_start.is_contiguous() else replay_start.contiguous(),
       positions if positions.is_contiguous() else positions.contiguous(), slot_mappings, s_g, s_t,
       rows, oqsl, opos, oslot, oslot.stride(0) if G > 1 else n_pad, kv, B, G, positions.shape[0], n_pad, W, S,
       req_progs, pad_progs, BLOCK, GB, s_t == 1)
    return _replay_batch(rows, oqsl, opos, oslot, kv, n, n_pad)


def _plan_values(plan, device: torch.device) -> torch.Tensor:
    """The plan's kept rows, trimmed and fixed (trimmed or prefilling) flags and its host
    ``dropped_before`` on ``device``, int32, flat (``3 * B + B + 1``), copied once per plan and
    device (as its device ``dropped_before``): what the checked kernel tests the plan's device
    ``dropped_before`` and the device ``query_start_loc`` against (``plan._launch_cache``)."""
    key = ("checked", device)  # (a torch.device hashes without building its type's string)
    cached = plan._launch_cache.get(key)
    if cached is None:
        host = plan.__dict__.get("_host")
        kept = host[0] if host is not None else plan.kept.numpy()
        trimmed = host[1][1:] > host[1][:-1] if host is not None else plan.trimmed.numpy()
        fixed = trimmed if plan.prefilling is None else trimmed | plan.prefilling.numpy()
        dropped = host[1] if host is not None else plan.dropped_before.numpy()
        values = np.concatenate([kept.astype(np.int32), trimmed.astype(np.int32), fixed.astype(np.int32),
                                 dropped.astype(np.int32)])
        cached = plan._launch_cache[key] = torch.from_numpy(values).to(device)
    return cached


def gather_replay_batch_checked(home, plan, query_start_loc, seq_lens, replay_start, positions, slot_mappings, W, *,
                                out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(ReplayBatch, Verdict)`` from one launch whose checker programs test every value the
    validator tests (the batch, the positions, the plan against the device ``query_start_loc``)
    and whose other programs are the plain kernel's once they pass (nothing written on a
    ``FAIL``); None for a call it does not take (no request)."""
    try:
        if not quick_check(plan, query_start_loc, seq_lens, replay_start, positions, slot_mappings, W, out=out):
            return None
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    dev = positions.device
    if plan.num_reqs == 0 or (home is not None and dev != home):
        return None
    entry = plan._launch_cache.get(positions.get_device())
    if entry is None:
        entry = plan_launch(plan, positions)
    dropped, B, n, n_pad, S, req_progs, pad_progs, _ = entry
    values = _plan_values(plan, dev)
    G, T = slot_mappings.shape[0], positions.shape[0]
    if out is None:
        out = allocate_out(plan, G, dev)
    rows, oqsl, opos, oslot, kv = (out["rows"], out["query_start_loc"], out["positions"], out["slot_mappings"],
                                   out["kv_start"])
    s_g, s_t = slot_mappings.stride()
    verdict, scratch, epoch, nap = open_checked(dev)
    P = checkers(flat_tiles(T))
    _K_CHECKED((s_t == 1, nap), (P + req_progs + pad_progs, 1, 1), query_start_loc, dropped, seq_lens, replay_start,
               positions, slot_mappings, s_g, s_t, rows, oqsl, opos, oslot, oslot.stride(0) if G > 1 else n_pad, kv,
               values, verdict.word, scratch, B, G, T, n_pad, W, S, req_progs, pad_progs, n, P, epoch, BLOCK, GB,
               s_t == 1, CHECK, MAX_POSITION, GATE, nap)
    return _replay_batch(rows, oqsl, opos, oslot, kv, n, n_pad), verdict


def _replay_batch(rows, oqsl, opos, oslot, kv, n, n_pad) -> ReplayBatch:
    """``ReplayBatch(...)`` without the frozen dataclass's per-field ``object.__setattr__``
    (a third of the host time): the same object, its fields set in its ``__dict__``."""
    batch = _new(ReplayBatch)
    fields = batch.__dict__
    fields["rows"] = rows
    fields["query_start_loc"] = oqsl
    fields["positions"] = opos
    fields["slot_mappings"] = oslot
    fields["kv_start"] = kv
    fields["num_rows"] = n
    fields["num_rows_padded"] = n_pad
    return batch


_new = object.__new__
