"""``pcp_pad_replayed_slots`` over a real gloo group of P = 2 and 4 processes (spawned on
this machine): identical mapping on every rank, equal to the single-process oracle; every
rank joins the all-gather whenever replay is on -- including ranks with no replayed token,
which launch nothing -- and no rank communicates when it is off. A rank that skipped the
collective would leave the others blocked until the 30 s gloo timeout fails the test."""

from __future__ import annotations

import datetime
import json
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _pcp_cases import SPEC_EXAMPLE_AFTER, CountingBackend, long_example, oracle_global, random_step, spec_example

from swa_backends import pcp_pad_replayed_slots, reference_backend, select

RANDOM_STEPS = 16


def _same_on_every_rank(t: torch.Tensor, P: int) -> bool:
    everyone = [torch.empty_like(t) for _ in range(P)]
    dist.all_gather(everyone, t.contiguous())
    return all(torch.equal(x, t) for x in everyone)


def _run(step, rank, gathers, device, inner, *, replay_on=None, device_R=False):
    """One step on this rank: returns (mapping after, launches on this rank, gathers joined)."""
    part = step.partition(rank)
    mapping = step.gathered_before(part).to(device)
    counting = CountingBackend(inner)
    before = len(gathers)
    R = torch.tensor(step.R, dtype=torch.int32, device=device) if device_R else step.R
    out = pcp_pad_replayed_slots(mapping, step.cacheable.to(device), part, R, step.Wr, backend=counting,
                                 replay_on=replay_on)
    assert out is mapping
    return out, len(counting.calls), len(gathers) - before, part


def _worker(rank: int, P: int, store: str, report_dir: str, backend: str = "gloo") -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        inner = select(str(device))
    else:
        device, inner = torch.device("cpu"), reference_backend()
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=P,
                            timeout=datetime.timedelta(seconds=30))
    gathers: list[int] = []
    for name in ("all_gather_single", "all_gather_into_tensor"):  # count the op's collective
        real = getattr(dist, name, None)
        if real is not None:
            def counted(*a, _real=real, **k):
                gathers.append(1)
                return _real(*a, **k)
            setattr(dist, name, counted)
    report: dict = {"rank": rank, "steps": []}
    try:
        steps = [("long", long_example(P), None)]
        if P == 2:
            steps.insert(0, ("spec", spec_example(), None))
        rng = np.random.default_rng(1234 + P)  # the same batches on every rank
        steps += [(f"random{i}", random_step(rng, P), None) for i in range(RANDOM_STEPS)]
        no_replay = random_step(np.random.default_rng(5), P)
        no_replay.R = [0] * len(no_replay.R)
        no_replay.cacheable = torch.tensor([0], dtype=torch.int32)
        steps += [("forced-on", no_replay, True), ("off", no_replay, None)]
        for i, (name, step, replay_on) in enumerate(steps):
            out, launches, joined, part = _run(step, rank, gathers, device, inner, replay_on=replay_on,
                                               device_R=bool(i % 2))
            assert out.device == device
            assert torch.equal(out.cpu(), oracle_global(step, part)), name
            assert _same_on_every_rank(out, P), name
            if name == "spec":
                assert out[0].tolist() == SPEC_EXAMPLE_AFTER
            if name == "long":
                report["variants"] = {op: list(inner.variants[op]) for op in ("pad_replayed_slots", "batch_replay_start")}
            live = [r if p and r <= c else 0 for p, r, c in zip(step.pre, step.R, step.nc)]  # stale R: 0
            on = replay_on if replay_on is not None else (
                step.Wr > 0 and any(r > 0 and q > 0 for r, q in zip(live, step.q)))
            assert joined == int(bool(on) and step.cacheable.numel() > 0), (name, joined, on)
            p = part.positions
            R = torch.tensor([live[i] for i in part.row_req.tolist()], dtype=torch.int64)
            R = R.repeat_interleave(part.query_start_loc.diff().to(torch.int64))
            local = bool(((R > 0) & (p >= R) & (p < R + step.Wr)).any())
            assert launches == (2 if local and joined else 0), (name, launches, local)
            report["steps"].append({"name": name, "joined": joined, "launches": launches, "local_replay": local})
    finally:
        dist.destroy_process_group()
    with open(os.path.join(report_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(report, fh)


def _spawn(P: int, backend: str) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="swa_pcp_") as tmp:
        mp.spawn(_worker, args=(P, os.path.join(tmp, "store"), tmp, backend), nprocs=P, join=True)
        return [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(P)]


@pytest.mark.parametrize("P", [2, 4])
def test_pcp_gather_over_gloo(P):
    _check_reports(_spawn(P, "gloo"), P)


@pytest.mark.gpu
def test_pcp_gather_over_nccl():
    """The same steps on CUDA tensors over NCCL, through the backend ``select`` picks for
    the GPU (its Triton kernels once issue 3 lands); needs two GPUs."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs for an NCCL group, found {torch.cuda.device_count()}")
    reports = _spawn(2, "nccl")
    _check_reports(reports, 2)
    print("variants on rank 0:", reports[0].get("variants"))


def _check_reports(reports: list[dict], P: int) -> None:
    by_step = {s["name"]: [rep["steps"][i] for rep in reports] for i, s in enumerate(reports[0]["steps"])}
    # the long example: only rank 0 replays; every rank joined the one gather, the others launched nothing
    long = by_step["long"]
    assert [s["local_replay"] for s in long] == [True] + [False] * (P - 1)
    assert [s["joined"] for s in long] == [1] * P
    assert [s["launches"] for s in long] == [2] + [0] * (P - 1)
    # joining is rank-invariant in every step; some random steps had an idle rank that still joined
    assert all(len({s["joined"] for s in ranks}) == 1 for ranks in by_step.values())
    assert any(ranks[0]["joined"] and not all(s["local_replay"] for s in ranks) for n, ranks in by_step.items()
               if n.startswith("random"))
    assert [s["joined"] for s in by_step["forced-on"]] == [1] * P
    assert [s["joined"] for s in by_step["off"]] == [0] * P
