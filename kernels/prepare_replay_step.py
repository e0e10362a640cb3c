"""``prepare_replay_step`` in Triton: a step's replay metadata in ONE launch.

Replaces up to six launches (``batch_replay_start``, ``pad_replayed_slots``,
``swa_indices_and_lens`` -- twice when split into decode and prefill rows --,
``prefill_gather_lens``, ``gather_replay_batch``) on the per-step host path. The 1-D grid
is split into roles, each program taking one:

* token tiles ``[0, tok_tiles)`` (token blocks x column blocks): each of ``BLOCK_T`` tokens finds its request (binary
  search over ``query_start_loc``), computes its request's replay start itself
  (``R_per_request[idx_mapping[b]]`` if prefilling), pads its replayed cacheable slots and
  writes its window indices row and length (as in ``swa_indices_and_lens``: 32-bit
  arithmetic, one block-table split per token, contiguous row stores) into the decode or
  the prefill buffers (``prefill_from``; a pointer select per token, no branch);
* with a plan, request programs (``S`` per request, as in ``gather_replay_batch``): the
  request's ``replay_start``, gather length, sub-batch ``query_start_loc`` entry and ``kv_start``, and its
  kept sub-batch rows; a gathered slot is PAD where the padding above makes it PAD,
  computed from the same condition rather than read back, so the result never depends on
  which program ran first; then padding programs for the graph-padded rows;
* without a plan, request tiles of ``BLOCK_R`` requests: ``replay_start`` and gather lengths.

No program reads anything another program of the launch writes except the padded slots,
whose final value both possible orders agree on (the validity row, ``valid_group``, is never
a padded group). No host synchronisation.
"""

from __future__ import annotations

import contextlib
import functools

import triton
import triton.language as tl

from ..common.ops.prepare_replay_step import PreparedStep, WindowRows, allocate_out, quick_check
from ..common.types import MAX_POSITION
from ..common.validation import INT32_MAX
from ._device import (CHECK, PAD, batch_bad, block_split, find_kept_request, find_request, pow2_shift, range_bad,
                      table_bad, write_graph_padding)
from ._launch import Kernel, jit
from .gather_replay_batch import BLOCK, GB, _plan_bad, _plan_values, _replay_batch, plan_launch
from .range_check import GATE, checkers, flat_bad, flat_tiles, open_checked, passed, settle

#: A token program's tile, ``(tokens, window columns, warps)``, by the step's token count,
#: chosen from a sweep of tiles at the replay step's shapes (GPU time, L2 warm, the step's launch
#: alone: ``bench/experiments/exp_prepare_config.py``, ``bench/results/h200/exp_prepare_config_sweep.json``;
#: bench/README.md, "The token tile, chosen by the step's size"): 8 tokens x 128 columns on 2 warps
#: was the fastest tile tried from 4K tokens up; at 1K tokens, where 8-token tiles leave SMs idle
#: and each program's lanes wait on their loads in turn, 8 x 64 on 4 warps (twice the programs, a
#: quarter of the work per lane) is faster; at 2K the two tie. Each tile is its own compiled
#: kernel: warmups launch every tile (:func:`forced_tile`).
SMALL_STEP_TOKENS = 1024
SMALL_TILE = (8, 64, 4)
TILE = (8, 128, 2)
TILES = (SMALL_TILE, TILE)
_forced_tile = None


@contextlib.contextmanager
def forced_tile(tile):
    """Inside, every launch uses ``tile`` (one of :data:`TILES`) whatever the step's size: the
    warmups compile each tile on their small steps (a step past :data:`SMALL_STEP_TOKENS`
    costs seconds per launch under Triton's interpreter). A process-wide setting, for
    warmup before serving: a launch made meanwhile elsewhere still computes the same
    outputs, with this tile."""
    global _forced_tile
    if tile not in TILES:
        raise ValueError(f"forced_tile: tile={tile!r}: expected one of {TILES}")
    before, _forced_tile = _forced_tile, tile
    try:
        yield
    finally:
        _forced_tile = before

BLOCK_R = 256  # requests per program without a plan
#: the checker programs' tile of the block table (requests x columns)
CHECK_B, CHECK_C = 64, 64
KB = 8  # cacheable-group entries per load


@triton.jit
def _replay_start_of(rall_ptr, idx_ptr, pre_ptr, b, mask):
    """``batch_replay_start`` for batch rows ``b`` (int32, 0 where masked off)."""
    i = tl.load(idx_ptr + b, mask=mask, other=0).to(tl.int64)
    pre = tl.load(pre_ptr + b, mask=mask, other=0) != 0
    r = tl.load(rall_ptr + i, mask=mask & pre, other=0)
    return tl.where(pre, r, 0).to(tl.int32)


@triton.jit
def _cacheable(groups_ptr, n_groups, gg, KB: tl.constexpr):
    """1 where slot group ``gg[i]`` is listed in ``cacheable_groups``, else 0 (int32)."""
    k = tl.arange(0, KB)
    hit = tl.zeros_like(gg)
    for k0 in range(0, n_groups, KB):
        grp = tl.load(groups_ptr + k0 + k, mask=k0 + k < n_groups, other=-1)
        hit = hit | tl.max((grp[None, :] == gg[:, None]).to(tl.int32), axis=1)
    return hit


@triton.jit
def _gather_len(q0, q1, seq, R, W):
    """``prefill_gather_lens`` of a request (int32): ``q + min(max(prefix - R, 0), W - 1)``."""
    q = q1 - q0
    return q + tl.minimum(tl.maximum(seq - q - R, 0), W - 1)


