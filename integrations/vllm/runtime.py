"""vLLM's replay-metadata calls (0.33 and 0.34 alike), mapped onto the pack's ops (no vLLM import).

Each function here takes exactly what vLLM hands its own kernel at that call site and
writes the same tensors through the pack's :class:`~swa_backends.Backend`, into the
buffers vLLM passed (its persistent, graph-captured buffers). The patches, the model
state and the tests (including the differential against vLLM's kernels, which can run on a
machine without vLLM) all go through these functions.

Hot-path policy: the backend :func:`backend_for` selects never validates
(``select(checked=False)``: vLLM's inputs are checked by the differential tests, not per
call) unless ``SWA_BACKENDS_VALIDATE`` is set to a true value in the environment (a debug
switch: the value checks read the device);
``SWA_BACKENDS_VLLM_PREFER`` forces a variant for every op (``triton`` makes the CPU run the
Triton kernels under the interpreter; tests use it). :data:`CALLS` counts the routed calls
per op (tests read it to prove the path went through the pack).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import os
import threading
from dataclasses import dataclass

import numpy as np
import torch

from ...common.ops.gather_replay_batch import leading_out
from ...common.types import ReplayPlan
from ...common.validation import env_setting
from ...dispatch import Backend
from ...dispatch import backend_for as dispatch_backend_for

#: routed calls per op name in this process
CALLS: collections.Counter = collections.Counter()

#: validate the pack's inputs on the hot path (debug): only with SWA_BACKENDS_VALIDATE set to a true
#: value (the pack's own parser; unset means off here, where the pack's default elsewhere is on)
VALIDATE = env_setting() is True
PREFER_ENV = "SWA_BACKENDS_VLLM_PREFER"


#: batches of at most this many requests take the predictions' Python-list path (:func:`query_lens`):
#: on their tiny arrays numpy's cost per call outweighs the work (bench/README.md, "Host costs on the
#: CPU")
SMALL_BATCH = 8


def backend_for(device) -> Backend:
    """The pack's backend for a torch device: unchecked unless :data:`VALIDATE`, the variant
    ``SWA_BACKENDS_VLLM_PREFER`` names forced (``dispatch.backend_for``: one per device and
    settings, and ``"cuda"`` shares ``"cuda:N"``'s)."""
    return dispatch_backend_for(device, prefer=os.environ.get(PREFER_ENV) or None, checked=VALIDATE)


def _head(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t[:n]``, or ``t`` itself when it has exactly ``n`` rows (vLLM mostly hands
    exact-size views; a slice is a new tensor object, which costs host time: bench/README.md,
    "Host costs on the CPU")."""
    return t if t.shape[0] == n else t[:n]


# ---------------------------------------------------------------------------------------
# encoder side: slot padding, clamped window indices, prefill gather lengths
# ---------------------------------------------------------------------------------------


def pad_replayed_slots(be: Backend, slot_mappings, cacheable_groups, query_start_loc, positions, replay_start,
                       window: int, num_reqs: int, *, fallback=None) -> None:
    """vLLM's ``_pad_replayed_slots_kernel[(num_reqs,)](slot_mappings, stride, cacheable_groups,
    query_start_loc, positions, replay_start, window, PAD_SLOT_ID, ...)`` (in place). Inside an
    open step (:func:`begin_step`) the call is held for the step's one launch
    (:func:`prepare_step`), or launched by :func:`flush_step` if that never comes;
    ``fallback``: a no-argument call of vLLM's own kernel for this call, which
    :func:`flush_step` runs if the pack's launch of a held call raises (vLLM was told the
    padding was done)."""
    step = _local.step
    if step is not None:
        if step.pad is None and not step.answered:
            CALLS["pad_replayed_slots.held"] += 1
            step.pad = (be, slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, window, num_reqs)
            step.pad_fallback = fallback
            return
        flush_step()  # a pad already held launches first: the calls keep their order
    CALLS["pad_replayed_slots"] += 1
    be.pad_replayed_slots(slot_mappings, cacheable_groups, _head(query_start_loc, num_reqs + 1), positions,
                          _head(replay_start, num_reqs), window)


def swa_rows(swa_indices: torch.Tensor, num_tokens: int, index_width: int) -> torch.Tensor | None:
    """``swa_indices`` (vLLM's ``[N, 1, width]`` buffer) as the pack's contiguous
    ``[num_tokens, index_width]`` rows, or None when its layout is not that (then the
    caller keeps vLLM's kernel)."""
    if swa_indices.dim() == 3 and swa_indices.shape[1] == 1:
        rows = _head(swa_indices, num_tokens)[:, 0]
    elif swa_indices.dim() == 2:
        rows = _head(swa_indices, num_tokens)
    else:
        return None
    if rows.shape[1] != index_width or not rows.is_contiguous():
        return None
    return rows


def swa_indices_and_lens(be: Backend, swa_indices, swa_lens, window_size: int, index_width: int, query_start_loc,
                         seq_lens, is_valid_token, block_table, block_size: int, replay_start, *, num_tokens: int,
                         token_offset: int) -> bool:
    """vLLM's ``_COMPUTE_SWA_INDICES_AND_LENS_KERNEL(swa_indices, swa_lens, window_size,
    index_width, left, right, query_start_loc, seq_lens, token_to_req_indices, is_valid_token,
    block_table, block_size, replay_start, num_tokens=, token_offset=)`` without image
    widening: one launch of the pack's op with the same ``token_offset`` (output row ``i`` is
    batch token ``i + token_offset``), ``valid=is_valid_token[token_offset:][:num_tokens]``
    and ``out=(rows, swa_lens[:num_tokens])``. The requests are the first
    ``min(len(query_start_loc) - 1, len(replay_start))``: FULL graphs pad the batch with
    requests that own no token and hand the real requests' ``replay_start`` only. Returns
    False (nothing written) when the output buffer's layout is not the pack's; the caller
    then runs vLLM's kernel."""
    if num_tokens == 0:
        return True
    rows = swa_rows(swa_indices, num_tokens, index_width)
    if rows is None:
        return False
    CALLS["swa_indices_and_lens"] += 1
    B = min(query_start_loc.shape[0] - 1, replay_start.shape[0])
    valid = is_valid_token[token_offset: token_offset + num_tokens] if token_offset else _head(is_valid_token, num_tokens)
    be.swa_indices_and_lens(_head(query_start_loc, B + 1), _head(seq_lens, B), block_table, block_size, window_size,
                            _head(replay_start, B), index_width=index_width, valid=valid, num_tokens=num_tokens,
                            token_offset=token_offset, out=(rows, _head(swa_lens, num_tokens)))
    return True


def prefill_gather_lens(be: Backend, prefill_gather_lens, seq_lens, query_start_loc, replay_start, num_prefills: int,
                        num_decodes: int, window_size: int) -> bool:
    """vLLM's ``_COMPUTE_PREFILL_METADATA_KERNEL(prefill_gather_lens, seq_lens, query_start_loc,
    replay_start, num_prefills, num_decodes, window_size)``: the prefills are requests
    ``num_decodes .. num_decodes + num_prefills - 1``; the pack's op reads only their query
    lengths, so their ``query_start_loc`` slice goes in as it is. Returns False (nothing
    written) when vLLM hands fewer per-request entries than that range (its kernel would read
    past them); the caller then runs vLLM's kernel."""
    if num_prefills == 0:
        return True
    d, p = num_decodes, num_prefills
    if min(replay_start.shape[0], seq_lens.shape[0], query_start_loc.shape[0] - 1) < d + p or prefill_gather_lens.shape[0] < p:
        return False
    CALLS["prefill_gather_lens"] += 1
    be.prefill_gather_lens(query_start_loc[d: d + p + 1], seq_lens[d: d + p], replay_start[d: d + p], window_size,
                           out=_head(prefill_gather_lens, p))
    return True


def rocm_sparse_prefill(be: Backend, q, kv, indices, topk_length, scale: float, attn_sink, output) -> bool:
    """vLLM's ROCm ``rocm_sparse_attn_prefill(q, kv, indices, topk_length, scale, head_dim,
    nope_head_dim, rope_head_dim, attn_sink, output)`` through the pack's ``sparse_mla``: ``q``
    ``[T, H, D]``, ``kv`` the bf16 workspace ``[rows, 1, D]``, ``indices`` ``[T, K]`` workspace
    rows (-1 PAD; vLLM's ``combine_topk_swa_indices``: the compressed top-k, then the window
    clamped at the replay start by the gather lengths), ``attn_sink`` ``[>= H]`` fp32 (its first
    H entries are this rank's heads, as vLLM reads them), ``output`` ``[T, H, d_v]`` written in
    place (d_v 448 or 512: the first d_v columns of each row). No LSE is computed. Returns False
    (nothing written) for a call in another form (ragged indices, no lengths, kv not
    ``[rows, 1, D]``, an output narrower than its dims); the caller then runs vLLM's kernel."""
    T, H, D = q.shape
    if (indices is None or topk_length is None or kv.dim() != 3 or kv.shape[1] != 1 or kv.shape[2] != D
            or output.dim() != 3 or tuple(output.shape[:2]) != (T, H) or output.shape[2] > D
            or (attn_sink is not None and attn_sink.shape[0] < H)):
        return False
    CALLS["rocm_sparse_prefill"] += 1
    if T == 0:
        return True
    sink = None if attn_sink is None else _head(attn_sink, H)
    out, _ = be.sparse_mla(q, kv[:, 0], indices.reshape(T, -1), topk_length, float(scale), int(output.shape[2]),
                           sink=sink, return_lse=False)
    output.copy_(out)
    return True


# ---------------------------------------------------------------------------------------
# decoder side: the sub-batch gather, hidden-row gather/scatter
# ---------------------------------------------------------------------------------------


def dropped_before(kept_lens: np.ndarray, query_start_loc_np: np.ndarray) -> np.ndarray:
    """int32 ``[B+1]``: rows dropped before each boundary (``ReplayPlan.dropped_before_of``;
    what vLLM's ``_kept_input_batch`` uploads)."""
    return ReplayPlan.dropped_before_of(kept_lens, query_start_loc_np)


def replay_plan(kept_lens: np.ndarray, query_start_loc_np: np.ndarray, num_padded: int, window: int, *,
                dropped: np.ndarray | None = None, device_dropped: torch.Tensor | None = None,
                is_prefilling: np.ndarray | None = None) -> ReplayPlan:
    """vLLM's planning result (``kept_lens``, the host ``query_start_loc``, the padded size)
    as the pack's :class:`ReplayPlan` (vLLM's own planning -- graph policy, DP agreement,
    idle batches, trim threshold -- decided ``kept_lens``). ``device_dropped``: the plan's
    ``dropped_before`` already on the device (vLLM's UVA upload), so the plan makes no
    host-to-device copy of its own. ``is_prefilling``: vLLM's host flags, so a validating
    backend holds prefills to their host length while decodes follow the device (adaptive
    verification resizes them there)."""
    return ReplayPlan.from_kept(kept_lens, query_start_loc_np, num_padded, window, dropped_before=dropped,
                                device_dropped_before=device_dropped, is_prefilling=is_prefilling)


def gather_replay_batch(be: Backend, plan: ReplayPlan, query_start_loc, seq_lens, replay_start, positions, slot_mappings,
                        window: int, out: dict) -> None:
    """vLLM's ``_gather_replay_batch_kernel[(num_reqs,)](...)`` plus its ``PAD_SLOT_ID``
    fill of the padded slot columns: one launch of the pack's op into ``out`` (vLLM's
    ``_kept_rows``, ``_kept_query_start_loc``, ``_kept_positions``, the kept slot mappings
    and ``_kept_kv_start``). Padded rows (``num_rows .. num_rows_padded``) get row 0, its
    position and PAD slots (vLLM leaves rows and positions there as they were). ``out`` may hold
    vLLM's whole persistent buffers (``[G', max_num_tokens]`` slot mappings included): the
    launch takes the plan's extents of them."""
    step = _local.step
    if step is not None:  # answered for this very plan, on these tensors
        hit = step.answered.get(("gather_replay_batch", id(plan)))
        if (hit is not None and hit[0] is plan and _same(hit[1], query_start_loc) and _same(hit[2], slot_mappings)
                and _same(hit[3], out["rows"])):
            CALLS["gather_replay_batch.answered"] += 1
            step.gathered = plan
            return
    CALLS["gather_replay_batch"] += 1
    B = plan.num_reqs
    be.gather_replay_batch(plan, _head(query_start_loc, B + 1), _head(seq_lens, B), _head(replay_start, B), positions,
                           slot_mappings, window, out=leading_out(out, plan, slot_mappings.shape[0]))


def gather_rows(be: Backend, x: torch.Tensor, rows: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x.index_select(0, rows)`` (or ``torch.index_select(x, 0, rows, out=out)``)."""
    CALLS["gather_rows"] += 1
    return be.gather_rows(x, rows, out=out)


def scatter_rows(be: Backend, y: torch.Tensor, rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``y.new_zeros((num_rows, ...)).index_copy_(0, rows, y)``."""
    CALLS["scatter_rows"] += 1
    return be.scatter_rows(y, rows, num_rows)


# ---------------------------------------------------------------------------------------
# one launch per step: what vLLM's call sites will ask for, written ahead by one launch
# ---------------------------------------------------------------------------------------
#
# vLLM (0.33, 0.34) launches a step's replay metadata from five call sites in three stages (the model
# state pads slots, each sparse-SWA builder writes decode rows, prefill rows and gather
# lengths, the model state gathers the decoder sub-batch). The model state (model.py) opens a
# step, vLLM's pad call is held, and before the builders run :func:`prepare_step` launches
# ``prepare_replay_step`` once for all of it, into the buffers those call sites will hand
# over. It records each call it answered by the arguments that call will pass (buffer
# addresses, sizes, offsets, scalars); a routed call whose arguments match returns without
# launching, any other launches as before. So a wrong prediction costs a launch, never a
# wrong value. :func:`end_step` closes the step (launching a pad still held).


@dataclass(slots=True)
class WindowTarget:
    """One sparse-SWA builder of the step: its KV group's row of ``slot_mappings``
    (``group``; validity: a negative slot), block table and block size, window, vLLM's
    decode/prefill split (``num_decodes`` requests, ``num_decode_tokens`` tokens) and its
    persistent decode and prefill buffers as ``[N, width]`` rows (vLLM's ``[N, 1, width]``
    buffers viewed once, ``buffer[:, 0]``: same address; their width is the index width) and
    ``[N]`` lengths. The model state keeps one per builder and sets the block table and the
    split each step."""

    group: int
    block_table: torch.Tensor
    block_size: int
    window: int
    num_decodes: int
    num_decode_tokens: int
    decode_rows: torch.Tensor
    decode_lens: torch.Tensor
    prefill_rows: torch.Tensor
    prefill_lens: torch.Tensor


@dataclass(slots=True)
class KeptTargets:
    """The decoder sub-batch's window builds the step's launch makes too (vLLM's
    ``_prepare_replay_batch``, right after its gather): ``builds``, one or two ``(decode rows,
    decode lens, prefill rows, prefill lens)`` of the replay builders' persistent buffers
    (``[N, width]`` rows as in :class:`WindowTarget`) -- the replay layers' build (clamped at the
    sub-batch's ``kv_start``) and, when it is the same KV group's, the first replay layer's
    (clamped at the batch's replay start); ``num_decodes`` / ``num_decode_tokens``: vLLM's
    split of the sub-batch (:func:`predicted_split` on its kept lengths); ``gather_lens``:
    one step buffer per build (``[max_num_reqs + 1]`` int32) that an answered call's tensor
    is set to."""

    builds: tuple
    num_decodes: int
    num_decode_tokens: int
    gather_lens: tuple


def query_lens(query_start_loc_np: np.ndarray, num_reqs: int) -> list[int] | np.ndarray:
    """The batch's host query lengths for the predictions: a list of ints for at most
    :data:`SMALL_BATCH` requests (one ``tolist``; the predictions then make no numpy call but
    their result's), else an int array."""
    if num_reqs <= SMALL_BATCH:
        qsl = query_start_loc_np[: num_reqs + 1].tolist()
        return [qsl[i + 1] - qsl[i] for i in range(num_reqs)]
    # not np.diff: it makes this same subtraction behind a Python wrapper
    return query_start_loc_np[1: num_reqs + 1] - query_start_loc_np[:num_reqs]


def kept_query_start_loc(kept_lens: np.ndarray, kept_list: list[int] | None = None) -> np.ndarray:
    """int32 ``[B+1]``: ``[0, cumsum(kept_lens)]``, the sub-batch's host ``query_start_loc`` as
    vLLM's ``_kept_input_batch`` makes it (for at most :data:`SMALL_BATCH` requests through a
    list, ``kept_list`` when the caller has it: numpy's cumsum into a slice costs more at these
    sizes)."""
    B = kept_lens.shape[0]
    if B <= SMALL_BATCH:
        return np.array([0, *itertools.accumulate(kept_lens.tolist() if kept_list is None else kept_list)],
                        dtype=np.int32)
    out = np.zeros(B + 1, dtype=np.int32)
    kept_lens.cumsum(out=out[1:])
    return out


def same_lens(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.array_equal(a, b)`` for two host int arrays, by their bytes when the dtypes agree
    (a tenth of ``array_equal``'s host time)."""
    if a.dtype != b.dtype:
        return bool(np.array_equal(a, b))
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def replaced(obj, **changes):
    """``dataclasses.replace(obj, **changes)`` for vLLM's ``InputBatch`` (a plain dataclass of
    37 fields in vLLM 0.33, whose ``replace`` calls ``__init__`` with every one of them): a new
    instance with ``obj``'s fields, then ``changes``, set straight into its ``__dict__``. The same object
    ``replace`` makes, for a class that is a dataclass with no ``__post_init__``, ``__slots__``
    or ``init=False`` field (checked once per class); any other class, or a change that is not
    a field, goes through ``dataclasses.replace``."""
    cls = type(obj)
    names = _PLAIN_FIELDS.get(cls)
    if names is None:
        names = _PLAIN_FIELDS[cls] = _plain_fields(cls)
    if not names or not changes.keys() <= names:
        return dataclasses.replace(obj, **changes)
    new = _new(cls)
    fields = new.__dict__
    fields.update(obj.__dict__)
    if len(fields) != len(names):  # attributes set on ``obj`` after construction: replace leaves them out
        for key in [k for k in fields if k not in names]:
            del fields[key]
    fields.update(changes)
    return new


def _plain_fields(cls: type) -> frozenset:
    """The field names of ``cls`` when :func:`replaced` may copy it through ``__dict__``;
    empty otherwise."""
    if (not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__") or hasattr(cls, "__slots__")
            or getattr(cls, "__setattr__", object.__setattr__) is not object.__setattr__):
        return frozenset()
    fields = dataclasses.fields(cls)
    if not all(f.init for f in fields):
        return frozenset()
    return frozenset(f.name for f in fields)


_PLAIN_FIELDS: dict = {}
_new = object.__new__


def predicted_split(query_lens: list[int] | np.ndarray, query_start_loc_np: np.ndarray, num_tokens: int,
                    max_query_len: int, decode_threshold: int) -> tuple[int, int]:
    """``(num_decodes, num_decode_tokens)`` as vLLM 0.33's ``split_decodes_and_prefills(...,
    decode_threshold)`` returns them for a batch (no uniform decodes, short extends counted as
    decodes: the sparse-SWA builder's call), from the batch's host query lengths
    (:func:`query_lens`) and ``query_start_loc``: the leading requests of at most
    ``decode_threshold`` queries. The drift tests pin vLLM's source."""
    if max_query_len > decode_threshold:
        if isinstance(query_lens, list):
            for d, n in enumerate(query_lens):
                if n > decode_threshold:
                    return d, int(query_start_loc_np[d])
        else:
            prefill = query_lens > decode_threshold
            d = int(prefill.argmax())  # the first prefill; 0 also when there is none (checked next)
            if prefill[d]:
                return d, int(query_start_loc_np[d])
    return len(query_lens), num_tokens


def predicted_kept(query_lens: list[int] | np.ndarray, keeps_rows: np.ndarray | None, is_prefilling: np.ndarray,
                   window: int, *, forced: bool = False) -> np.ndarray | None:
    """vLLM 0.33's ``kept_lens`` (int32) for a step without PCP (``_prepare_replay_batch``), from
    the batch's host query lengths (:func:`query_lens`): every row of a request that keeps its
    rows (prompt logprobs; ``keeps_rows`` None: no request does), the last ``window`` of the
    others. None when vLLM builds no sub-batch: an eager step where no prefill is trimmed;
    ``forced`` (a PIECEWISE graph that breaks out to the sub-batch: vLLM builds one trimmed or
    not) needs only a prefilling request (without one vLLM may take the batch for an idle one
    and keep a single row: not predicted)."""
    if isinstance(query_lens, list):
        pre = is_prefilling.tolist()
        keeps = keeps_rows.tolist() if keeps_rows is not None else None
        if forced:
            if True not in pre:
                return None
        else:
            for i, n in enumerate(query_lens):  # a loop: a generator in any() costs more at these sizes
                if n > window and pre[i] and not (keeps and keeps[i]):
                    break
            else:
                return None
        if keeps is None:
            return np.array([min(n, window) for n in query_lens], dtype=np.int32)
        return np.array([n if keeps[i] else min(n, window) for i, n in enumerate(query_lens)], dtype=np.int32)
    if forced:
        if not np.count_nonzero(is_prefilling):
            return None
    else:
        trims = (query_lens > window) & is_prefilling
        if keeps_rows is not None:
            trims &= ~keeps_rows
        if not np.count_nonzero(trims):
            return None
    kept = np.minimum(query_lens, window).astype(np.int32, copy=False)
    return kept if keeps_rows is None else np.where(keeps_rows, query_lens, kept).astype(np.int32, copy=False)


class _Step:
    __slots__ = ("pad", "pad_fallback", "answered", "gathered")

    def __init__(self) -> None:
        self.pad: tuple | None = None  # vLLM's pad call, held for the step's launch
        self.pad_fallback = None  # vLLM's kernel for the held call, if the pack's launch of it raises
        self.answered: dict = {}  # call key -> what answers it (True, the gather lengths' buffer, the plan)
        # the plan whose sub-batch gather was answered: the sub-batch builds' answers hold only for it (vLLM's own
        # gather, on another plan, rewrites the sub-batch buffers their answers are matched by)
        self.gathered = None


class _Local(threading.local):
    step: _Step | None = None  # the open step of this thread (vLLM prepares a step on one thread)


_local = _Local()


def begin_step() -> None:
    """Open a step on this thread: the pad call is held, routed calls look for their answers."""
    _local.step = _Step()


def flush_step() -> None:
    """Launch a held pad call (no :func:`prepare_step` took it). If the pack's launch raises,
    the call's ``fallback`` (vLLM's kernel) writes the padding, then the error propagates for
    the caller to turn the route off."""
    step = _local.step
    if step is not None and step.pad is not None:
        held, step.pad = step.pad, None
        fallback, step.pad_fallback = step.pad_fallback, None
        step.answered = {}
        CALLS["pad_replayed_slots"] += 1
        be, slot_mappings, groups, qsl, positions, replay_start, window, num_reqs = held
        try:
            be.pad_replayed_slots(slot_mappings, groups, _head(qsl, num_reqs + 1), positions,
                                  _head(replay_start, num_reqs), window)
        except Exception:
            if fallback is not None:
                fallback()
            raise


def end_step() -> None:
    """Close the step: a held pad launches, nothing is answered any more."""
    try:
        flush_step()
    finally:
        _local.step = None


# Answers. Each is kept under the call's sizes and matched against the call's tensors: the
# output buffer by address (vLLM hands a fresh slice of its persistent buffer), the inputs
# (query_start_loc, replay_start, block table, slot mappings) as the very objects prepare_step
# got -- vLLM passes the same objects down a step -- or, failing that, by address. A window-rows
# call's output buffer is one builder's (its window, width and block size with it). Looked up
# where vLLM's call arrives, before anything else of it: the patches' shims (then
# swa_indices_and_lens / prefill_gather_lens above, which always launch) and
# gather_replay_batch (the model state's call).


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``b`` is ``a`` or starts at ``a``'s address (a torch call only when not the same object)."""
    return a is b or a.data_ptr() == b.data_ptr()


def answered_swa(swa_indices, query_start_loc, replay_start, block_table, num_tokens: int, token_offset: int) -> bool:
    """True when the open step's launch already wrote this window-rows call's outputs (kept
    by the output buffer's address: the main batch's builder and the sub-batch's replay
    builders each have their own)."""
    step = _local.step
    if step is None or not step.answered:
        return False
    hit = step.answered.get(("swa_indices_and_lens", swa_indices.data_ptr(), num_tokens, token_offset))
    if hit is None:
        return False
    q, r, bt, plan = hit  # _same inlined: three of these per answered call, six calls a step
    if (q is not query_start_loc and q.data_ptr() != query_start_loc.data_ptr()
            or r is not replay_start and r.data_ptr() != replay_start.data_ptr()
            or bt is not block_table and bt.data_ptr() != block_table.data_ptr()
            or plan is not None and step.gathered is not plan):
        return False
    CALLS["swa_indices_and_lens.answered"] += 1
    return True


def answered_gather_lens(prefill_gather_lens, query_start_loc, replay_start, num_prefills: int, num_decodes: int,
                         window: int) -> bool:
    """True when the open step's launch already wrote these gather lengths: vLLM allocates its
    tensor per build (``torch.empty``), so it becomes a view of the step's (``Tensor.set_``;
    no copy launch)."""
    step = _local.step
    if step is None:
        return False
    hits = step.answered.get(("gather_lens", num_prefills, num_decodes, window))  # the batch's, the sub-batch's
    if not hits:
        return False
    q_ptr = r_ptr = None  # read once, when an answer's tensors are not the call's own objects
    for q, r, storage, offset, dtype, plan in hits:
        if q is not query_start_loc:
            q_ptr = query_start_loc.data_ptr() if q_ptr is None else q_ptr
            if q.data_ptr() != q_ptr:
                continue
        if r is not replay_start:
            r_ptr = replay_start.data_ptr() if r_ptr is None else r_ptr
            if r.data_ptr() != r_ptr:
                continue
        if plan is not None and step.gathered is not plan:
            continue
        if prefill_gather_lens.dtype == dtype and prefill_gather_lens.shape == (num_prefills,):
            prefill_gather_lens.set_(storage, offset, (num_prefills,), (1,))  # the step's buffer: a view, no slice
            CALLS["gather_lens.answered"] += 1
            return True
    return False


def _storage_view(scratch: dict, key: str) -> tuple:
    """``(buffer, its storage, storage offset, dtype)`` of the step buffer ``scratch[key]``, read
    once: what an answered gather-lengths call's tensor is set to."""
    buf = scratch[key]
    view = scratch["views"].get(key)
    if view is None or view[0] is not buf:
        view = scratch["views"][key] = (buf, buf.untyped_storage(), buf.storage_offset(), buf.dtype)
    return view


def prepare_step(be: Backend, target: WindowTarget, query_start_loc, seq_lens, positions, slot_mappings, replay_start,
                 num_reqs: int, num_tokens: int, scratch: dict, *, gather: tuple | None = None,
                 kept: KeptTargets | None = None, second: WindowTarget | None = None,
                 second_kept: KeptTargets | None = None) -> bool:
    """One ``prepare_replay_step`` launch for the open step: the held pad (if vLLM made one),
    ``target``'s decode rows (tokens ``[0, num_decode_tokens)``) and prefill rows into its
    buffers, the prefills' gather lengths into ``scratch["gather_lens"]`` and, with ``gather =
    (plan, window, out)``, the decoder sub-batch into ``out`` (answered for a later call with
    that same plan object) and, with ``kept`` as well, the sub-batch's window builds into the
    replay builders' buffers (:class:`KeptTargets`; answered for vLLM's sub-batch builds, which
    pass the sub-batch's ``query_start_loc`` and ``kv_start`` -- ``out``'s -- or the batch's
    ``replay_start``). ``second``: a second window group's builder, whose rows (and, with
    ``second_kept``, its replay layers' sub-batch build) a second launch writes
    (:func:`_second_launch`). ``scratch``: the model state's persistent ``arange`` (int32) and
    ``ones`` (bool) of ``max_num_reqs``, ``replay_start``, ``stale_replay`` and ``gather_lens`` (int32), an
    empty int32 ``no_groups`` and a dict ``views`` (kept: the first two's slices per batch
    size; under ``"gather_lens"`` that buffer's storage, which an answered call's tensor is set
    to). The outputs go to whole buffers (their leading rows written, SPEC §3.6): a slice is a new
    tensor object, which costs host time.
    Records the calls it answered; returns False (nothing launched, the pad still held) when
    the held pad is on other tensors."""
    step = _local.step
    if step is None:
        return False
    B, T, t = num_reqs, num_tokens, target
    qsl, seq, rs = _head(query_start_loc, B + 1), _head(seq_lens, B), _head(replay_start, B)
    pad, Wr, groups = step.pad, 0, scratch["no_groups"]  # no pad held: a zero-width pad of no group
    if pad is not None:
        _, p_slots, groups, p_qsl, p_pos, p_rs, Wr, p_reqs = pad
        if (p_slots is not slot_mappings or p_reqs != B  # the same tensors mostly (then no address read)
                or p_qsl is not qsl and p_qsl.data_ptr() != qsl.data_ptr()
                or p_pos is not positions and p_pos.data_ptr() != positions.data_ptr()
                or p_rs is not rs and p_rs.data_ptr() != rs.data_ptr()):
            return False
    D, d = t.num_decode_tokens, t.num_decodes
    views = scratch["views"].get(B)
    if views is None:  # per batch size, made once
        views = scratch["views"][B] = (scratch["arange"][:B], scratch["ones"][:B])
    gl = scratch["gather_lens"]
    gl_view = _storage_view(scratch, "gather_lens")
    out = {"replay_start": scratch["replay_start"], "stale_replay": scratch["stale_replay"],
           "swa_indices": t.decode_rows, "swa_lens": t.decode_lens,
           "prefill_swa_indices": t.prefill_rows, "prefill_swa_lens": t.prefill_lens, "gather_lens": gl}
    plan, k_args = None, {}
    if gather is not None and gather[1] == t.window:
        plan, _, g_out = gather
        out["replay_batch"] = g_out
        if kept is not None:
            for key, build, gl_key in zip(("kept_windows", "kept_first_windows"), kept.builds, kept.gather_lens):
                out[key] = {"swa_indices": build[0], "swa_lens": build[1], "prefill_swa_indices": build[2],
                            "prefill_swa_lens": build[3], "gather_lens": scratch[gl_key]}
            k_args = {"kept_windows": len(kept.builds), "kept_prefill_from": kept.num_decode_tokens,
                      "kept_gather_lens_from": kept.num_decodes}
    CALLS["prepare_step"] += 1
    be.prepare_replay_step(rs, views[0], views[1], qsl, seq, _head(positions, T), slot_mappings, groups, t.block_table,
                           t.block_size, t.window, Wr, index_width=t.decode_rows.shape[1], plan=plan, prefill_from=D,
                           gather_lens_from=d, valid_group=t.group, out=out, **k_args)
    step.pad = step.pad_fallback = None
    answered = step.answered
    bt = t.block_table
    if D:
        answered[("swa_indices_and_lens", t.decode_rows.data_ptr(), D, 0)] = (qsl, rs, bt, None)
    if T > D:
        answered[("swa_indices_and_lens", t.prefill_rows.data_ptr(), T - D, D)] = (qsl, rs, bt, None)
    if B > d:
        answered[("gather_lens", B - d, d, t.window)] = [(qsl, rs, *gl_view[1:], None)]  # None: no plan to wait for
    if plan is not None:
        answered[("gather_replay_batch", id(plan))] = (plan, qsl, slot_mappings, g_out["rows"])
        if k_args:
            _answer_kept(answered, kept, scratch, g_out, rs, bt, plan, B, t.window)
    if second is not None:
        _second_launch(be, second, rs, views, qsl, seq, _head(positions, T), slot_mappings, scratch, T,
                       (plan, g_out, second_kept) if plan is not None and second.window == t.window else None)
    return True


def _second_launch(be: Backend, t: WindowTarget, rs, views, qsl, seq, positions, slot_mappings, scratch: dict, T: int,
                   sub: tuple | None) -> None:
    """A second window group's builds in one more launch: its decode and prefill rows (its block
    table, its slots' validity, its split) and, with ``sub = (plan, g_out, kept)``, its replay
    layers' sub-batch build. The launch pads nothing (the first one did, and is ahead of it in
    the stream) and, with a plan, gathers the sub-batch again into the same buffers: the same
    inputs, the same window, already padded slots, so the same values. Its gather lengths are
    the first group's (the same window over the same boundaries): answered already."""
    D = t.num_decode_tokens
    out = {"replay_start": scratch["replay_start"], "stale_replay": scratch["stale_replay"],
           "swa_indices": t.decode_rows, "swa_lens": t.decode_lens, "prefill_swa_indices": t.prefill_rows,
           "prefill_swa_lens": t.prefill_lens}
    plan = g_out = kept = None
    k_args = {}
    if sub is not None:
        plan, g_out, kept = sub
        out["replay_batch"] = g_out
        if kept is not None:
            build = kept.builds[0]
            out["kept_windows"] = {"swa_indices": build[0], "swa_lens": build[1], "prefill_swa_indices": build[2],
                                   "prefill_swa_lens": build[3], "gather_lens": scratch[kept.gather_lens[0]]}
            k_args = {"kept_windows": 1, "kept_prefill_from": kept.num_decode_tokens,
                      "kept_gather_lens_from": kept.num_decodes}
    CALLS["prepare_step.second"] += 1
    be.prepare_replay_step(rs, views[0], views[1], qsl, seq, positions, slot_mappings, scratch["no_groups"],
                           t.block_table, t.block_size, t.window, 0, index_width=t.decode_rows.shape[1], plan=plan,
                           prefill_from=D, valid_group=t.group, out=out, **k_args)
    answered = _local.step.answered
    if D:
        answered[("swa_indices_and_lens", t.decode_rows.data_ptr(), D, 0)] = (qsl, rs, t.block_table, None)
    if T > D:
        answered[("swa_indices_and_lens", t.prefill_rows.data_ptr(), T - D, D)] = (qsl, rs, t.block_table, None)
    if k_args:
        _answer_kept(answered, kept, scratch, g_out, rs, t.block_table, plan, views[0].shape[0], t.window)


def _answer_kept(answered: dict, kept: KeptTargets, scratch: dict, g_out: dict, rs, bt, plan: ReplayPlan, B: int,
                 window: int) -> None:
    """Record the sub-batch builds the launch made: vLLM's calls pass the sub-batch's
    ``query_start_loc`` and, for the replay layers' build, its ``kv_start`` (``g_out``'s
    buffers: fresh slices of the same memory), for the first replay layer's the batch's
    ``replay_start`` (``rs``, the same object). Each answer holds only once the gather of
    ``plan`` was answered (``_Step.gathered``): the buffers are matched by address, and vLLM's
    own gather of another plan rewrites them."""
    kq, n, Dk, dk = g_out["query_start_loc"], plan.num_rows, kept.num_decode_tokens, kept.num_decodes
    for build, clamp, gl_key in zip(kept.builds, (g_out["kv_start"], rs), kept.gather_lens):
        if Dk:
            answered[("swa_indices_and_lens", build[0].data_ptr(), Dk, 0)] = (kq, clamp, bt, plan)
        if n > Dk:
            answered[("swa_indices_and_lens", build[2].data_ptr(), n - Dk, Dk)] = (kq, clamp, bt, plan)
        if B > dk:
            answered.setdefault(("gather_lens", B - dk, dk, window), []).append(
                (kq, clamp, *_storage_view(scratch, gl_key)[1:], plan))


# ---------------------------------------------------------------------------------------
# warmup
# ---------------------------------------------------------------------------------------


def _launch_tiles(be: Backend) -> list:
    """Context factories, one per launch tile of ``be``'s ``prepare_replay_step`` (its Triton
    kernel's tile follows the step's size; warmup forces each on a small step); one no-op
    for any other variant."""
    if "triton" not in be.variants.get("prepare_replay_step", ()):
        return [contextlib.nullcontext]
    from ...kernels.prepare_replay_step import TILES, forced_tile

    return [functools.partial(forced_tile, t) for t in TILES]


def warm_up(be: Backend, device, *, pad: bool = False, num_groups: int = 1, swa: bool = False,
            gather_lens: bool = False, gather: bool = False, step: bool = False, window: int = 128,
            block_size: int = 32, rows: tuple[tuple[tuple[int, ...], torch.dtype], ...] = ()) -> list[str]:
    """One small real launch of every op the integration routes, on a synthetic step (a
    decode and a replaying prefill, padded): the pack's launch keys never depend on sizes
    but for ``prepare_replay_step``'s token tile (each tile forced here), so serving steps
    compile nothing afterwards. ``rows``: ``(trailing shape, dtype)`` of
    each tensor the replay layers gather and scatter. Returns the ops launched."""
    dev = torch.device(device)
    W, bs = int(window), int(block_size)
    width = W  # vLLM's prefill rows may be wider: a runtime argument, the same kernel
    i32, i64 = torch.int32, torch.int64
    q, prefix = [1, 3], [W + 4, W + 5]
    seq = [a + b for a, b in zip(q, prefix)]
    T, T_pad = sum(q), sum(q) + 2
    qsl = torch.tensor([0, 1, 4], dtype=i32, device=dev)
    seq_t = torch.tensor(seq, dtype=i32, device=dev)
    R = torch.tensor([0, prefix[1]], dtype=i32, device=dev)
    cols = -(-max(seq) // bs) + 1
    table = torch.arange(2 * cols, dtype=i32, device=dev).view(2, cols)
    pos = torch.zeros(T_pad, dtype=i64, device=dev)
    pos[:T] = torch.tensor([seq[0] - 1, *range(prefix[1], seq[1])], dtype=i64)
    slots = torch.arange(max(num_groups, 1) * T_pad, dtype=i64, device=dev).view(-1, T_pad)
    ran: list[str] = []
    if pad:
        be.pad_replayed_slots(slots.clone(), torch.zeros(1, dtype=i32, device=dev), qsl, pos, R, W)
        ran.append("pad_replayed_slots")
    if swa:
        valid = torch.ones(T_pad, dtype=torch.bool, device=dev)
        out = (torch.empty(T_pad, width, dtype=i32, device=dev), torch.empty(T_pad, dtype=i32, device=dev))
        be.swa_indices_and_lens(qsl, seq_t, table, bs, W, R, index_width=width, valid=valid, num_tokens=T_pad,
                                out=out)
        ran.append("swa_indices_and_lens")
    if gather_lens:
        be.prefill_gather_lens(qsl, seq_t, R, W, out=torch.empty(2, dtype=i32, device=dev))
        ran.append("prefill_gather_lens")
    if gather:
        kept = np.array([1, 2], dtype=np.int32)
        plan = replay_plan(kept, np.array([0, 1, 4], dtype=np.int32), 5, W)
        out = {"rows": torch.empty(5, dtype=i64, device=dev), "query_start_loc": torch.empty(3, dtype=i32, device=dev),
               "positions": torch.empty(5, dtype=i64, device=dev),
               "slot_mappings": torch.empty(slots.shape[0], 5, dtype=i64, device=dev),
               "kv_start": torch.empty(2, dtype=i32, device=dev)}
        be.gather_replay_batch(plan, qsl, seq_t, R, pos, slots, W, out=out)
        ran.append("gather_replay_batch")
    if step:  # prepare_step's launches: with and without a held pad, with a sub-batch (and its builds) if gathered
        kept = np.array([1, 2], dtype=np.int32)
        plan = replay_plan(kept, np.array([0, 1, 4], dtype=np.int32), 5, W)
        ones = torch.ones(2, dtype=torch.bool, device=dev)
        idx = torch.arange(2, dtype=i32, device=dev)
        two = torch.arange(2 * T_pad, dtype=i64, device=dev).view(2, T_pad)  # group 0 cacheable, 1 the window's
        for tile in _launch_tiles(be):  # the Triton kernel's tile depends on the step's size
            for held in (True, False):
                for p, kept in ((None, 0), (plan, 0), (plan, 1), (plan, 2)) if gather else ((None, 0),):
                    groups = torch.zeros(1 if held else 0, dtype=i32, device=dev)
                    k_args = dict(kept_windows=kept, kept_prefill_from=1, kept_gather_lens_from=1) if kept else {}
                    with tile():
                        be.prepare_replay_step(R, idx, ones, qsl, seq_t, pos[:T], two.clone(), groups, table, bs, W,
                                               W if held else 0, index_width=width, plan=p, prefill_from=1,
                                               gather_lens_from=1, valid_group=1, **k_args)
                        if not held and kept < 2:  # a second window group's launch: no pad, no gather lengths
                            be.prepare_replay_step(R, idx, ones, qsl, seq_t, pos[:T], two.clone(), groups, table, bs,
                                                   W, 0, index_width=width, plan=p, prefill_from=1, valid_group=1,
                                                   **k_args)
        ran.append("prepare_replay_step")
    if rows:
        idx = torch.tensor([0, 2, 3], dtype=i64, device=dev)
        for tail, dtype in rows:
            x = torch.zeros(T, *tail, dtype=dtype, device=dev)
            buf = torch.empty(3, *tail, dtype=dtype, device=dev)
            be.gather_rows(x, idx, out=buf)  # without out= the same kernel, into a fresh buffer
            be.scatter_rows(buf, idx, T)
        ran += ["gather_rows", "scatter_rows"]
    return ran


__all__ = ["CALLS", "VALIDATE", "KeptTargets", "WindowTarget", "answered_gather_lens", "answered_swa", "backend_for", "begin_step",
           "dropped_before", "end_step", "flush_step", "gather_replay_batch", "gather_rows", "pad_replayed_slots",
           "predicted_kept", "predicted_split", "prefill_gather_lens", "prepare_step", "query_lens", "replay_plan",
           "scatter_rows", "swa_indices_and_lens", "swa_rows", "warm_up"]
