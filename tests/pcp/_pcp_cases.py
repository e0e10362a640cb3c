"""Shared by the PCP tests (in-process, multi-process, interpreter subprocess): random
serving-like PCP steps and the two single-process oracles of SPEC §6."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from swa_backends import PAD, pcp_gather_columns, pcp_pad_own_block, pcp_partition
from swa_backends.common.ops import OPS


@dataclass
class Step:
    P: int
    q: list[int]
    nc: list[int]
    pre: list[bool]
    R: list[int]  # the request's R (decodes may carry their old one: it must be ignored)
    Wr: int
    slots: torch.Tensor  # int64 [G, T] global token slots
    cacheable: torch.Tensor  # int32 [g]
    explicit: bool = True  # pass is_prefilling to pcp_partition

    @property
    def T(self) -> int:
        return sum(self.q)

    def partition(self, rank: int):
        return pcp_partition(self.q, self.nc, self.P, rank, is_prefilling=self.pre if self.explicit else None)

    def gathered_before(self, part) -> torch.Tensor:
        """The gathered mapping every rank holds before replay padding."""
        return pcp_gather_columns(self.slots, part)


def random_step(rng: np.random.Generator, P: int, *, max_reqs: int = 6, max_q: int = 40) -> Step:
    """Decodes (some carrying an old R), fresh / chunked / replaying prefills (a first
    replay chunk starting at R or a later one), prefills restarted in place (a stale R above
    their first position, SPEC §0), one-token prefill chunks, empty rows."""
    Wr = int(rng.choice([1, 3, 4, 8, 16]))
    G = int(rng.integers(1, 5))
    B = int(rng.integers(0, max_reqs + 1))
    q, nc, pre, R = [], [], [], []
    for _ in range(B):
        kind = rng.choice(["decode", "fresh", "chunk", "replay", "replay", "one", "empty", "restarted"])
        if kind == "decode":
            r = int(rng.integers(0, 60)) if rng.random() < 0.5 else 0
            q.append(1), nc.append(r + Wr + int(rng.integers(0, 50)) if r else int(rng.integers(1, 200)))
            pre.append(False), R.append(r)
        elif kind == "fresh":
            q.append(int(rng.integers(1, max_q + 1))), nc.append(0), pre.append(True), R.append(0)
        elif kind == "chunk":
            q.append(int(rng.integers(1, max_q + 1))), nc.append(int(rng.integers(1, 200))), pre.append(True), R.append(0)
        elif kind in ("replay", "one"):
            r = int(rng.integers(1, 80))
            start = r if rng.random() < 0.5 else r + int(rng.integers(0, Wr + 3))
            q.append(1 if kind == "one" else int(rng.integers(1, max_q + 1)))
            nc.append(start), pre.append(True), R.append(r)
        elif kind == "restarted":  # recomputes from an earlier position, its old R kept
            start = int(rng.integers(0, 40))
            q.append(int(rng.integers(1, 3 * max_q))), nc.append(start), pre.append(True)
            R.append(start + int(rng.integers(1, 2 * max_q)))
        else:
            q.append(0), nc.append(int(rng.integers(0, 30))), pre.append(True), R.append(0)
    T = sum(q)
    slots = torch.from_numpy(rng.permutation(10 * G * max(T, 1) + 7)[: G * T].reshape(G, T).astype(np.int64)) + 1
    cacheable = torch.from_numpy(np.sort(rng.choice(G, size=int(rng.integers(0, G + 1)), replace=False))).to(torch.int32)
    # the flag can only be guessed when no one-token prefill chunk is in the batch
    explicit = bool(rng.random() < 0.5) or any(p and a == 1 and c > 0 for p, a, c in zip(pre, q, nc))
    return Step(P, q, nc, pre, R, Wr, slots, cacheable, explicit)


def oracle_laid_out(step: Step, parts, backend=None) -> torch.Tensor:
    """SPEC §6's statement: single-process ``pad_replayed_slots`` on the global batch laid
    out in the rank-major column order (each rank's local rows with their request's live R on
    prefilling rows -- 0 for a stale one: the request's, not the row's, first position decides
    --, a filler row with R 0 over each rank's padding)."""
    pad = OPS["pad_replayed_slots"].reference if backend is None else backend.pad_replayed_slots
    padded = parts[0].padded
    lens, pos, Rrows = [], [], []
    for part in parts:
        n = part.query_start_loc.diff().tolist()
        lens += n
        Rrows += [step.R[i] if step.pre[i] and step.R[i] <= step.nc[i] else 0 for i in part.row_req.tolist()]
        pos.append(part.positions)
        if part.num_tokens < padded:
            lens.append(padded - part.num_tokens)
            Rrows.append(0)
            pos.append(torch.zeros(padded - part.num_tokens, dtype=torch.int64))
    qsl = torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32)
    out = step.gathered_before(parts[0]).clone()
    pad(out, step.cacheable, qsl, torch.cat(pos) if pos else torch.zeros(0, dtype=torch.int64),
        torch.tensor(Rrows, dtype=torch.int32), step.Wr)
    return out


