"""The pack's device ops as ``torch.library`` custom ops: ``torch.ops.swa_backends.<op>``.

Importing this module defines the ops (``swa_backends.plugin.register()`` does it for a
serving engine); ``import swa_backends`` alone does not. Every op has a fake (meta)
implementation, so ``torch.compile`` and graph capture trace it without running it, and
its real implementation dispatches to :func:`swa_backends.select` for the device of its
data tensor (one ``select()`` per device, cached): the best variant of that platform,
validated by the op's shared ``validate`` unless validation is off.

Forms (a custom op may not return one of its inputs, so ``out=`` and in-place calls are
separate ops that return nothing and declare what they write):

* ``<op>(...)`` -- functional: fresh output tensors, the Python op's arguments without
  ``out=``. Custom ops cannot take keyword-only tensors, so optional tensors (``valid``,
  ``sink``) are positional-or-keyword; scalar options stay keyword-only;
* ``<op>_out(..., out)`` -- writes preallocated buffers (stable addresses for graphs),
  declared in ``mutates_args``; a tuple ``out=(a, b)`` becomes two arguments
  (``out_indices``/``out_lens``, ``out_indptr``/``out_values``, ``out_<field>``) placed
  after the required tensors;
* ``pad_replayed_slots`` -- in place on ``slot_mappings`` (declared), returns nothing.

``gather_replay_batch`` takes a host :class:`ReplayPlan`, which a custom op cannot carry;
its tensor-level form takes the plan's fields instead (:func:`plan_arguments` unpacks a
plan, :func:`replay_batch` packs the five outputs back into a :class:`ReplayBatch`)::

    torch.ops.swa_backends.gather_replay_batch(
        kept, trimmed, dropped_before, num_rows, num_rows_padded,   # the plan
        query_start_loc, seq_lens, replay_start, positions, slot_mappings, W)
    -> (rows, query_start_loc, positions, slot_mappings, kv_start)

Pass the plan tensors already on the device inside a captured graph (``plan_arguments(plan,
device)`` copies them once per plan and device); host tensors work eagerly.

``prepare_replay_step`` (where the build has it) pads ``slot_mappings`` in place *and*
returns ``(replay_start, swa_indices, swa_lens)``; ``prepare_replay_step_plan`` takes the
plan's fields after ``Wr`` and returns the five sub-batch tensors as well; ``_out`` forms
of both write ``out_replay_start, out_swa_indices, out_swa_lens`` (and
``out_batch_<field>``).

:func:`call` runs any op with its Python arguments (``out=``, plans and all) through these
custom ops and returns what the Python op returns.
"""

# No ``from __future__ import annotations``: torch infers each op's schema from real
# annotation objects.

import functools
from typing import Optional

import torch
from torch import Tensor

from .dispatch import Backend, select
from .common.ops.combined_indices import combined_width
from .common.ops import OPS
from .common.ops.mixed_indices import mixed_width
from .common.types import INDEX_DTYPE, SLOT_DTYPE, ReplayBatch, ReplayPlan

NAMESPACE = "swa_backends"

#: Every op defined here, functional and out/in-place forms.
OP_NAMES: list[str] = []


def _define(name: str, mutates_args=()):
    """``torch.library.custom_op`` under the pack's namespace, recorded in OP_NAMES."""

    def deco(fn):
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=tuple(mutates_args))(fn)
        OP_NAMES.append(name)
        return op

    return deco


# ---------------------------------------------------------------------------------------
# dispatch to the selected backend of a device
# ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _backend(device: str) -> Backend:
    return select(device)


def backend_for(device: torch.device | str) -> Backend:
    """The backend the ops use for tensors on ``device`` (``select(device)``, cached)."""
    d = torch.device(device)
    if d.type == "cpu":
        return _backend("cpu")
    if d.index is None and d.type == "cuda":
        d = torch.device("cuda", torch.cuda.current_device())
    return _backend(str(d))


def clear_backends() -> None:
    """Forget the cached backends (after changing the matrix, a fake device, probes...)."""
    _backend.cache_clear()


def _call(op: str, device: torch.device, *args, **kwargs):
    return getattr(backend_for(device), op)(*args, **kwargs)


