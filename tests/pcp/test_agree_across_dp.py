"""``agree_across_dp`` over a real torch.distributed gloo group: 2 and 4 processes on this
machine, idle ranks included, the default group and DP sub-groups."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random

import pytest
import torch.distributed as dist

from swa_backends import agree_across_dp


def _scenarios(world: int) -> list[dict]:
    """Per scenario: each rank's (trims, num_tokens). Deterministic, so every process and
    the parent agree on the inputs."""
    rng = random.Random(world)
    out = [
        {"name": "nobody trims", "inputs": [(False, rng.randint(1, 500)) for _ in range(world)]},
        {"name": "last rank trims, others idle",
         "inputs": [(False, 0)] * (world - 1) + [(True, 128)]},
        {"name": "first rank trims, last idle",
         "inputs": [(True, 77)] + [(False, rng.randint(1, 300)) for _ in range(world - 2)] + [(False, 0)]},
        {"name": "everyone idle", "inputs": [(False, 0)] * world},
        {"name": "all trim", "inputs": [(True, rng.randint(1, 128)) for _ in range(world)]},
    ]
    for _ in range(3):
        out.append({"name": "random", "inputs": [(rng.random() < 0.3, rng.choice([0, 1, rng.randint(2, 4000)]))
                                                 for _ in range(world)]})
    return out


def _worker(rank: int, world: int, store: str, result_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results = []
        for sc in _scenarios(world):
            trims, n = sc["inputs"][rank]
            results.append(list(agree_across_dp(trims, n, None)))
        sub = []
        if world == 4:
            # two DP groups of two ranks: {0, 1} and {2, 3}; every rank creates both.
            groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            mine = groups[rank // 2]
            for trims_at in (None, 3, 0):
                sub.append(list(agree_across_dp(rank == trims_at, 10 * (rank + 1) if rank != 1 else 0, mine)))
        with open(os.path.join(result_dir, f"{rank}.json"), "w") as fh:
            json.dump({"default": results, "sub": sub}, fh)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_agree_across_dp_gloo(tmp_path, world):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, world, str(tmp_path / "store"), str(tmp_path)))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0] * world, "a rank failed or hung"
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]
    for i, sc in enumerate(_scenarios(world)):
        want_trims = any(t for t, _ in sc["inputs"])
        want_kept = [max(1, n) for _, n in sc["inputs"]]
        for r in range(world):
            trims, kept = got[r]["default"][i]
            assert trims == want_trims, (sc["name"], r)
            assert kept == want_kept, (sc["name"], r)
    if world == 4:
        for j, trims_at in enumerate((None, 3, 0)):
            for r in range(4):
                members = [0, 1] if r < 2 else [2, 3]
                trims, kept = got[r]["sub"][j]
                assert trims == (trims_at in members), (trims_at, r)
                assert kept == [max(1, 10 * (m + 1) if m != 1 else 0) for m in members], (trims_at, r)


def test_agree_across_dp_single_process_group(tmp_path):
    """World size 1 answers without a collective; bad arguments fail before any."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store1'}", rank=0, world_size=1)
    try:
        assert agree_across_dp(True, 0) == (True, (1,))
        assert agree_across_dp(False, 300) == (False, (300,))
        with pytest.raises(ValueError, match="agree_across_dp: trims=1: expected a bool"):
            agree_across_dp(1, 5)
        with pytest.raises(ValueError, match="num_tokens"):
            agree_across_dp(False, -1)
    finally:
        dist.destroy_process_group()


def test_agree_across_dp_needs_a_group():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="an initialised torch.distributed process group"):
        agree_across_dp(False, 3)
