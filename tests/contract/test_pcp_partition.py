"""``pcp_partition`` (SPEC §6): per-rank rows, rank-major columns, the inverse maps, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swa_backends import PAD, pcp_gather_columns, pcp_partition, pcp_restore_tokens


def rows_of(part):
    """Local rows as lists of absolute positions."""
    qsl = part.query_start_loc.tolist()
    pos = part.positions.tolist()
    return [pos[a:b] for a, b in zip(qsl[:-1], qsl[1:])]


def test_spec_worked_example_layout():
    # P 2, R 16, 10 tokens at positions 16..25: chunks of 3
    r0, r1 = (pcp_partition([10], [16], 2, r) for r in range(2))
    assert rows_of(r0) == [[16, 17, 18], [25]]
    assert rows_of(r1) == [[19, 20, 21], [22, 23, 24]]
    assert r0.per_rank_tokens == (4, 6) and r0.padded == r1.padded == 6
    assert r0.columns.tolist() == [0, 1, 2, 3] and r1.columns.tolist() == [6, 7, 8, 9, 10, 11]
    slots = torch.arange(16, 26, dtype=torch.int64)[None] + 100  # slot = 100 + position
    gathered = pcp_gather_columns(slots, r0)
    assert gathered.tolist() == [[116, 117, 118, 125, PAD, PAD, 119, 120, 121, 122, 123, 124]]
    assert torch.equal(pcp_gather_columns(slots, r1), gathered)  # rank-invariant
    assert torch.equal(pcp_restore_tokens(gathered, r1), slots)


def test_spec_second_example_rank1_holds_no_replayed_position():
    # W 128, hit 1024 -> R 896; 2000 tokens scheduled from the rewound position 896
    R, W = 896, 128
    for q in (2000, 2000 + 128 - 1024):  # also: a 2000-token prompt, computed rewound to R
        r1 = pcp_partition([q], [R], 2, 1)
        p = r1.positions
        assert r1.num_tokens > 0 and not bool(((p >= R) & (p < R + W)).any())
        r0 = pcp_partition([q], [R], 2, 0)
        assert bool(((r0.positions >= R) & (r0.positions < R + W)).sum() == W)


def test_chunks_ceil_and_empty_trailing_dropped():
    # q 5, P 2: chunks of 2 -> [0,2) [2,4) [4,5) and an empty 4th chunk (dropped)
    r0, r1 = (pcp_partition([5], [7], 2, r) for r in range(2))
    assert rows_of(r0) == [[7, 8]]
    assert rows_of(r1) == [[9, 10], [11]]
    # q 9, P 4: ceil(9/8) = 2 -> chunks [0,2) [2,4) [4,6) [6,8) [8,9) then 3 empty
    got = [rows_of(pcp_partition([9], [100], 4, r)) for r in range(4)]
    assert got == [[[100, 101]], [[102, 103]], [[104, 105]], [[106, 107], [108]]]


def test_fresh_head_moves_after_the_others_and_decodes_are_replicated():
    q, nc = [6, 1, 4, 8], [0, 50, 0, 20]  # fresh, decode, fresh, chunked prefill
    pre = [True, False, True, True]
    r0 = pcp_partition(q, nc, 2, 0, is_prefilling=pre)
    r1 = pcp_partition(q, nc, 2, 1, is_prefilling=pre)
    # rank 0: chunk 0 and 3 of each prefill; the two fresh heads (start 0) go last, in order
    # (request 0: chunks of 2, its chunk 3 is empty; request 2: chunks of 1)
    assert rows_of(r0) == [[50], [3], [20, 21], [26, 27], [0, 1], [0]]
    assert r0.row_req.tolist() == [1, 2, 3, 3, 0, 2]
    assert r0.row_prefilling.tolist() == [False, True, True, True, True, True]
    # rank 1: chunks 1 and 2; the decode is replicated but not published
    assert rows_of(r1) == [[2, 3], [4, 5], [50], [1], [2], [22, 23], [24, 25]]
    assert r1.publishes.tolist() == [True] * 4 + [False] + [True] * 6
    assert r0.per_rank_tokens == (9, 11) and r0.padded == 11
    assert r0.publishes.all()
    # every token published exactly once; the decode by rank 0
    T = sum(q)
    c2t = r0.column_to_token
    assert sorted(c2t[c2t >= 0].tolist()) == list(range(T))
    assert int(r0.token_to_column[6]) == r0.columns[r0.token_index.tolist().index(6)]


def test_decode_guess_and_explicit_flag():
    # q == 1 and num_computed > 0 is guessed to be a decode (replicated)...
    g = pcp_partition([1, 1], [0, 9], 2, 1)
    assert g.prefilling_inferred and g.is_prefilling.tolist() == [True, False]
    assert rows_of(g) == [[9]]  # the decode, replicated on rank 1; the fresh 1-token prefill is on rank 0
    # ...the explicit flag splits a one-token prefill chunk instead: only rank 0 holds it
    e = [pcp_partition([1], [9], 2, r, is_prefilling=[True]) for r in range(2)]
    assert not e[0].prefilling_inferred
    assert rows_of(e[0]) == [[9]] and rows_of(e[1]) == []
    assert e[0].per_rank_tokens == (1, 0)


def test_empty_batch_and_zero_length_requests():
    p = pcp_partition([], [], 4, 3)
    assert p.padded == 0 and p.num_rows == 0 and p.num_columns == 0 and p.query_start_loc.tolist() == [0]
    z = pcp_partition([0, 4, 0], [5, 0, 2], 2, 0)
    assert rows_of(z) == [[3], [0]]  # chunk 3 of the fresh request, then its head
    # q 3, P 2: chunks of 1 and an empty chunk 3 -> rank 0 holds the head only
    assert rows_of(pcp_partition([0, 3, 0], [5, 0, 2], 2, 0)) == [[0]]
    assert z.row_req.tolist() == [1, 1]


@st.composite
def batches(draw):
    P = draw(st.sampled_from([1, 2, 3, 4]))
    B = draw(st.integers(0, 7))
    q, nc, pre = [], [], []
    for _ in range(B):
        kind = draw(st.sampled_from(["decode", "fresh", "chunk", "one", "empty"]))
        if kind == "decode":
            q.append(1), nc.append(draw(st.integers(1, 300))), pre.append(False)
        elif kind == "fresh":
            q.append(draw(st.integers(1, 70))), nc.append(0), pre.append(True)
        elif kind == "chunk":
            q.append(draw(st.integers(1, 70))), nc.append(draw(st.integers(1, 300))), pre.append(True)
        elif kind == "one":
            q.append(1), nc.append(draw(st.integers(1, 300))), pre.append(True)
        else:
            q.append(0), nc.append(draw(st.integers(0, 30))), pre.append(True)
    return P, q, nc, pre


@settings(max_examples=150)
@given(batches())
def test_partition_properties(batch):
    P, q, nc, pre = batch
    parts = [pcp_partition(q, nc, P, r, is_prefilling=pre) for r in range(P)]
    T = sum(q)
    gqsl = np.concatenate([[0], np.cumsum(q)]).astype(int)
    padded = parts[0].padded
    for r, part in enumerate(parts):
        # global fields are rank-invariant
        assert part.padded == padded and part.per_rank_tokens == parts[0].per_rank_tokens
        assert torch.equal(part.column_to_token, parts[0].column_to_token)
        assert torch.equal(part.token_to_column, parts[0].token_to_column)
        assert part.num_tokens == part.per_rank_tokens[r] <= padded
        assert padded == max(part.per_rank_tokens)
        # local rows: the SPEC's chunks, positions = num_computed + offset
        seen_fresh = False
        for k, (i, off) in enumerate(zip(part.row_req.tolist(), part.row_offset.tolist())):
            a, b = part.query_start_loc[k].item(), part.query_start_loc[k + 1].item()
            assert b > a
            assert part.positions[a:b].tolist() == list(range(nc[i] + off, nc[i] + off + b - a))
            assert part.token_index[a:b].tolist() == list(range(gqsl[i] + off, gqsl[i] + off + b - a))
            if not pre[i]:
                assert (off, b - a) == (0, q[i])
            else:
                c = math.ceil(q[i] / (2 * P))
                assert off in (r * c, (2 * P - 1 - r) * c) and b - a == min(c, q[i] - off)
            fresh = pre[i] and nc[i] + off == 0
            assert fresh or not seen_fresh, "a fresh head precedes a non-head row"
            seen_fresh |= fresh
        assert part.columns.tolist() == [r * padded + i for i in range(part.num_tokens)]
        assert torch.equal(part.publishes, torch.tensor([pre[i] or r == 0 for i in part.row_req.tolist()
                                                         for _ in range(1)]).repeat_interleave(
            (part.query_start_loc[1:] - part.query_start_loc[:-1]).to(torch.int64)))
    # every global token is published by exactly one column, and the maps are inverse
    c2t, t2c = parts[0].column_to_token, parts[0].token_to_column
    assert sorted(c2t[c2t >= 0].tolist()) == list(range(T))
    assert torch.equal(c2t[t2c], torch.arange(T))
    x = torch.randint(0, 10**6, (3, T + 2))
    g = pcp_gather_columns(x, parts[-1])
    assert g.shape == (3, P * padded)
    assert torch.equal(pcp_restore_tokens(g, parts[0]), x[:, :T])
    assert bool((g[:, c2t < 0] == PAD).all())
    # dim 0 (hidden states [T, H])
    h = torch.randn(T, 5)
    assert torch.equal(pcp_restore_tokens(pcp_gather_columns(h, parts[0], dim=0, fill=0), parts[0], dim=0), h)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([4], [0], 2, 2), {}, r"pcp_partition: rank=2: expected 0 <= rank < P=2"),
        (([4], [0], 2, -1), {}, r"pcp_partition: rank=-1: expected an int >= 0"),
        (([4], [0], 0, 0), {}, r"pcp_partition: P=0: expected an int >= 1"),
        (([4], [0], 2.0, 0), {}, r"pcp_partition: P=2.0: expected a Python int"),
        (([4, 2], [0], 2, 0), {}, r"pcp_partition: num_computed=\[0\]: expected 2 entries"),
        (([4, 2], [0, 0], 2, 0), {"is_prefilling": [True]}, r"pcp_partition: is_prefilling=\[True\]: expected 2 entries"),
        (([4, -1], [0, 0], 2, 0), {}, r"pcp_partition: query_lens\[1\]=-1: expected values >= 0"),
        (([4], [-3], 2, 0), {}, r"pcp_partition: num_computed\[0\]=-3: expected values >= 0"),
        (([[4]], [0], 2, 0), {}, r"query_lens=\[\[4\]\]: expected a 1-D sequence of ints"),
        (([1.5], [0], 2, 0), {}, r"query_lens=\[1.5\]: expected a 1-D sequence of ints"),
        (([1], [0], 2, 0), {"is_prefilling": [False]}, r"pcp_partition: num_computed\[0\]=0: expected >= 1 for request 0, a decode"),
        (([1], [3], 2, 0), {"is_prefilling": [1]}, r"is_prefilling=\[1\]: expected a 1-D sequence of bools"),
    ],
)
def test_bad_input_names_the_argument(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pcp_partition(*args, **kwargs)


def test_gather_restore_bad_input():
    part = pcp_partition([4, 4], [0, 8], 2, 0)
    with pytest.raises(ValueError, match=r"pcp_gather_columns: x=.*expected at least 8 entries along dim -1"):
        pcp_gather_columns(torch.zeros(2, 7, dtype=torch.int64), part)
    with pytest.raises(ValueError, match=r"pcp_restore_tokens: gathered=.*expected at least 8 entries"):
        pcp_restore_tokens(torch.zeros(2, 3, dtype=torch.int64), part)