def _fresh(result, *inputs):
    """Outputs of a functional custom op must not alias its inputs: clone any output a
    variant returned that shares storage with an argument (a copy-through fast path)."""
    ptrs = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, Tensor) and t.numel()}

    def one(t: Tensor) -> Tensor:
        return t.clone() if t.numel() and t.untyped_storage().data_ptr() in ptrs else t

    if isinstance(result, tuple):
        return tuple(one(t) for t in result)
    return one(result)


def _empty(like: Tensor, shape, dtype) -> Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=like.device)


# ---------------------------------------------------------------------------------------
# encoder side
# ---------------------------------------------------------------------------------------


@_define("batch_replay_start")
def batch_replay_start(R_per_request: Tensor, idx_mapping: Tensor, is_prefilling: Tensor) -> Tensor:
    return _fresh(_call("batch_replay_start", R_per_request.device, R_per_request, idx_mapping, is_prefilling),
                  R_per_request, idx_mapping, is_prefilling)


@batch_replay_start.register_fake
def _(R_per_request, idx_mapping, is_prefilling):
    return _empty(R_per_request, (idx_mapping.shape[0],), INDEX_DTYPE)


@_define("batch_replay_start_out", mutates_args=("out",))
def batch_replay_start_out(R_per_request: Tensor, idx_mapping: Tensor, is_prefilling: Tensor, out: Tensor) -> None:
    _call("batch_replay_start", R_per_request.device, R_per_request, idx_mapping, is_prefilling, out=out)


@batch_replay_start_out.register_fake
def _(R_per_request, idx_mapping, is_prefilling, out):
    return None


@_define("pad_replayed_slots", mutates_args=("slot_mappings",))
def pad_replayed_slots(slot_mappings: Tensor, cacheable_groups: Tensor, query_start_loc: Tensor, positions: Tensor,
                       replay_start: Tensor, Wr: int, *, any_replay: Optional[bool] = None) -> None:
    _call("pad_replayed_slots", slot_mappings.device, slot_mappings, cacheable_groups, query_start_loc, positions,
          replay_start, Wr, any_replay=any_replay)


@pad_replayed_slots.register_fake
def _(slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, Wr, *, any_replay=None):
    return None


@_define("compressed_slot_mapping")
def compressed_slot_mapping(token_slots: Tensor, query_start_loc: Tensor, seq_lens: Tensor, block_table: Tensor,
                            block_size: int, ratio: int) -> Tensor:
    args = (token_slots, query_start_loc, seq_lens, block_table)
    return _fresh(_call("compressed_slot_mapping", token_slots.device, *args, block_size, ratio), *args)


@compressed_slot_mapping.register_fake
def _(token_slots, query_start_loc, seq_lens, block_table, block_size, ratio):
    return _empty(token_slots, (token_slots.shape[0],), SLOT_DTYPE)


@_define("compressed_slot_mapping_out", mutates_args=("out",))
def compressed_slot_mapping_out(token_slots: Tensor, query_start_loc: Tensor, seq_lens: Tensor, block_table: Tensor,
                                block_size: int, ratio: int, out: Tensor) -> None:
    _call("compressed_slot_mapping", token_slots.device, token_slots, query_start_loc, seq_lens, block_table,
          block_size, ratio, out=out)


@compressed_slot_mapping_out.register_fake
def _(token_slots, query_start_loc, seq_lens, block_table, block_size, ratio, out):
    return None


@_define("swa_indices_and_lens")
def swa_indices_and_lens(query_start_loc: Tensor, seq_lens: Tensor, block_table: Tensor, block_size: int, W: int,
                         replay_start: Tensor, valid: Optional[Tensor] = None, *, index_width: Optional[int] = None,
                         num_tokens: Optional[int] = None) -> tuple[Tensor, Tensor]:
    args = (query_start_loc, seq_lens, block_table)
    res = _call("swa_indices_and_lens", query_start_loc.device, *args, block_size, W, replay_start,
                index_width=index_width, valid=valid, num_tokens=num_tokens)
    return _fresh(res, *args, replay_start, valid)


@swa_indices_and_lens.register_fake
def _(query_start_loc, seq_lens, block_table, block_size, W, replay_start, valid=None, *, index_width=None,
      num_tokens=None):
    if num_tokens is not None:
        T = num_tokens
    elif valid is not None:
        T = valid.shape[0]
    else:  # query_start_loc[-1], a value: data-dependent size (pass num_tokens to avoid it)
        T = torch.library.get_ctx().new_dynamic_size()
    width = W if index_width is None else index_width
    return _empty(query_start_loc, (T, width), INDEX_DTYPE), _empty(query_start_loc, (T,), INDEX_DTYPE)