def oracle_global(step: Step, part) -> torch.Tensor:
    """Single-process ``pad_replayed_slots`` on the global batch in its own token order,
    then laid out rank-major with ``pcp_gather_columns``."""
    q = torch.tensor(step.q, dtype=torch.int64)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), q.cumsum(0)]).to(torch.int32)
    pos = torch.cat([torch.arange(c, c + a) for a, c in zip(step.q, step.nc)] or [torch.zeros(0, dtype=torch.int64)])
    Rb = torch.tensor([r if p else 0 for r, p in zip(step.R, step.pre)], dtype=torch.int32)
    out = step.slots.clone()
    OPS["pad_replayed_slots"].reference(out, step.cacheable, qsl, pos.to(torch.int64), Rb, step.Wr)
    return pcp_gather_columns(out, part)


def simulated_gather(step: Step, parts, backend=None) -> torch.Tensor:
    """Every rank's :func:`pcp_pad_own_block`, concatenated rank-major in one process
    (what the all-gather produces), written into the cacheable rows."""
    before = step.gathered_before(parts[0])
    blocks = [pcp_pad_own_block(before.clone(), step.cacheable, part, step.R, step.Wr, backend=backend) for part in parts]
    out = before.clone()
    if step.cacheable.numel():
        out[step.cacheable.to(torch.int64)] = torch.cat(blocks, dim=1)
    return out


class CountingBackend:
    """Delegates the two device ops ``pcp_pad_*`` runs and counts their launches."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[str] = []

    def batch_replay_start(self, *args, **kwargs):
        self.calls.append("batch_replay_start")
        return self.inner.batch_replay_start(*args, **kwargs)

    def pad_replayed_slots(self, *args, **kwargs):
        self.calls.append("pad_replayed_slots")
        return self.inner.pad_replayed_slots(*args, **kwargs)


def spec_example() -> Step:
    """SPEC §6: P 2, W = Wr = 4, R 16, 10 tokens at positions 16..25, slot = 100 + p;
    group 0 cacheable, group 1 a window group (slot = 1000 + p)."""
    slots = torch.stack([torch.arange(116, 126), torch.arange(1016, 1026)]).to(torch.int64)
    return Step(2, [10], [16], [True], [16], 4, slots, torch.tensor([0], dtype=torch.int32))


SPEC_EXAMPLE_AFTER = [PAD, PAD, PAD, 125, PAD, PAD, PAD, 120, 121, 122, 123, 124]


def long_example(P: int = 2) -> Step:
    """SPEC §6: W 128, hit 1024 (R 896), 2000 tokens from position 896; plus a decode that
    replayed long ago and a fresh prefill. With P 2 rank 1 holds no replayed position."""
    q, nc, pre, R = [2000, 1, 37], [896, 5000, 0], [True, False, True], [896, 700, 0]
    T = sum(q)
    slots = torch.stack([torch.arange(T) * 3 + 11, torch.arange(T) * 5 + 2, torch.arange(T) + 9]).to(torch.int64)
    return Step(P, q, nc, pre, R, 128, slots, torch.tensor([0, 2], dtype=torch.int32))
