"""The torch reference of every op of SPEC §1-§3, with its validator.

:class:`Ops` lists every op of the pack, one line each. Device ops (those with per-platform
variants) are :class:`OpSpec` declarations, each in its op's own module (``OP``): reference,
validator, results and the op's other facts; ``OPS`` maps their names to them. Host-side
helpers (scheduler, planning, DP agreement) have a single implementation and are listed as
plain functions (``HOST_OPS``). For type checkers ``Backend`` (``swa_backends.dispatch``)
subclasses :class:`Ops`: every op is a typed attribute of every backend, with the reference's
signature (at run time each is an instance attribute, prepared per device).

A new device op is its module (reference, validator, results, ``OP``) and one line in
:class:`Ops`; :func:`register_op` adds one at run time instead.
"""

from __future__ import annotations

from typing import Callable

from ..registry import declarations_changed
from ..validation import fail
from ._results import Results  # noqa: F401  (re-exported: an op module's result declaration)
from ._spec import OpSpec

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
from .plan_replay_batch import plan_replay_batch
from .scheduler import admit_prefix_hit, mark_prefix_replay, replay_block_is_live, replay_layer_ids


class Ops:
    """Every op of the pack, one line each (``OPS`` and ``HOST_OPS`` are read off this class).

    A device op is its module's :class:`OpSpec`, typed as a callable with the reference's
    signature on an instance (``Backend``, whose ``__init__`` prepares each). A host op is its
    one implementation."""

    batch_replay_start = batch_replay_start.OP
    pad_replayed_slots = pad_replayed_slots.OP
    compressed_slot_mapping = compressed_slot_mapping.OP
    swa_indices_and_lens = swa_indices_and_lens.OP
    prefill_gather_lens = prefill_gather_lens.OP
    combined_indices = combined_indices.OP
    mixed_indices = mixed_indices.OP
    plain_indices = plain_indices.OP
    indices_to_csr = indices_to_csr.OP
    sparse_mla = sparse_mla.OP
    gather_replay_batch = gather_replay_batch.OP
    gather_rows = rows.GATHER_OP
    scatter_rows = rows.SCATTER_OP
    prepare_replay_step = prepare_replay_step.OP

    mark_prefix_replay = staticmethod(mark_prefix_replay)
    admit_prefix_hit = staticmethod(admit_prefix_hit)
    replay_block_is_live = staticmethod(replay_block_is_live)
    replay_layer_ids = staticmethod(replay_layer_ids)
    plan_replay_batch = staticmethod(plan_replay_batch)
    agree_across_dp = staticmethod(agree_across_dp)
    pcp_partition = staticmethod(pcp_partition)


def _declared_ops() -> dict[str, OpSpec]:
    ops = {}
    for attr, spec in vars(Ops).items():
        if isinstance(spec, OpSpec):
            if spec.name != attr:
                raise RuntimeError(f"Ops.{attr} declares op {spec.name!r}: the attribute is the op's name")
            ops[attr] = spec
    return ops


#: Every device op by name, in the order of :class:`Ops` (and of every table that lists ops).
OPS: dict[str, OpSpec] = _declared_ops()

#: Every host op by name.
HOST_OPS: dict[str, Callable] = {name: fn.__func__ for name, fn in vars(Ops).items() if isinstance(fn, staticmethod)}


def register_op(spec: OpSpec) -> OpSpec:
    """Add a device op for the rest of the process (or until :func:`unregister_op`): dispatch
    (its reference on every platform), ``Backend``, the conformance suite and the matrix runner
    see it from now on; ``swa_backends.torch_ops.define_ops()`` defines its custom ops."""
    if not isinstance(spec, OpSpec):
        fail("register_op", "spec", spec, "an OpSpec")
    if spec.name in OPS or spec.name in HOST_OPS or not spec.name.isidentifier() or spec.name.startswith("_"):
        fail("register_op", "spec.name", spec.name, f"a new op name, a public identifier (taken: {sorted(OPS)})")
    OPS[spec.name] = spec
    declarations_changed()
    return spec


def unregister_op(name: str) -> None:
    """Forget an op :func:`register_op` added (a declared one cannot be removed)."""
    if name not in OPS or isinstance(vars(Ops).get(name), OpSpec):
        fail("unregister_op", "name", name, "an op added with register_op")
    del OPS[name]
    declarations_changed()


__all__ = ["OPS", "HOST_OPS", "OpSpec", "Ops", "PCPPartition", "STEP_GRAPH_MODES", "TRIM_THRESHOLD",
           "allocate_replay_batch_out", "pcp_gather_columns", "pcp_restore_tokens", "register_op", "unregister_op",
           *HOST_OPS]
