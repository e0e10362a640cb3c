"""``prepare_replay_step`` in Triton: a step's replay metadata in ONE launch.

Replaces four launches (``batch_replay_start``, ``pad_replayed_slots``,
``swa_indices_and_lens``, ``gather_replay_batch``) on the per-step host path. The 1-D grid
is split into three roles, each program taking one:

* token tiles ``[0, tok_tiles)``: each of ``BLOCK_T`` tokens finds its request (binary
  search over ``query_start_loc``), computes its request's replay start itself
  (``R_per_request[idx_mapping[b]]`` if prefilling), pads its replayed cacheable slots and
  writes its window indices row (loop over ``BLOCK_W`` columns) and length;
* sub-batch tiles (with a plan): ``BLOCK`` sub-batch rows as in ``gather_replay_batch``;
  a gathered slot is PAD where the padding above makes it PAD, computed from the same
  condition rather than read back, so the result never depends on which program ran first;
* request tiles: ``replay_start``, the sub-batch ``query_start_loc`` and ``kv_start``.

No program reads anything another program of the launch writes except the padded slots,
whose final value both possible orders agree on. No host synchronisation.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.ops.prepare_replay_step import PreparedStep, allocate_out
from ..common.types import ReplayBatch
from ._device import PAD, find_request, warm
from ._launch import Kernel, contiguous, jit

BLOCK_T = 32
BLOCK_W = 128
BLOCK = 256


@triton.jit
def _replay_start_of(rall_ptr, idx_ptr, pre_ptr, b, mask):
    """``batch_replay_start`` for batch rows ``b`` (int32, 0 where masked off)."""
    i = tl.load(idx_ptr + b, mask=mask, other=0).to(tl.int64)
    pre = tl.load(pre_ptr + b, mask=mask, other=0) != 0
    r = tl.load(rall_ptr + i, mask=mask & pre, other=0)
    return tl.where(pre, r, 0).to(tl.int32)


@triton.jit
def _token_role(pid, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t, groups_ptr, n_groups,
                bt_ptr, bt_s0, bt_s1, n_cols, swa_ptr, swa_s0, lens_ptr, B, T, width, n_steps, block_size, W, Wr,
                DO_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    """Tokens ``[pid*BLOCK_T, ...)``: pad their replayed cacheable slots, write their
    clamped window indices (a loop over column blocks) and lengths."""
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    m = t < T
    req = find_request(qsl_ptr, B, t, n_steps)
    ok = m & (req < B)
    R = _replay_start_of(rall_ptr, idx_ptr, pre_ptr, req, ok).to(tl.int64)
    if DO_PAD:
        p = tl.load(pos_ptr + t, mask=ok, other=0)
        replayed = ok & (R > 0) & (p >= R) & (p < R + Wr)
        col_t = t.to(tl.int64) * s_t
        for k in range(n_groups):
            g = tl.load(groups_ptr + k).to(tl.int64)
            tl.store(slot_ptr + g * s_g + col_t, tl.full([BLOCK_T], PAD, tl.int64), mask=replayed)
    seq = tl.load(seq_ptr + req, mask=ok, other=0).to(tl.int64)
    end = tl.load(qsl_ptr + req + 1, mask=ok, other=0).to(tl.int64)
    pos = seq - end + t
    lo = tl.maximum(tl.maximum(pos - (W - 1), 0), R)  # the clamp contract
    lens = tl.where(ok, pos - lo + 1, 0)
    tl.store(lens_ptr + t, lens.to(tl.int32), mask=m)
    row = req.to(tl.int64) * bt_s0
    t_off = t.to(tl.int64)[:, None] * swa_s0
    for j0 in range(0, width, BLOCK_W):
        j = j0 + tl.arange(0, BLOCK_W)
        pj = lo[:, None] + j[None, :]
        live = (j[None, :] < lens[:, None]) & ok[:, None]
        col = tl.minimum(tl.maximum(pj // block_size, 0), n_cols - 1)
        block = tl.load(bt_ptr + row[:, None] + col * bt_s1, mask=live, other=0).to(tl.int64)
        slot = tl.where(live, block * block_size + pj % block_size, PAD).to(tl.int32)
        tl.store(swa_ptr + t_off + j[None, :], slot, mask=m[:, None] & (j[None, :] < width))


@triton.jit
def _gather_role(pid, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, pos_ptr, slot_ptr, s_g, s_t, groups_ptr, n_groups,
                 drop_ptr, rows_ptr, opos_ptr, oslot_ptr, B, G, n, n_pad, n_steps, Wr,
                 DO_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """Sub-batch rows ``[pid*BLOCK, ...)`` as in ``gather_replay_batch``, their slots
    padded by the same condition the token role pads with."""
    o = pid * BLOCK + tl.arange(0, BLOCK)
    m = o < n_pad
    real = o < n
    lo = tl.zeros([BLOCK], tl.int32)
    hi = tl.maximum(lo + B, tl.minimum(warm(qsl_ptr, B + 1), warm(drop_ptr, B + 1)))  # == B
    for _ in range(n_steps):  # searchsorted((query_start_loc - dropped_before)[1:], o, right=True)
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(qsl_ptr + 1 + mid, mask=active, other=0) - tl.load(drop_ptr + 1 + mid, mask=active, other=0)
        right = v <= o
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (~right), mid, hi)
    req = tl.minimum(lo, tl.maximum(B - 1, 0))
    has_req = real & (req < B)
    d = tl.load(drop_ptr + req + 1, mask=has_req, other=0).to(tl.int64)
    src = tl.where(has_req, o.to(tl.int64) + d, 0)
    tl.store(rows_ptr + o, src, mask=m)
    p = tl.load(pos_ptr + src, mask=m, other=0)
    tl.store(opos_ptr + o, p, mask=m)
    # the padding condition of token `src` (a row at or past query_start_loc[B] is never padded)
    inside = has_req & (lo < B)
    R = _replay_start_of(rall_ptr, idx_ptr, pre_ptr, req, inside).to(tl.int64)
    replayed = inside & (R > 0) & (p >= R) & (p < R + Wr)
    o64 = o.to(tl.int64)
    for g in range(G):
        cacheable = tl.zeros([1], tl.int32)
        if DO_PAD:
            for k in range(n_groups):
                cacheable = cacheable | (tl.load(groups_ptr + k) == g).to(tl.int32)
        s = tl.load(slot_ptr + g * s_g + src * s_t, mask=real, other=PAD)
        s = tl.where(replayed & (cacheable != 0), PAD, s)
        tl.store(oslot_ptr + g * n_pad + o64, s, mask=m)


@triton.jit
def _request_role(pid, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, rs_out_ptr, drop_ptr, trim_ptr, oqsl_ptr, kv_ptr,
                  B, W, HAS_PLAN: tl.constexpr, BLOCK: tl.constexpr):
    """Requests ``[pid*BLOCK, ...)``: ``replay_start`` and, with a plan, the sub-batch
    ``query_start_loc`` and ``kv_start``."""
    b = pid * BLOCK + tl.arange(0, BLOCK)
    mb = b < B
    R = _replay_start_of(rall_ptr, idx_ptr, pre_ptr, b, mb)
    tl.store(rs_out_ptr + b, R, mask=mb)
    if HAS_PLAN:
        mq = b <= B
        q_out = tl.load(qsl_ptr + b, mask=mq, other=0) - tl.load(drop_ptr + b, mask=mq, other=0)
        tl.store(oqsl_ptr + b, q_out, mask=mq)
        seq = tl.load(seq_ptr + b, mask=mb, other=0).to(tl.int64)
        trimmed = tl.load(trim_ptr + b, mask=mb, other=0) != 0
        R64 = R.to(tl.int64)
        kv = tl.where(trimmed, tl.maximum(R64, seq - W), R64)
        tl.store(kv_ptr + b, kv.to(tl.int32), mask=mb)


@jit
def _prepare_replay_step(rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t,
                         groups_ptr, n_groups, bt_ptr, bt_s0, bt_s1, n_cols,
                         rs_out_ptr, swa_ptr, swa_s0, lens_ptr,
                         drop_ptr, trim_ptr, rows_ptr, oqsl_ptr, opos_ptr, oslot_ptr, kv_ptr,
                         B, T, G, width, n, n_pad, n_steps, block_size, W, Wr, tok_tiles, gather_tiles,
                         DO_PAD: tl.constexpr, HAS_PLAN: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid < tok_tiles:
        _token_role(pid, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t, groups_ptr,
                    n_groups, bt_ptr, bt_s0, bt_s1, n_cols, swa_ptr, swa_s0, lens_ptr, B, T, width, n_steps,
                    block_size, W, Wr, DO_PAD, BLOCK_T, BLOCK_W)
    elif pid < tok_tiles + gather_tiles:
        if HAS_PLAN:  # gather_tiles is 0 without a plan
            _gather_role(pid - tok_tiles, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, pos_ptr, slot_ptr, s_g, s_t,
                         groups_ptr, n_groups, drop_ptr, rows_ptr, opos_ptr, oslot_ptr, B, G, n, n_pad, n_steps, Wr,
                         DO_PAD, BLOCK)
    else:
        _request_role(pid - tok_tiles - gather_tiles, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, rs_out_ptr,
                      drop_ptr, trim_ptr, oqsl_ptr, kv_ptr, B, W, HAS_PLAN, BLOCK)


_K = Kernel(_prepare_replay_step)


def prepare_replay_step(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
                        cacheable_groups, block_table, block_size, W, Wr, *, index_width=None, plan=None,
                        any_replay=None, out=None) -> PreparedStep:
    """``R = batch_replay_start(R_per_request, idx_mapping, is_prefilling)``;
    ``pad_replayed_slots(slot_mappings, cacheable_groups, query_start_loc, positions, R, Wr)``;
    ``swa_indices_and_lens(query_start_loc, seq_lens, block_table, block_size, W, R,
    index_width=index_width, num_tokens=len(positions))``; with a plan,
    ``gather_replay_batch(plan, query_start_loc, seq_lens, R, positions, slot_mappings, W)``
    on the padded slots -- all in one launch. Returns a :class:`PreparedStep`.
    """
    dev = positions.device
    B = idx_mapping.shape[0]
    T = positions.shape[0]
    G = slot_mappings.shape[0]
    width = W if index_width is None else index_width
    if out is None:
        out = allocate_out(B, T, width, dev, plan, G)
    rs, swa, lens = out["replay_start"], out["swa_indices"], out["swa_lens"]
    n_groups = cacheable_groups.shape[0]
    do_pad = not (any_replay is False or Wr == 0 or n_groups == 0)
    has_plan = plan is not None
    tok_tiles = (T + BLOCK_T - 1) // BLOCK_T
    if has_plan:
        dropped, trimmed = plan.device_tensors(dev)
        n, n_pad = plan.num_rows, plan.num_rows_padded
        rb = out["replay_batch"]
        rows, oqsl, opos, oslot, kv = (rb["rows"], rb["query_start_loc"], rb["positions"], rb["slot_mappings"],
                                       rb["kv_start"])
        gather_tiles = (n_pad + BLOCK - 1) // BLOCK
    else:
        dropped = trimmed = rows = oqsl = opos = oslot = kv = None
        n = n_pad = gather_tiles = 0
    grid = (tok_tiles + gather_tiles + (B + BLOCK) // BLOCK, 1, 1)
    _K((R_per_request.dtype, idx_mapping.dtype, do_pad, has_plan), grid,
       contiguous(R_per_request), contiguous(idx_mapping), contiguous(is_prefilling), contiguous(query_start_loc),
       contiguous(seq_lens), contiguous(positions), slot_mappings, slot_mappings.stride(0), slot_mappings.stride(1),
       contiguous(cacheable_groups), n_groups, block_table, block_table.stride(0), block_table.stride(1),
       block_table.shape[1], rs, swa, swa.stride(0), lens, dropped, trimmed, rows, oqsl, opos, oslot, kv,
       B, T, G, width, n, n_pad, B.bit_length(), block_size, W, Wr, tok_tiles, gather_tiles,
       do_pad, has_plan, BLOCK_T, BLOCK_W, BLOCK)
    batch = ReplayBatch(rows, oqsl, opos, oslot, kv, n, n_pad) if has_plan else None
    return PreparedStep(rs, slot_mappings, swa, lens, batch)
