"""Serving-like steps the ops' own facts draw on: random valid batches for their test cases
(``OpSpec.case``) and the small fixed step of their warmup calls (``OpSpec.warmup``).

A :class:`Batch` looks like a serving step (decodes, speculative decodes, cold, chunked and
replaying prefills whose replay start is or is not block-aligned, graph-capture dummies, padded
token columns), so every variant of every op is compared with the reference on the same kind of
data.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..types import INDEX_DTYPE, PAD, SLOT_DTYPE, ReplayPlan
from .plan_replay_batch import plan_replay_batch  # the public host op: validated while validation is on

POISON_INT = -7  # never a valid slot, index or length: shows unwritten outputs


@dataclass
class Batch:
    """One serving-like step on the host (numpy) with its torch tensors built on demand."""

    q: np.ndarray  # [B] query lengths
    seq: np.ndarray  # [B] KV lengths after the step
    R: np.ndarray  # [B] replay starts (0: none)
    prefilling: np.ndarray  # [B] bool
    W: int
    Wr: int
    block_size: int
    num_padded: int  # extra token columns past query_start_loc[B]
    num_groups: int
    cacheable: np.ndarray  # group ids
    block_table: np.ndarray  # [B, max_blocks] int32 (distinct block ids per request)
    slots: np.ndarray  # [G, T_padded] int64 (token slots per group, PAD past the batch)
    extra: dict = field(default_factory=dict)

    @property
    def B(self) -> int:
        return len(self.q)

    @property
    def qsl(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.q)]).astype(np.int32)

    @property
    def T(self) -> int:
        return int(self.q.sum())

    @property
    def positions(self) -> np.ndarray:
        if self.B == 0:
            return np.zeros(0, np.int64)
        return np.concatenate([np.arange(s - q, s) for q, s in zip(self.q, self.seq)]).astype(np.int64)

    def tensors(self, device) -> dict[str, torch.Tensor]:
        d = torch.device(device)
        T_pad = self.T + self.num_padded
        pos = np.zeros(T_pad, np.int64)
        pos[: self.T] = self.positions
        return {
            "query_start_loc": torch.tensor(self.qsl, dtype=INDEX_DTYPE, device=d),
            "seq_lens": torch.tensor(self.seq, dtype=INDEX_DTYPE, device=d),
            "replay_start": torch.tensor(self.R, dtype=INDEX_DTYPE, device=d),
            "positions": torch.tensor(pos, dtype=SLOT_DTYPE, device=d),
            "slot_mappings": torch.tensor(self.slots, dtype=SLOT_DTYPE, device=d),
            "cacheable_groups": torch.tensor(self.cacheable, dtype=INDEX_DTYPE, device=d),
            "block_table": torch.tensor(self.block_table, dtype=INDEX_DTYPE, device=d),
            "is_prefilling": torch.tensor(self.prefilling, dtype=torch.bool, device=d),
        }


def random_batch(rng: np.random.Generator, *, max_reqs: int = 6, max_q: int = 48, W: int | None = None,
                 block_size: int | None = None, num_groups: int | None = None, max_padded: int = 5,
                 long_prefill: bool = False) -> Batch:
    """A random valid step. Request kinds: decode (q 1), speculative decode (q 2-4: verification
    rows), cold prefill, chunked prefill, replaying prefill (``R = hit - Wr > 0``, its chunk
    starting at or after ``R``), with replay starts on and off block boundaries, a prefill
    restarted in place (its replay start stale: above its chunk's first position, SPEC §0) and,
    rarely, a graph-capture dummy (its block-table row all the null block, 0); some padded
    token columns at the end. ``long_prefill``: at least one request is a prefill longer than
    W (something trims)."""
    W = W if W is not None else int(rng.choice([1, 3, 8, 16, 32, 128]))
    Wr = W
    bs = block_size if block_size is not None else int(rng.choice([1, 4, 16, 64]))
    G = num_groups if num_groups is not None else int(rng.integers(1, 6))
    B = int(rng.integers(1 if long_prefill else 0, max_reqs + 1))
    forced = int(rng.integers(0, B)) if long_prefill else -1
    q, seq, R, pre, dummies = [], [], [], [], []
    for i in range(B):
        kind = rng.choice(["decode", "spec", "cold", "chunk", "replay", "replay_aligned", "restarted"],
                          p=[0.16, 0.1, 0.16, 0.16, 0.16, 0.16, 0.1])
        if i == forced and kind in ("decode", "spec"):
            kind = "cold"
        if rng.random() < 0.08:
            dummies.append(i)
        if kind == "decode":
            qi, prefix, Ri, p = 1, int(rng.integers(0, 4 * W + 8)), 0, False
        elif kind == "spec":
            qi, prefix, Ri, p = int(rng.integers(2, 5)), int(rng.integers(0, 4 * W + 8)), 0, False
        elif kind == "restarted":  # recomputes from an earlier position, its old replay start kept
            prefix = int(rng.integers(0, 2 * W + 4))
            qi, Ri, p = int(rng.integers(1, max_q + 1)), prefix + int(rng.integers(1, W + 8)), True
        elif kind == "cold":
            qi, prefix, Ri, p = int(rng.integers(1, max_q + 1)), 0, 0, True
        elif kind == "chunk":
            qi, prefix, Ri, p = int(rng.integers(1, max_q + 1)), int(rng.integers(1, 3 * W + 8)), 0, True
        else:
            hit = int(rng.integers(Wr + 1, 3 * Wr + 2 * bs + 2))
            if kind == "replay_aligned":
                hit = max(Wr + bs, hit - hit % bs)
            Ri = hit - min(Wr, hit)
            # the chunk starts at R (first replay chunk) or later inside/after the replayed range
            prefix = Ri if rng.random() < 0.5 else Ri + int(rng.integers(0, Wr + 4))
            qi, p = int(rng.integers(1, max_q + 1)), True
        if i == forced:
            qi = W + int(rng.integers(1, max(2, min(max_q, 3 * W))))
        q.append(qi)
        seq.append(prefix + qi)
        R.append(Ri)
        pre.append(p)
    q_a = np.array(q, np.int64)
    seq_a = np.array(seq, np.int64)
    max_blocks = int(math.ceil(max(seq_a.max() if B else 1, 1) / bs)) + int(rng.integers(0, 3))
    pool = rng.permutation(B * max_blocks + 8)[: B * max_blocks].reshape(B, max_blocks) if B else np.zeros((0, max_blocks))
    pool[dummies] = 0  # the shared null block
    T = int(q_a.sum())
    npad = int(rng.integers(0, max_padded + 1))
    slots = np.full((G, T + npad), PAD, np.int64)
    positions = np.concatenate([np.arange(s - a, s) for a, s in zip(q_a, seq_a)]) if B else np.zeros(0, np.int64)
    req = np.repeat(np.arange(B), q_a) if B else np.zeros(0, np.int64)
    for g in range(G):
        scale = int(rng.integers(1, 4))
        slots[g, :T] = (pool[req, positions // bs].astype(np.int64) * bs + positions % bs) * scale + g
    cacheable = np.sort(rng.choice(G, size=int(rng.integers(0, G + 1)), replace=False)).astype(np.int32)
    return Batch(q_a, seq_a, np.array(R, np.int64), np.array(pre, bool), W, Wr, bs, npad, G, cacheable,
                 pool.astype(np.int32), slots)


def host_plan(rng: np.random.Generator, b: Batch, keeps: np.ndarray) -> ReplayPlan:
    """A trimming plan for batch ``b`` (its tensors the device's view), made from the host's
    ``query_start_loc``: the same as the device's, or, two times in five when ``b`` has decodes,
    one where adaptive verification resized them on the device alone (the host counts each
    decode at 1-4 rows, SPEC §3.2). Padded to the graph size half the time; always large
    enough for the device's kept rows. A batch with nothing to trim gets a plan that keeps every
    row (``ReplayPlan.from_kept``: ``plan_replay_batch`` plans none)."""
    pre = b.prefilling
    host_q = b.q.copy()
    if (~pre).any() and rng.random() < 0.4:
        host_q[~pre] = rng.integers(1, 5, int((~pre).sum()))
    host_qsl = np.concatenate([[0], np.cumsum(host_q)]).astype(np.int64)
    kept = np.where(pre & ~keeps, np.minimum(host_q, b.W), host_q)
    n_host, n_dev = int(kept.sum()), int(kept.sum() - host_q[~pre].sum() + b.q[~pre].sum())
    pad_to = max(n_host, n_dev) + (0 if n_dev <= n_host and rng.random() < 0.5 else int(rng.integers(0, 9)))
    pad_to = max(pad_to, 1)  # (graph sizes start at 1: a batch of no request)
    plan = plan_replay_batch(host_qsl, pre, keeps, b.W, pad_to=pad_to, trim_threshold=0)
    if plan is None:  # nothing trims (no prefill longer than W): an engine's own plan that keeps every row
        plan = ReplayPlan.from_kept(kept.astype(np.int32), host_qsl, pad_to, b.W, is_prefilling=pre)
    return plan


def random_topk(d: "CaseDraw") -> tuple[torch.Tensor, torch.Tensor]:
    """Random top-k slots (width 0, 1, 5 or 16, PAD among them) with random lengths, one row per
    token of the case's batch: the layout ops' top-k input."""
    b, rng, dev = d.batch, d.rng, d.device
    K = int(rng.choice([0, 1, 5, 16]))
    topk = torch.tensor(rng.integers(-1, 1000, size=(b.T, K)), dtype=INDEX_DTYPE, device=dev)
    topk_lens = torch.tensor(rng.integers(0, K + 1, size=b.T), dtype=INDEX_DTYPE, device=dev)
    return topk, topk_lens


def poisoned(shape, dtype, device) -> torch.Tensor:
    """An ``out=`` buffer filled with a value no output may keep."""
    return torch.full(shape, POISON_INT, dtype=dtype, device=device)


@dataclass
class CaseDraw:
    """What an op's ``case`` draws its arguments from: ``rng`` (continue drawing from it),
    ``device``, ``batch`` (a random step drawn for this case, or the caller's), ``given`` (the
    caller's step, None when drawn here: an op that needs a particular kind of step draws its
    own then), ``poison`` (pass ``out=`` buffers filled with :data:`POISON_INT`), ``exact_out``
    (never longer ``out=`` buffers than the op writes, where it allows longer ones)."""

    rng: np.random.Generator
    device: torch.device
    batch: Batch
    given: Batch | None = None
    poison: bool = False
    exact_out: bool = False

    @functools.cached_property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The batch's tensors on the device (made once per case)."""
        return self.batch.tensors(self.device)

    def out(self, shape, dtype) -> torch.Tensor:
        """A poisoned ``out=`` buffer on the device."""
        return poisoned(shape, dtype, self.device)


class WarmupStep:
    """A small serving step for the ops' ``warmup`` calls: a decode, a replaying prefill (R > 0, not
    block aligned), a cold prefill longer than W (it trims), a chunked prefill; three padded token
    columns; with the model's settings the calls cover (``kernels.warmup.warmup`` documents them)."""

    def __init__(self, dev, W: int = 128, block_size: int = 64, num_groups: int = 5, index_width: int | None = None,
                 compress_ratios=(4, 128), top_k: int = 512, hidden_sizes=(7168,), hidden_dtypes=(torch.bfloat16,),
                 index_dtypes=(torch.int32, torch.int64)):
        bs, G = block_size, num_groups
        self.device = dev
        self.W, self.block_size, self.num_groups = W, block_size, num_groups
        self.width = W if index_width is None else index_width
        self.compress_ratios, self.top_k = tuple(compress_ratios), top_k
        self.hidden_sizes, self.hidden_dtypes = tuple(hidden_sizes), tuple(hidden_dtypes)
        self.index_dtypes = tuple(index_dtypes)
        q = np.array([1, W // 2 + 3, W + 5, 7])
        R = np.array([0, W + 3, 0, 0])
        prefix = np.array([3 * W + 1, W + 3, 0, 2 * W])
        seq = prefix + q
        self.B, self.T, self.T_pad = len(q), int(q.sum()), int(q.sum()) + 3
        self.qsl_host = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
        self.prefilling_host = np.array([False, True, True, True])
        kept = np.where(self.prefilling_host, np.minimum(q, W), q)
        self.n_kept = int(kept.sum())
        n_blocks = int(-(-seq.max() // bs)) + 1
        table = np.arange(self.B * n_blocks, dtype=np.int32).reshape(self.B, n_blocks)[:, ::-1].copy()
        pos = np.zeros(self.T_pad, np.int64)
        pos[: self.T] = np.concatenate([np.arange(s - a, s) for a, s in zip(q, seq)])
        req = np.repeat(np.arange(self.B), q)
        token_slots = table[req, pos[: self.T] // bs].astype(np.int64) * bs + pos[: self.T] % bs
        slots = np.full((G, self.T_pad), PAD, np.int64)
        slots[:, : self.T] = token_slots[None, :] * (np.arange(G)[:, None] + 1)
        t = lambda a, dt: torch.tensor(a, dtype=dt, device=dev)  # noqa: E731
        self.qsl = t(self.qsl_host, INDEX_DTYPE)
        self.seq = t(seq, INDEX_DTYPE)
        self.R = t(R, INDEX_DTYPE)
        self.positions = t(pos, SLOT_DTYPE)
        self.slots = t(slots, SLOT_DTYPE)
        self.cacheable = t(np.arange(0, G, 2), INDEX_DTYPE)
        self.block_table = t(table, INDEX_DTYPE)
        self.prefilling = t(self.prefilling_host, torch.bool)
        self.valid = t(np.arange(self.T_pad) % 5 != 4, torch.bool)
        self.idx = t(np.array([2, 0, 3, 1]), INDEX_DTYPE)
        R_all = np.zeros(4, np.int64)
        R_all[[2, 0, 3, 1]] = R
        self.R_all = t(R_all, INDEX_DTYPE)
        back = np.minimum(np.maximum(prefix - R, 0), W - 1)
        self.gather_lens = q + back

    @functools.cached_property
    def plan(self) -> ReplayPlan:
        """A trimming plan of the step, padded three rows past its kept rows."""
        return plan_replay_batch(self.qsl_host, self.prefilling_host, np.zeros(self.B, bool), self.W,
                                 pad_to=self.n_kept + 3, trim_threshold=0)

    @functools.cached_property
    def topk(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Random top-k slots (PAD among them) and lengths for the combined and mixed layouts."""
        topk = torch.randint(-1, 64, (self.T, self.top_k), dtype=INDEX_DTYPE, device=self.device)
        lens = torch.randint(0, self.top_k + 1, (self.T,), dtype=INDEX_DTYPE, device=self.device)
        return topk, lens
