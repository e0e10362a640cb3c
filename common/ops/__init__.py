"""The torch reference of every op of SPEC §1-§3, with its validator.

``OPS`` lists the *device* ops (those with per-platform variants) as :class:`OpSpec`:
name, validator and reference, all with one signature. Host-side helpers (scheduler,
planning, DP agreement) have a single implementation and are exported as plain functions.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable

from ..validation import check_writes, one_read
from ._results import Results

from . import (
    batch_replay_start,
    combined_indices,
    compressed_slot_mapping,
    gather_replay_batch,
    indices_to_csr,
    mixed_indices,
    pad_replayed_slots,
    plain_indices,
    prefill_gather_lens,
    prepare_replay_step,
    rows,
    sparse_mla,
    swa_indices_and_lens,
)
from .agree_across_dp import agree_across_dp
from .gather_replay_batch import allocate_out as allocate_replay_batch_out
from .pcp_partition import PCPPartition, pcp_gather_columns, pcp_partition, pcp_restore_tokens
from .plan_replay_batch import STEP_GRAPH_MODES, TRIM_THRESHOLD
from .plan_replay_batch import reference as _plan_reference
from .plan_replay_batch import validate as _plan_validate
from .scheduler import admit_prefix_hit, mark_prefix_replay, replay_block_is_live, replay_layer_ids


@dataclass(frozen=True)
class OpSpec:
    """One device op: its validator and reference (same signature), what it returns
    (``results``: names, shapes and dtypes of its result tensors) and the arguments it writes
    in place (``mutates``; ``out=`` is always written when given). The torch custom ops are
    generated from these declarations (``swa_backends.torch_ops``)."""

    name: str
    validate: Callable
    reference: Callable
    doc: str
    results: Results
    mutates: tuple[str, ...] = ()

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.reference)

    def check_writes(self, args: tuple, kwargs: dict) -> None:
        """Every buffer the op writes (``out=`` entries, ``mutates``) overlaps neither itself nor an
        input (a plan's tensors included) nor another written buffer, by address (see
        :func:`check_writes`)."""
        check_writes(self.name, self.signature, args, kwargs, self.mutates)


def _one_read(validate: Callable) -> Callable:
    """``validate`` whose value checks are read with one device->host transfer at its end (an
    enclosing :func:`one_read` block, the dispatcher's, reads them later still)."""

    @functools.wraps(validate)
    def run(*args, **kwargs) -> None:
        with one_read():
            validate(*args, **kwargs)

    return run


def _spec(module, name=None, validate=None, reference=None, results=None, mutates=()) -> OpSpec:
    name = name or module.NAME
    ref = reference or module.reference
    return OpSpec(name, _one_read(validate or module.validate), ref, (ref.__doc__ or "").strip().split("\n")[0],
                  results or module.RESULTS, tuple(mutates))


OPS: dict[str, OpSpec] = {
    s.name: s
    for s in (
        _spec(batch_replay_start),
        _spec(pad_replayed_slots, mutates=("slot_mappings",)),
        _spec(compressed_slot_mapping),
        _spec(swa_indices_and_lens),
        _spec(prefill_gather_lens),
        _spec(combined_indices),
        _spec(mixed_indices),
        _spec(plain_indices),
        _spec(indices_to_csr),
        _spec(sparse_mla),
        _spec(gather_replay_batch),
        _spec(rows, "gather_rows", rows.validate_gather, rows.gather_rows, rows.GATHER_RESULTS),
        _spec(rows, "scatter_rows", rows.validate_scatter, rows.scatter_rows, rows.SCATTER_RESULTS),
        _spec(prepare_replay_step, mutates=("slot_mappings",)),
    )
}


def plan_replay_batch(query_start_loc_host, is_prefilling, keeps_rows, W, *, pad_to=None, graph_mode="none",
                      trim_threshold=TRIM_THRESHOLD, num_tokens=None):
    """Host plan of the decoder-side sub-batch; None when nothing trims, for a FULL-graph
    step and for a step of fewer than ``trim_threshold`` tokens (SPEC §3.1, §3.5)."""
    from ..validation import validation_enabled

    kw = dict(pad_to=pad_to, graph_mode=graph_mode, trim_threshold=trim_threshold, num_tokens=num_tokens)
    if validation_enabled():
        _plan_validate(query_start_loc_host, is_prefilling, keeps_rows, W, **kw)
    return _plan_reference(query_start_loc_host, is_prefilling, keeps_rows, W, **kw)


HOST_OPS: dict[str, Callable] = {
    "mark_prefix_replay": mark_prefix_replay,
    "admit_prefix_hit": admit_prefix_hit,
    "replay_block_is_live": replay_block_is_live,
    "replay_layer_ids": replay_layer_ids,
    "plan_replay_batch": plan_replay_batch,
    "agree_across_dp": agree_across_dp,
    "pcp_partition": pcp_partition,
}

__all__ = ["OPS", "HOST_OPS", "OpSpec", "PCPPartition", "STEP_GRAPH_MODES", "TRIM_THRESHOLD",
           "allocate_replay_batch_out", "pcp_gather_columns", "pcp_restore_tokens", *HOST_OPS]