@_define("swa_indices_and_lens_out", mutates_args=("out_indices", "out_lens"))
def swa_indices_and_lens_out(query_start_loc: Tensor, seq_lens: Tensor, block_table: Tensor, block_size: int, W: int,
                             replay_start: Tensor, out_indices: Tensor, out_lens: Tensor,
                             valid: Optional[Tensor] = None, *, index_width: Optional[int] = None,
                             num_tokens: Optional[int] = None) -> None:
    # The buffers fix T: num_tokens defaults to their length.
    T = out_lens.shape[0] if num_tokens is None else num_tokens
    _call("swa_indices_and_lens", query_start_loc.device, query_start_loc, seq_lens, block_table, block_size, W,
          replay_start, index_width=index_width, valid=valid, num_tokens=T, out=(out_indices, out_lens))


@swa_indices_and_lens_out.register_fake
def _(query_start_loc, seq_lens, block_table, block_size, W, replay_start, out_indices, out_lens, valid=None, *,
      index_width=None, num_tokens=None):
    return None


@_define("prefill_gather_lens")
def prefill_gather_lens(query_start_loc: Tensor, seq_lens: Tensor, replay_start: Tensor, W: int) -> Tensor:
    args = (query_start_loc, seq_lens, replay_start)
    return _fresh(_call("prefill_gather_lens", query_start_loc.device, *args, W), *args)


@prefill_gather_lens.register_fake
def _(query_start_loc, seq_lens, replay_start, W):
    return _empty(query_start_loc, (seq_lens.shape[0],), INDEX_DTYPE)


@_define("prefill_gather_lens_out", mutates_args=("out",))
def prefill_gather_lens_out(query_start_loc: Tensor, seq_lens: Tensor, replay_start: Tensor, W: int,
                            out: Tensor) -> None:
    _call("prefill_gather_lens", query_start_loc.device, query_start_loc, seq_lens, replay_start, W, out=out)


@prefill_gather_lens_out.register_fake
def _(query_start_loc, seq_lens, replay_start, W, out):
    return None


