"""``pcp_partition`` (SPEC §6): one rank's share of a batch under prefill context parallelism.

With PCP of size ``P`` every prefill of ``q`` tokens is cut into ``2P`` chunks of
``c = ceil(q / 2P)`` tokens (chunk ``k`` = query offsets ``[k*c, min((k+1)*c, q))``, empty
trailing chunks dropped); rank ``r`` holds chunks ``r`` and ``2P-1-r`` (each one *local
row*), which balances causal-attention work across ranks. Decodes are replicated: every
rank holds the whole decode row. Rows keep batch order (a request's chunk ``r`` before its
chunk ``2P-1-r``) except that a row starting its request at absolute position 0 (a fresh
prefill's head, always on rank 0) moves after the others. Every rank pads its tokens to
the largest rank's count ``padded``; the gathered (published) layout is rank-major:
column ``r * padded + i`` is rank ``r``'s local token ``i``, and padding columns and, on
ranks > 0, replicated decode rows are PAD (each decode is published once, by rank 0).

Decodes are identified by ``is_prefilling`` (the flag SPEC §2.1's ``batch_replay_start``
reads, so the partition and the replay-start staging agree by construction). It is
optional: without it a row is a decode when ``q == 1 and num_computed > 0``. That guess
is wrong for a one-token *prefill* chunk (the tail of a chunked prefill), which would be
replicated instead of split and lose its replay start; pass the runner's flag (vLLM's
``is_prefilling_np``). ``pcp_pad_replayed_slots`` refuses a guessed partition in the one
case where the guess can change the result (a guessed decode at a replayed position).

Host-only (numpy, vectorised per request); the result is a frozen :class:`PCPPartition`
of CPU tensors, identical in its global fields on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..types import INDEX_DTYPE, MAX_POSITION, PAD, SLOT_DTYPE
from ..validation import check_int, fail

NAME = "pcp_partition"
#: Largest PCP group the partition takes, far above any deployment.
MAX_PCP_SIZE = 1024
#: Bound of ``P * B`` (requests): the partition makes one pass over the batch per rank, and
#: every rank holds each decode, so the work and the gathered layout grow with both.
MAX_RANK_REQUESTS = 2**22


@dataclass(frozen=True, eq=False)
class PCPPartition:
    """Rank ``rank``'s local rows under PCP of size ``P`` (SPEC §6). CPU tensors.

    Global, rank-invariant fields (``B`` requests, ``T`` scheduled tokens):
    ``query_lens`` / ``num_computed`` int64 [B], ``is_prefilling`` bool [B],
    ``prefilling_inferred`` (True when ``is_prefilling`` was guessed from
    ``q == 1 and num_computed > 0``), ``per_rank_tokens`` (local token count of every rank),
    ``padded`` (their maximum), ``column_to_token`` int64 [P * padded] (the global token
    each gathered column publishes, -1 for PAD columns), ``token_to_column`` int64 [T] (the
    column that publishes each global token; decodes: rank 0's column).

    Local fields (``n`` rows, ``n_tok`` tokens): ``row_req`` int32 [n] (local row ->
    global request, the ``idx_mapping`` of the local batch), ``row_offset`` int32 [n] (row
    start within its request's query), ``row_prefilling`` bool [n], ``query_start_loc``
    int32 [n+1], ``positions`` int64 [n_tok] (absolute), ``token_index`` int64 [n_tok]
    (the global token each local token is), ``columns`` int64 [n_tok] (``rank * padded +
    i``), ``publishes`` bool [n_tok] (False for replicated decode tokens on ranks > 0).
    """

    P: int
    rank: int
    query_lens: torch.Tensor
    num_computed: torch.Tensor
    is_prefilling: torch.Tensor
    prefilling_inferred: bool
    per_rank_tokens: tuple[int, ...]
    padded: int
    column_to_token: torch.Tensor
    token_to_column: torch.Tensor
    row_req: torch.Tensor
    row_offset: torch.Tensor
    row_prefilling: torch.Tensor
    query_start_loc: torch.Tensor
    positions: torch.Tensor
    token_index: torch.Tensor
    columns: torch.Tensor
    publishes: torch.Tensor
    # init=False: dataclasses.replace() gives the new partition a cache of its own
    _device_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_reqs(self) -> int:
        return self.query_lens.shape[0]

    @property
    def num_global_tokens(self) -> int:
        return self.token_to_column.shape[0]

    @property
    def num_rows(self) -> int:
        return self.row_req.shape[0]

    @property
    def num_tokens(self) -> int:
        """This rank's local token count (``<= padded``)."""
        return self.positions.shape[0]

    @property
    def num_columns(self) -> int:
        """Width of the gathered layout, ``P * padded``."""
        return self.P * self.padded

    @property
    def own_columns(self) -> slice:
        """This rank's block of the gathered layout."""
        return slice(self.rank * self.padded, (self.rank + 1) * self.padded)

    def device_tensors(self, device) -> dict[str, torch.Tensor]:
        """The local batch on ``device`` (copied once per partition and device):
        ``query_start_loc`` int32, ``positions`` int64, ``idx_mapping`` int32 (``row_req``),
        ``is_prefilling`` bool (per local row)."""
        key = str(device)
        cached = self._device_cache.get(key)
        if cached is None:
            cached = {
                "query_start_loc": self.query_start_loc.to(device),
                "positions": self.positions.to(device),
                "idx_mapping": self.row_req.to(device),
                "is_prefilling": self.row_prefilling.to(device),
            }
            self._device_cache[key] = cached
        return cached


def _host_tensor(name: str, values: torch.Tensor) -> np.ndarray:
    if values.device.type == "meta":
        fail(NAME, name, values, "values on a real device (the partition reads them on the host)")
    return values.detach().cpu().resolve_conj().resolve_neg().numpy()


def _host_ints(name: str, values, *, length: int | None = None) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            fail(NAME, name, values, "integer values")
        values = _host_tensor(name, values)
    try:
        arr = np.asarray(values)
    except Exception:
        fail(NAME, name, values, "a 1-D sequence of ints")
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        fail(NAME, name, values, "a 1-D sequence of ints")
    arr = arr.astype(np.int64)
    if length is not None and arr.shape[0] != length:
        fail(NAME, name, values, f"{length} entries (one per request, like query_lens)")
    if arr.size and int(arr.min()) < 0:
        i = int(np.flatnonzero(arr < 0)[0])
        fail(NAME, f"{name}[{i}]", int(arr[i]), "values >= 0")
    if arr.size and (int(arr.max()) > MAX_POSITION or int(arr.sum()) > MAX_POSITION):
        fail(NAME, name, values, f"values (and their sum) <= MAX_POSITION={MAX_POSITION}")
    return arr


def _host_flags(name: str, values, length: int) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        if values.dtype != torch.bool:
            fail(NAME, name, values, "bool values")
        values = _host_tensor(name, values)
    try:
        arr = np.asarray(values)
    except Exception:
        fail(NAME, name, values, "a 1-D sequence of bools")
    if arr.ndim != 1 or (arr.size and arr.dtype != np.bool_):
        fail(NAME, name, values, "a 1-D sequence of bools")
    if arr.shape[0] != length:
        fail(NAME, name, values, f"{length} entries (one per request, like query_lens)")
    return arr.astype(bool)


def _rank_rows(q: np.ndarray, nc: np.ndarray, pre: np.ndarray, P: int, rank: int):
    """``(req, offset, length)`` of ``rank``'s local rows, in local order."""
    B = q.shape[0]
    c = -(-q // (2 * P))  # ceil(q / 2P); 0 for q == 0
    starts = np.stack([rank * c, (2 * P - 1 - rank) * c], axis=1)
    ends = np.minimum(starts + c[:, None], q[:, None])
    # decodes: one replicated row holding the whole query
    starts[~pre] = 0
    ends[~pre, 0] = q[~pre]
    ends[~pre, 1] = 0
    lens = np.maximum(ends - starts, 0)
    req = np.repeat(np.arange(B, dtype=np.int64), 2).reshape(B, 2)
    keep = lens.reshape(-1) > 0
    req, off, ln = req.reshape(-1)[keep], starts.reshape(-1)[keep], lens.reshape(-1)[keep]
    # a fresh prefill's head row (absolute start 0) goes after every other row (stable)
    fresh_head = pre[req] & (nc[req] + off == 0)
    order = np.argsort(fresh_head, kind="stable")
    return req[order], off[order], ln[order]


def _expand(off: np.ndarray, ln: np.ndarray) -> np.ndarray:
    """Per token of rows ``(off, ln)``: ``off[row] + j`` for ``j < ln[row]``."""
    total = int(ln.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    row_start = np.cumsum(ln) - ln
    j = np.arange(total, dtype=np.int64) - np.repeat(row_start, ln)
    return np.repeat(off, ln) + j


def pcp_partition(query_lens, num_computed, P: int, rank: int, *, is_prefilling=None) -> PCPPartition:
    """Rank ``rank``'s local rows of a batch under PCP of size ``P`` (SPEC §6).

    ``query_lens`` / ``num_computed``: per request (host ints; tokens scheduled this step
    and tokens already computed, so positions are ``num_computed + offset``);
    ``is_prefilling``: per request, False for decodes (default: ``q == 1 and
    num_computed > 0`` is a decode; see the module docstring for why passing it is better).
    Requests with ``q == 0`` hold no row. Returns a :class:`PCPPartition`.
    """
    P = check_int(NAME, "P", P, min_value=1, max_value=MAX_PCP_SIZE, why="MAX_PCP_SIZE")
    rank = check_int(NAME, "rank", rank, min_value=0)
    if rank >= P:
        fail(NAME, "rank", rank, f"0 <= rank < P={P}")
    q = _host_ints("query_lens", query_lens)
    B = q.shape[0]
    if P * B > MAX_RANK_REQUESTS:
        fail(NAME, "query_lens", f"{B} requests", f"P * requests <= {MAX_RANK_REQUESTS} (P={P}; one pass per rank)")
    nc = _host_ints("num_computed", num_computed, length=B)
    inferred = is_prefilling is None
    pre = ~((q == 1) & (nc > 0)) if inferred else _host_flags("is_prefilling", is_prefilling, B)
    bad = ~pre & (q > 0) & (nc == 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        fail(NAME, f"num_computed[{i}]", 0,
             f">= 1 for request {i}, a decode (is_prefilling[{i}]=False continues a computed sequence)")

    gqsl = np.concatenate([[0], np.cumsum(q)]).astype(np.int64)
    T = int(gqsl[-1])
    rows = [_rank_rows(q, nc, pre, P, r) for r in range(P)]
    counts = tuple(int(ln.sum()) for _, _, ln in rows)
    padded = max(counts) if counts else 0
    if P * padded > MAX_POSITION:  # decodes are replicated: every rank holds each of them
        fail(NAME, "P", P, f"a gathered layout of P * padded = {P} * {padded} <= MAX_POSITION={MAX_POSITION} columns")

    column_to_token = np.full(P * padded, PAD, np.int64)
    token_to_column = np.full(T, PAD, np.int64)
    for r, (req, off, ln) in enumerate(rows):
        tok = np.repeat(gqsl[req], ln) + _expand(off, ln)
        cols = r * padded + np.arange(tok.shape[0], dtype=np.int64)
        pub = np.repeat(pre[req] | (r == 0), ln)
        column_to_token[cols[pub]] = tok[pub]
        token_to_column[tok[pub]] = cols[pub]

    req, off, ln = rows[rank]
    offsets = _expand(off, ln)
    tok = np.repeat(gqsl[req], ln) + offsets
    n_tok = tok.shape[0]
    t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(dt)  # noqa: E731
    return PCPPartition(
        P=P, rank=rank,
        query_lens=t(q, torch.int64), num_computed=t(nc, torch.int64), is_prefilling=t(pre, torch.bool),
        prefilling_inferred=inferred, per_rank_tokens=counts, padded=padded,
        column_to_token=t(column_to_token, SLOT_DTYPE), token_to_column=t(token_to_column, SLOT_DTYPE),
        row_req=t(req, INDEX_DTYPE), row_offset=t(off, INDEX_DTYPE), row_prefilling=t(pre[req], torch.bool),
        query_start_loc=t(np.concatenate([[0], np.cumsum(ln)]), INDEX_DTYPE),
        positions=t(np.repeat(nc[req], ln) + offsets, SLOT_DTYPE),
        token_index=t(tok, SLOT_DTYPE),
        columns=t(rank * padded + np.arange(n_tok), SLOT_DTYPE),
        publishes=t(np.repeat(pre[req] | (rank == 0), ln), torch.bool),
    )


def _check_partition(op: str, partition) -> None:
    if not isinstance(partition, PCPPartition):
        fail(op, "partition", partition, "a PCPPartition from pcp_partition(...)")


def _check_dim(op: str, dim, t: torch.Tensor) -> int:
    """A dimension of ``t`` (negative counts from the end), as a non-negative index."""
    if t.dim() == 0:
        fail(op, "x" if op == "pcp_gather_columns" else "gathered", t, "at least one dimension (the tokens)")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -t.dim() <= dim < t.dim():
        fail(op, "dim", dim, f"an int in [{-t.dim()}, {t.dim()}) (a dimension of the {t.dim()}-D tensor)")
    return dim % t.dim()


def _check_fill(op: str, fill, dtype: torch.dtype) -> None:
    """``fill`` is a number ``dtype`` holds exactly (an int in its range for integer dtypes)."""
    if dtype == torch.bool:
        ok = isinstance(fill, bool)
        want = "a bool (x is a bool tensor)"
    elif dtype.is_floating_point or dtype.is_complex:
        ok = isinstance(fill, (int, float)) and not isinstance(fill, bool)
        if ok and dtype.is_floating_point:
            try:
                value = float(fill)
            except OverflowError:
                value = math.inf
            ok = not math.isfinite(value) or abs(value) <= torch.finfo(dtype).max
        want = f"an int or float that {dtype} holds"
    else:
        info = torch.iinfo(dtype)
        ok = isinstance(fill, int) and not isinstance(fill, bool) and info.min <= fill <= info.max
        want = f"an int in [{info.min}, {info.max}] ({dtype})"
    if not ok:
        fail(op, "fill", fill, want)


def pcp_gather_columns(x: torch.Tensor, partition: PCPPartition, *, dim: int = -1, fill: int = PAD) -> torch.Tensor:
    """Lay a global per-token tensor out in the gathered rank-major column order:
    ``out[..., col] = x[..., column_to_token[col]]`` along ``dim``, ``fill`` (PAD) where a
    column publishes nothing (padding, replicated decodes on ranks > 0).

    ``x`` has ``T`` (the batch's token count) or more entries along ``dim``; e.g. the global
    slot mapping ``[G, T]`` -> the gathered mapping ``[G, P * padded]`` every rank holds.
    """
    op = "pcp_gather_columns"
    if not isinstance(x, torch.Tensor):
        fail(op, "x", x, "a torch.Tensor")
    _check_partition(op, partition)
    d = _check_dim(op, dim, x)
    _check_fill(op, fill, x.dtype)
    T = partition.num_global_tokens
    if x.shape[d] < T:
        fail(op, "x", x, f"at least {T} entries along dim {dim} (one per scheduled token)")
    c2t = partition.column_to_token.to(x.device)
    out = x.index_select(d, c2t.clamp(min=0))
    shape = [1] * x.dim()
    shape[d] = c2t.shape[0]
    return out.masked_fill((c2t < 0).view(shape), fill)


def pcp_restore_tokens(gathered: torch.Tensor, partition: PCPPartition, *, dim: int = -1) -> torch.Tensor:
    """Inverse of :func:`pcp_gather_columns`: ``out[..., t] = gathered[..., token_to_column[t]]``
    (global token order; a decode is read from rank 0's column)."""
    if not isinstance(gathered, torch.Tensor):
        fail("pcp_restore_tokens", "gathered", gathered, "a torch.Tensor")
    _check_partition("pcp_restore_tokens", partition)
    d = _check_dim("pcp_restore_tokens", dim, gathered)
    if gathered.shape[d] < partition.num_columns:
        fail("pcp_restore_tokens", "gathered", gathered,
             f"at least {partition.num_columns} entries along dim {dim} (P * padded)")
    return gathered.index_select(d, partition.token_to_column.to(gathered.device))
