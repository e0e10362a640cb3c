"""``pcp_pad_replayed_slots`` (SPEC §6): encoder replay under prefill context parallelism.

A composite above dispatch: it runs a backend's device ops (``backend=``, default the
selected backend of the tensors' device) and a collective, so it is no backend op itself.

Every rank holds the same gathered slot mapping ``[G, P * padded]`` (rank-major, see
:mod:`.pcp_partition`). Replay must leave the cached (cacheable-group) KV of positions
``[R, R + Wr)`` untouched, but only the rank that computes a token knows which of its own
local rows replay, so:

1. every local row carries its request's ``R`` (prefilling rows only) -- staged with the
   selected backend's ``batch_replay_start`` on the local ``idx_mapping``;
2. the rank pads, in the cacheable groups, its OWN block of the gathered mapping -- the
   selected backend's ``pad_replayed_slots`` on the local batch (reference, Triton or a
   vendor variant: reused, never copied);
3. the masked cacheable rows are all-gathered over the PCP group rank-major, so every rank
   ends with the identical mapping, equal to single-process ``pad_replayed_slots`` on the
   global batch laid out in the same column order.

Every rank enters the collective whenever replay is on for the step -- decided from
rank-invariant data (the global per-request ``R``, or the caller's ``replay_on``) -- even
a rank none of whose tokens replays: deciding from local rows would leave the others
blocked in the gather (or pair it with the next, unrelated collective). Window (non-cacheable) groups are never touched. Not graph-safe (host
metadata and a collective); SPEC §4 allows PCP replay only in eager mode anyway.
"""

from __future__ import annotations

import functools

import torch

from .common.ops.agree_across_dp import check_group
from .common.ops.pcp_partition import PCPPartition
from .common.ops._checks import check_window
from .common.types import INDEX_DTYPE, MAX_POSITION, PAD, SLOT_DTYPE
from .common.validation import check_range, check_tensor, fail, validation_enabled, value_checks_enabled
from .dispatch import reference_backend, select

NAME = "pcp_pad_replayed_slots"


@functools.cache
def _backend_for(device: str):
    return reference_backend() if device == "cpu" else select(device)


