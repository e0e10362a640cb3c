"""``agree_across_dp`` (SPEC §3.4): data-parallel ranks agree on trimming."""

from __future__ import annotations

import torch

from ..validation import check_int, fail

NAME = "agree_across_dp"


def agree_across_dp(trims: bool, num_tokens: int, group=None) -> tuple[bool, tuple[int, ...]]:
    """``(any_rank_trims, kept_per_rank)`` over ``group`` (a ``torch.distributed`` group,
    e.g. the CPU/gloo DP group; None = the default group).

    Every rank trims if any does (the replay layers' collectives must match); each rank's
    entry is its kept row count, at least 1 (an idle rank runs one dummy row). One
    all-gather of two int64 per rank.
    """
    import torch.distributed as dist

    if not isinstance(trims, bool):
        fail(NAME, "trims", trims, "a bool")
    check_int(NAME, "num_tokens", num_tokens, min_value=0)
    if not dist.is_available() or not dist.is_initialized():
        fail(NAME, "group", group, "an initialised torch.distributed process group")
    world = dist.get_world_size(group)
    backend = dist.get_backend(group)
    dev = torch.device("cpu") if backend == "gloo" else torch.device("cuda", torch.cuda.current_device())
    mine = torch.tensor([int(trims), max(1, num_tokens)], dtype=torch.int64, device=dev)
    gathered = torch.empty(world * 2, dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(gathered, mine, group=group)
    table = gathered.view(world, 2).cpu()
    return bool(table[:, 0].any()), tuple(int(x) for x in table[:, 1])
