"""``prepare_replay_step``: a step's replay metadata in one call (SPEC §2.1, §2.2, §2.4, §3.2).

The encoder- and decoder-side metadata of one serving step, produced together:
the per-batch replay start (``batch_replay_start``), the replayed cacheable slots padded in
place (``pad_replayed_slots``), the clamped window indices and lengths
(``swa_indices_and_lens``), optionally the prefill gather lengths (``prefill_gather_lens``)
and, given a plan, the decoder sub-batch (``gather_replay_batch``, gathered from the
*padded* slots). The reference below is exactly those references composed in that order; a
fused variant (the Triton one is a single launch) must give the same result bit for bit.

Three keywords shape the outputs the way a serving engine keeps them (vLLM 0.33's sparse-SWA
builder: decode rows and prefill rows in two buffers, gather lengths for its prefills only,
token validity from the window group's slots): ``prefill_from`` (tokens from it on write
``prefill_swa_indices`` / ``prefill_swa_lens``, their rows based at 0), ``gather_lens_from``
(requests from it on get ``gather_lens``) and ``valid_group`` (a token whose slot in that
row of ``slot_mappings``, read before padding, is negative gets no window: length 0, row all
PAD; the row must not be a cacheable group). Left out, the step is as before: every token in
``swa_indices``, no gather lengths, every token valid.

With a plan, ``kept_windows`` (1 or 2) adds the decoder sub-batch's own window builds, which
vLLM 0.33 makes right after the gather (``_prepare_replay_batch``: one build for the replay
layers, clamped at the sub-batch's ``kv_start``, one for the first replay layer, clamped at
the batch's replay start): ``swa_indices_and_lens`` and ``prefill_gather_lens`` over the
sub-batch the step gathers (its ``query_start_loc``, its slots in ``valid_group``'s row),
split at ``kept_prefill_from`` sub-batch tokens, gather lengths from sub-batch request
``kept_gather_lens_from`` on, into ``out["kept_windows"]`` (and ``out["kept_first_windows"]``).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

import numpy as np
import torch

from ..types import INDEX_DTYPE, MAX_WINDOW, PAD, SLOT_DTYPE, ReplayBatch, ReplayPlan
from ..validation import check_int, check_out, check_tensor, defer, fail, labelled, value_checks_enabled
from . import batch_replay_start, gather_replay_batch, pad_replayed_slots, prefill_gather_lens, swa_indices_and_lens
from ._batch import stale_replay
from ._quick import disjoint, plain
from ._quick import rows as row_slices  # (``rows`` names the step's row counts here)
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import Batch, CaseDraw, WarmupStep, host_plan, poisoned, random_batch

NAME = "prepare_replay_step"


class PreparedStep(NamedTuple):
    """``replay_start`` int32 [B] (each row's live replay start: 0 where it was stale);
    ``slot_mappings`` (the input, padded in place);
    ``swa_indices`` int32 [P, index_width] and ``swa_lens`` int32 [P] (tokens ``[0, P)``,
    ``P = prefill_from``, default T); ``replay_batch`` (:class:`ReplayBatch`, None without a
    plan); ``prefill_swa_indices`` [T - P, index_width] and ``prefill_swa_lens`` [T - P]
    (tokens ``[P, T)``); ``gather_lens`` int32 [B - gather_lens_from] (empty by default);
    ``stale_replay`` int32 [B]: 1 where a row's replay start was stale (above its first
    scheduled position ``seq_len - q``, SPEC §0: an in-place restart) and counted as 0, so
    the engine can preempt and re-admit the request without reading the device first."""

    replay_start: torch.Tensor
    slot_mappings: torch.Tensor
    swa_indices: torch.Tensor
    swa_lens: torch.Tensor
    replay_batch: ReplayBatch | None
    prefill_swa_indices: torch.Tensor | None = None
    prefill_swa_lens: torch.Tensor | None = None
    gather_lens: torch.Tensor | None = None
    stale_replay: torch.Tensor | None = None
    kept_windows: WindowRows | None = None
    kept_first_windows: WindowRows | None = None


class WindowRows(NamedTuple):
    """One window build of the decoder sub-batch (``kept_windows``): ``swa_indices``
    int32 [Pk, index_width] and ``swa_lens`` [Pk] (sub-batch tokens ``[0, Pk)``, ``Pk =
    kept_prefill_from``, default every sub-batch token), ``prefill_swa_indices`` / ``prefill_swa_lens``
    (tokens ``[Pk, num_rows)``), ``gather_lens`` int32 [B - kept_gather_lens_from] (default empty)."""

    swa_indices: torch.Tensor
    swa_lens: torch.Tensor
    prefill_swa_indices: torch.Tensor
    prefill_swa_lens: torch.Tensor
    gather_lens: torch.Tensor


#: the outputs that exist only when their keyword asks for them (``out=`` may leave them out)
OPTIONAL_OUTPUTS = ("prefill_swa_indices", "prefill_swa_lens", "gather_lens")
#: the sub-batch builds' outputs, by build (``kept_windows`` 1: the first; 2: both) and field
KEPT_BUILDS = ("kept_windows", "kept_first_windows")
KEPT_FIELDS = WindowRows._fields
KEPT_OUTPUTS = tuple(f"{b}.{f}" for b in KEPT_BUILDS for f in KEPT_FIELDS)
#: the outputs whose ``out=`` buffers may have more rows than the step writes (a serving
#: engine's persistent buffers, sized for its largest step): the step writes their leading rows
LEADING_ROWS = ("replay_start", "swa_indices", "swa_lens", "stale_replay") + OPTIONAL_OUTPUTS
#: the sub-batch's buffers (``out["replay_batch"]``), whose leading extents the step writes
BATCH_FIELDS = ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start")


def _rows(B: int, T: int, prefill_from: int | None, gather_lens_from: int | None) -> dict:
    """Rows the step writes of each :data:`LEADING_ROWS` output."""
    P = T if prefill_from is None else prefill_from
    return {"replay_start": B, "stale_replay": B, "swa_indices": P, "swa_lens": P, "prefill_swa_indices": T - P,
            "prefill_swa_lens": T - P, "gather_lens": B - (B if gather_lens_from is None else gather_lens_from)}


def _leading(o: dict, rows: dict) -> dict:
    """``o`` with each buffer of :data:`LEADING_ROWS` cut to the rows the step writes."""
    return {k: v[: rows[k]] if k in rows and v.shape[0] != rows[k] else v for k, v in o.items()}


def _leading_batch(rb: dict, plan: ReplayPlan, num_groups: int, *, check: bool = False) -> dict:
    """``out["replay_batch"]`` cut to what the step writes (``gather_replay_batch.leading_out``:
    a serving engine's persistent sub-batch buffers, sized for its largest step, pass whole).
    ``check``: one too small, or of another rank, fails naming it first (a missing one is left
    for ``gather_replay_batch``'s validation to name)."""
    if check:
        for key, (ext, _) in gather_replay_batch.out_shapes(plan, num_groups).items():
            buf = rb.get(key)
            if buf is not None and (not isinstance(buf, torch.Tensor) or buf.dim() != len(ext)
                                    or any(have < want for have, want in zip(buf.shape, ext))):
                fail(NAME, f"out['replay_batch'][{key!r}]", buf,
                     f"a {len(ext)}-D tensor of at least {list(ext)} (the step writes its leading "
                     f"{'rows' if len(ext) == 1 else 'rows and columns'})")
    return gather_replay_batch.leading_out(rb, plan, num_groups)


def _kept_shapes(num_reqs: int, index_width: int, plan: ReplayPlan, kept_prefill_from: int | None,
                 kept_gather_lens_from: int | None) -> dict:
    """Shapes of one sub-batch build's buffers (:class:`WindowRows`)."""
    n = plan.num_rows
    Pk = n if kept_prefill_from is None else kept_prefill_from
    gk = num_reqs if kept_gather_lens_from is None else kept_gather_lens_from
    return {"swa_indices": ((Pk, index_width), INDEX_DTYPE), "swa_lens": ((Pk,), INDEX_DTYPE),
            "prefill_swa_indices": ((n - Pk, index_width), INDEX_DTYPE), "prefill_swa_lens": ((n - Pk,), INDEX_DTYPE),
            "gather_lens": ((num_reqs - gk,), INDEX_DTYPE)}


def out_shapes(num_reqs: int, num_tokens: int, index_width: int, plan: ReplayPlan | None = None,
               num_groups: int = 0, *, prefill_from: int | None = None, gather_lens_from: int | None = None,
               kept_windows: int = 0, kept_prefill_from: int | None = None,
               kept_gather_lens_from: int | None = None) -> dict:
    """Shapes and dtypes of the ``out=`` buffers: ``replay_start``, ``swa_indices``,
    ``swa_lens``, ``stale_replay``, with ``prefill_from`` ``prefill_swa_indices`` and ``prefill_swa_lens``,
    with ``gather_lens_from`` ``gather_lens``, with a plan ``replay_batch``
    (``gather_replay_batch``'s dict) and, with ``kept_windows``, ``kept_windows`` (and
    ``kept_first_windows``): dicts of the :class:`WindowRows` fields."""
    P = num_tokens if prefill_from is None else prefill_from
    shapes: dict = {
        "replay_start": ((num_reqs,), INDEX_DTYPE),
        "swa_indices": ((P, index_width), INDEX_DTYPE),
        "swa_lens": ((P,), INDEX_DTYPE),
        "stale_replay": ((num_reqs,), INDEX_DTYPE),
    }
    if prefill_from is not None:
        shapes["prefill_swa_indices"] = ((num_tokens - P, index_width), INDEX_DTYPE)
        shapes["prefill_swa_lens"] = ((num_tokens - P,), INDEX_DTYPE)
    if gather_lens_from is not None:
        shapes["gather_lens"] = ((num_reqs - gather_lens_from,), INDEX_DTYPE)
    if plan is not None:
        shapes["replay_batch"] = gather_replay_batch.out_shapes(plan, num_groups)
        for build in KEPT_BUILDS[:kept_windows]:
            shapes[build] = _kept_shapes(num_reqs, index_width, plan, kept_prefill_from, kept_gather_lens_from)
    return shapes


def allocate_out(num_reqs: int, num_tokens: int, index_width: int, device, plan: ReplayPlan | None = None,
                 num_groups: int = 0, *, prefill_from: int | None = None, gather_lens_from: int | None = None,
                 kept_windows: int = 0, kept_prefill_from: int | None = None,
                 kept_gather_lens_from: int | None = None) -> dict:
    """Buffers for ``out=``; reuse them across steps for stable addresses (graphs)."""

    def make(spec):
        if isinstance(spec, dict):
            return {k: make(v) for k, v in spec.items()}
        shape, dtype = spec
        return torch.empty(shape, dtype=dtype, device=device)

    return make(out_shapes(num_reqs, num_tokens, index_width, plan, num_groups, prefill_from=prefill_from,
                           gather_lens_from=gather_lens_from, kept_windows=kept_windows,
                           kept_prefill_from=kept_prefill_from, kept_gather_lens_from=kept_gather_lens_from))


def validate(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
             cacheable_groups, block_table, block_size, W, Wr, *, index_width=None, plan=None, any_replay=None,
             prefill_from=None, gather_lens_from=None, valid_group=None, kept_windows=0, kept_prefill_from=None,
             kept_gather_lens_from=None, out=None) -> None:
    """The parts' own validators, in order, on the replay starts this call produces;
    their errors are re-labelled ``prepare_replay_step: <argument>=...: expected ...``."""
    with labelled(NAME, _PARTS):  # (also the errors of their value checks, read after this returns)
        _validate(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
                  cacheable_groups, block_table, block_size, W, Wr, index_width=index_width, plan=plan,
                  any_replay=any_replay, prefill_from=prefill_from, gather_lens_from=gather_lens_from,
                  valid_group=valid_group, kept_windows=kept_windows, kept_prefill_from=kept_prefill_from,
                  kept_gather_lens_from=kept_gather_lens_from, out=out)


_PARTS = (batch_replay_start.NAME, pad_replayed_slots.NAME, swa_indices_and_lens.NAME, prefill_gather_lens.NAME,
          gather_replay_batch.NAME)


def _buffers(out) -> dict:
    """``out`` without the entries left None (the optional outputs' ``_out`` form passes None)."""
    return {k: v for k, v in (out or {}).items() if v is not None}


def _swa_parts(T: int, prefill_from: int | None) -> list[tuple]:
    """``(num_tokens, token_offset, indices key, lens key)`` of the window rows' one or two
    ``swa_indices_and_lens`` calls: every token, or tokens ``[0, P)`` and ``[P, T)``."""
    if prefill_from is None:
        return [(T, None, "swa_indices", "swa_lens")]
    P = prefill_from
    return [(P, 0, "swa_indices", "swa_lens"), (T - P, P, "prefill_swa_indices", "prefill_swa_lens")]


def _validate(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
              cacheable_groups, block_table, block_size, W, Wr, *, index_width, plan, any_replay, prefill_from,
              gather_lens_from, valid_group, kept_windows, kept_prefill_from, kept_gather_lens_from, out) -> None:
    if out is not None and not isinstance(out, dict):
        fail(NAME, "out", out, "a dict of buffers from allocate_out()")
    o = _buffers(out)
    needed = ["replay_start", "swa_indices", "swa_lens", "stale_replay"]
    if prefill_from is not None:
        needed += ["prefill_swa_indices", "prefill_swa_lens"]
    if gather_lens_from is not None:
        needed.append("gather_lens")
    for key in needed if out is not None else ():
        if key not in o:
            fail(NAME, "out", sorted(o), f"a buffer for {key!r}")
    check_tensor(NAME, "idx_mapping", idx_mapping, ndim=1)
    check_tensor(NAME, "positions", positions, ndim=1)
    B, T = idx_mapping.shape[0], positions.shape[0]
    _check_split("gather_lens_from", gather_lens_from, B, "the number of requests", "len(idx_mapping)")
    _check_split("prefill_from", prefill_from, T, "the number of tokens", "len(positions)")
    rows = _rows(B, T, prefill_from, gather_lens_from)
    for key in LEADING_ROWS:
        buf = o.get(key)
        if buf is not None and (not isinstance(buf, torch.Tensor) or buf.dim() == 0 or buf.shape[0] < rows[key]):
            fail(NAME, f"out[{key!r}]", buf, f"a tensor of at least {rows[key]} rows (the step writes its leading rows)")
    o = _leading(o, rows)
    batch_replay_start.validate(R_per_request, idx_mapping, is_prefilling, out=o.get("replay_start"))
    if "stale_replay" in o:  # (the one output no part's validator checks)
        check_out(NAME, "out['stale_replay']", o["stale_replay"], shape=(B,), dtype=INDEX_DTYPE,
                  device=R_per_request.device)
    check_tensor(NAME, "query_start_loc", query_start_loc, dtypes=INDEX_DTYPE, ndim=1,
                 device=R_per_request.device)
    if query_start_loc.shape[0] != B + 1:
        fail(NAME, "query_start_loc", query_start_loc, f"{B + 1} entries (one per batch row + 1)")
    if plan is not None and not isinstance(plan, ReplayPlan):
        fail(NAME, "plan", plan, "None or a ReplayPlan from plan_replay_batch")
    if plan is not None:  # (its sizes cut the sub-batch buffers below)
        gather_replay_batch.check_plan_sizes(NAME, plan)
    if plan is not None and out is not None and "replay_batch" not in o:
        fail(NAME, "out", sorted(o), "a buffer dict for 'replay_batch' (a plan is given)")
    # The checks below read the replay starts this call will produce (a stale one is valid:
    # it counts as 0); without value checks (graph capture) the validators only look at the
    # tensor's metadata. (idx_mapping clamped: its range is checked with the call's one read.)
    if value_checks_enabled():
        idx = idx_mapping.clamp(0, max(R_per_request.shape[0] - 1, 0))
        R = batch_replay_start.reference(R_per_request if R_per_request.numel() else R_per_request.new_zeros(1), idx,
                                         is_prefilling)
    else:
        R = torch.empty(B, dtype=INDEX_DTYPE, device=R_per_request.device)
    pad_replayed_slots.validate(slot_mappings, cacheable_groups, query_start_loc, positions, R, Wr,
                                any_replay=any_replay)
    if valid_group is not None:
        check_int(NAME, "valid_group", valid_group, min_value=0)
        if valid_group >= slot_mappings.shape[0]:
            fail(NAME, "valid_group", valid_group, f"a row of slot_mappings (< {slot_mappings.shape[0]})")
        if value_checks_enabled():
            def test(groups):
                if (groups == valid_group).any():
                    fail(NAME, "valid_group", valid_group, "a group not in cacheable_groups (its slots are read before "
                         "padding)")

            defer(NAME, (("cacheable_groups", cacheable_groups),), test)
    for n, off, rows, lens in _swa_parts(T, prefill_from):
        swa_out = (o[rows], o[lens]) if out is not None else None
        swa_indices_and_lens.validate(query_start_loc, seq_lens, block_table, block_size, W, R,
                                      index_width=index_width, num_tokens=n, token_offset=off, out=swa_out)
    if gather_lens_from is not None:
        g = gather_lens_from
        prefill_gather_lens.validate(query_start_loc[g:], seq_lens[g:], R[g:], W, out=o.get("gather_lens"))
    if plan is not None:
        rb = o.get("replay_batch")
        if isinstance(rb, dict):
            rb = _leading_batch(rb, plan, slot_mappings.shape[0], check=True)
        gather_replay_batch.validate(plan, query_start_loc, seq_lens, R, positions, slot_mappings, W, out=rb)
    _validate_kept(plan, B, W if index_width is None else index_width, R_per_request.device, kept_windows,
                   kept_prefill_from, kept_gather_lens_from, out, o)


def _check_split(name: str, value, bound: int, what: str, where: str) -> None:
    """A split point (None, or an int in ``[0, bound]``)."""
    if value is not None:
        check_int(NAME, name, value, min_value=0)
        if value > bound:
            fail(NAME, name, value, f"at most {what}, {bound} ({where})")


def _validate_kept(plan, B: int, width: int, dev, kept_windows, kept_prefill_from, kept_gather_lens_from, out,
                   o: dict) -> None:
    """The sub-batch builds' arguments and buffers (their inputs are the step's, checked above;
    their sub-batch is the gather's, made from them)."""
    check_int(NAME, "kept_windows", kept_windows, min_value=0, max_value=len(KEPT_BUILDS),
              why="0, 1 (the replay layers' build) or 2 (and the first replay layer's)")
    if not kept_windows:
        for name, v in (("kept_prefill_from", kept_prefill_from), ("kept_gather_lens_from", kept_gather_lens_from)):
            if v is not None:
                fail(NAME, name, v, "None without kept_windows (it splits the sub-batch's builds)")
        return
    if plan is None:
        fail(NAME, "kept_windows", kept_windows, "0 without a plan (the builds are of the plan's sub-batch)")
    _check_split("kept_prefill_from", kept_prefill_from, plan.num_rows, "the sub-batch's rows", "plan.num_rows")
    _check_split("kept_gather_lens_from", kept_gather_lens_from, B, "the number of requests", "len(idx_mapping)")
    if out is None:
        return
    shapes = _kept_shapes(B, width, plan, kept_prefill_from, kept_gather_lens_from)
    for build in KEPT_BUILDS[:kept_windows]:
        bufs = o.get(build)
        if not isinstance(bufs, dict):
            fail(NAME, "out", sorted(o), f"a buffer dict for {build!r} (kept_windows={kept_windows})")
        for field in KEPT_FIELDS:
            (rows, *rest), dtype = shapes[field]
            buf, name = bufs.get(field), f"out[{build!r}][{field!r}]"
            if not isinstance(buf, torch.Tensor) or buf.dim() == 0 or buf.shape[0] < rows:
                fail(NAME, name, buf, f"a tensor of at least {rows} rows (the step writes its leading rows)")
            check_out(NAME, name, buf if buf.shape[0] == rows else buf[:rows], shape=(rows, *rest), dtype=dtype,
                      device=dev)


_I32, _I32_64, _I64, _BOOL = (INDEX_DTYPE,), (torch.int32, torch.int64), (SLOT_DTYPE,), (torch.bool,)


def _int_in(v, low: int, high: int) -> bool:
    return v.__class__ is int and low <= v <= high


def _split_ok(v, bound: int) -> bool:
    return v is None or _int_in(v, 0, bound)


def _leading_ok(buf, rows: int, rest: tuple, dev) -> bool:
    """A buffer the step writes the leading ``rows`` of (``rest``: its other extents), as the
    validator takes it: a ``torch.Tensor`` with at least ``rows`` rows whose leading rows are a
    plain tensor of ``rest`` on ``dev``."""
    if buf.__class__ is not torch.Tensor or buf.dim() != 1 + len(rest) or buf.shape[0] < rows:
        return False
    if rest and tuple(buf.shape[1:]) != rest:
        return False
    return plain(buf if buf.shape[0] == rows else buf[:rows], (buf.dtype,), 1 + len(rest), dev)


def quick_check(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
                cacheable_groups, block_table, block_size, W, Wr, *, index_width=None, plan=None, any_replay=None,
                prefill_from=None, gather_lens_from=None, valid_group=None, kept_windows=0, kept_prefill_from=None,
                kept_gather_lens_from=None, out=None) -> bool:
    """``validate``'s host checks and ``check_writes`` for plain tensors and a plan on the host
    (``OpSpec.quick_check``; ``slot_mappings`` and the block table may be slices of wider buffers,
    ``out=`` buffers a serving engine's persistent ones, longer than the step)."""
    if not plain(R_per_request, _I32_64, 1):
        return False
    dev = R_per_request.device
    if not (plain(idx_mapping, _I32_64, 1, dev) and plain(positions, _I64, 1, dev)):
        return False
    B, T = idx_mapping.shape[0], positions.shape[0]
    if not (plain(is_prefilling, _BOOL, 1, dev) and is_prefilling.shape[0] == B and plain(query_start_loc, _I32, 1, dev)
            and query_start_loc.shape[0] == B + 1 and plain(seq_lens, _I32, 1, dev) and seq_lens.shape[0] == B
            and row_slices(slot_mappings, _I64, dev) and slot_mappings.shape[1] >= T
            and plain(cacheable_groups, _I32, 1, dev)
            and row_slices(block_table, _I32, dev) and block_table.shape[0] >= B):
        return False
    G = slot_mappings.shape[0]
    if not (_int_in(W, 1, MAX_WINDOW) and _int_in(block_size, 1, MAX_WINDOW) and _int_in(Wr, 0, MAX_WINDOW)
            and (index_width is None or _int_in(index_width, W, MAX_WINDOW))
            and (any_replay is None or any_replay.__class__ is bool) and _split_ok(prefill_from, T)
            and _split_ok(gather_lens_from, B) and (valid_group is None or _int_in(valid_group, 0, G - 1))
            and _int_in(kept_windows, 0, len(KEPT_BUILDS))):
        return False
    if plan is not None and (plan.__class__ is not ReplayPlan or plan.num_reqs != B or plan.window != W
                             or not gather_replay_batch.plan_quick(plan, B)):
        return False
    if kept_windows == 0:
        if kept_prefill_from is not None or kept_gather_lens_from is not None:
            return False
    elif plan is None or not _split_ok(kept_prefill_from, plan.num_rows) or not _split_ok(kept_gather_lens_from, B):
        return False
    written = [slot_mappings]
    if out is not None:
        bufs = _out_quick(out, dev, B, T, W if index_width is None else index_width, plan, G, prefill_from,
                          gather_lens_from, kept_windows, kept_prefill_from, kept_gather_lens_from)
        if bufs is None:
            return False
        written += bufs
    inputs = [R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, cacheable_groups,
              block_table]
    if plan is not None:
        inputs += gather_replay_batch.plan_tensors(plan, dev)
    return disjoint(written, inputs)


def _out_quick(out, dev, B: int, T: int, width: int, plan, G: int, prefill_from, gather_lens_from, kept_windows,
               kept_prefill_from, kept_gather_lens_from) -> list | None:
    """Every buffer of a plain ``out=`` the validator takes (the step's rows of each, ``_leading``),
    or None: one missing, short, of another dtype, device or layout, or an entry it does not know."""
    if out.__class__ is not dict:
        return None
    shapes = out_shapes(B, T, width, plan, G, prefill_from=prefill_from, gather_lens_from=gather_lens_from,
                        kept_windows=kept_windows, kept_prefill_from=kept_prefill_from,
                        kept_gather_lens_from=kept_gather_lens_from)
    if any(v is not None and k not in shapes for k, v in out.items()):
        return None
    found = []
    for key, spec in shapes.items():
        buf = out.get(key)
        if spec.__class__ is dict:  # the sub-batch's buffers (leading extents) or a build's (leading rows)
            if buf.__class__ is not dict or len(buf) != len(spec):
                return None
            for field, (shape, dtype) in spec.items():
                t = buf.get(field)
                if t.__class__ is not torch.Tensor or t.dtype != dtype:
                    return None
                if key == "replay_batch" and len(shape) == 2:
                    if t.dim() != 2 or t.shape[0] < shape[0] or t.shape[1] < shape[1]:
                        return None
                    if not row_slices(t[: shape[0], : shape[1]], (dtype,), dev):
                        return None
                elif not _leading_ok(t, shape[0], tuple(shape[1:]), dev):
                    return None
                found.append(t)
            continue
        shape, dtype = spec
        if (buf.__class__ is not torch.Tensor or buf.dtype != dtype
                or not _leading_ok(buf, shape[0], tuple(shape[1:]), dev)):
            return None
        found.append(buf)
    return found


def reference(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
              cacheable_groups, block_table, block_size, W, Wr, *, index_width=None, plan=None, any_replay=None,
              prefill_from=None, gather_lens_from=None, valid_group=None, kept_windows=0, kept_prefill_from=None,
              kept_gather_lens_from=None, out=None) -> PreparedStep:
    """``R = batch_replay_start(R_per_request, idx_mapping, is_prefilling)``, then ``stale_replay
    = R > seq_len - q`` and ``R = 0`` there (the live replay start, SPEC §0);
    ``valid = slot_mappings[valid_group] >= 0`` (before padding; all True without it);
    ``pad_replayed_slots(slot_mappings, cacheable_groups, query_start_loc, positions, R, Wr)``;
    ``swa_indices_and_lens(query_start_loc, seq_lens, block_table, block_size, W, R,
    index_width=index_width, valid=valid[:P], num_tokens=P)`` with ``P = prefill_from`` (default
    T), and with ``prefill_from`` the same for tokens ``[P, T)`` (``token_offset=P``) into
    ``prefill_swa_*``; with ``gather_lens_from = g``, ``prefill_gather_lens(query_start_loc[g:],
    seq_lens[g:], R[g:], W)``; with a plan, ``gather_replay_batch(plan, query_start_loc,
    seq_lens, R, positions, slot_mappings, W)`` on the padded slots; with ``kept_windows``, for
    the clamps ``C`` = the sub-batch's ``kv_start`` and (2) the batch's replay start before the
    stale ones are zeroed (what an engine hands the first replay layer's build),
    ``swa_indices_and_lens(kq, seq_lens, block_table, block_size, W, C, valid=kv[:Pk],
    num_tokens=Pk)`` and the same for sub-batch tokens ``[Pk, n)``, and
    ``prefill_gather_lens(kq[gk:], seq_lens[gk:], C[gk:], W)``, where ``kq`` is the sub-batch's
    ``query_start_loc``, ``n = plan.num_rows``, ``kv = sub-batch slot_mappings[valid_group] >=
    0`` (every token valid without it), ``Pk = kept_prefill_from`` (default n), ``gk =
    kept_gather_lens_from`` (default B). Returns a :class:`PreparedStep`.
    """
    given = _buffers(out)
    T = positions.shape[0]
    o = _leading(given, _rows(idx_mapping.shape[0], T, prefill_from, gather_lens_from))
    R = raw = batch_replay_start.reference(R_per_request, idx_mapping, is_prefilling)
    stale = stale_replay(query_start_loc, seq_lens, R)
    R = torch.where(stale, torch.zeros_like(R), R)
    stale = stale.to(INDEX_DTYPE)
    if out is not None:
        R = o["replay_start"].copy_(R)
        stale = o["stale_replay"].copy_(stale)
    valid = None if valid_group is None else slot_mappings[valid_group, :T] >= 0
    pad_replayed_slots.reference(slot_mappings, cacheable_groups, query_start_loc, positions, R, Wr,
                                 any_replay=any_replay)
    parts = [(None, None), (None, None)]
    for i, (n, off, rows, lens) in enumerate(_swa_parts(T, prefill_from)):
        swa_out = (o[rows], o[lens]) if out is not None else None
        v = None if valid is None else valid[off or 0: (off or 0) + n]
        parts[i] = swa_indices_and_lens.reference(query_start_loc, seq_lens, block_table, block_size, W, R,
                                                  index_width=index_width, valid=v, num_tokens=n, token_offset=off,
                                                  out=swa_out)
    gather_lens = None
    if gather_lens_from is not None:
        g = gather_lens_from
        gather_lens = prefill_gather_lens.reference(query_start_loc[g:], seq_lens[g:], R[g:], W,
                                                    out=o.get("gather_lens"))
    batch = None
    if plan is not None:
        rb = o.get("replay_batch")
        batch = gather_replay_batch.reference(plan, query_start_loc, seq_lens, R, positions, slot_mappings, W,
                                              out=None if rb is None else _leading_batch(rb, plan,
                                                                                         slot_mappings.shape[0]))
    windows = [None, None]
    if plan is not None and kept_windows:
        windows = _kept_reference(plan, batch, seq_lens, block_table, block_size, W, raw, index_width, valid_group,
                                  kept_windows, kept_prefill_from, kept_gather_lens_from, given)
    (idx, lens), (pidx, plens) = parts
    if out is not None:  # the buffers as given (their leading rows written)
        R, idx, lens, stale = given["replay_start"], given["swa_indices"], given["swa_lens"], given["stale_replay"]
        if prefill_from is not None:
            pidx, plens = given["prefill_swa_indices"], given["prefill_swa_lens"]
        if gather_lens_from is not None:
            gather_lens = given["gather_lens"]
        if batch is not None:
            batch = dataclasses.replace(batch, **{k: given["replay_batch"][k] for k in BATCH_FIELDS})
    return PreparedStep(R, slot_mappings, idx, lens, batch, pidx, plens, gather_lens, stale, *windows)


def _kept_reference(plan, batch, seq_lens, block_table, block_size, W, raw, index_width, valid_group, kept_windows,
                    kept_prefill_from, kept_gather_lens_from, given) -> list:
    """The sub-batch builds of :func:`reference` (into ``given``'s buffers when there are some)."""
    n, B = plan.num_rows, plan.num_reqs
    Pk = n if kept_prefill_from is None else kept_prefill_from
    gk = B if kept_gather_lens_from is None else kept_gather_lens_from
    kq = batch.query_start_loc
    valid = None if valid_group is None else batch.slot_mappings[valid_group, :n] >= 0
    builds = []
    for build, C in zip(KEPT_BUILDS[:kept_windows], (batch.kv_start, raw.to(INDEX_DTYPE))):
        bufs = given.get(build)
        o = None if bufs is None else _leading_kept(bufs, n, Pk, B - gk)
        res = []
        for num, off, rows, lens in ((Pk, 0, "swa_indices", "swa_lens"),
                                     (n - Pk, Pk, "prefill_swa_indices", "prefill_swa_lens")):
            v = None if valid is None else valid[off: off + num]
            res += swa_indices_and_lens.reference(kq, seq_lens, block_table, block_size, W, C, index_width=index_width,
                                                  valid=v, num_tokens=num, token_offset=off,
                                                  out=None if o is None else (o[rows], o[lens]))
        res.append(prefill_gather_lens.reference(kq[gk:], seq_lens[gk:], C[gk:], W,
                                                 out=None if o is None else o["gather_lens"]))
        builds.append(WindowRows(*(res if bufs is None else (bufs[f] for f in KEPT_FIELDS))))
    return builds + [None] * (2 - len(builds))


def _leading_kept(bufs: dict, n: int, Pk: int, gl: int) -> dict:
    rows = {"swa_indices": Pk, "swa_lens": Pk, "prefill_swa_indices": n - Pk, "prefill_swa_lens": n - Pk,
            "gather_lens": gl}
    return {k: v[: rows[k]] if v.shape[0] != rows[k] else v for k, v in bufs.items() if k in rows}


def _result_shapes(a) -> dict:
    B, T = a["idx_mapping"].shape[0], a["positions"].shape[0]
    width = a["W"] if a.get("index_width") is None else a["index_width"]
    pf, gf = a.get("prefill_from"), a.get("gather_lens_from")
    plan = a.get("plan")
    shapes = out_shapes(B, T, width, plan, a["slot_mappings"].shape[0],
                        prefill_from=T if pf is None else pf, gather_lens_from=B if gf is None else gf)
    batch = shapes.pop("replay_batch", {})
    kept = {}
    for i, build in enumerate(KEPT_BUILDS):
        if plan is not None and (a.get("kept_windows") or 0) > i:
            ks = _kept_shapes(B, width, plan, a.get("kept_prefill_from"), a.get("kept_gather_lens_from"))
        else:  # not asked for: size 0
            ks = {f: ((0, width) if f.endswith("indices") else (0,), INDEX_DTYPE) for f in KEPT_FIELDS}
        kept |= {f"{build}.{f}": v for f, v in ks.items()}
    return shapes | kept | {f"replay_batch.{k}": v for k, v in batch.items()}


def _pack(t: dict, a) -> PreparedStep:
    plan = a.get("plan")
    batch = None
    if plan is not None:
        batch = ReplayBatch(num_rows=plan.num_rows, num_rows_padded=plan.num_rows_padded,
                            **{k.split(".", 1)[1]: v for k, v in t.items() if k.startswith("replay_batch.")})
    asked = {"prefill_swa_indices": "prefill_from", "prefill_swa_lens": "prefill_from", "gather_lens": "gather_lens_from"}
    kept = a.get("kept_windows") or 0 if plan is not None else 0
    windows = [WindowRows(*(t[f"{build}.{f}"] for f in KEPT_FIELDS)) if kept > i else None
               for i, build in enumerate(KEPT_BUILDS)]
    return PreparedStep(t["replay_start"], a["slot_mappings"], t["swa_indices"], t["swa_lens"], batch,
                        *(t.get(k) if a.get(asked[k]) is not None else None for k in OPTIONAL_OUTPUTS),
                        t["stale_replay"], *windows)


RESULTS = Results(("replay_start", "swa_indices", "swa_lens", "stale_replay"), _result_shapes, out="dict", pack=_pack,
                  plan_names=tuple(f"replay_batch.{f}" for f in BATCH_FIELDS),
                  optional_names=OPTIONAL_OUTPUTS + KEPT_OUTPUTS)


def random_case(rng: np.random.Generator, dev, *, batch: Batch | None = None, poison: bool = False,
                 exact_out: bool = False) -> Call:
    """A step for ``prepare_replay_step``: per-request replay starts mapped so the batch rows
    get ``batch.R``, a trimming plan half the time; poisoned ``out=`` buffers longer than the
    step half the time unless ``exact_out``."""
    with_plan = rng.random() < 0.5
    b = batch if batch is not None else random_batch(rng, long_prefill=with_plan)
    with_plan = with_plan and bool((b.prefilling & (b.q > b.W)).any())
    t = b.tensors(dev)
    n_req = b.B + int(rng.integers(0, 4))
    idx = rng.permutation(n_req)[: b.B]
    R_all = rng.integers(0, 500, n_req)
    R_all[idx] = np.where(b.prefilling, b.R, rng.integers(0, 500, b.B))  # decode rows: ignored (not prefilling)
    T = b.T + b.num_padded
    width = b.W + int(rng.integers(0, 3))
    plan = None
    if with_plan:
        keeps = rng.random(b.B) < 0.2
        keeps[np.flatnonzero(b.prefilling & (b.q > b.W))[0]] = False
        plan = host_plan(rng, b, keeps)
    kw: dict = {"index_width": width, "plan": plan}
    if rng.random() < 0.3:
        kw["any_replay"] = bool((b.R > 0).any())
    if rng.random() < 0.5:  # the serving layout (vLLM's builder): decode / prefill rows apart, gather lengths
        kw["prefill_from"] = int(rng.integers(0, T + 1))
        kw["gather_lens_from"] = int(rng.integers(0, b.B + 1))
        window_groups = sorted(set(range(b.num_groups)) - {int(g) for g in b.cacheable})
        if window_groups and rng.random() < 0.7:
            g = int(rng.choice(window_groups))
            kw["valid_group"] = g
            invalid = rng.random(T) < 0.15  # tokens with no slot in the window group (PCP peers, padding)
            t["slot_mappings"][g, :T][torch.tensor(invalid, device=dev)] = PAD
    if plan is not None and "prefill_from" in kw and rng.random() < 0.6:  # the sub-batch's builds (vLLM's)
        kw["kept_windows"] = int(rng.integers(1, 3))
        kw["kept_prefill_from"] = int(rng.integers(0, plan.num_rows + 1))
        kw["kept_gather_lens_from"] = int(rng.integers(0, b.B + 1))
    if poison:
        longer = rng.random() < 0.5 and not exact_out  # persistent buffers (SPEC §3.6): rows past the step's

        def fill(spec, key=None, parent=None):
            if isinstance(spec, dict):
                return {k: fill(v, k, key) for k, v in spec.items()}
            shape = spec[0]
            if longer and parent == "replay_batch":  # every extent of the sub-batch's buffers
                shape = tuple(n + int(rng.integers(1, 6)) for n in shape)
            elif longer and key in LEADING_ROWS:
                shape = (shape[0] + int(rng.integers(1, 6)), *shape[1:])
            return poisoned(shape, spec[1], dev)

        kw["out"] = fill(out_shapes(b.B, T, width, plan, b.num_groups, prefill_from=kw.get("prefill_from"),
                                    gather_lens_from=kw.get("gather_lens_from"), kept_windows=kw.get("kept_windows", 0),
                                    kept_prefill_from=kw.get("kept_prefill_from"),
                                    kept_gather_lens_from=kw.get("kept_gather_lens_from")))
    args = (torch.tensor(R_all, dtype=INDEX_DTYPE if rng.random() < 0.5 else torch.int64, device=dev),
            torch.tensor(idx, dtype=INDEX_DTYPE, device=dev), t["is_prefilling"], t["query_start_loc"], t["seq_lens"],
            t["positions"], t["slot_mappings"], t["cacheable_groups"], t["block_table"], b.block_size, b.W, b.Wr)
    return args, kw


def case(d: CaseDraw) -> Call:
    return random_case(d.rng, d.device, batch=d.given, poison=d.poison, exact_out=d.exact_out)


def warmup(s: WarmupStep):
    """Every pair of index dtypes, with and without host knowledge that nothing replays and a plan,
    in each serving layout (vLLM's builder: decode and prefill rows apart with gather lengths, and
    with them tokens left out by a window group's PAD slots, group 1: never cacheable). The launch
    tile follows the step's size: the kernel's warmup forces each tile around these calls. With a
    plan, the serving layouts also with the sub-batch's builds (one and two)."""
    layouts = [{}, {"prefill_from": 1, "gather_lens_from": 1}]
    if s.num_groups > 1:
        layouts.append({**layouts[1], "valid_group": 1})
    kept = [{**layouts[-1], "kept_windows": k, "kept_prefill_from": 0, "kept_gather_lens_from": 0} for k in (1, 2)]
    for rd, idd, any_replay, p, layout in itertools.product(s.index_dtypes, s.index_dtypes, (None, False),
                                                           (None, s.plan), layouts + kept):
        if p is None and "kept_windows" in layout:
            continue
        # any_replay=False (host knowledge that no request replays) needs replay starts of 0
        R_all = s.R_all.to(rd) if any_replay is None else torch.zeros_like(s.R_all, dtype=rd)
        yield ((R_all, s.idx.to(idd), s.prefilling, s.qsl, s.seq, s.positions, s.slots.clone(), s.cacheable,
                s.block_table, s.block_size, s.W, s.W),
               dict(index_width=s.width, plan=p, any_replay=any_replay, **layout))


OP = OpSpec(NAME, reference, validate, RESULTS, mutates=("slot_mappings",), short="prepare_step",
            scalars={"block_size": "int", "W": "int", "Wr": "int", "index_width": "int", "any_replay": "bool",
                     "prefill_from": "int", "gather_lens_from": "int", "valid_group": "int", "kept_windows": "int",
                     "kept_prefill_from": "int", "kept_gather_lens_from": "int"},
            case=case, warmup=warmup, quick_check=quick_check)
