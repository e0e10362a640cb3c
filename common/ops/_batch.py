"""Vectorised per-token views of a batch, shared by the torch references.

No Python loop per token and no host synchronisation: tokens find their request with
``searchsorted`` over ``query_start_loc``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class TokenView:
    """For tokens ``0..T-1``: ``req`` (clamped to a real request), ``valid`` (inside
    ``query_start_loc[B]`` and the caller's mask), ``pos`` (absolute position derived from
    ``seq_lens`` and the query length), ``offset`` (index within its request)."""

    req: torch.Tensor
    valid: torch.Tensor
    pos: torch.Tensor
    offset: torch.Tensor

    def take(self, per_request: torch.Tensor) -> torch.Tensor:
        """``per_request[req]`` as int64 (zeros when the batch has no request)."""
        if per_request.shape[0] == 0:
            return torch.zeros_like(self.req)
        return per_request.to(torch.int64)[self.req]


def token_view(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor | None,
    num_tokens: int,
    *,
    valid: torch.Tensor | None = None,
    token_offset: int = 0,
) -> TokenView:
    """Token ``i`` of the view is token ``token_offset + i`` of the batch (``valid[i]`` masks it)."""
    dev = query_start_loc.device
    qsl = query_start_loc.to(torch.int64)
    B = qsl.shape[0] - 1
    t = torch.arange(token_offset, token_offset + num_tokens, device=dev, dtype=torch.int64)
    if B <= 0:
        zeros = torch.zeros_like(t)
        return TokenView(zeros, torch.zeros_like(t, dtype=torch.bool), zeros, zeros)
    req = torch.searchsorted(qsl[1:].contiguous(), t, right=True)
    ok = req < B
    req = req.clamp(max=B - 1)
    if valid is not None:
        ok &= valid
    start = qsl[req]
    offset = t - start
    if seq_lens is not None:
        q = qsl[req + 1] - start
        pos = seq_lens.to(torch.int64)[req] - q + offset
    else:
        pos = offset
    return TokenView(req, ok, pos, offset)


def live_replay_start(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, replay_start: torch.Tensor) -> torch.Tensor:
    """int64 [B]: each request's replay start ``R``, or 0 where it is stale, above the
    request's first scheduled position ``seq_len - q`` (SPEC §0: an in-place restart left
    it behind; the request is treated as not replaying: no padding, no clamp)."""
    q = (query_start_loc[1:] - query_start_loc[:-1]).to(torch.int64)
    R = replay_start.to(torch.int64)
    return torch.where(R <= seq_lens.to(torch.int64) - q, R, torch.zeros_like(R))


def stale_replay(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, replay_start: torch.Tensor) -> torch.Tensor:
    """bool [B]: the requests whose replay start is stale (see :func:`live_replay_start`)."""
    q = (query_start_loc[1:] - query_start_loc[:-1]).to(torch.int64)
    return replay_start.to(torch.int64) > seq_lens.to(torch.int64) - q


def resolve_num_tokens(query_start_loc: torch.Tensor, num_tokens: int | None, valid: torch.Tensor | None,
                       token_offset: int = 0) -> int:
    """T for ops whose token count is not carried by a tensor: ``num_tokens``, else the
    length of ``valid``, else ``query_start_loc[-1] - token_offset`` (one host read; pass
    ``num_tokens`` on a hot path or inside a graph)."""
    if num_tokens is not None:
        return num_tokens
    if valid is not None:
        return valid.shape[0]
    return max(int(query_start_loc[-1]) - token_offset, 0) if query_start_loc.numel() else 0


def nonempty_table(block_table: torch.Tensor) -> torch.Tensor:
    """The block table as int64, with one dummy row when the batch has no request (every
    token is then invalid, but the vectorised lookups still need a row to index)."""
    table = block_table.to(torch.int64)
    if table.shape[0] == 0 or table.shape[1] == 0:
        table = torch.zeros(max(1, table.shape[0]), max(1, table.shape[1]), dtype=torch.int64, device=table.device)
    return table
