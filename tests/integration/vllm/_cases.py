"""Mixed serving batches for the vLLM differentials (no vLLM import).

A batch is ordered as vLLM reorders it (decodes first): decodes (speculative rows up to
``1 + spec``), then prefills of every replay shape -- the first chunk after a prefix hit
(``prefix == R``), a later chunk still inside the replayed window, a chunked prefill without
replay, a cold prefill, a long prefill that the decoder side trims -- then optional
padding requests (``q = 0``, FULL-graph padding) and padded token columns (slot PAD).
Several KV-cache groups, each with its own block table; some groups prefix-cacheable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

PAD = -1


@dataclass
class Batch:
    W: int
    block_size: int
    q: np.ndarray  # [B_all] query lengths (padding requests 0)
    prefix: np.ndarray  # [B_all]
    R: np.ndarray  # [B_all] replay starts (prefills only)
    num_decodes: int
    num_reqs: int  # real requests (padding requests excluded)
    num_pad_reqs: int
    T: int
    T_pad: int
    decode_threshold: int
    cacheable: list[int]
    keeps_rows: np.ndarray  # [B_all] prompt-logprob requests
    qsl: torch.Tensor = field(repr=False, default=None)
    seq: torch.Tensor = field(repr=False, default=None)
    R_t: torch.Tensor = field(repr=False, default=None)
    positions: torch.Tensor = field(repr=False, default=None)
    block_tables: list = field(repr=False, default_factory=list)
    slots: torch.Tensor = field(repr=False, default=None)  # [G, T_pad] int64

    @property
    def B_all(self) -> int:
        return self.num_reqs + self.num_pad_reqs

    @property
    def seq_np(self) -> np.ndarray:
        return self.prefix + self.q

    @property
    def qsl_np(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.q)]).astype(np.int32)

    @property
    def is_prefilling(self) -> np.ndarray:
        out = np.zeros(self.B_all, dtype=bool)
        out[self.num_decodes: self.num_reqs] = True
        return out

    @property
    def kept_lens(self) -> np.ndarray:
        """Rows per request the decoder side keeps: vLLM's ``_prepare_replay_batch`` planning
        without PCP (a prefill its last ``W`` rows, unless it keeps every row for prompt
        logprobs; decodes and padding requests all of theirs)."""
        return np.where(self.keeps_rows | ~self.is_prefilling, self.q, np.minimum(self.q, self.W))

    @property
    def num_decode_tokens(self) -> int:
        return int(self.q[: self.num_decodes].sum())


def make_batch(rng: np.random.Generator, *, W: int = 16, block_size: int = 8, groups: int = 3, spec: int = 0,
               num_decodes: int = 3, kinds=("replay", "replay_chunk", "chunked", "cold", "long"), pad_reqs: int = 0,
               pad_tokens: int = 0, keeps_rows_frac: float = 0.0, device="cpu") -> Batch:
    """One mixed batch. ``kinds``: the prefills, in order. ``groups``: KV-cache groups;
    group 1 is a window (non-cacheable) group, the others prefix-cacheable."""
    q, prefix, R = [], [], []
    for _ in range(num_decodes):
        q.append(int(rng.integers(1, spec + 2)))
        prefix.append(int(rng.integers(W + 1, 6 * W)))
        R.append(0)
    for kind in kinds:
        if kind == "replay":  # first chunk after a hit: prefix == R
            r = int(rng.integers(1, 5 * W))
            q.append(int(rng.integers(1, 3 * W)))
            prefix.append(r)
            R.append(r)
        elif kind == "replay_chunk":  # a later chunk, still inside [R, R + W)
            r = int(rng.integers(1, 5 * W))
            q.append(int(rng.integers(1, 2 * W)))
            prefix.append(r + int(rng.integers(1, W)))
            R.append(r)
        elif kind == "chunked":
            q.append(int(rng.integers(1, 3 * W)))
            prefix.append(int(rng.integers(1, 6 * W)))
            R.append(0)
        elif kind == "cold":
            q.append(int(rng.integers(2, 2 * W)))
            prefix.append(0)
            R.append(0)
        elif kind == "long":  # trimmed by the decoder side
            q.append(int(rng.integers(W + 1, 4 * W)))
            prefix.append(int(rng.integers(0, 2 * W)))
            R.append(0)
        elif kind == "single":  # a one-token prefill chunk
            r = int(rng.integers(1, 4 * W))
            q.append(1)
            prefix.append(r)
            R.append(r)
        else:
            raise ValueError(kind)
    num_reqs = len(q)
    keeps = np.zeros(num_reqs + pad_reqs, dtype=bool)
    if keeps_rows_frac:
        keeps[num_decodes:num_reqs] = rng.random(num_reqs - num_decodes) < keeps_rows_frac
    return explicit_batch(q, prefix, R, W=W, block_size=block_size, groups=groups, spec=spec, num_decodes=num_decodes,
                          pad_reqs=pad_reqs, pad_tokens=pad_tokens, keeps=keeps, rng=rng, device=device)


def explicit_batch(q, prefix, R, *, W: int, block_size: int, groups: int = 3, spec: int = 0, num_decodes: int = 0,
                   pad_reqs: int = 0, pad_tokens: int = 0, keeps=None, rng=None, tables=None, device="cpu") -> Batch:
    """The batch of the requests ``q`` / ``prefix`` / ``R`` (decodes first); ``tables``: each
    group's block table ``[B_all, cols]`` (default: random distinct blocks from ``rng``)."""
    num_reqs = len(q)
    q = list(q) + [0] * pad_reqs
    prefix = list(prefix) + [0] * pad_reqs
    R = list(R) + [0] * pad_reqs
    q_np, prefix_np, R_np = (np.array(a, dtype=np.int64) for a in (q, prefix, R))
    T = int(q_np.sum())
    keeps = np.zeros(len(q), dtype=bool) if keeps is None else keeps
    b = Batch(W=W, block_size=block_size, q=q_np, prefix=prefix_np, R=R_np, num_decodes=num_decodes,
              num_reqs=num_reqs, num_pad_reqs=pad_reqs, T=T, T_pad=T + pad_tokens, decode_threshold=1 + spec,
              cacheable=[g for g in range(groups) if g != 1], keeps_rows=keeps)
    dev = torch.device(device)
    seq = prefix_np + q_np
    b.qsl = torch.tensor(b.qsl_np, dtype=torch.int32, device=dev)
    b.seq = torch.tensor(seq, dtype=torch.int32, device=dev)
    b.R_t = torch.tensor(R_np, dtype=torch.int32, device=dev)
    pos = np.zeros(b.T_pad, dtype=np.int64)
    pos[:T] = np.concatenate([np.arange(p, p + n) for p, n in zip(prefix_np, q_np)]) if T else []
    b.positions = torch.tensor(pos, dtype=torch.int64, device=dev)
    req = np.repeat(np.arange(len(q)), q_np)
    cols = int(-(-max(int(seq.max()), 1) // block_size)) + 1
    slots = np.full((groups, b.T_pad), PAD, dtype=np.int64)
    for g in range(groups):
        if tables is not None:
            table = np.asarray(tables[g], dtype=np.int32)
        else:
            table = rng.permutation(len(q) * cols * 2)[: len(q) * cols].reshape(len(q), cols).astype(np.int32)
            table[num_reqs:] = 0
        b.block_tables.append(torch.tensor(table, device=dev))
        slots[g, :T] = table[req, pos[:T] // block_size].astype(np.int64) * block_size + pos[:T] % block_size
    b.slots = torch.tensor(slots, device=dev)
    return b


def mixed_batches(seed: int, *, W: int = 16, block_size: int = 8, device="cpu"):
    """The differential's batch list: every kind, with and without speculative rows,
    graph padding (requests and tokens), a decode-only and a prefill-only batch."""
    rng = np.random.default_rng(seed)
    yield "mixed", make_batch(rng, W=W, block_size=block_size, device=device)
    yield "spec-decode+replay", make_batch(rng, W=W, block_size=block_size, spec=3, num_decodes=4,
                                           kinds=("replay", "single", "long", "replay_chunk"), device=device)
    # a one-token replay chunk right after the decodes: vLLM counts it as a decode (short
    # extends go with the decodes), so decode rows carry R > 0
    yield "short-extend-replay", make_batch(rng, W=W, block_size=block_size, spec=3, num_decodes=2,
                                            kinds=("single", "replay", "long"), device=device)
    yield "graph-padding", make_batch(rng, W=W, block_size=block_size, num_decodes=2, pad_reqs=3, pad_tokens=5,
                                      kinds=("replay", "chunked", "long"), device=device)
    yield "prompt-logprobs", make_batch(rng, W=W, block_size=block_size, num_decodes=1, keeps_rows_frac=0.5,
                                        kinds=("long", "replay", "long", "cold"), device=device)
    yield "decode-only", make_batch(rng, W=W, block_size=block_size, spec=1, num_decodes=5, kinds=(), pad_tokens=3,
                                    device=device)
    yield "prefill-only", make_batch(rng, W=W, block_size=block_size, num_decodes=0, groups=4,
                                     kinds=("long", "replay", "replay", "cold", "chunked"), device=device)
    yield "block-32-W-128", make_batch(rng, W=128, block_size=32, num_decodes=2, spec=1,
                                       kinds=("replay", "long", "replay_chunk"), device=device)
