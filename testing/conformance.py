"""Random valid inputs for every op, and the comparison with the reference.

Used by ``swa-backends check``, the matrix runner and the test-suite: one generator of
batches that look like serving steps (decodes, cold prefills, chunked prefills, replaying
prefills whose replay start is or is not block-aligned), so every variant is compared
with the reference on the same kind of data.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..common.ops import OPS, plan_replay_batch
from ..common.types import INDEX_DTYPE, PAD, SLOT_DTYPE, ReplayBatch, ReplayPlan

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


# ---------------------------------------------------------------------------------------
# one case per op: (args, kwargs) on a device, from a batch
# ---------------------------------------------------------------------------------------

Case = tuple[tuple, dict]


def _poison(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, POISON_INT, dtype=dtype, device=device)


def case_for(op: str, rng: np.random.Generator, device, *, batch: Batch | None = None, poison: bool | None = None,
             exact_out: bool = False) -> Case:
    """Random valid arguments for ``op`` on ``device`` (``poison``: pass out= buffers
    filled with a value no output may keep; default: half the time; ``exact_out``: never
    longer than the op writes, where an op allows longer ones)."""
    b = batch if batch is not None else random_batch(rng)
    t = b.tensors(device)
    dev = torch.device(device)
    poison = bool(rng.random() < 0.5) if poison is None else poison
    T = b.T
    if op == "batch_replay_start":
        n_req = b.B + int(rng.integers(0, 4))
        R_all = torch.tensor(rng.integers(0, 500, n_req), dtype=torch.int32, device=dev)
        idx = torch.tensor(rng.permutation(n_req)[: b.B], dtype=torch.int32, device=dev)
        kw = {"out": _poison((b.B,), INDEX_DTYPE, dev)} if poison else {}
        return (R_all, idx, t["is_prefilling"]), kw
    if op == "pad_replayed_slots":
        any_replay = None if rng.random() < 0.7 else bool((b.R > 0).any())
        return (t["slot_mappings"], t["cacheable_groups"], t["query_start_loc"], t["positions"][:T],
                t["replay_start"], b.Wr), {"any_replay": any_replay}
    if op == "compressed_slot_mapping":
        ratio = int(rng.choice([d for d in (1, 2, 4, 8, 16, 128) if b.block_size % d == 0]))
        tok = t["slot_mappings"][0, :T].clone()
        if T:
            tok[torch.tensor(rng.random(T) < 0.2, device=dev)] = PAD
        kw = {"out": _poison((T,), SLOT_DTYPE, dev)} if poison else {}
        return (tok, t["query_start_loc"], t["seq_lens"], t["block_table"], b.block_size, ratio), kw
    if op == "swa_indices_and_lens":
        width = b.W + int(rng.integers(0, 3))
        n_tok = T + b.num_padded
        kw: dict = {"index_width": width, "num_tokens": n_tok}
        if rng.random() < 0.3:  # a window of the batch's tokens (vLLM's decode or prefill rows)
            off = int(rng.integers(0, n_tok + 1))
            n_tok -= off
            kw.update(num_tokens=n_tok, token_offset=off)
        if rng.random() < 0.3:
            kw["valid"] = torch.tensor(rng.random(n_tok) < 0.8, device=dev)
        if poison:
            kw["out"] = (_poison((n_tok, width), INDEX_DTYPE, dev), _poison((n_tok,), INDEX_DTYPE, dev))
        return (t["query_start_loc"], t["seq_lens"], t["block_table"], b.block_size, b.W, t["replay_start"]), kw
    if op == "prefill_gather_lens":
        lo, hi = 0, b.B
        if b.B and rng.random() < 0.3:  # a slice of the requests (vLLM's prefills), qsl not from 0
            lo = int(rng.integers(0, b.B + 1))
            hi = int(rng.integers(lo, b.B + 1))
        kw = {"out": _poison((hi - lo,), INDEX_DTYPE, dev)} if poison else {}
        return (t["query_start_loc"][lo: hi + 1], t["seq_lens"][lo:hi], t["replay_start"][lo:hi], b.W), kw
    if op == "combined_indices":
        ratio = int(rng.choice([0, 4, 128]))
        top_k = int(rng.choice([0, 4, 16, 64]))
        N = int(rng.integers(1, 80))
        gl = OPS["prefill_gather_lens"].reference(t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W)
        M = N + max(1, int(gl.max()) if b.B else 0) + int(rng.integers(0, 5))
        topk = torch.tensor(rng.integers(-1, N + 6, size=(T, top_k + int(rng.integers(0, 3)))), dtype=INDEX_DTYPE, device=dev)
        kw = {}
        if rng.random() < 0.3:
            kw["valid"] = torch.tensor(rng.random(T) < 0.8, device=dev)
        if poison:
            from ..common.ops.combined_indices import combined_width

            w = combined_width(top_k, b.W)
            kw["out"] = (_poison((T, w), INDEX_DTYPE, dev), _poison((T,), INDEX_DTYPE, dev))
        return (topk, t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W, ratio, top_k, M, N), kw
    if op in ("mixed_indices", "plain_indices"):
        swa, lens = OPS["swa_indices_and_lens"].reference(t["query_start_loc"], t["seq_lens"], t["block_table"],
                                                         b.block_size, b.W, t["replay_start"], num_tokens=T)
        K = int(rng.choice([0, 1, 5, 16]))
        topk = torch.tensor(rng.integers(-1, 1000, size=(T, K)), dtype=INDEX_DTYPE, device=dev)
        tl = torch.tensor(rng.integers(0, K + 1, size=T), dtype=INDEX_DTYPE, device=dev)
        if op == "mixed_indices":
            from ..common.ops.mixed_indices import mixed_width

            kw = {"out": (_poison((T, mixed_width(b.W, K)), INDEX_DTYPE, dev), _poison((T,), INDEX_DTYPE, dev))} if poison else {}
            return (swa, topk, tl), kw
        kw = {"topk_offset": int(rng.integers(0, 50)), "window_offset": int(rng.integers(0, 50))}
        if poison:
            kw["out"] = (_poison((T, K + b.W), INDEX_DTYPE, dev), _poison((T,), INDEX_DTYPE, dev))
        if K == 0 and rng.random() < 0.5:
            return (swa, lens), kw
        return (swa, lens, topk, tl), kw
    if op == "indices_to_csr":
        Tn, K = int(rng.integers(0, 40)), int(rng.integers(1, 70))
        idx = torch.tensor(rng.integers(-1, 5000, size=(Tn, K)), dtype=INDEX_DTYPE, device=dev)
        idx[torch.tensor(rng.random((Tn, K)) < 0.3, device=dev)] = PAD
        lens = torch.tensor(rng.integers(0, K + 1, size=Tn), dtype=INDEX_DTYPE, device=dev)
        kw = {"out": (_poison((Tn + 1,), INDEX_DTYPE, dev), _poison((Tn * K,), INDEX_DTYPE, dev))} if poison else {}
        return (idx, lens), kw
    if op == "sparse_mla":
        # one call in four reads a paged record cache (every format and flavour), one in five
        # asks for no lse
        if rng.random() < 0.25:
            args, kw = sparse_mla_record_case(rng, dev)
        else:
            args, kw = sparse_mla_case(rng, dev)
        if rng.random() < 0.2:
            kw["return_lse"] = False
        return args, kw
    if op == "gather_replay_batch":
        if batch is None:
            b = random_batch(rng, long_prefill=True)
            t = b.tensors(device)
        pre = b.prefilling
        keeps = rng.random(b.B) < 0.2
        long = np.flatnonzero(pre & (b.q > b.W))
        keeps[long[0]] = False  # something trims
        plan = host_plan(rng, b, keeps)
        kw = {}
        if poison:
            from ..common.ops.gather_replay_batch import out_shapes

            kw["out"] = {k: _poison(s, d, dev) for k, (s, d) in out_shapes(plan, b.num_groups).items()}
        return (plan, t["query_start_loc"], t["seq_lens"], t["replay_start"], t["positions"], t["slot_mappings"], b.W), kw
    if op in ("gather_rows", "scatter_rows"):
        return rows_case(op, rng, dev, poison=poison)
    if op == "prepare_replay_step":
        return prepare_case(rng, dev, batch=batch, poison=poison, exact_out=exact_out)
    raise KeyError(op)


def host_plan(rng: np.random.Generator, b: Batch, keeps: np.ndarray) -> ReplayPlan:
    """A trimming plan for batch ``b`` (its tensors the device's view), made from the host's
    ``query_start_loc``: the same as the device's, or, two times in five when ``b`` has decodes,
    one where adaptive verification resized them on the device alone (the host counts each
    decode at 1-4 rows, SPEC §3.2). Padded to the graph size half the time; always large
    enough for the device's kept rows."""
    pre = b.prefilling
    host_q = b.q.copy()
    if (~pre).any() and rng.random() < 0.4:
        host_q[~pre] = rng.integers(1, 5, int((~pre).sum()))
    host_qsl = np.concatenate([[0], np.cumsum(host_q)]).astype(np.int64)
    kept = np.where(pre & ~keeps, np.minimum(host_q, b.W), host_q)
    n_host, n_dev = int(kept.sum()), int(kept.sum() - host_q[~pre].sum() + b.q[~pre].sum())
    pad_to = max(n_host, n_dev) + (0 if n_dev <= n_host and rng.random() < 0.5 else int(rng.integers(0, 9)))
    return plan_replay_batch(host_qsl, pre, keeps, b.W, pad_to=pad_to, trim_threshold=0)


def prepare_case(rng: np.random.Generator, dev, *, batch: Batch | None = None, poison: bool = False,
                 exact_out: bool = False) -> Case:
    """A step for ``prepare_replay_step``: per-request replay starts mapped so the batch rows
    get ``batch.R``, a trimming plan half the time; poisoned ``out=`` buffers longer than the
    step half the time unless ``exact_out``."""
    from ..common.ops.prepare_replay_step import LEADING_ROWS, out_shapes

    with_plan = rng.random() < 0.5
    b = batch if batch is not None else random_batch(rng, long_prefill=with_plan)
    with_plan = with_plan and bool((b.prefilling & (b.q > b.W)).any())
    t = b.tensors(dev)
    n_req = b.B + int(rng.integers(0, 4))
    idx = rng.permutation(n_req)[: b.B]
    R_all = rng.integers(0, 500, n_req)
    R_all[idx] = np.where(b.prefilling, b.R, rng.integers(0, 500, b.B))  # decode rows: ignored (not prefilling)
    T = b.T + b.num_padded
    width = b.W + int(rng.integers(0, 3))
    plan = None
    if with_plan:
        keeps = rng.random(b.B) < 0.2
        keeps[np.flatnonzero(b.prefilling & (b.q > b.W))[0]] = False
        plan = host_plan(rng, b, keeps)
    kw: dict = {"index_width": width, "plan": plan}
    if rng.random() < 0.3:
        kw["any_replay"] = bool((b.R > 0).any())
    if rng.random() < 0.5:  # the serving layout (vLLM's builder): decode / prefill rows apart, gather lengths
        kw["prefill_from"] = int(rng.integers(0, T + 1))
        kw["gather_lens_from"] = int(rng.integers(0, b.B + 1))
        window_groups = sorted(set(range(b.num_groups)) - {int(g) for g in b.cacheable})
        if window_groups and rng.random() < 0.7:
            g = int(rng.choice(window_groups))
            kw["valid_group"] = g
            invalid = rng.random(T) < 0.15  # tokens with no slot in the window group (PCP peers, padding)
            t["slot_mappings"][g, :T][torch.tensor(invalid, device=dev)] = PAD
    if poison:
        longer = rng.random() < 0.5 and not exact_out  # persistent buffers (SPEC §3.6): rows past the step's

        def fill(spec, key=None):
            if isinstance(spec, dict):
                return {k: fill(v, k) for k, v in spec.items()}
            shape = spec[0]
            if longer and key in LEADING_ROWS:
                shape = (shape[0] + int(rng.integers(1, 6)), *shape[1:])
            return _poison(shape, spec[1], dev)

        kw["out"] = fill(out_shapes(b.B, T, width, plan, b.num_groups, prefill_from=kw.get("prefill_from"),
                                    gather_lens_from=kw.get("gather_lens_from")))
    args = (torch.tensor(R_all, dtype=INDEX_DTYPE if rng.random() < 0.5 else torch.int64, device=dev),
            torch.tensor(idx, dtype=INDEX_DTYPE, device=dev), t["is_prefilling"], t["query_start_loc"], t["seq_lens"],
            t["positions"], t["slot_mappings"], t["cacheable_groups"], t["block_table"], b.block_size, b.W, b.Wr)
    return args, kw


def sparse_mla_case(rng: np.random.Generator, dev, *, T: int | None = None, H: int | None = None, D: int | None = None,
                    d_v: int | None = None, K: int | None = None, S: int | None = None,
                    dtype: torch.dtype | None = None) -> Case:
    """Random q/kv (never zeros), indices with PAD holes inside and past the length,
    tokens with nothing to read, optional sink."""
    T = T if T is not None else int(rng.integers(0, 12))
    H = H if H is not None else int(rng.choice([1, 2, 3, 8]))
    D = D if D is not None else int(rng.choice([16, 32, 48, 64]))
    d_v = d_v if d_v is not None else int(rng.choice([d for d in (16, 32, D) if d <= D]))
    K = K if K is not None else int(rng.integers(1, 70))
    S = S if S is not None else int(rng.integers(1, 300))
    dtype = dtype if dtype is not None else (torch.bfloat16 if rng.random() < 0.6 else torch.float16)
    g = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    q = torch.randn(T, H, D, generator=g).to(dtype).to(dev)
    kv = torch.randn(S, D, generator=g).to(dtype).to(dev)
    idx = torch.tensor(rng.integers(0, S, size=(T, K)), dtype=INDEX_DTYPE)
    idx[torch.tensor(rng.random((T, K)) < 0.15)] = PAD
    lens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=INDEX_DTYPE)
    if T:
        lens[torch.tensor(rng.random(T) < 0.1)] = 0
    kw = {}
    if rng.random() < 0.4:
        kw["sink"] = torch.randn(H, generator=g).to(dev)
    return (q, kv, idx.to(dev), lens.to(dev), float(1.0 / math.sqrt(D)), d_v), kw