@_define("combined_indices")
def combined_indices(topk_indices: Tensor, query_start_loc: Tensor, seq_lens: Tensor, replay_start: Tensor, W: int,
                     ratio: int, top_k: int, slab_stride: int, window_offset: int,
                     valid: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    args = (topk_indices, query_start_loc, seq_lens, replay_start)
    res = _call("combined_indices", topk_indices.device, *args, W, ratio, top_k, slab_stride, window_offset,
                valid=valid)
    return _fresh(res, *args, valid)


@combined_indices.register_fake
def _(topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride, window_offset,
      valid=None):
    T = topk_indices.shape[0]
    return (_empty(topk_indices, (T, combined_width(top_k, W)), INDEX_DTYPE),
            _empty(topk_indices, (T,), INDEX_DTYPE))


@_define("combined_indices_out", mutates_args=("out_indices", "out_lens"))
def combined_indices_out(topk_indices: Tensor, query_start_loc: Tensor, seq_lens: Tensor, replay_start: Tensor,
                         W: int, ratio: int, top_k: int, slab_stride: int, window_offset: int, out_indices: Tensor,
                         out_lens: Tensor, valid: Optional[Tensor] = None) -> None:
    _call("combined_indices", topk_indices.device, topk_indices, query_start_loc, seq_lens, replay_start, W, ratio,
          top_k, slab_stride, window_offset, valid=valid, out=(out_indices, out_lens))


@combined_indices_out.register_fake
def _(topk_indices, query_start_loc, seq_lens, replay_start, W, ratio, top_k, slab_stride, window_offset,
      out_indices, out_lens, valid=None):
    return None


@_define("mixed_indices")
def mixed_indices(swa_indices: Tensor, topk_slots: Tensor, topk_lens: Tensor) -> tuple[Tensor, Tensor]:
    args = (swa_indices, topk_slots, topk_lens)
    return _fresh(_call("mixed_indices", swa_indices.device, *args), *args)


@mixed_indices.register_fake
def _(swa_indices, topk_slots, topk_lens):
    T, SW = swa_indices.shape
    return (_empty(swa_indices, (T, mixed_width(SW, topk_slots.shape[1])), INDEX_DTYPE),
            _empty(swa_indices, (T,), INDEX_DTYPE))


@_define("mixed_indices_out", mutates_args=("out_indices", "out_lens"))
def mixed_indices_out(swa_indices: Tensor, topk_slots: Tensor, topk_lens: Tensor, out_indices: Tensor,
                      out_lens: Tensor) -> None:
    _call("mixed_indices", swa_indices.device, swa_indices, topk_slots, topk_lens, out=(out_indices, out_lens))


@mixed_indices_out.register_fake
def _(swa_indices, topk_slots, topk_lens, out_indices, out_lens):
    return None


@_define("plain_indices")
def plain_indices(swa_indices: Tensor, swa_lens: Tensor, topk_slots: Optional[Tensor] = None,
                  topk_lens: Optional[Tensor] = None, *, topk_offset: int = 0,
                  window_offset: int = 0) -> tuple[Tensor, Tensor]:
    args = (swa_indices, swa_lens, topk_slots, topk_lens)
    res = _call("plain_indices", swa_indices.device, *args, topk_offset=topk_offset, window_offset=window_offset)
    return _fresh(res, *args)


@plain_indices.register_fake
def _(swa_indices, swa_lens, topk_slots=None, topk_lens=None, *, topk_offset=0, window_offset=0):
    T, SW = swa_indices.shape
    K = 0 if topk_slots is None else topk_slots.shape[1]
    return _empty(swa_indices, (T, K + SW), INDEX_DTYPE), _empty(swa_indices, (T,), INDEX_DTYPE)


@_define("plain_indices_out", mutates_args=("out_indices", "out_lens"))
def plain_indices_out(swa_indices: Tensor, swa_lens: Tensor, out_indices: Tensor, out_lens: Tensor,
                      topk_slots: Optional[Tensor] = None, topk_lens: Optional[Tensor] = None, *,
                      topk_offset: int = 0, window_offset: int = 0) -> None:
    _call("plain_indices", swa_indices.device, swa_indices, swa_lens, topk_slots, topk_lens, topk_offset=topk_offset,
          window_offset=window_offset, out=(out_indices, out_lens))


@plain_indices_out.register_fake
def _(swa_indices, swa_lens, out_indices, out_lens, topk_slots=None, topk_lens=None, *, topk_offset=0,
      window_offset=0):
    return None


@_define("indices_to_csr")
def indices_to_csr(indices: Tensor, lens: Tensor) -> tuple[Tensor, Tensor]:
    return _fresh(_call("indices_to_csr", indices.device, indices, lens), indices, lens)


@indices_to_csr.register_fake
def _(indices, lens):
    T, K = indices.shape
    return _empty(indices, (T + 1,), INDEX_DTYPE), _empty(indices, (T * K,), INDEX_DTYPE)


@_define("indices_to_csr_out", mutates_args=("out_indptr", "out_values"))
def indices_to_csr_out(indices: Tensor, lens: Tensor, out_indptr: Tensor, out_values: Tensor) -> None:
    _call("indices_to_csr", indices.device, indices, lens, out=(out_indptr, out_values))


@indices_to_csr_out.register_fake
def _(indices, lens, out_indptr, out_values):
    return None


@_define("sparse_mla")
def sparse_mla(q: Tensor, kv: Tensor, indices: Tensor, lens: Tensor, sm_scale: float, d_v: int,
               sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    res = _call("sparse_mla", q.device, q, kv, indices, lens, sm_scale, d_v, sink=sink)
    return _fresh(res, q, kv, indices, lens, sink)


@sparse_mla.register_fake
def _(q, kv, indices, lens, sm_scale, d_v, sink=None):
    T, H, _ = q.shape
    return _empty(q, (T, H, d_v), q.dtype), _empty(q, (T, H), torch.float32)


# ---------------------------------------------------------------------------------------
# decoder side
# ---------------------------------------------------------------------------------------

#: Output order of the tensor-level ``gather_replay_batch`` (the ReplayBatch fields).
REPLAY_BATCH_FIELDS = ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start")


def plan_arguments(plan: ReplayPlan, device=None) -> tuple:
    """``(kept, trimmed, dropped_before, num_rows, num_rows_padded)`` of a host plan, the
    first arguments of ``torch.ops.swa_backends.gather_replay_batch[_out]``. With
    ``device``, the tensors are copied there once per plan and device (graph capture)."""
    if not isinstance(plan, ReplayPlan):
        raise ValueError(f"gather_replay_batch: plan={plan!r}: expected a ReplayPlan from plan_replay_batch")
    if device is None:
        return plan.kept, plan.trimmed, plan.dropped_before, plan.num_rows, plan.num_rows_padded
    dropped, trimmed = plan.device_tensors(torch.device(device))
    key = f"kept:{torch.device(device)}"
    kept = plan._device_cache.get(key)
    if kept is None:
        kept = plan._device_cache[key] = plan.kept.to(device)
    return kept, trimmed, dropped, plan.num_rows, plan.num_rows_padded


def replay_batch(outputs, num_rows: int) -> ReplayBatch:
    """The five outputs of the tensor-level op as a :class:`ReplayBatch`."""
    fields = dict(zip(REPLAY_BATCH_FIELDS, outputs))
    return ReplayBatch(num_rows=int(num_rows), num_rows_padded=int(fields["rows"].shape[0]), **fields)


def _plan(kept, trimmed, dropped_before, num_rows, num_rows_padded, W) -> ReplayPlan:
    return ReplayPlan(kept, trimmed, dropped_before, num_rows, num_rows_padded, W)


@_define("gather_replay_batch")
def gather_replay_batch(kept: Tensor, trimmed: Tensor, dropped_before: Tensor, num_rows: int, num_rows_padded: int,
                        query_start_loc: Tensor, seq_lens: Tensor, replay_start: Tensor, positions: Tensor,
                        slot_mappings: Tensor, W: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    plan = _plan(kept, trimmed, dropped_before, num_rows, num_rows_padded, W)
    args = (query_start_loc, seq_lens, replay_start, positions, slot_mappings)
    res = _call("gather_replay_batch", positions.device, plan, *args, W)
    return _fresh(tuple(getattr(res, f) for f in REPLAY_BATCH_FIELDS), kept, trimmed, dropped_before, *args)


@gather_replay_batch.register_fake
def _(kept, trimmed, dropped_before, num_rows, num_rows_padded, query_start_loc, seq_lens, replay_start, positions,
      slot_mappings, W):
    B = query_start_loc.shape[0] - 1
    n = num_rows_padded
    return (_empty(positions, (n,), SLOT_DTYPE), _empty(positions, (B + 1,), INDEX_DTYPE),
            _empty(positions, (n,), SLOT_DTYPE), _empty(positions, (slot_mappings.shape[0], n), SLOT_DTYPE),
            _empty(positions, (B,), INDEX_DTYPE))


@_define("gather_replay_batch_out", mutates_args=tuple(f"out_{f}" for f in REPLAY_BATCH_FIELDS))
def gather_replay_batch_out(kept: Tensor, trimmed: Tensor, dropped_before: Tensor, num_rows: int,
                            num_rows_padded: int, query_start_loc: Tensor, seq_lens: Tensor, replay_start: Tensor,
                            positions: Tensor, slot_mappings: Tensor, W: int, out_rows: Tensor,
                            out_query_start_loc: Tensor, out_positions: Tensor, out_slot_mappings: Tensor,
                            out_kv_start: Tensor) -> None:
    plan = _plan(kept, trimmed, dropped_before, num_rows, num_rows_padded, W)
    out = dict(zip(REPLAY_BATCH_FIELDS, (out_rows, out_query_start_loc, out_positions, out_slot_mappings,
                                         out_kv_start)))
    _call("gather_replay_batch", positions.device, plan, query_start_loc, seq_lens, replay_start, positions,
          slot_mappings, W, out=out)


@gather_replay_batch_out.register_fake
def _(kept, trimmed, dropped_before, num_rows, num_rows_padded, query_start_loc, seq_lens, replay_start, positions,
      slot_mappings, W, out_rows, out_query_start_loc, out_positions, out_slot_mappings, out_kv_start):
    return None


@_define("gather_rows")
def gather_rows(x: Tensor, rows: Tensor) -> Tensor:
    return _fresh(_call("gather_rows", x.device, x, rows), x, rows)


@gather_rows.register_fake
def _(x, rows):
    return _empty(x, (rows.shape[0], *x.shape[1:]), x.dtype)


@_define("gather_rows_out", mutates_args=("out",))
def gather_rows_out(x: Tensor, rows: Tensor, out: Tensor) -> None:
    _call("gather_rows", x.device, x, rows, out=out)


@gather_rows_out.register_fake
def _(x, rows, out):
    return None


@_define("scatter_rows")
def scatter_rows(y: Tensor, rows: Tensor, num_rows: int) -> Tensor:
    return _fresh(_call("scatter_rows", y.device, y, rows, num_rows), y, rows)


@scatter_rows.register_fake
def _(y, rows, num_rows):
    return _empty(y, (num_rows, *y.shape[1:]), y.dtype)


@_define("scatter_rows_out", mutates_args=("out",))
def scatter_rows_out(y: Tensor, rows: Tensor, num_rows: int, out: Tensor) -> None:
    _call("scatter_rows", y.device, y, rows, num_rows, out=out)


@scatter_rows_out.register_fake
def _(y, rows, num_rows, out):
    return None


# ---------------------------------------------------------------------------------------
# prepare_replay_step: the four step ops in one call (present when the build has it)
# ---------------------------------------------------------------------------------------

#: Outputs of the tensor-level prepare_replay_step (the PreparedStep tensors; the padded
#: slot_mappings is the mutated input, not an output).
PREPARED_FIELDS = ("replay_start", "swa_indices", "swa_lens")

if "prepare_replay_step" in OPS:

    def _prepared(res, with_plan: bool, inputs) -> tuple:
        outs = tuple(getattr(res, f) for f in PREPARED_FIELDS)
        if with_plan:
            outs += tuple(getattr(res.replay_batch, f) for f in REPLAY_BATCH_FIELDS)
        return _fresh(outs, *inputs)

    def _prepared_fake(R_per_request, idx_mapping, positions, slot_mappings, W, index_width, num_rows_padded=None,
                       query_start_loc=None):
        T = positions.shape[0]
        width = W if index_width is None else index_width
        outs = (_empty(R_per_request, (idx_mapping.shape[0],), INDEX_DTYPE),
                _empty(positions, (T, width), INDEX_DTYPE), _empty(positions, (T,), INDEX_DTYPE))
        if num_rows_padded is not None:
            B, n = query_start_loc.shape[0] - 1, num_rows_padded
            outs += (_empty(positions, (n,), SLOT_DTYPE), _empty(positions, (B + 1,), INDEX_DTYPE),
                     _empty(positions, (n,), SLOT_DTYPE), _empty(positions, (slot_mappings.shape[0], n), SLOT_DTYPE),
                     _empty(positions, (B,), INDEX_DTYPE))
        return outs

    @_define("prepare_replay_step", mutates_args=("slot_mappings",))
    def prepare_replay_step(R_per_request: Tensor, idx_mapping: Tensor, is_prefilling: Tensor,
                            query_start_loc: Tensor, seq_lens: Tensor, positions: Tensor, slot_mappings: Tensor,
                            cacheable_groups: Tensor, block_table: Tensor, block_size: int, W: int, Wr: int, *,
                            index_width: Optional[int] = None,
                            any_replay: Optional[bool] = None) -> tuple[Tensor, Tensor, Tensor]:
        args = (R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
                cacheable_groups, block_table)
        res = _call("prepare_replay_step", positions.device, *args, block_size, W, Wr, index_width=index_width,
                    any_replay=any_replay)
        return _prepared(res, False, args)

    @prepare_replay_step.register_fake
    def _(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
          cacheable_groups, block_table, block_size, W, Wr, *, index_width=None, any_replay=None):
        return _prepared_fake(R_per_request, idx_mapping, positions, slot_mappings, W, index_width)

    @_define("prepare_replay_step_plan", mutates_args=("slot_mappings",))
    def prepare_replay_step_plan(R_per_request: Tensor, idx_mapping: Tensor, is_prefilling: Tensor,
                                 query_start_loc: Tensor, seq_lens: Tensor, positions: Tensor, slot_mappings: Tensor,
                                 cacheable_groups: Tensor, block_table: Tensor, block_size: int, W: int, Wr: int,
                                 kept: Tensor, trimmed: Tensor, dropped_before: Tensor, num_rows: int,
                                 num_rows_padded: int, *, index_width: Optional[int] = None,
                                 any_replay: Optional[bool] = None
                                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        args = (R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
                cacheable_groups, block_table)
        plan = _plan(kept, trimmed, dropped_before, num_rows, num_rows_padded, W)
        res = _call("prepare_replay_step", positions.device, *args, block_size, W, Wr, index_width=index_width,
                    plan=plan, any_replay=any_replay)
        return _prepared(res, True, (*args, kept, trimmed, dropped_before))

    @prepare_replay_step_plan.register_fake
    def _(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
          cacheable_groups, block_table, block_size, W, Wr, kept, trimmed, dropped_before, num_rows, num_rows_padded,
          *, index_width=None, any_replay=None):
        return _prepared_fake(R_per_request, idx_mapping, positions, slot_mappings, W, index_width, num_rows_padded,
                              query_start_loc)

    @_define("prepare_replay_step_out",
             mutates_args=("slot_mappings", *(f"out_{f}" for f in PREPARED_FIELDS)))
    def prepare_replay_step_out(R_per_request: Tensor, idx_mapping: Tensor, is_prefilling: Tensor,
                                query_start_loc: Tensor, seq_lens: Tensor, positions: Tensor, slot_mappings: Tensor,
                                cacheable_groups: Tensor, block_table: Tensor, block_size: int, W: int, Wr: int,
                                out_replay_start: Tensor, out_swa_indices: Tensor, out_swa_lens: Tensor, *,
                                index_width: Optional[int] = None, any_replay: Optional[bool] = None) -> None:
        out = {"replay_start": out_replay_start, "swa_indices": out_swa_indices, "swa_lens": out_swa_lens}
        _call("prepare_replay_step", positions.device, R_per_request, idx_mapping, is_prefilling, query_start_loc,
              seq_lens, positions, slot_mappings, cacheable_groups, block_table, block_size, W, Wr,
              index_width=index_width, any_replay=any_replay, out=out)

    @prepare_replay_step_out.register_fake
    def _(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
          cacheable_groups, block_table, block_size, W, Wr, out_replay_start, out_swa_indices, out_swa_lens, *,
          index_width=None, any_replay=None):
        return None

    @_define("prepare_replay_step_plan_out",
             mutates_args=("slot_mappings", *(f"out_{f}" for f in PREPARED_FIELDS),
                           *(f"out_batch_{f}" for f in REPLAY_BATCH_FIELDS)))
    def prepare_replay_step_plan_out(R_per_request: Tensor, idx_mapping: Tensor, is_prefilling: Tensor,
                                     query_start_loc: Tensor, seq_lens: Tensor, positions: Tensor,
                                     slot_mappings: Tensor, cacheable_groups: Tensor, block_table: Tensor,
                                     block_size: int, W: int, Wr: int, kept: Tensor, trimmed: Tensor,
                                     dropped_before: Tensor, num_rows: int, num_rows_padded: int,
                                     out_replay_start: Tensor, out_swa_indices: Tensor, out_swa_lens: Tensor,
                                     out_batch_rows: Tensor, out_batch_query_start_loc: Tensor,
                                     out_batch_positions: Tensor, out_batch_slot_mappings: Tensor,
                                     out_batch_kv_start: Tensor, *, index_width: Optional[int] = None,
                                     any_replay: Optional[bool] = None) -> None:
        plan = _plan(kept, trimmed, dropped_before, num_rows, num_rows_padded, W)
        batch = dict(zip(REPLAY_BATCH_FIELDS, (out_batch_rows, out_batch_query_start_loc, out_batch_positions,
                                               out_batch_slot_mappings, out_batch_kv_start)))
        out = {"replay_start": out_replay_start, "swa_indices": out_swa_indices, "swa_lens": out_swa_lens,
               "replay_batch": batch}
        _call("prepare_replay_step", positions.device, R_per_request, idx_mapping, is_prefilling, query_start_loc,
              seq_lens, positions, slot_mappings, cacheable_groups, block_table, block_size, W, Wr,
              index_width=index_width, plan=plan, any_replay=any_replay, out=out)

    @prepare_replay_step_plan_out.register_fake
    def _(R_per_request, idx_mapping, is_prefilling, query_start_loc, seq_lens, positions, slot_mappings,
          cacheable_groups, block_table, block_size, W, Wr, kept, trimmed, dropped_before, num_rows, num_rows_padded,
          out_replay_start, out_swa_indices, out_swa_lens, out_batch_rows, out_batch_query_start_loc,
          out_batch_positions, out_batch_slot_mappings, out_batch_kv_start, *, index_width=None, any_replay=None):
        return None


def _call_prepare(*args, index_width=None, plan=None, any_replay=None, out=None):
    """``call("prepare_replay_step", ...)``: the PreparedStep of the Python op."""
    from .common.ops.prepare_replay_step import PreparedStep

    ns = torch.ops.swa_backends
    kw = {"index_width": index_width, "any_replay": any_replay}
    slot_mappings = args[6]
    plan_args = plan_arguments(plan)[:5] if plan is not None else ()
    if out is None:
        res = getattr(ns, "prepare_replay_step_plan" if plan is not None else "prepare_replay_step")(
            *args, *plan_args, **kw)
        batch = replay_batch(res[3:], plan.num_rows) if plan is not None else None
        return PreparedStep(res[0], slot_mappings, res[1], res[2], batch)
    if not isinstance(out, dict):
        raise ValueError(f"prepare_replay_step: out={out!r}: expected a dict of buffers from allocate_out()")
    bufs = [out.get(f) for f in PREPARED_FIELDS]
    if plan is None:
        ns.prepare_replay_step_out(*args, *bufs, **kw)
        return PreparedStep(out["replay_start"], slot_mappings, out["swa_indices"], out["swa_lens"], None)
    rb = out.get("replay_batch")
    if not isinstance(rb, dict):
        raise ValueError(f"prepare_replay_step: out={sorted(out)}: expected a buffer dict for 'replay_batch'")
    ns.prepare_replay_step_plan_out(*args, *plan_args, *bufs, *(rb.get(f) for f in REPLAY_BATCH_FIELDS), **kw)
    batch = ReplayBatch(num_rows=plan.num_rows, num_rows_padded=plan.num_rows_padded,
                        **{f: rb[f] for f in REPLAY_BATCH_FIELDS})
    return PreparedStep(out["replay_start"], slot_mappings, out["swa_indices"], out["swa_lens"], batch)


def qualified_names() -> list[str]:
    """``swa_backends::<op>`` for every op defined here."""
    return [f"{NAMESPACE}::{n}" for n in OP_NAMES]


# ---------------------------------------------------------------------------------------
# calling the ops with the Python API's arguments
# ---------------------------------------------------------------------------------------

_OUT_ARGUMENTS = {
    "swa_indices_and_lens": ("out_indices", "out_lens"),
    "combined_indices": ("out_indices", "out_lens"),
    "mixed_indices": ("out_indices", "out_lens"),
    "plain_indices": ("out_indices", "out_lens"),
    "indices_to_csr": ("out_indptr", "out_values"),
}


def call(op: str, *args, **kwargs):
    """Run the pack's op ``op`` through ``torch.ops.swa_backends`` with the arguments of
    its Python form (``backend.<op>``, ``OPS[op].reference``): picks the functional,
    ``_out`` or in-place custom op, unpacks a ReplayPlan, and returns what the Python op
    returns (the ``out=`` buffers, the mutated ``slot_mappings``, a ReplayBatch)."""
    if op == "prepare_replay_step":
        return _call_prepare(*args, **kwargs)
    ns = torch.ops.swa_backends
    kwargs = dict(kwargs)
    out = kwargs.pop("out", None)
    plan = None
    if op == "gather_replay_batch":
        plan, *rest = args
        args = (*plan_arguments(plan), *rest)
    if op == "plain_indices" and len(args) > 2:  # the _out form's buffers come before these
        kwargs.update(zip(("topk_slots", "topk_lens"), args[2:]))
        args = args[:2]
    if out is None:
        result = getattr(ns, op)(*args, **kwargs)
        if op == "pad_replayed_slots":
            return args[0]
        return replay_batch(result, plan.num_rows) if plan is not None else result
    if op == "gather_replay_batch":
        if not isinstance(out, dict):
            raise ValueError(f"gather_replay_batch: out={out!r}: expected a dict of buffers from allocate_out()")
        kwargs.update({f"out_{f}": out.get(f) for f in REPLAY_BATCH_FIELDS})
    elif op in _OUT_ARGUMENTS:
        if not isinstance(out, tuple) or len(out) != 2:
            raise ValueError(f"{op}: out={out!r}: expected a tuple of two tensors")
        kwargs.update(zip(_OUT_ARGUMENTS[op], out))
    else:
        kwargs["out"] = out
    getattr(ns, f"{op}_out")(*args, **kwargs)
    if plan is not None:
        return ReplayBatch(num_rows=plan.num_rows, num_rows_padded=plan.num_rows_padded,
                           **{f: out[f] for f in REPLAY_BATCH_FIELDS})
    return out