@triton.jit
def _token_role(pid, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t, groups_ptr, n_groups,
                bt_ptr, bt_s0, bt_s1, n_cols, swa_ptr, swa_s0, lens_ptr, pswa_ptr, pswa_s0, plens_ptr, P, vg,
                B, T, width, n_steps, block_size, bs_shift, W, Wr, col_blocks, DO_PAD: tl.constexpr,
                SPLIT: tl.constexpr, HAS_VALID: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
                KB: tl.constexpr):
    """Tokens ``[tile*BLOCK_T, ...)``, columns ``[cb*BLOCK_W, ...)`` (``pid = tile *
    col_blocks + cb``): their clamped window indices (tokens from ``P`` on into the prefill
    buffers when ``SPLIT``; a token whose slot in row ``vg`` is negative gets none when
    ``HAS_VALID``); the ``cb == 0`` program also pads the tokens' replayed cacheable slots
    and writes their lengths. (One program per column block rather than a loop over them: a
    loop gets software-pipelined into twice the registers.)"""
    tile = pid // col_blocks
    cb = pid - tile * col_blocks
    t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    m = t < T
    req = find_request(qsl_ptr, B, t, n_steps)
    ok = m & (req < B)
    R = _replay_start_of(rall_ptr, idx_ptr, pre_ptr, req, ok)
    seq = tl.load(seq_ptr + req, mask=ok, other=0)
    start = tl.load(qsl_ptr + req, mask=ok, other=0)
    end = tl.load(qsl_ptr + req + 1, mask=ok, other=0)
    R = tl.where(R <= seq - (end - start), R, 0)  # the live replay start: a stale one pads and clamps nothing
    t64 = t.to(tl.int64)
    if DO_PAD and cb == 0:
        p = tl.load(pos_ptr + t, mask=ok, other=0)
        # pad_replayed_slots' own rule too: an R above the request's first position pads nothing
        # (the two agree for a consistent batch; SPEC §0)
        first_p = tl.load(pos_ptr + start, mask=ok, other=0)
        R64 = R.to(tl.int64)
        replayed = ok & (R64 > 0) & (R64 <= first_p) & (p >= R64) & (p < R64 + Wr)
        k = tl.arange(0, KB)
        for k0 in range(0, n_groups, KB):
            km = k0 + k < n_groups
            grp = tl.load(groups_ptr + k0 + k, mask=km, other=0).to(tl.int64)
            tl.store(slot_ptr + grp[:, None] * s_g + t64[None, :] * s_t, tl.full([KB, BLOCK_T], PAD, tl.int64),
                     mask=km[:, None] & replayed[None, :])
    if HAS_VALID:  # the window group is never padded: its slots read the same before and after
        ok = ok & (tl.load(slot_ptr + vg.to(tl.int64) * s_g + t64 * s_t, mask=ok, other=-1) >= 0)
    _window_rows(t, m, ok, req, seq - (end - t), R, P, swa_ptr, swa_s0, lens_ptr, pswa_ptr, pswa_s0, plens_ptr,
                 bt_ptr, bt_s0, bt_s1, n_cols, cb, width, block_size, bs_shift, W, SPLIT, BLOCK_W)


@triton.jit
def _window_rows(t, m, ok, req, pos, R, P, swa_ptr, swa_s0, lens_ptr, pswa_ptr, pswa_s0, plens_ptr, bt_ptr, bt_s0,
                 bt_s1, n_cols, cb, width, block_size, bs_shift, W, SPLIT: tl.constexpr, BLOCK_W: tl.constexpr):
    """Tokens ``t`` (of request ``req``, at ``pos``, live replay start ``R``; ``m``: in the
    call, ``ok``: with a window): their window indices ``[max(pos - W + 1, 0, R), pos]`` through
    the block table, columns ``[cb*BLOCK_W, ...)`` of each row, and (``cb == 0``) their lengths;
    tokens from ``P`` on into the prefill buffers when ``SPLIT`` (a pointer select per token,
    no branch)."""
    t64 = t.to(tl.int64)
    lo = tl.maximum(tl.maximum(pos - (W - 1), 0), R)  # the clamp contract
    lens = tl.where(ok, pos - lo + 1, 0)
    if SPLIT:
        pre = t >= P
        len_at = tl.where(pre, plens_ptr + (t - P), lens_ptr + t)
        row_at = tl.where(pre, pswa_ptr + (t64 - P) * pswa_s0, swa_ptr + t64 * swa_s0)
    else:
        len_at = lens_ptr + t
        row_at = swa_ptr + t64 * swa_s0
    if cb == 0:
        tl.store(len_at, lens, mask=m)
    lo_col, lo_off = block_split(lo, block_size, bs_shift)
    j = cb * BLOCK_W + tl.arange(0, BLOCK_W)
    live = (j[None, :] < lens[:, None]) & ok[:, None]
    nb, within = block_split(lo_off[:, None] + j[None, :], block_size, bs_shift)
    col = tl.minimum(lo_col[:, None] + nb, n_cols - 1)  # -1 only for an empty table: block 0, as the reference
    block = tl.load(bt_ptr + req.to(tl.int64)[:, None] * bt_s0 + col.to(tl.int64) * bt_s1, mask=live & (col >= 0),
                    other=0)
    slot = tl.where(live, block * block_size + within, PAD)
    tl.store(row_at[:, None] + j[None, :], slot, mask=m[:, None] & (j[None, :] < width))