def sparse_mla_record_case(rng: np.random.Generator, dev, *, kv_format: str | None = None, fp8: str | None = None,
                           T: int | None = None, H: int | None = None, K: int | None = None,
                           block_size: int | None = None, num_blocks: int | None = None,
                           block_stride: int | None = None, sink: bool | None = None, scale: float = 1.0) -> Case:
    """A ``sparse_mla`` call on a paged record cache (``_records``): random rows written as
    ``kv_format`` records with vLLM's quantizer into a cache whose every other byte is random
    garbage (page padding, block stride past the page), indices of slots with PAD holes inside
    and past the length, tokens with nothing to read, optional sink. D_qk = d_v = 512, q bf16."""
    from ..common.ops import _records

    fmt = _records.FORMATS[kv_format if kv_format is not None else str(rng.choice(list(_records.FORMATS)))]
    fp8 = fp8 if fp8 is not None else str(rng.choice(fmt.fp8_flavours))
    T = T if T is not None else int(rng.integers(0, 6))
    H = H if H is not None else int(rng.choice([1, 2, 3, 8]))
    K = K if K is not None else int(rng.integers(1, 50))
    bs = block_size if block_size is not None else int(rng.choice([1, 4, 16, 64]))
    nb = num_blocks if num_blocks is not None else int(rng.integers(1, 5)) + 64 // bs
    page = bs * fmt.record_bytes
    stride = block_stride if block_stride is not None else page + int(rng.choice([0, 0, 64, 576, 1000]))
    g = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    buf = torch.randint(0, 256, (nb, stride), generator=g, dtype=torch.uint8)  # garbage, not zeros
    kv = buf.as_strided((nb, bs, fmt.record_bytes), (stride, fmt.record_bytes, 1))
    S = nb * bs
    rows = (torch.randn(S, _records.HEAD_DIM, generator=g) * scale).to(torch.bfloat16)
    _records.write(kv, rows, torch.arange(S), fmt.name, fp8)
    q = torch.randn(T, H, _records.HEAD_DIM, generator=g).to(torch.bfloat16)
    idx = torch.tensor(rng.integers(0, S, size=(T, K)), dtype=INDEX_DTYPE)
    idx[torch.tensor(rng.random((T, K)) < 0.15)] = PAD
    lens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=INDEX_DTYPE)
    if T:
        lens[torch.tensor(rng.random(T) < 0.1)] = 0
    kw: dict = {"kv_format": fmt.name}
    if not fmt.fp8_fixed or rng.random() < 0.5:
        kw["fp8"] = fp8
    if sink if sink is not None else rng.random() < 0.4:
        kw["sink"] = torch.randn(H, generator=g).to(dev)
    buf = buf.to(dev)
    kv = buf.as_strided((nb, bs, fmt.record_bytes), (stride, fmt.record_bytes, 1))
    return (q.to(dev), kv, idx.to(dev), lens.to(dev), float(1.0 / math.sqrt(_records.HEAD_DIM)),
            _records.HEAD_DIM), kw


