"""``gather_replay_batch`` (SPEC §3.2): the decoder-side sub-batch, on the device."""

from __future__ import annotations

import numpy as np
import torch

from ..types import INDEX_DTYPE, MAX_POSITION, MAX_WINDOW, PAD, SLOT_DTYPE, ReplayBatch, ReplayPlan
from ..validation import check_int, check_out, check_tensor, defer, fail, first_true, value_checks_enabled
from ._batch import live_replay_start
from ._checks import check_batch, check_extents, check_positions, check_slot_mappings, check_window
from ._quick import disjoint, plain, rows
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep, host_plan, random_batch

NAME = "gather_replay_batch"


def out_shapes(plan: ReplayPlan, num_groups: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of the ``out=`` buffers (keys of ``ReplayBatch``)."""
    n, B = plan.num_rows_padded, plan.num_reqs
    return {
        "rows": ((n,), SLOT_DTYPE),
        "query_start_loc": ((B + 1,), INDEX_DTYPE),
        "positions": ((n,), SLOT_DTYPE),
        "slot_mappings": ((num_groups, n), SLOT_DTYPE),
        "kv_start": ((B,), INDEX_DTYPE),
    }


def leading_out(out: dict, plan: ReplayPlan, num_groups: int) -> dict:
    """``out`` with each buffer cut to its leading :func:`out_shapes` extents (a serving engine's
    persistent sub-batch buffers, sized for its largest step: ``prepare_replay_step`` takes them
    whole, this op exact); a buffer already of that shape stays the same object."""
    res = dict(out)
    for key, (shape, _) in out_shapes(plan, num_groups).items():
        buf = out.get(key)
        if isinstance(buf, torch.Tensor) and tuple(buf.shape) != shape:
            res[key] = buf[: shape[0]] if len(shape) == 1 else buf[: shape[0], : shape[1]]
    return res


def allocate_out(plan: ReplayPlan, num_groups: int, device) -> dict[str, torch.Tensor]:
    """Buffers for ``out=``; reuse them across steps for stable addresses."""
    return {k: torch.empty(s, dtype=d, device=device) for k, (s, d) in out_shapes(plan, num_groups).items()}


def validate(plan, query_start_loc, seq_lens, replay_start, positions, slot_mappings, W, *, out=None) -> None:
    if not isinstance(plan, ReplayPlan):
        fail(NAME, "plan", plan, "a ReplayPlan from plan_replay_batch (None means nothing trims: skip the call)")
    check_tensor(NAME, "positions", positions, dtypes=SLOT_DTYPE, ndim=1)
    dev = positions.device
    T = positions.shape[0]
    check_tensor(NAME, "query_start_loc", query_start_loc, device=dev)
    B = check_batch(NAME, query_start_loc, seq_lens, replay_start, num_tokens=T)
    check_plan_sizes(NAME, plan)
    if B != plan.num_reqs:
        fail(NAME, "query_start_loc", query_start_loc, f"{plan.num_reqs + 1} entries (the plan's B + 1)")
    G = check_slot_mappings(NAME, slot_mappings, dev, T)
    check_window(NAME, "W", W)
    if W != plan.window:
        fail(NAME, "W", W, f"the plan's window {plan.window}")
    check_plan(NAME, plan, query_start_loc, T)
    check_positions(NAME, positions)
    if out is not None:
        if not isinstance(out, dict):
            fail(NAME, "out", out, "a dict of buffers from allocate_out()")
        for key, (shape, dtype) in out_shapes(plan, G).items():
            if key not in out:
                fail(NAME, "out", sorted(out), f"a buffer for {key!r}")
            check_out(NAME, f"out[{key!r}]", out[key], shape=shape, dtype=dtype, device=dev,
                      row_stride=key == "slot_mappings")  # e.g. vLLM's [:, :n_pad] of a [G, max_tokens] buffer
        check_extents(NAME, "out['slot_mappings']", out["slot_mappings"])


_SLOT, _INDEX, _BOOL = (SLOT_DTYPE,), (INDEX_DTYPE,), (torch.bool,)
_CPU = torch.device("cpu")


def plan_quick(plan, B: int) -> bool:
    """``check_plan``'s host checks of a plan of ``B`` requests: sizes, and host tensors of the
    right dtypes and shapes (numpy arrays of int32 for a plan of ``from_kept``, whose tensors are
    made from them; contiguous CPU tensors for a plan built field by field)."""
    n, n_pad = plan.num_rows, plan.num_rows_padded
    if n.__class__ is not int or n_pad.__class__ is not int or not 0 <= n <= n_pad <= MAX_POSITION:
        return False
    pre = plan.prefilling
    if pre is not None and not (plain(pre, _BOOL, 1, _CPU) and pre.shape[0] == B):
        return False
    host = plan.__dict__.get("_host")
    if host is not None:
        kept, dropped = host
        return (kept.__class__ is np.ndarray and dropped.__class__ is np.ndarray and kept.dtype == np.int32
                and dropped.dtype == np.int32 and kept.shape == (B,) and dropped.shape == (B + 1,))
    return (plain(plan.kept, _INDEX, 1, _CPU) and plan.kept.shape[0] == B and plain(plan.trimmed, _BOOL, 1, _CPU)
            and plan.trimmed.shape[0] == B and plain(plan.dropped_before, _INDEX, 1, _CPU)
            and plan.dropped_before.shape[0] == B + 1)


def quick_check(plan, query_start_loc, seq_lens, replay_start, positions, slot_mappings, W, *, out=None) -> bool:
    """``validate``'s host checks and ``check_writes`` for plain tensors and a plan on the host
    (``OpSpec.quick_check``; ``slot_mappings`` and ``out['slot_mappings']`` may be slices of wider
    buffers)."""
    if plan.__class__ is not ReplayPlan or not plain(positions, _SLOT, 1):
        return False
    dev = positions.device
    B = query_start_loc.shape[0] - 1 if query_start_loc.__class__ is torch.Tensor else -1
    if (B < 0 or not plain(query_start_loc, _INDEX, 1, dev) or not plain(seq_lens, _INDEX, 1, dev)
            or not plain(replay_start, _INDEX, 1, dev) or seq_lens.shape[0] != B or replay_start.shape[0] != B
            or B != plan.num_reqs or not rows(slot_mappings, _SLOT, dev)
            or slot_mappings.shape[1] < positions.shape[0]):
        return False
    if W.__class__ is not int or not 1 <= W <= MAX_WINDOW or W != plan.window or not plan_quick(plan, B):
        return False
    if out is None:
        return True
    if out.__class__ is not dict or len(out) != 5:
        return False
    shapes = out_shapes(plan, slot_mappings.shape[0])
    bufs = []
    for key, (shape, dtype) in shapes.items():
        buf = out.get(key)
        if buf.__class__ is not torch.Tensor or tuple(buf.shape) != shape:
            return False
        if not (rows(buf, (dtype,), dev) if key == "slot_mappings" else plain(buf, (dtype,), len(shape), dev)):
            return False
        bufs.append(buf)
    inputs = [query_start_loc, seq_lens, replay_start, positions, slot_mappings, *plan_tensors(plan, dev)]
    return disjoint(bufs, inputs)


def plan_tensors(plan: ReplayPlan, dev: torch.device) -> list[torch.Tensor]:
    """The plan's tensors a buffer written on ``dev`` could share memory with (``check_writes``
    counts every one as an input): its device copies, and on a CPU its host tensors (device memory
    never shares an address with host memory)."""
    found = list(plan._device_cache.values())
    for entry in plan._launch_cache.values():  # the kernels' own copies
        found += [v for v in (entry if entry.__class__ is tuple else (entry,)) if v.__class__ is torch.Tensor]
    if dev == _CPU:  # (a torch.device compares without building its type's string)
        found += [plan.kept, plan.trimmed, plan.dropped_before] + ([pre] if (pre := plan.prefilling) is not None else [])
    return found


def check_plan_sizes(op: str, plan: ReplayPlan) -> None:
    """The plan's sizes, which shape the call's buffers, before anything reads them: ``num_rows``,
    ``num_rows_padded`` and, for a plan built field by field, ``kept`` (its length is the plan's B)."""
    check_int(op, "plan.num_rows", plan.num_rows, min_value=0)  # the host's count: decodes may differ here
    check_int(op, "plan.num_rows_padded", plan.num_rows_padded, min_value=plan.num_rows, max_value=MAX_POSITION,
              why="MAX_POSITION")
    if plan.__dict__.get("_host") is None:
        check_tensor(op, "plan.kept", plan.kept, dtypes=INDEX_DTYPE, ndim=1)


def check_plan(op: str, plan: ReplayPlan, query_start_loc, num_tokens: int) -> None:
    """The plan fits this batch (it was made from the host copy of the same
    ``query_start_loc``): shapes and counts always, and with value checks, on the *device*
    ``query_start_loc``: every request keeps between 0 and its query length rows, a trimmed
    request (and, where the plan knows them, a prefill) has the query length the plan was
    made for, the trimmed flags match, and the kept rows fit the sub-batch buffers
    (``num_rows_padded``). Decodes the device resized (adaptive verification: the host
    counts a decode at one length, the device at another) are accepted: their kept rows
    follow the device. A plan from another batch fails here instead of writing past the
    sub-batch buffers."""
    B = query_start_loc.shape[0] - 1
    check_plan_sizes(op, plan)
    check_tensor(op, "plan.kept", plan.kept, dtypes=INDEX_DTYPE, shape=(B,))
    check_tensor(op, "plan.trimmed", plan.trimmed, dtypes=torch.bool, shape=(B,), device=plan.kept.device)
    check_tensor(op, "plan.dropped_before", plan.dropped_before, dtypes=INDEX_DTYPE, shape=(B + 1,),
                 device=plan.kept.device)
    if plan.prefilling is not None:
        check_tensor(op, "plan.prefilling", plan.prefilling, dtypes=torch.bool, shape=(B,), device=plan.kept.device)
    if not value_checks_enabled() or B == 0:
        return
    reads = [("query_start_loc", query_start_loc), ("plan.kept", plan.kept),
             ("plan.dropped_before", plan.dropped_before), ("plan.trimmed", plan.trimmed)]
    has_prefilling = plan.prefilling is not None
    reads += [("plan.prefilling", plan.prefilling)] if has_prefilling else []
    # the plan's copy on the call's device is what the kernels read (an engine's own upload, given to
    # from_kept, or one a graph's replays rewrite): checked against the host values checked here
    copy = plan._device_cache.get(str(query_start_loc.device))
    has_copy = copy is not None and copy is not plan.dropped_before
    reads += [("plan.device_dropped_before", copy)] if has_copy else []

    def test(qsl, kept_host, dropped, trimmed, *rest):
        prefilling = rest[0] if has_prefilling else None
        if has_copy and not np.array_equal(rest[-1], dropped):
            i = first_true(rest[-1] != dropped)
            fail(op, "plan.device_dropped_before", f"its entry {i}={int(rest[-1][i])}",
                 f"plan.dropped_before[{i}]={int(dropped[i])}: the device copy the kernels read holds the plan's "
                 "host values (ReplayPlan.from_kept's device_dropped_before is the caller's upload of them)")
        _check_plan_values(op, plan, qsl, kept_host, dropped, trimmed, prefilling)

    defer(op, reads, test)


def _check_plan_values(op: str, plan: ReplayPlan, qsl, kept_host, dropped, trimmed, prefilling=None) -> None:
    """:func:`check_plan`'s value part, on the host copies (read with the call's other checks)."""
    kept_host, dropped = kept_host.astype(np.int64), dropped.astype(np.int64)
    inside = dropped[1:] - dropped[:-1]  # rows the plan drops inside each request: q - kept
    if (kept_host < 0).any() or int(kept_host.sum()) != plan.num_rows or (inside < 0).any() or int(dropped[0]) != 0:
        fail(op, "plan", f"kept={kept_host.tolist()[:16]}, dropped_before={dropped.tolist()[:16]}",
             f"kept >= 0 adding up to plan.num_rows={plan.num_rows} and dropped_before non-decreasing from 0 "
             "(a plan from plan_replay_batch or ReplayPlan.from_kept)")
    qsl = qsl.astype(np.int64)
    out_qsl = qsl - dropped
    kept = out_qsl[1:] - out_qsl[:-1]
    q = qsl[1:] - qsl[:-1]
    q_plan = kept_host + inside  # the query lengths the plan was made for (host)
    fixed = trimmed if prefilling is None else trimmed | prefilling
    bad = (kept < 0) | (kept > q) | (fixed & (q != q_plan))
    if bad.any():
        i = first_true(bad)
        what = "a trimmed request" if bool(trimmed[i]) else ("a prefill" if bool(fixed[i]) else "a request")
        fail(op, "plan", f"request {i} ({what}) has {int(q[i])} rows on the device, the plan was made for {int(q_plan[i])}",
             "a plan made from this batch's query_start_loc (plan_replay_batch): only decodes may differ "
             "between the host and the device (adaptive verification), and keep all their rows")
    if int(out_qsl[-1]) > plan.num_rows_padded:
        fail(op, "query_start_loc", f"query_start_loc[{qsl.shape[0] - 1}]={int(qsl[-1])}",
             f"at most {plan.num_rows_padded + int(dropped[-1])}: the kept rows ({int(out_qsl[-1])}) must fit "
             f"the sub-batch's {plan.num_rows_padded} rows")
    if not np.array_equal(trimmed, kept < q):
        i = first_true(trimmed != (kept < q))
        fail(op, "plan.trimmed", f"plan.trimmed[{i}]={bool(trimmed[i])}",
             f"kept < q per request (request {i} keeps {int(kept[i])} of {int(q[i])} rows)")


def reference(plan, query_start_loc, seq_lens, replay_start, positions, slot_mappings, W, *, out=None) -> ReplayBatch:
    """The sub-batch follows the *device* ``query_start_loc``: request ``i``'s kept rows are
    the output rows ``[qsl[i] - dropped_before[i], qsl[i+1] - dropped_before[i+1])``, gathered
    from the last rows before its end ``qsl[i+1]`` (so a decode the device resized keeps all
    its device rows; a trimmed request keeps ``kept_i``). Returns ``rows``,
    ``query_start_loc``, ``positions``, ``slot_mappings`` and ``kv_start`` (``max(R,
    seq_len - W)`` for trimmed requests, ``R`` otherwise; a stale R counts as 0). Rows from
    ``qsl[B] - dropped_before[B]`` (the device's kept count) to ``num_rows_padded`` are graph
    padding: row 0 with every slot PAD (position 0 in a step with no token rows); kept rows past
    ``num_rows_padded`` are not written.
    """
    dev = positions.device
    n, n_pad = plan.num_rows, plan.num_rows_padded
    dropped = plan.device_dropped_before(dev)
    trimmed = dropped[1:] > dropped[:-1]  # kept < q
    qsl = query_start_loc.to(torch.int64)
    out_qsl = qsl - dropped.to(torch.int64)
    o = torch.arange(n_pad, device=dev, dtype=torch.int64)
    req = torch.searchsorted(out_qsl[1:].contiguous(), o, right=True).clamp(max=max(plan.num_reqs - 1, 0))
    real = o < out_qsl[-1]  # the device's kept rows (== n unless the device resized decodes)
    if plan.num_reqs == 0:  # (no request: every row graph padding)
        rows = torch.zeros_like(o)
    else:
        rows = torch.where(real, o + dropped.to(torch.int64)[req + 1], 0)
    R = live_replay_start(query_start_loc, seq_lens, replay_start)
    kv_start = torch.where(trimmed, torch.maximum(R, seq_lens.to(torch.int64) - W), R).to(INDEX_DTYPE)
    if positions.shape[0] == 0:  # a step with no token rows: every row padding, read from nothing (position 0)
        gathered_slots = slot_mappings.new_full((slot_mappings.shape[0], n_pad), PAD)
        gathered_positions = positions.new_zeros(n_pad)
    else:
        gathered_slots = torch.where(real[None, :], slot_mappings.index_select(1, rows), PAD)
        gathered_positions = positions.index_select(0, rows)
    result = {
        "rows": rows,
        "query_start_loc": out_qsl.to(INDEX_DTYPE),
        "positions": gathered_positions,
        "slot_mappings": gathered_slots,
        "kv_start": kv_start,
    }
    if out is not None:
        for key, value in result.items():
            out[key].copy_(value)
        result = out
    return ReplayBatch(num_rows=n, num_rows_padded=n_pad, **result)


RESULTS = Results(("rows", "query_start_loc", "positions", "slot_mappings", "kv_start"), lambda a: out_shapes(a["plan"], a["slot_mappings"].shape[0]), out="dict",
                  pack=lambda t, a: ReplayBatch(num_rows=a["plan"].num_rows,
                                                num_rows_padded=a["plan"].num_rows_padded, **t))


def case(d: CaseDraw) -> Call:
    """A step where something trims (drawn here unless given; a given one may have nothing to
    trim), a host plan of it (from a host ``query_start_loc`` the device resized at times)."""
    if d.given is None:
        b = random_batch(d.rng, long_prefill=True)
        t = b.tensors(d.device)
    else:
        b, t = d.batch, d.tensors
    rng = d.rng
    keeps = rng.random(b.B) < 0.2
    long = np.flatnonzero(b.prefilling & (b.q > b.W))
    if long.size:  # something trims (a given batch may have nothing to trim: a plan that keeps all)
        keeps[long[0]] = False
    plan = host_plan(rng, b, keeps)
    kw = {}
    if d.poison:
        kw["out"] = {k: d.out(s, dt) for k, (s, dt) in out_shapes(plan, b.num_groups).items()}
    return (plan, t["query_start_loc"], t["seq_lens"], t["replay_start"], t["positions"], t["slot_mappings"], b.W), kw


def warmup(s: WarmupStep):
    yield (s.plan, s.qsl, s.seq, s.R, s.positions, s.slots, s.W), {}


OP = OpSpec(NAME, reference, validate, RESULTS, short="replay_batch", scalars={"W": "int"}, case=case, warmup=warmup,
            quick_check=quick_check, anchor="query_start_loc")