@triton.jit
def _kept_token_role(pid, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, drop_ptr, seq_ptr, slot_ptr, s_g, s_t, bt_ptr, bt_s0,
                     bt_s1, n_cols, ka_ptr, ka_s0, kal_ptr, kpa_ptr, kpa_s0, kpal_ptr, kf_ptr, kf_s0, kfl_ptr, kpf_ptr,
                     kpf_s0, kpfl_ptr, Pk, vg, B, T, Tk, width, n_steps, block_size, bs_shift, W, col_blocks,
                     KEPT: tl.constexpr, HAS_VALID: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
    """The decoder sub-batch's window rows, sub-batch tokens ``[tile*BLOCK_T, ...)`` x columns
    ``[cb*BLOCK_W, ...)``: what ``swa_indices_and_lens`` writes for the sub-batch the request
    programs gather (its boundaries, its slots in row ``vg``: computed here from the same
    inputs, never read back), split at ``Pk``, clamped at the sub-batch's ``kv_start`` (the
    replay layers' build) and, with ``KEPT == 2``, at the batch's replay start (the first
    replay layer's build); a clamp above the sub-batch row's first position counts as 0, as
    the op judges it."""
    tile = pid // col_blocks
    cb = pid - tile * col_blocks
    t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    m = t < Tk
    req = find_kept_request(qsl_ptr, drop_ptr, B, t, n_steps)
    ok = m & (req < B)
    seq = tl.load(seq_ptr + req, mask=ok, other=0)
    q0 = tl.load(qsl_ptr + req, mask=ok, other=0)
    q1 = tl.load(qsl_ptr + req + 1, mask=ok, other=0)
    d0 = tl.load(drop_ptr + req, mask=ok, other=0)
    d1 = tl.load(drop_ptr + req + 1, mask=ok, other=0)
    end = q1 - d1
    first = seq - (end - (q0 - d0))  # the sub-batch request's first position
    raw = _replay_start_of(rall_ptr, idx_ptr, pre_ptr, req, ok)
    R = tl.where(raw <= seq - (q1 - q0), raw, 0)
    kv = tl.where(d1 > d0, tl.maximum(R, seq - W), R)
    if HAS_VALID:  # the row's slot in the window group (never padded), as the gather copies it
        row = (t + d1).to(tl.int64)
        live = ok & (row < T) & (row >= 0)
        ok = ok & (tl.load(slot_ptr + vg.to(tl.int64) * s_g + row * s_t, mask=live, other=-1) >= 0)
    pos = seq - (end - t)
    _window_rows(t, m, ok, req, pos, tl.where(kv <= first, kv, 0), Pk, ka_ptr, ka_s0, kal_ptr, kpa_ptr, kpa_s0,
                 kpal_ptr, bt_ptr, bt_s0, bt_s1, n_cols, cb, width, block_size, bs_shift, W, True, BLOCK_W)
    if KEPT == 2:
        _window_rows(t, m, ok, req, pos, tl.where(raw <= first, raw, 0), Pk, kf_ptr, kf_s0, kfl_ptr, kpf_ptr, kpf_s0,
                     kpfl_ptr, bt_ptr, bt_s0, bt_s1, n_cols, cb, width, block_size, bs_shift, W, True, BLOCK_W)


@triton.jit
def _request_gather_role(pid, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t, groups_ptr,
                         n_groups, rs_out_ptr, stale_ptr, drop_ptr, rows_ptr, oqsl_ptr, opos_ptr, oslot_ptr, os_g,
                         kv_ptr, gl_ptr, g_from, kgla_ptr, kglf_ptr, gk, B, G, T, n_pad, W, Wr, S,
                         DO_PAD: tl.constexpr, HAS_GL: tl.constexpr, KEPT: tl.constexpr, BLOCK: tl.constexpr,
                         GB: tl.constexpr, KB: tl.constexpr, UNIT_T: tl.constexpr):
    """Request ``pid // S``: its live replay start and stale flag, sub-batch
    ``query_start_loc`` entry, ``kv_start`` and (``HAS_GL``, from request ``g_from`` on)
    gather length (the first of its ``S`` programs) and, for the sub-batch's ``KEPT`` window
    builds (:func:`_kept_token_role`), their gather lengths from request ``gk`` on; and every ``S``-th block of its kept
    rows on the device ``qsl`` (as ``gather_replay_batch``: stores inside the ``n_pad``
    output rows, gathers inside the batch's ``T``), their slots padded by the same
    condition the token role pads with."""
    r = tl.arange(0, BLOCK)
    g = tl.arange(0, GB)
    b = pid // S
    s = pid - b * S
    has = b < B
    q0 = tl.load(qsl_ptr + b)
    d0 = tl.load(drop_ptr + b)
    q1 = tl.load(qsl_ptr + b + 1, mask=has, other=0)
    d1 = tl.load(drop_ptr + b + 1, mask=has, other=0)
    seq = tl.load(seq_ptr + b, mask=has, other=0)
    trimmed = d1 > d0  # rows dropped inside the request: kept < q
    raw = _replay_start_of(rall_ptr, idx_ptr, pre_ptr, b, has)
    stale = raw > seq - (q1 - q0)
    R = tl.where(stale, 0, raw)
    start = q0 - d0
    end = tl.where(has, q1 - d1, start)
    if s == 0:
        kv = tl.where(trimmed, tl.maximum(R, seq - W), R)
        tl.store(rs_out_ptr + b, R, mask=has)
        tl.store(stale_ptr + b, stale.to(tl.int32), mask=has)
        tl.store(oqsl_ptr + b, start)
        tl.store(oqsl_ptr + B, end, mask=has & (b == B - 1))
        tl.store(kv_ptr + b, kv, mask=has)
        if HAS_GL:
            tl.store(gl_ptr + (b - g_from), _gather_len(q0, q1, seq, R, W), mask=has & (b >= g_from))
        if KEPT > 0:  # the sub-batch's builds: a clamp above its first position counts as 0
            first = seq - (end - start)
            tl.store(kgla_ptr + (b - gk), _gather_len(start, end, seq, tl.where(kv <= first, kv, 0), W),
                     mask=has & (b >= gk))
            if KEPT == 2:
                tl.store(kglf_ptr + (b - gk), _gather_len(start, end, seq, tl.where(raw <= first, raw, 0), W),
                         mask=has & (b >= gk))
    R64 = R.to(tl.int64)
    # the padding rule of pad_replayed_slots: an R above the request's first position pads nothing
    first_p = tl.load(pos_ptr + q0, mask=has & (q0 < q1), other=0)
    R64 = tl.where(R64 <= first_p, R64, 0)
    cacheable = tl.zeros([GB], tl.int32)
    if DO_PAD:
        cacheable = _cacheable(groups_ptr, n_groups, g, KB)
    for o0 in range(tl.maximum(start, 0) + s * BLOCK, tl.minimum(end, n_pad), S * BLOCK):
        o = o0 + r
        row = (o + d1).to(tl.int64)
        m = (o < end) & (o < n_pad)
        mr = m & (row < T) & (row >= 0)  # the batch's rows only
        gm = (g[:, None] < G) & m[None, :]
        p = tl.load(pos_ptr + row, mask=mr, other=0)
        if UNIT_T:  # the slot rows contiguous (usual): load and store tiles share one layout
            tok = row[None, :]
        else:
            tok = row[None, :] * s_t
        sl = tl.load(slot_ptr + g[:, None].to(tl.int64) * s_g + tok, mask=gm & mr[None, :], other=PAD)
        replayed = m & (R64 > 0) & (p >= R64) & (p < R64 + Wr)
        if DO_PAD:
            sl = tl.where(replayed[None, :] & (cacheable[:, None] != 0), PAD, sl)
        tl.store(rows_ptr + o, row, mask=m)
        tl.store(opos_ptr + o, p, mask=m)
        tl.store(oslot_ptr + g[:, None].to(tl.int64) * os_g + o[None, :], sl, mask=gm)
        for g0 in range(GB, G, GB):  # more than GB groups (rare)
            gg = g0 + g
            gm = (gg[:, None] < G) & m[None, :]
            sl = tl.load(slot_ptr + gg[:, None].to(tl.int64) * s_g + tok, mask=gm & mr[None, :], other=PAD)
            if DO_PAD:
                more = _cacheable(groups_ptr, n_groups, gg, KB)
                sl = tl.where(replayed[None, :] & (more[:, None] != 0), PAD, sl)
            tl.store(oslot_ptr + gg[:, None].to(tl.int64) * os_g + o[None, :], sl, mask=gm)


@triton.jit
def _step_program(pid, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t, groups_ptr,
                  n_groups, bt_ptr, bt_s0, bt_s1, n_cols, rs_out_ptr, stale_ptr, swa_ptr, swa_s0, lens_ptr, pswa_ptr,
                  pswa_s0, plens_ptr, P, vg, gl_ptr, g_from, drop_ptr, rows_ptr, oqsl_ptr, opos_ptr, oslot_ptr, os_g,
                  kv_ptr, ka_ptr, ka_s0, kal_ptr, kpa_ptr, kpa_s0, kpal_ptr, kgla_ptr, kf_ptr, kf_s0, kfl_ptr,
                  kpf_ptr, kpf_s0, kpfl_ptr, kglf_ptr, Pk, gk, Tk, B, T, G, width, n_pad, n_steps, block_size,
                  bs_shift, W, Wr, S, col_blocks, tok_tiles, req_progs, pad_progs, DO_PAD: tl.constexpr,
                  HAS_PLAN: tl.constexpr, SPLIT: tl.constexpr, HAS_VALID: tl.constexpr, HAS_GL: tl.constexpr,
                  KEPT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_R: tl.constexpr, GB: tl.constexpr, KB: tl.constexpr, UNIT_T: tl.constexpr):
    """Program ``pid`` of the launch the module docstring describes."""
    if pid < tok_tiles:
        _token_role(pid, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t, groups_ptr,
                    n_groups, bt_ptr, bt_s0, bt_s1, n_cols, swa_ptr, swa_s0, lens_ptr, pswa_ptr, pswa_s0, plens_ptr,
                    P, vg, B, T, width, n_steps, block_size, bs_shift, W, Wr, col_blocks, DO_PAD, SPLIT, HAS_VALID,
                    BLOCK_T, BLOCK_W, KB)
    elif HAS_PLAN:
        if pid < tok_tiles + req_progs:
            _request_gather_role(pid - tok_tiles, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr,
                                 s_g, s_t, groups_ptr, n_groups, rs_out_ptr, stale_ptr, drop_ptr, rows_ptr, oqsl_ptr,
                                 opos_ptr, oslot_ptr, os_g, kv_ptr, gl_ptr, g_from, kgla_ptr, kglf_ptr, gk, B, G, T,
                                 n_pad, W, Wr, S, DO_PAD, HAS_GL, KEPT, BLOCK, GB, KB, UNIT_T)
        elif pid < tok_tiles + req_progs + pad_progs:
            write_graph_padding(pid - tok_tiles - req_progs, pad_progs, qsl_ptr, drop_ptr, B, T, pos_ptr, rows_ptr,
                                opos_ptr, oslot_ptr, os_g, G, n_pad, BLOCK, GB)
        elif KEPT > 0:
            _kept_token_role(pid - tok_tiles - req_progs - pad_progs, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, drop_ptr,
                             seq_ptr, slot_ptr, s_g, s_t, bt_ptr, bt_s0, bt_s1, n_cols, ka_ptr, ka_s0, kal_ptr,
                             kpa_ptr, kpa_s0, kpal_ptr, kf_ptr, kf_s0, kfl_ptr, kpf_ptr, kpf_s0, kpfl_ptr, Pk, vg, B,
                             T, Tk, width, n_steps, block_size, bs_shift, W, col_blocks, KEPT, HAS_VALID, BLOCK_T,
                             BLOCK_W)
    else:
        b = (pid - tok_tiles) * BLOCK_R + tl.arange(0, BLOCK_R)
        mb = b < B
        R = _replay_start_of(rall_ptr, idx_ptr, pre_ptr, b, mb)
        q0 = tl.load(qsl_ptr + b, mask=mb, other=0)
        q1 = tl.load(qsl_ptr + b + 1, mask=mb, other=0)
        seq = tl.load(seq_ptr + b, mask=mb, other=0)
        stale = R > seq - (q1 - q0)
        R = tl.where(stale, 0, R)
        tl.store(rs_out_ptr + b, R, mask=mb)
        tl.store(stale_ptr + b, stale.to(tl.int32), mask=mb)
        if HAS_GL:
            tl.store(gl_ptr + (b - g_from), _gather_len(q0, q1, seq, R, W), mask=mb & (b >= g_from))


@jit
def _prepare_replay_step(rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t,
                         groups_ptr, n_groups, bt_ptr, bt_s0, bt_s1, n_cols,
                         rs_out_ptr, stale_ptr, swa_ptr, swa_s0, lens_ptr, pswa_ptr, pswa_s0, plens_ptr, P, vg,
                         gl_ptr, g_from, drop_ptr, rows_ptr, oqsl_ptr, opos_ptr, oslot_ptr, os_g, kv_ptr,
                         ka_ptr, ka_s0, kal_ptr, kpa_ptr, kpa_s0, kpal_ptr, kgla_ptr,
                         kf_ptr, kf_s0, kfl_ptr, kpf_ptr, kpf_s0, kpfl_ptr, kglf_ptr, Pk, gk, Tk,
                         B, T, G, width, n_pad, n_steps, block_size, bs_shift, W, Wr, S, col_blocks, tok_tiles,
                         req_progs, pad_progs,
                         DO_PAD: tl.constexpr, HAS_PLAN: tl.constexpr, SPLIT: tl.constexpr, HAS_VALID: tl.constexpr,
                         HAS_GL: tl.constexpr, KEPT: tl.constexpr, BLOCK_T: tl.constexpr,
                         BLOCK_W: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, GB: tl.constexpr,
                         KB: tl.constexpr, UNIT_T: tl.constexpr):
    _step_program(tl.program_id(0), rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t,
                  groups_ptr, n_groups, bt_ptr, bt_s0, bt_s1, n_cols, rs_out_ptr, stale_ptr, swa_ptr, swa_s0,
                  lens_ptr, pswa_ptr, pswa_s0, plens_ptr, P, vg, gl_ptr, g_from, drop_ptr, rows_ptr, oqsl_ptr,
                  opos_ptr, oslot_ptr, os_g, kv_ptr, ka_ptr, ka_s0, kal_ptr, kpa_ptr, kpa_s0, kpal_ptr, kgla_ptr,
                  kf_ptr, kf_s0, kfl_ptr, kpf_ptr, kpf_s0, kpfl_ptr, kglf_ptr, Pk, gk, Tk, B, T, G, width, n_pad,
                  n_steps, block_size, bs_shift, W, Wr, S, col_blocks, tok_tiles, req_progs, pad_progs, DO_PAD,
                  HAS_PLAN, SPLIT, HAS_VALID, HAS_GL, KEPT, BLOCK_T, BLOCK_W, BLOCK, BLOCK_R, GB, KB, UNIT_T)


@triton.jit
def _listed(groups_ptr, n_groups, vg, CHECK: tl.constexpr):
    """``vg`` is among ``groups_ptr[0:n_groups]`` (the validity row a padded group)."""
    k = tl.arange(0, CHECK)
    hit = tl.zeros([CHECK], tl.int32)
    for s in range(0, n_groups, CHECK):
        grp = tl.load(groups_ptr + s + k, mask=s + k < n_groups, other=-1)
        hit |= (grp == vg).to(tl.int32)
    return tl.max(hit, axis=0)


@triton.jit
def _some_replay(rall_ptr, idx_ptr, pre_ptr, B, NR, CHECK: tl.constexpr):
    """Some batch row's replay start (``batch_replay_start``, an ``idx_mapping`` entry out of range
    read as none) above 0: refused with ``any_replay=False``."""
    k = tl.arange(0, CHECK)
    some = tl.zeros([CHECK], tl.int32)
    for s in range(0, B, CHECK):
        b = s + k
        m = b < B
        i = tl.load(idx_ptr + b, mask=m, other=0).to(tl.int64)
        pre = tl.load(pre_ptr + b, mask=m, other=0) != 0
        r = tl.load(rall_ptr + i, mask=m & pre & (i >= 0) & (i < NR), other=0)
        some |= (r > 0).to(tl.int32)
    return tl.max(some, axis=0)


@triton.jit
def _step_bad(pid, NCHK, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, groups_ptr, n_groups, bt_ptr, bt_s0,
              bt_s1, n_cols, drop_ptr, plan_ptr, vg, B, T, G, n_pad, block_size, NR, top, n_rows, any_false,
              HAS_PLAN: tl.constexpr, HAS_VALID: tl.constexpr, CHECK: tl.constexpr,
              CHECK_B: tl.constexpr, CHECK_C: tl.constexpr, MAX_POSITION: tl.constexpr):
    """Checker ``pid`` of ``NCHK`` (at least 4): its share of the value checks of the parts'
    validators (on the replay starts the call makes; a stale one passes them): every checker its
    share of the positions and of the block table's rows; checker 0 ``batch_replay_start``'s
    (every ``R_per_request``, ``idx_mapping`` inside it), 1 the batch (``query_start_loc`` from 0,
    non-decreasing, at most T; ``seq_lens``), 2 the cacheable groups (rows of ``slot_mappings``,
    never ``valid_group``), 3 the plan (``gather_replay_batch``'s) and ``any_replay=False``. (The
    replay starts' range follows from ``R_per_request``'s.)"""
    bad = flat_bad(pos_ptr, T, 0, MAX_POSITION, pid, NCHK, CHECK)
    bad |= table_bad(bt_ptr, bt_s0, bt_s1, n_cols, seq_ptr, B, block_size, top, pid, NCHK, CHECK_B, CHECK_C)
    if pid == 0:
        bad |= range_bad(rall_ptr, NR, 0, MAX_POSITION, CHECK) | range_bad(idx_ptr, B, 0, NR - 1, CHECK)
    if pid == 1:
        bad |= batch_bad(qsl_ptr, seq_ptr, seq_ptr, B, T, MAX_POSITION, True, True, False, CHECK)
    if pid == 2:
        bad |= range_bad(groups_ptr, n_groups, 0, G - 1, CHECK)
        if HAS_VALID:
            bad |= _listed(groups_ptr, n_groups, vg, CHECK)
    if pid == 3:
        if HAS_PLAN:
            bad |= _plan_bad(qsl_ptr, drop_ptr, plan_ptr, B, n_rows, n_pad, CHECK)
        if any_false != 0:
            bad |= _some_replay(rall_ptr, idx_ptr, pre_ptr, B, NR, CHECK)
    return bad


@jit
def _prepare_replay_step_checked(rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t,
                                 groups_ptr, n_groups, bt_ptr, bt_s0, bt_s1, n_cols, rs_out_ptr, stale_ptr, swa_ptr,
                                 swa_s0, lens_ptr, pswa_ptr, pswa_s0, plens_ptr, P, vg, gl_ptr, g_from, drop_ptr,
                                 rows_ptr, oqsl_ptr, opos_ptr, oslot_ptr, os_g, kv_ptr, ka_ptr, ka_s0, kal_ptr,
                                 kpa_ptr, kpa_s0, kpal_ptr, kgla_ptr, kf_ptr, kf_s0, kfl_ptr, kpf_ptr, kpf_s0,
                                 kpfl_ptr, kglf_ptr, Pk, gk, Tk, B, T, G, width, n_pad, n_steps, block_size, bs_shift,
                                 W, Wr, S, col_blocks, tok_tiles, req_progs, pad_progs, plan_ptr, flag_ptr,
                                 scratch_ptr, NR, top, n_rows, any_false, NCHK, epoch, DO_PAD: tl.constexpr,
                                 HAS_PLAN: tl.constexpr, SPLIT: tl.constexpr, HAS_VALID: tl.constexpr,
                                 HAS_GL: tl.constexpr, KEPT: tl.constexpr, BLOCK_T: tl.constexpr,
                                 BLOCK_W: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, GB: tl.constexpr,
                                 KB: tl.constexpr, UNIT_T: tl.constexpr, CHECK: tl.constexpr,
                                 CHECK_B: tl.constexpr, CHECK_C: tl.constexpr, MAX_POSITION: tl.constexpr,
                                 GATE: tl.constexpr, NAP: tl.constexpr):
    """A validated call: ``NCHK`` (at least 4) checker programs test every value the validator tests
    (``_step_bad``), the others are the plain kernel's programs once they pass (``range_check.py``)."""
    pid = tl.program_id(0)
    if pid < NCHK:
        bad = _step_bad(pid, NCHK, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, groups_ptr, n_groups, bt_ptr,
                        bt_s0, bt_s1, n_cols, drop_ptr, plan_ptr, vg, B, T, G, n_pad, block_size, NR, top, n_rows,
                        any_false, HAS_PLAN, HAS_VALID, CHECK, CHECK_B, CHECK_C, MAX_POSITION)
        settle(bad, NCHK, flag_ptr, scratch_ptr, epoch, GATE)
    elif passed(scratch_ptr, epoch, GATE, NAP):
        _step_program(pid - NCHK, rall_ptr, idx_ptr, pre_ptr, qsl_ptr, seq_ptr, pos_ptr, slot_ptr, s_g, s_t, groups_ptr,
                      n_groups, bt_ptr, bt_s0, bt_s1, n_cols, rs_out_ptr, stale_ptr, swa_ptr, swa_s0, lens_ptr,
                      pswa_ptr, pswa_s0, plens_ptr, P, vg, gl_ptr, g_from, drop_ptr, rows_ptr, oqsl_ptr, opos_ptr,
                      oslot_ptr, os_g, kv_ptr, ka_ptr, ka_s0, kal_ptr, kpa_ptr, kpa_s0, kpal_ptr, kgla_ptr, kf_ptr,
                      kf_s0, kfl_ptr, kpf_ptr, kpf_s0, kpfl_ptr, kglf_ptr, Pk, gk, Tk, B, T, G, width, n_pad, n_steps,
                      block_size, bs_shift, W, Wr, S, col_blocks, tok_tiles, req_progs, pad_progs, DO_PAD, HAS_PLAN,
                      SPLIT, HAS_VALID, HAS_GL, KEPT, BLOCK_T, BLOCK_W, BLOCK, BLOCK_R, GB, KB, UNIT_T)


def _compile_options(key: tuple) -> dict:
    return {"num_warps": key[-1]}  # the key ends with the tile


_K = Kernel(_prepare_replay_step, options=_compile_options)
_K_CHECKED = Kernel(_prepare_replay_step_checked, options=_compile_options)


def prepare_replay_step(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
                        cacheable_groups, block_table, block_size, W, Wr, *, index_width=None, plan=None,
                        any_replay=None, prefill_from=None, gather_lens_from=None, valid_group=None,
                        kept_windows=0, kept_prefill_from=None, kept_gather_lens_from=None,
                        out=None) -> PreparedStep:
    """``R = batch_replay_start(R_per_request, idx_mapping, is_prefilling)``;
    ``pad_replayed_slots(slot_mappings, cacheable_groups, query_start_loc, positions, R, Wr)``;
    ``swa_indices_and_lens(query_start_loc, seq_lens, block_table, block_size, W, R,
    index_width=index_width, num_tokens=len(positions))`` (split at ``prefill_from``, tokens
    whose slot in row ``valid_group`` is negative invalid); with ``gather_lens_from``, the
    gather lengths of the requests from it on; with a plan, ``gather_replay_batch(plan,
    query_start_loc, seq_lens, R, positions, slot_mappings, W)`` on the padded slots -- all
    in one launch; with ``kept_windows`` (1 or 2), the sub-batch's window builds too
    (``common.ops.prepare_replay_step.reference``). Returns a :class:`PreparedStep`.
    """
    return _run(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
                cacheable_groups, block_table, block_size, W, Wr, index_width, plan, any_replay, prefill_from,
                gather_lens_from, valid_group, kept_windows, kept_prefill_from, kept_gather_lens_from, out, None)


def prepare_replay_step_checked(home, R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions,
                                slot_mappings, cacheable_groups, block_table, block_size, W, Wr, *, index_width=None,
                                plan=None, any_replay=None, prefill_from=None, gather_lens_from=None, valid_group=None,
                                kept_windows=0, kept_prefill_from=None, kept_gather_lens_from=None, out=None):
    """The validated form (``Variant.self_checked``), behind the op's quick host checks:
    ``(PreparedStep, Verdict)`` from one launch whose checker programs test every value the parts'
    validators test and whose other programs are the plain kernel's once they pass (nothing written
    on a ``FAIL``, the slot mappings included); None for a call it does not take (no request)."""
    try:
        if not quick_check(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions,
                           slot_mappings, cacheable_groups, block_table, block_size, W, Wr, index_width=index_width,
                           plan=plan, any_replay=any_replay, prefill_from=prefill_from,
                           gather_lens_from=gather_lens_from, valid_group=valid_group, kept_windows=kept_windows,
                           kept_prefill_from=kept_prefill_from, kept_gather_lens_from=kept_gather_lens_from, out=out):
            return None
    except Exception:  # an argument the quick checks cannot read: the validator names it
        return None
    dev = positions.device
    if idx_mapping.shape[0] == 0 or (home is not None and dev != home):
        return None
    checked = open_checked(dev)
    return _run(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
                cacheable_groups, block_table, block_size, W, Wr, index_width, plan, any_replay, prefill_from,
                gather_lens_from, valid_group, kept_windows, kept_prefill_from, kept_gather_lens_from, out,
                checked), checked[0]


def _run(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
         cacheable_groups, block_table, block_size, W, Wr, index_width, plan, any_replay, prefill_from,
         gather_lens_from, valid_group, kept_windows, kept_prefill_from, kept_gather_lens_from, out, checked):
    B, T, G = idx_mapping.shape[0], positions.shape[0], slot_mappings.shape[0]
    width = W if index_width is None else index_width
    split, has_gl, has_valid = prefill_from is not None, gather_lens_from is not None, valid_group is not None
    if out is None:
        out = allocate_out(B, T, width, positions.device, plan, G, prefill_from=prefill_from,
                           gather_lens_from=gather_lens_from, kept_windows=kept_windows,
                           kept_prefill_from=kept_prefill_from, kept_gather_lens_from=kept_gather_lens_from)
    rs, swa, lens, stale = out["replay_start"], out["swa_indices"], out["swa_lens"], out["stale_replay"]
    pswa = out["prefill_swa_indices"] if split else None
    plens = out["prefill_swa_lens"] if split else None
    gl = out["gather_lens"] if has_gl else None
    n_groups = cacheable_groups.shape[0]
    do_pad = not (any_replay is False or Wr == 0 or n_groups == 0)
    bt, bw, warps = _forced_tile or (SMALL_TILE if T <= SMALL_STEP_TOKENS else TILE)
    col_blocks = (width + bw - 1) // bw or 1
    tok_tiles = (T + bt - 1) // bt * col_blocks
    if plan is not None:
        entry = plan._launch_cache.get(positions.get_device())
        if entry is None:
            entry = plan_launch(plan, positions)
        dropped, _, n, n_pad, S, req_progs, pad_progs, _ = entry
        rb = out["replay_batch"]
        rows, oqsl, opos, oslot, kv = (rb["rows"], rb["query_start_loc"], rb["positions"], rb["slot_mappings"],
                                       rb["kv_start"])
        os_g = oslot.stride()[0] if G > 1 else n_pad
    else:
        dropped = rows = oqsl = opos = oslot = kv = None
        n = n_pad = req_progs = pad_progs = os_g = 0
        S = 1
    kept = kept_windows if plan is not None else 0
    ka = kf = _NO_WINDOWS
    Pk = gk = kept_progs = 0
    if kept:
        Pk = n if kept_prefill_from is None else kept_prefill_from
        gk = B if kept_gather_lens_from is None else kept_gather_lens_from
        ka = _window_args(out["kept_windows"])
        if kept == 2:
            kf = _window_args(out["kept_first_windows"])
        kept_progs = (n + bt - 1) // bt * col_blocks
    if plan is not None:
        grid = (tok_tiles + req_progs + pad_progs + kept_progs, 1, 1)
    else:
        grid = (tok_tiles + (B + BLOCK_R - 1) // BLOCK_R, 1, 1)
    s_g, s_t = slot_mappings.stride()
    bt_s0, bt_s1 = block_table.stride()
    key = (R_per_request.dtype, idx_mapping.dtype, do_pad, plan is not None, s_t == 1, split, has_valid, has_gl, kept,
           bt, bw, warps)
    head = (R_per_request if R_per_request.is_contiguous() else R_per_request.contiguous(),
            idx_mapping if idx_mapping.is_contiguous() else idx_mapping.contiguous(),
            is_prefilling if is_prefilling.is_contiguous() else is_prefilling.contiguous(),
            query_start_loc if query_start_loc.is_contiguous() else query_start_loc.contiguous(),
            seq_lens if seq_lens.is_contiguous() else seq_lens.contiguous(),
            positions if positions.is_contiguous() else positions.contiguous(), slot_mappings, s_g, s_t,
            cacheable_groups if cacheable_groups.is_contiguous() else cacheable_groups.contiguous(), n_groups,
            block_table, bt_s0, bt_s1, block_table.shape[1],
            rs, stale, swa, swa.stride()[0], lens, pswa, pswa.stride()[0] if split else 0, plens, prefill_from or 0,
            valid_group or 0, gl, gather_lens_from or 0, dropped, rows, oqsl, opos, oslot, os_g, kv, *ka, *kf, Pk, gk,
            n, B, T, G, width, n_pad, B.bit_length(), block_size, _pow2_shift(block_size), W, Wr, S, col_blocks,
            tok_tiles, req_progs, pad_progs)
    tail = (do_pad, plan is not None, split, has_valid, has_gl, kept, bt, bw, BLOCK, BLOCK_R, GB, KB, s_t == 1)
    if checked is None:
        _K(key, grid, *head, *tail)
    else:
        verdict, scratch, epoch, nap = checked
        # (at least 4 checkers: four share the per-request checks, _step_bad)
        nchk = max(4, checkers(max(flat_tiles(T), -(-B // CHECK_B))))
        _K_CHECKED((nap, *key), (nchk + grid[0], 1, 1), *head,
                   _plan_values(plan, positions.device) if plan is not None else None, verdict.word, scratch,
                   R_per_request.shape[0], (INT32_MAX - block_size + 1) // block_size, n, int(any_replay is False),
                   nchk, epoch, *tail, CHECK, CHECK_B, CHECK_C, MAX_POSITION, GATE, nap)
    batch = _replay_batch(rows, oqsl, opos, oslot, kv, n, n_pad) if plan is not None else None
    windows = (_windows(out["kept_windows"]) if kept else None, _windows(out["kept_first_windows"]) if kept == 2 else None)
    return _tuple_new(PreparedStep, (rs, slot_mappings, swa, lens, batch, pswa, plens, gl, stale, *windows))


#: the kernel's arguments for a sub-batch build it does not make
_NO_WINDOWS = (None, 0, None, None, 0, None, None)


def _window_args(o: dict) -> tuple:
    """One sub-batch build's buffers as the kernel takes them (rows with their row strides)."""
    swa, pswa = o["swa_indices"], o["prefill_swa_indices"]
    return (swa, swa.stride()[0], o["swa_lens"], pswa, pswa.stride()[0], o["prefill_swa_lens"], o["gather_lens"])


def _windows(o: dict) -> WindowRows:
    return _tuple_new(WindowRows, (o["swa_indices"], o["swa_lens"], o["prefill_swa_indices"], o["prefill_swa_lens"],
                                   o["gather_lens"]))


_pow2_shift = functools.lru_cache(maxsize=64)(pow2_shift)
# a NamedTuple of every field: its generated __new__ is a Python function around this same call
# (bench/README.md, "Host costs on the CPU")
_tuple_new = tuple.__new__