def rows_case(op: str, rng: np.random.Generator, dev, *, poison: bool = False) -> Case:
    N = int(rng.integers(1, 60))
    trailing = [(), (3,), (7,), (2, 5), (33,)][int(rng.integers(0, 5))]
    dtype = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8][int(rng.integers(0, 5))]
    n = int(rng.integers(0, N + 1))
    rows = torch.tensor(np.sort(rng.choice(N, size=n, replace=False)), dtype=SLOT_DTYPE, device=dev)
    g = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    if op == "gather_rows":
        x = (torch.randn(N, *trailing, generator=g) * 50).to(dtype).to(dev)
        kw = {"out": torch.full((n, *trailing), 77, dtype=dtype, device=dev)} if poison else {}
        return (x, rows), kw
    y = (torch.randn(n, *trailing, generator=g) * 50).to(dtype).to(dev)
    kw = {"out": torch.full((N, *trailing), 77, dtype=dtype, device=dev)} if poison else {}
    return (y, rows, N), kw


# ---------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------


def to_device(obj, device):
    """Deep copy of a case's arguments onto ``device`` (tensors cloned)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(device, copy=True)
    if isinstance(obj, tuple):
        return tuple(to_device(o, device) for o in obj)
    if isinstance(obj, list):
        return [to_device(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def mismatch(op: str, got, want, *, rtol: float = 1e-2) -> str | None:
    """None when ``got`` (any device) equals the reference result ``want``: exact for every
    integer/data-movement op, ``||got - want|| / ||want|| <= rtol`` (and identical -inf lse,
    no NaN) for ``sparse_mla``."""
    if op == "sparse_mla":
        (o, l), (wo, wl) = got, want
        if wl is None or l is None:  # return_lse=False: (out, None)
            if l is not None or wl is not None:
                return f"lse {'None' if l is None else 'a tensor'}, expected {'None' if wl is None else 'a tensor'}"
            l, wl = torch.zeros(o.shape[:2]), torch.zeros(wo.shape[:2])
        o, l = o.float().cpu(), l.float().cpu()
        wo, wl = wo.float().cpu(), wl.float().cpu()
        if o.shape != wo.shape or l.shape != wl.shape:
            return f"shape {tuple(o.shape)}/{tuple(l.shape)} != {tuple(wo.shape)}/{tuple(wl.shape)}"
        if torch.isnan(o).any() or torch.isnan(l).any():
            return "NaN in the output"
        if not torch.equal(torch.isneginf(l), torch.isneginf(wl)):
            return "lse = -inf at different tokens"
        fin = torch.isfinite(wl)
        err_o = (o - wo).norm() / wo.norm().clamp_min(1e-6)
        err_l = (l[fin] - wl[fin]).abs().max().item() if fin.any() else 0.0
        if err_o > rtol or err_l > rtol * 10:
            return f"relative error {float(err_o):.3g} (out), max |dlse| {err_l:.3g}"
        return None
    if isinstance(want, ReplayBatch):
        for f in ("num_rows", "num_rows_padded"):
            if getattr(got, f) != getattr(want, f):
                return f"{f}: {getattr(got, f)} != {getattr(want, f)}"
        for f in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start"):
            why = mismatch(op, getattr(got, f), getattr(want, f))
            if why:
                return f"{f}: {why}"
        return None
    if isinstance(want, tuple):
        if not isinstance(got, tuple) or len(got) != len(want):
            return f"expected a tuple of {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            why = mismatch(op, g, w)
            if why:
                return f"[{i}]: {why}"
        return None
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"expected a tensor, got {type(got).__name__}"
        g, w = got.detach().cpu(), want.detach().cpu()
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"{g.dtype}{tuple(g.shape)} != {w.dtype}{tuple(w.shape)}"
        if not torch.equal(g, w):
            diff = (g != w) if g.dtype != torch.bool else g ^ w
            where = torch.nonzero(diff)[0].tolist()
            return f"differs at {where}: {g[tuple(where)].item()} != {w[tuple(where)].item()}"
        return None
    return None if got == want else f"{got!r} != {want!r}"


@dataclass(frozen=True)
class Result:
    op: str
    variant: str
    passed: int
    failed: int
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.failed == 0


def run_op(op: str, fn: Callable, args: tuple, kwargs: dict, device) -> tuple[object, object]:
    """Run ``fn`` on a copy of the case on ``device`` and the reference on a CPU copy;
    returns ``(got, want)``. In-place ops return their mutated argument."""
    ref = OPS[op].reference
    got = fn(*to_device(args, device), **to_device(kwargs, device))
    want = ref(*to_device(args, "cpu"), **to_device(kwargs, "cpu"))
    return got, want


def check_backend(backend, *, device, seed: int = 0, cases: int = 20, ops: Iterable[str] | None = None) -> list[Result]:
    """Every op of ``backend`` against the CPU reference on ``cases`` random cases each."""
    results = []
    for op in ops or OPS:
        rng = np.random.default_rng([seed, list(OPS).index(op)])
        fn = getattr(backend, op)
        passed, failed, detail = 0, 0, ""
        for _ in range(cases):
            args, kwargs = case_for(op, rng, "cpu")
            try:
                got, want = run_op(op, fn, args, kwargs, device)
                why = mismatch(op, got, want)
            except Exception as exc:  # a crash is a failure with its message
                why = f"{type(exc).__name__}: {exc}"
            if why:
                failed += 1
                detail = detail or why
            else:
                passed += 1
        results.append(Result(op, "|".join(backend.variants[op]), passed, failed, detail))
    return results
