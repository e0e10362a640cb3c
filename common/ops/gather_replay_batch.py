"""``gather_replay_batch`` (SPEC §3.2): the decoder-side sub-batch, on the device."""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, PAD, SLOT_DTYPE, ReplayBatch, ReplayPlan
from ..validation import check_out, check_tensor, fail
from ._checks import check_batch, check_slot_mappings, check_window

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
    if B != plan.num_reqs:
        fail(NAME, "query_start_loc", query_start_loc, f"{plan.num_reqs + 1} entries (the plan's B + 1)")
    G = check_slot_mappings(NAME, slot_mappings, dev, T)
    check_window(NAME, "W", W)
    if W != plan.window:
        fail(NAME, "W", W, f"the plan's window {plan.window}")
    if plan.num_rows > T:
        fail(NAME, "plan", plan.num_rows, f"at most {T} kept rows (the batch's tokens)")
    if out is not None:
        if not isinstance(out, dict):
            fail(NAME, "out", out, "a dict of buffers from allocate_out()")
        for key, (shape, dtype) in out_shapes(plan, G).items():
            if key not in out:
                fail(NAME, "out", sorted(out), f"a buffer for {key!r}")
            check_out(NAME, f"out[{key!r}]", out[key], shape=shape, dtype=dtype, device=dev)


def reference(plan, query_start_loc, seq_lens, replay_start, positions, slot_mappings, W, *, out=None) -> ReplayBatch:
    """Request ``i`` keeps its last ``kept_i`` rows before its end ``query_start_loc[i+1]``
    (the *device* copy); they land at ``end - dropped_before[i+1]``. Returns ``rows``,
    ``query_start_loc``, ``positions``, ``slot_mappings`` and ``kv_start`` (``max(R,
    seq_len - W)`` for trimmed requests, ``R`` otherwise). Rows past ``num_rows`` (graph
    padding) gather row 0 with every slot PAD.
    """
    dev = positions.device
    n, n_pad = plan.num_rows, plan.num_rows_padded
    dropped, trimmed = plan.device_tensors(dev)
    qsl = query_start_loc.to(torch.int64)
    out_qsl = qsl - dropped.to(torch.int64)
    o = torch.arange(n_pad, device=dev, dtype=torch.int64)
    req = torch.searchsorted(out_qsl[1:].contiguous(), o, right=True).clamp(max=max(plan.num_reqs - 1, 0))
    real = o < n
    rows = torch.where(real, o + dropped.to(torch.int64)[req + 1], 0)
    if plan.num_reqs == 0:
        rows = torch.zeros_like(o)
    R = replay_start.to(torch.int64)
    kv_start = torch.where(trimmed, torch.maximum(R, seq_lens.to(torch.int64) - W), R).to(INDEX_DTYPE)
    gathered_slots = slot_mappings.index_select(1, rows)
    gathered_slots = torch.where(real[None, :], gathered_slots, PAD)
    result = {
        "rows": rows,
        "query_start_loc": out_qsl.to(INDEX_DTYPE),
        "positions": positions.index_select(0, rows),
        "slot_mappings": gathered_slots,
        "kv_start": kv_start,
    }
    if out is not None:
        for key, value in result.items():
            out[key].copy_(value)
        result = out
    return ReplayBatch(num_rows=n, num_rows_padded=n_pad, **result)