def _replay_starts(replay_start, partition: PCPPartition, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-request R as ``(int32 [B] on device, int64 [B] on the host)``; host
    sequences accepted. A device tensor costs one copy to the host (the rank-invariant
    decision and the launch skip read it there)."""
    B = partition.num_reqs
    if isinstance(replay_start, torch.Tensor):
        check_tensor(NAME, "replay_start", replay_start, dtypes=(torch.int32, torch.int64), shape=(B,))
        if replay_start.device.type == "meta":
            fail(NAME, "replay_start", replay_start, "values on a real device (read on the host)")
        t = replay_start
    else:
        try:
            t = torch.as_tensor(replay_start)
        except Exception:
            t = None
        if t is None or t.dim() != 1 or t.shape[0] != B or (B and (t.dtype.is_floating_point or t.dtype == torch.bool)):
            fail(NAME, "replay_start", replay_start, f"a tensor or sequence of {B} ints (R per request, like query_lens)")
    return t.to(device=device, dtype=INDEX_DTYPE), t.detach().to("cpu", torch.int64)


def _live(R: torch.Tensor, Rh: torch.Tensor, partition: PCPPartition) -> tuple[torch.Tensor, torch.Tensor]:
    """``(R, Rh)`` with every stale R -- above its request's first scheduled position
    ``num_computed``: an in-place restart, SPEC §0 -- set to 0. Decided per request here,
    where the request's first position is known: a local row of a later chunk starts above
    it, so ``pad_replayed_slots`` on the local rows cannot tell."""
    stale = Rh > partition.num_computed
    if not bool(stale.any()):
        return R, Rh
    Rh = torch.where(stale, torch.zeros_like(Rh), Rh)
    return Rh.to(device=R.device, dtype=INDEX_DTYPE), Rh


def _validate(slot_mappings, cacheable_groups, partition, Rh: torch.Tensor, Wr, replay_on) -> None:
    check_tensor(NAME, "slot_mappings", slot_mappings, dtypes=SLOT_DTYPE, ndim=2)
    dev = slot_mappings.device
    if slot_mappings.shape[1] < partition.num_columns:
        fail(NAME, "slot_mappings", slot_mappings,
             f"at least P * padded = {partition.P} * {partition.padded} = {partition.num_columns} columns "
             "(the gathered rank-major mapping)")
    check_tensor(NAME, "cacheable_groups", cacheable_groups, dtypes=INDEX_DTYPE, ndim=1, device=dev)
    check_window(NAME, "Wr", Wr, min_value=0)
    if replay_on is not None and not isinstance(replay_on, bool):
        fail(NAME, "replay_on", replay_on, "None or a bool identical on every rank")
    check_range(NAME, "cacheable_groups", cacheable_groups, low=0, high=slot_mappings.shape[0])
    if not value_checks_enabled() or partition.num_reqs == 0:
        return
    check_range(NAME, "replay_start", Rh, low=0, high=MAX_POSITION + 1)
    pre = partition.is_prefilling
    replays = pre & (Rh > 0) & (partition.query_lens > 0)
    if replay_on is False and Wr > 0 and bool(replays.any()):
        i = int(torch.nonzero(replays)[0])
        fail(NAME, "replay_on", False, f"True or None: request {i} replays (replay_start[{i}]={int(Rh[i])})")
    if partition.prefilling_inferred and Wr > 0:
        # A guessed decode (q == 1, num_computed > 0) at a replayed position is a one-token
        # prefill chunk (a real decode sits at p >= R + Wr): it would lose its R.
        p = partition.num_computed
        guessed = ~pre & (partition.query_lens > 0) & (Rh > 0) & (p >= Rh) & (p < Rh + Wr)
        if bool(guessed.any()):
            i = int(torch.nonzero(guessed)[0])
            fail(NAME, "partition.is_prefilling", "guessed (pcp_partition(..., is_prefilling=None))",
                 f"the runner's flag: the guess made request {i} (q 1 at position {int(p[i])}) a decode, but it sits "
                 f"in its replayed range [{int(Rh[i])}, {int(Rh[i]) + Wr}), so it is a one-token prefill chunk")
    # the gathered layout: padding and replicated decodes on ranks > 0 publish nothing
    base = partition.rank * partition.padded
    idle = torch.ones(partition.padded, dtype=torch.bool)
    idle[partition.columns[partition.publishes] - base] = False
    if bool(idle.any()):
        own = slot_mappings[:, partition.own_columns]
        bad = own[:, idle.to(dev)] != PAD
        if bool(bad.any()):
            g, j = (int(v) for v in torch.nonzero(bad)[0])
            col = base + int(torch.nonzero(idle)[j])
            fail(NAME, f"slot_mappings[{g}, {col}]", int(slot_mappings[g, col]),
                 f"PAD: column {col} publishes no token (rank-major padding, or a decode replicated on rank "
                 f"{partition.rank} > 0)")


def _local_replays(Rh: torch.Tensor, partition: PCPPartition, Wr: int) -> bool:
    """Host: whether any of this rank's tokens sits in its request's ``[R, R + Wr)``."""
    if Wr == 0 or partition.num_tokens == 0:
        return False
    rows = partition.query_start_loc[1:] - partition.query_start_loc[:-1]
    R = torch.where(partition.row_prefilling, Rh[partition.row_req.to(torch.int64)], 0)
    R = R.repeat_interleave(rows.to(torch.int64))
    p = partition.positions
    return bool(((R > 0) & (p >= R) & (p < R + Wr)).any())


def _replay_is_on(Rh: torch.Tensor, partition: PCPPartition, Wr: int, replay_on) -> bool:
    """Rank-invariant: the caller's word, else whether any prefilling request of the global
    batch has ``R > 0`` (every rank sees the same global ``R`` and ``is_prefilling``)."""
    if replay_on is not None:
        return replay_on
    if Wr == 0 or partition.num_reqs == 0:
        return False
    live = partition.is_prefilling & (partition.query_lens > 0)
    return bool(((Rh > 0) & live).any())


def _check_partition(partition) -> None:
    if not isinstance(partition, PCPPartition):
        fail(NAME, "partition", partition, "a PCPPartition from pcp_partition(...)")


def _check_backend(backend) -> None:
    if backend is not None and not all(callable(getattr(backend, op, None))
                                       for op in ("batch_replay_start", "pad_replayed_slots")):
        fail(NAME, "backend", backend, "None or a Backend from select() (batch_replay_start, pad_replayed_slots)")


def _own_block(slot_mappings, cacheable_groups, partition, R: torch.Tensor, Rh: torch.Tensor, Wr: int,
               backend) -> torch.Tensor:
    dev = slot_mappings.device
    # a contiguous copy: kernels address a [G, T] mapping with the row length as stride
    own = slot_mappings[:, partition.own_columns].contiguous()
    if _local_replays(Rh, partition, Wr):
        be = backend if backend is not None else _backend_for(str(dev))
        local = partition.device_tensors(dev)
        local_R = be.batch_replay_start(R, local["idx_mapping"], local["is_prefilling"])
        be.pad_replayed_slots(own, cacheable_groups, local["query_start_loc"], local["positions"], local_R, Wr,
                              any_replay=True)
    return own.index_select(0, cacheable_groups.to(torch.int64))


def pcp_pad_own_block(slot_mappings, cacheable_groups, partition: PCPPartition, replay_start, Wr: int, *,
                      backend=None) -> torch.Tensor:
    """Steps 1-2 alone (no collective): this rank's own block of the cacheable rows of the
    gathered mapping with its replayed tokens padded, ``int64 [g, padded]`` (a new tensor;
    ``slot_mappings`` is only read). The selected backend's ``batch_replay_start`` and
    ``pad_replayed_slots`` run on the local batch; a rank with no replayed token launches
    nothing. :func:`pcp_pad_replayed_slots` is this plus the rank-major all-gather."""
    _check_partition(partition)
    check_tensor(NAME, "slot_mappings", slot_mappings, dtypes=SLOT_DTYPE, ndim=2)
    _check_backend(backend)
    R, Rh = _replay_starts(replay_start, partition, slot_mappings.device)
    if validation_enabled():
        _validate(slot_mappings, cacheable_groups, partition, Rh, Wr, None)
    R, Rh = _live(R, Rh, partition)
    return _own_block(slot_mappings, cacheable_groups, partition, R, Rh, Wr, backend)


def _all_gather_rank_major(block: torch.Tensor, P: int, group) -> torch.Tensor:
    """``[g, padded]`` per rank -> ``[g, P * padded]``: rank r's block at columns
    ``[r * padded, (r+1) * padded)``, the order KV is published in."""
    import torch.distributed as dist

    g, padded = block.shape
    dev = block.device
    if dist.get_backend(group) == "gloo" and dev.type != "cpu":
        block = block.cpu()
    out = torch.empty(P * g * padded, dtype=block.dtype, device=block.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    gather(out, block.contiguous().view(-1), group=group)
    return out.view(P, g, padded).permute(1, 0, 2).reshape(g, P * padded).to(dev)


def pcp_pad_replayed_slots(slot_mappings, cacheable_groups, partition: PCPPartition, replay_start, Wr: int, *,
                           group=None, backend=None, replay_on: bool | None = None) -> torch.Tensor:
    """In place on the gathered mapping ``slot_mappings`` int64 ``[G, >= P * padded]``
    (identical on every rank, rank-major): afterwards ``slot_mappings[g, col] = PAD`` for
    every cacheable group ``g`` and every column publishing a prefill token of a request
    with ``R > 0`` at a position in ``[R, R + Wr)``; everything else is unchanged, and the
    result is identical on every rank of ``group``.

    ``cacheable_groups`` int32 [g] (the model's, identical on every rank); ``partition``:
    this rank's :func:`pcp_partition`; ``replay_start``: each request's ``R`` (ints [B],
    host or device; decode rows ignored); ``group``: the PCP ``torch.distributed`` group
    (None: the default group) of size ``P``, this process at ``partition.rank``;
    ``backend``: the :class:`Backend` whose ``batch_replay_start`` / ``pad_replayed_slots``
    run (None: ``select`` for the mapping's device); ``replay_on``: the step's
    rank-invariant decision (None: ``Wr > 0`` and some prefilling request has ``R > 0``).
    When on, every rank joins one all-gather of ``g * padded`` int64, whether or not any of
    its tokens replays; when off (or with no cacheable group: the model's layout, the same
    on every rank) no rank launches or communicates. Returns ``slot_mappings``.
    """
    import torch.distributed as dist

    _check_partition(partition)
    check_tensor(NAME, "slot_mappings", slot_mappings, dtypes=SLOT_DTYPE, ndim=2)
    _check_backend(backend)
    R, Rh = _replay_starts(replay_start, partition, slot_mappings.device)
    if validation_enabled():
        _validate(slot_mappings, cacheable_groups, partition, Rh, Wr, replay_on)
        check_group(NAME, group)
        world, me = dist.get_world_size(group), dist.get_rank(group)
        if world != partition.P:
            fail(NAME, "group.size", world, f"P={partition.P} (the PCP group)")
        if me != partition.rank:
            fail(NAME, "partition.rank", partition.rank, f"this process's rank {me} in the group")
    R, Rh = _live(R, Rh, partition)
    if not _replay_is_on(Rh, partition, Wr, replay_on) or cacheable_groups.numel() == 0:
        return slot_mappings
    block = _own_block(slot_mappings, cacheable_groups, partition, R, Rh, Wr, backend)
    gathered = _all_gather_rank_major(block, partition.P, group)
    slot_mappings[cacheable_groups.to(torch.int64), : partition.num_columns] = gathered
    return slot_mappings
