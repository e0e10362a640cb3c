"""``prepare_replay_step``: a step's replay metadata in one call (SPEC §2.1, §2.2, §2.4, §3.2).

The encoder- and decoder-side metadata of one serving step, produced together:
the per-batch replay start (``batch_replay_start``), the replayed cacheable slots padded in
place (``pad_replayed_slots``), the clamped window indices and lengths
(``swa_indices_and_lens``) and, given a plan, the decoder sub-batch
(``gather_replay_batch``, gathered from the *padded* slots). The reference below is
exactly those four references composed in that order; a fused variant (the Triton one is a
single launch) must give the same result bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..types import INDEX_DTYPE, ReplayBatch, ReplayPlan
from ..validation import check_tensor, fail, value_checks_enabled
from . import batch_replay_start, gather_replay_batch, pad_replayed_slots, swa_indices_and_lens
from ._results import Results

NAME = "prepare_replay_step"


class PreparedStep(NamedTuple):
    """``replay_start`` int32 [B]; ``slot_mappings`` (the input, padded in place);
    ``swa_indices`` int32 [T, index_width] and ``swa_lens`` int32 [T];
    ``replay_batch`` (:class:`ReplayBatch`, None without a plan)."""

    replay_start: torch.Tensor
    slot_mappings: torch.Tensor
    swa_indices: torch.Tensor
    swa_lens: torch.Tensor
    replay_batch: ReplayBatch | None


def out_shapes(num_reqs: int, num_tokens: int, index_width: int, plan: ReplayPlan | None = None,
               num_groups: int = 0) -> dict:
    """Shapes and dtypes of the ``out=`` buffers: ``replay_start``, ``swa_indices``,
    ``swa_lens`` and, with a plan, ``replay_batch`` (``gather_replay_batch``'s dict)."""
    shapes: dict = {
        "replay_start": ((num_reqs,), INDEX_DTYPE),
        "swa_indices": ((num_tokens, index_width), INDEX_DTYPE),
        "swa_lens": ((num_tokens,), INDEX_DTYPE),
    }
    if plan is not None:
        shapes["replay_batch"] = gather_replay_batch.out_shapes(plan, num_groups)
    return shapes


def allocate_out(num_reqs: int, num_tokens: int, index_width: int, device, plan: ReplayPlan | None = None,
                 num_groups: int = 0) -> dict:
    """Buffers for ``out=``; reuse them across steps for stable addresses (graphs)."""

    def make(spec):
        if isinstance(spec, dict):
            return {k: make(v) for k, v in spec.items()}
        shape, dtype = spec
        return torch.empty(shape, dtype=dtype, device=device)

    return make(out_shapes(num_reqs, num_tokens, index_width, plan, num_groups))


def validate(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
             cacheable_groups, block_table, block_size, W, Wr, *, index_width=None, plan=None, any_replay=None,
             out=None) -> None:
    """The four ops' own validators, in order, on the replay starts this call produces;
    their errors are re-labelled ``prepare_replay_step: <argument>=...: expected ...``."""
    try:
        _validate(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
                  cacheable_groups, block_table, block_size, W, Wr, index_width=index_width, plan=plan,
                  any_replay=any_replay, out=out)
    except ValueError as exc:
        msg = str(exc)
        for op in _PARTS:
            if msg.startswith(op + ": "):
                raise ValueError(f"{NAME}: {msg[len(op) + 2:]}") from exc
        raise


_PARTS = (batch_replay_start.NAME, pad_replayed_slots.NAME, swa_indices_and_lens.NAME, gather_replay_batch.NAME)


def _validate(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
              cacheable_groups, block_table, block_size, W, Wr, *, index_width, plan, any_replay, out) -> None:
    if out is not None and not isinstance(out, dict):
        fail(NAME, "out", out, "a dict of buffers from allocate_out()")
    o = out or {}
    for key in ("replay_start", "swa_indices", "swa_lens") if out is not None else ():
        if key not in o:
            fail(NAME, "out", sorted(o), f"a buffer for {key!r}")
    batch_replay_start.validate(R_per_request, idx_mapping, is_prefilling, out=o.get("replay_start"))
    check_tensor(NAME, "query_start_loc", query_start_loc, dtypes=INDEX_DTYPE, ndim=1,
                 device=R_per_request.device)
    if query_start_loc.shape[0] != idx_mapping.shape[0] + 1:
        fail(NAME, "query_start_loc", query_start_loc, f"{idx_mapping.shape[0] + 1} entries (one per batch row + 1)")
    if plan is not None and not isinstance(plan, ReplayPlan):
        fail(NAME, "plan", plan, "None or a ReplayPlan from plan_replay_batch")
    if plan is not None and out is not None and "replay_batch" not in o:
        fail(NAME, "out", sorted(o), "a buffer dict for 'replay_batch' (a plan is given)")
    # The clamp checks below read the replay starts this call will produce; without value
    # checks (graph capture) the validators only look at the tensor's metadata.
    if value_checks_enabled():
        R = batch_replay_start.reference(R_per_request, idx_mapping, is_prefilling)
    else:
        R = torch.empty(idx_mapping.shape[0], dtype=INDEX_DTYPE, device=R_per_request.device)
    pad_replayed_slots.validate(slot_mappings, cacheable_groups, query_start_loc, positions, R, Wr,
                                any_replay=any_replay)
    swa_out = (o["swa_indices"], o["swa_lens"]) if out is not None else None
    swa_indices_and_lens.validate(query_start_loc, seq_lens, block_table, block_size, W, R, index_width=index_width,
                                  num_tokens=positions.shape[0], out=swa_out)
    if plan is not None:
        gather_replay_batch.validate(plan, query_start_loc, seq_lens, R, positions, slot_mappings, W,
                                     out=o.get("replay_batch"))


def reference(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
              cacheable_groups, block_table, block_size, W, Wr, *, index_width=None, plan=None, any_replay=None,
              out=None) -> PreparedStep:
    """``R = batch_replay_start(R_per_request, idx_mapping, is_prefilling)``;
    ``pad_replayed_slots(slot_mappings, cacheable_groups, query_start_loc, positions, R, Wr)``;
    ``swa_indices_and_lens(query_start_loc, seq_lens, block_table, block_size, W, R,
    index_width=index_width, num_tokens=len(positions))``; with a plan,
    ``gather_replay_batch(plan, query_start_loc, seq_lens, R, positions, slot_mappings, W)``
    on the padded slots. Returns a :class:`PreparedStep`.
    """
    o = out or {}
    R = batch_replay_start.reference(R_per_request, idx_mapping, is_prefilling, out=o.get("replay_start"))
    pad_replayed_slots.reference(slot_mappings, cacheable_groups, query_start_loc, positions, R, Wr,
                                 any_replay=any_replay)
    swa_out = (o["swa_indices"], o["swa_lens"]) if out is not None else None
    idx, lens = swa_indices_and_lens.reference(query_start_loc, seq_lens, block_table, block_size, W, R,
                                               index_width=index_width, num_tokens=positions.shape[0], out=swa_out)
    batch = None
    if plan is not None:
        batch = gather_replay_batch.reference(plan, query_start_loc, seq_lens, R, positions, slot_mappings, W,
                                              out=o.get("replay_batch"))
    return PreparedStep(R, slot_mappings, idx, lens, batch)


def _result_shapes(a) -> dict:
    shapes = out_shapes(a["idx_mapping"].shape[0], a["positions"].shape[0],
                        a["W"] if a.get("index_width") is None else a["index_width"], a.get("plan"),
                        a["slot_mappings"].shape[0])
    batch = shapes.pop("replay_batch", {})
    return shapes | {f"replay_batch.{k}": v for k, v in batch.items()}


def _pack(t: dict, a) -> PreparedStep:
    plan = a.get("plan")
    batch = None
    if plan is not None:
        batch = ReplayBatch(num_rows=plan.num_rows, num_rows_padded=plan.num_rows_padded,
                            **{k.split(".", 1)[1]: v for k, v in t.items() if k.startswith("replay_batch.")})
    return PreparedStep(t["replay_start"], a["slot_mappings"], t["swa_indices"], t["swa_lens"], batch)


RESULTS = Results(("replay_start", "swa_indices", "swa_lens"), _result_shapes, out="dict", pack=_pack,
                  plan_names=tuple(f"replay_batch.{f}" for f in ("rows", "query_start_loc", "positions",
                                                                 "slot_mappings", "kv_start")))
