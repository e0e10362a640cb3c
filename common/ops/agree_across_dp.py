"""``agree_across_dp`` (SPEC §3.4): data-parallel ranks agree on trimming."""

from __future__ import annotations

import torch

from ..validation import check_int, fail

NAME = "agree_across_dp"


def _collective_device(group) -> torch.device:
    """Where the exchanged tensor lives: the host for a gloo (or mpi) group -- including a
    mixed ``cpu:gloo,cuda:nccl`` group, whose CPU tensors go to gloo -- else the
    backend's accelerator (nccl: CUDA/ROCm, hccl: Ascend)."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    if "hccl" in backend:
        return torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]
    return torch.device("cpu")


def check_group(op: str, group) -> None:
    """``group``: None (the default group) or a ``torch.distributed`` process group, with
    ``torch.distributed`` initialised."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        fail(op, "group", group, "an initialised torch.distributed process group")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        fail(op, "group", group, "None (the default group) or a torch.distributed ProcessGroup")


def agree_across_dp(trims: bool, num_tokens: int, group=None) -> tuple[bool, tuple[int, ...]]:
    """``(any_rank_trims, kept_per_rank)`` over ``group`` (a ``torch.distributed`` group,
    e.g. the CPU/gloo DP group; None = the default group).

    Every rank trims if any does (the replay layers' collectives must match); entry ``r``
    of ``kept_per_rank`` is rank ``r``'s (group rank) kept row count, at least 1: an idle
    rank (``num_tokens == 0``) runs one dummy row. One all-gather of two int64 per rank;
    every rank of ``group`` must call it in the same step.
    """
    import torch.distributed as dist

    if not isinstance(trims, bool):
        fail(NAME, "trims", trims, "a bool")
    check_int(NAME, "num_tokens", num_tokens, min_value=0)
    check_group(NAME, group)
    world = dist.get_world_size(group)
    if world < 0:  # the calling process is not a member of ``group``
        fail(NAME, "group", group, "a process group this rank belongs to")
    kept = max(1, num_tokens)
    if world == 1:
        return trims, (kept,)
    dev = _collective_device(group)
    mine = torch.tensor([int(trims), kept], dtype=torch.int64, device=dev)
    # all_gather (list form): supported by gloo, nccl and hccl on every torch we run on.
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    table = torch.stack(parts).cpu()
    return bool(table[:, 0].any()), tuple(int(x) for x in table[:, 1])
