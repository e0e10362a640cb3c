"""Layout converters (common/layouts.py): every index builder feeds a plain consumer.

Checked three ways: entry by entry against a per-token Python statement of the layout,
attention over the converted rows equal to attention over the original layout (torch
reference), and round trips (plain -> CSR -> plain).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swa_backends import OPS, PAD, validation
from swa_backends.testing.conformance import POISON_INT, random_batch
from swa_backends.common.ops.layouts import (
    combined_to_plain,
    combined_workspace_rows,
    compact_indices,
    csr_to_plain,
    mixed_to_plain,
)

I32 = torch.int32
ATTN = OPS["sparse_mla"].reference


def _rows(rng, T, K, S, pad=0.3):
    idx = torch.tensor(rng.integers(0, S, size=(T, K)), dtype=I32)
    idx[torch.tensor(rng.random((T, K)) < pad)] = PAD
    lens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=I32)
    return idx, lens


def _readable(idx, lens, t):
    return [int(v) for v in idx[t, : int(lens[t])] if int(v) != PAD]


def _attn(kv, idx, lens, seed=0, H=3, sink=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(idx.shape[0], H, kv.shape[1], generator=g)
    kw = {"sink": torch.randn(H, generator=g)} if sink else {}
    return ATTN(q, kv, idx, lens, 1.0 / math.sqrt(kv.shape[1]), kv.shape[1], **kw)


def _same_attention(a, b):
    (oa, la), (ob, lb) = a, b
    assert torch.allclose(oa, ob, atol=1e-5, rtol=1e-5)
    assert torch.equal(torch.isneginf(la), torch.isneginf(lb))
    fin = torch.isfinite(la)
    assert torch.allclose(la[fin], lb[fin], atol=1e-5)


def _poison_pair(T, K):
    return torch.full((T, K), POISON_INT, dtype=I32), torch.full((T,), POISON_INT, dtype=I32)


# ---------------------------------------------------------------------------------------
# compaction and CSR
# ---------------------------------------------------------------------------------------


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1))
def test_compact_and_csr_round_trip(seed):
    rng = np.random.default_rng(seed)
    T, K, S = int(rng.integers(0, 12)), int(rng.integers(1, 40)), 60
    idx, lens = _rows(rng, T, K, S)
    c_idx, c_lens = compact_indices(idx, lens, out=_poison_pair(T, K))
    for t in range(T):
        keep = _readable(idx, lens, t)
        assert c_lens[t] == len(keep)
        assert c_idx[t].tolist() == keep + [PAD] * (K - len(keep))
    indptr, values = OPS["indices_to_csr"].reference(idx, lens)
    p_idx, p_lens = csr_to_plain(indptr, values, K, out=_poison_pair(T, K))
    assert torch.equal(p_idx, c_idx) and torch.equal(p_lens, c_lens)
    if T:
        kv = torch.randn(S, 16, generator=torch.Generator().manual_seed(seed % 1000))
        _same_attention(_attn(kv, idx, lens), _attn(kv, c_idx, c_lens))


@pytest.mark.parametrize("T, K", [(0, 0), (0, 4), (3, 0), (1, 1), (1, 9), (6, 1), (5, 37)])
def test_converters_on_odd_shapes_and_sliced_rows(T, K):
    """compact_indices, csr_to_plain and mixed_to_plain at no token, no column, one of each and
    widths off any power of two, on index rows sliced from a wider buffer (read in place), into
    poisoned ``out=`` buffers: each token's readable entries in order, PAD after them."""
    rng = np.random.default_rng(T * 100 + K)
    wide = torch.tensor(rng.integers(-1, 60, size=(T, K + 5)), dtype=I32)
    idx = wide[:, 2:2 + K]
    lens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=I32)
    want_i = torch.full((T, K), PAD, dtype=I32)
    want_l = torch.zeros(T, dtype=I32)
    for t in range(T):
        keep = _readable(idx, lens, t)
        want_i[t, : len(keep)] = torch.tensor(keep, dtype=I32)
        want_l[t] = len(keep)
    for got in (compact_indices(idx, lens), compact_indices(idx, lens, out=_poison_pair(T, K)),
                csr_to_plain(*OPS["indices_to_csr"].reference(idx, lens), K, out=_poison_pair(T, K))):
        assert torch.equal(got[0], want_i) and torch.equal(got[1], want_l)
    if K:
        for compact in (True, False):
            got_i, got_l = mixed_to_plain(idx, lens, 1, compact=compact, out=_poison_pair(T, K))
            if compact:
                assert torch.equal(got_i, want_i) and torch.equal(got_l, want_l)
            else:
                assert torch.equal(got_l, lens)
                for t in range(T):
                    assert [v for v in got_i[t, : int(lens[t])].tolist() if v != PAD] == _readable(idx, lens, t)
                    assert (got_i[t, int(lens[t]):] == PAD).all()


def test_csr_validation():
    indptr = torch.tensor([0, 2, 5], dtype=I32)
    values = torch.tensor([3, 4, 5, 6, 7, PAD], dtype=I32)
    idx, lens = csr_to_plain(indptr, values, 4)
    assert idx.tolist() == [[3, 4, PAD, PAD], [5, 6, 7, PAD]] and lens.tolist() == [2, 3]
    with pytest.raises(ValueError, match="width"):
        csr_to_plain(indptr, values, 2)
    with pytest.raises(ValueError, match=r"indptr.*0"):
        csr_to_plain(torch.tensor([1, 2], dtype=I32), values, 4)
    with pytest.raises(ValueError, match="non-decreasing"):
        csr_to_plain(torch.tensor([0, 3, 2], dtype=I32), values, 4)
    with pytest.raises(ValueError, match="values.numel"):
        csr_to_plain(torch.tensor([0, 7], dtype=I32), values, 8)
    with pytest.raises(ValueError, match="values"):
        csr_to_plain(indptr, torch.tensor([3, -5, 5, 6, 7], dtype=I32), 4)
    with pytest.raises(ValueError, match="indptr"):
        csr_to_plain(indptr.long(), values, 4)
    with validation(False):  # the hot path skips value checks, still converts
        assert torch.equal(csr_to_plain(indptr, values, 4)[0], idx)


# ---------------------------------------------------------------------------------------
# mixed (FlashInfer-style): PAD holes inside the active length
# ---------------------------------------------------------------------------------------


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), compact=st.booleans())
def test_mixed_to_plain(seed, compact):
    rng = np.random.default_rng(seed)
    b = random_batch(rng)
    t = b.tensors("cpu")
    T = b.T
    swa, _ = OPS["swa_indices_and_lens"].reference(t["query_start_loc"], t["seq_lens"], t["block_table"],
                                                  b.block_size, b.W, t["replay_start"], num_tokens=T)
    Ktop = int(rng.choice([0, 3, 8]))
    topk = torch.tensor(rng.integers(-1, 500, size=(T, Ktop)), dtype=I32)
    tl = torch.tensor(rng.integers(0, Ktop + 1, size=T), dtype=I32)
    idx, lens = OPS["mixed_indices"].reference(swa, topk, tl)
    K = idx.shape[1]
    wo, to = int(rng.integers(0, 50)), int(rng.integers(0, 50))
    got_i, got_l = mixed_to_plain(idx, lens, b.W, window_offset=wo, topk_offset=to, compact=compact,
                                  out=_poison_pair(T, K))
    for tok in range(T):
        want = [v + (wo if j < b.W else to) for j, v in enumerate(idx[tok, : int(lens[tok])].tolist()) if v != PAD]
        if compact:
            assert got_l[tok] == len(want)
            assert got_i[tok].tolist() == want + [PAD] * (K - len(want))
        else:
            assert got_l[tok] == lens[tok]
            assert [v for v in got_i[tok, : int(lens[tok])].tolist() if v != PAD] == want
            assert (got_i[tok, int(lens[tok]):] == PAD).all()
    if T:
        # no offsets: the plain consumer reads the mixed rows as they are
        plain_i, plain_l = mixed_to_plain(idx, lens, b.W, compact=compact)
        S = int(max(int(idx.max()), 0)) + 1
        kv = torch.randn(S, 16, generator=torch.Generator().manual_seed(seed % 1000))
        _same_attention(_attn(kv, idx, lens), _attn(kv, plain_i, plain_l))


def test_mixed_validation():
    idx = torch.tensor([[1, PAD, 2, 3]], dtype=I32)
    lens = torch.tensor([4], dtype=I32)
    assert mixed_to_plain(idx, lens, 2)[0].tolist() == [[1, 2, 3, PAD]]
    with pytest.raises(ValueError, match="swa_width"):
        mixed_to_plain(idx, lens, 5)
    with pytest.raises(ValueError, match="lens"):
        mixed_to_plain(idx, torch.tensor([5], dtype=I32), 2)
    with pytest.raises(ValueError, match="topk_offset"):
        mixed_to_plain(idx, lens, 2, topk_offset=-1)
    with pytest.raises(ValueError, match="offset"):
        mixed_to_plain(idx, lens, 2, topk_offset=2**31 - 2)
    with pytest.raises(ValueError, match="out"):
        mixed_to_plain(idx, lens, 2, out=(torch.zeros(1, 3, dtype=I32), torch.zeros(1, dtype=I32)))


# ---------------------------------------------------------------------------------------
# combined (FlashMLA-style workspace)
# ---------------------------------------------------------------------------------------


def _combined_case(seed):
    rng = np.random.default_rng(seed)
    b = random_batch(rng)
    t = b.tensors("cpu")
    T, B, bs = b.T, b.B, b.block_size
    ratio = int(rng.choice([r for r in (0, 1, 2, 4) if r == 0 or bs % r == 0]))
    top_k = int(rng.choice([0, 4, 16]))
    N = int(rng.integers(1, 40))
    gl = OPS["prefill_gather_lens"].reference(t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W)
    M = N + max(1, int(gl.max()) if B else 1) + int(rng.integers(0, 4))
    # realistic top-k: compressed entries already closed at the token's position, some outside the slab
    pos = t["positions"][:T]
    written = (pos + 1) // ratio if ratio else torch.zeros_like(pos)
    raw = torch.tensor(rng.integers(0, 10**6, size=(T, top_k + 2)), dtype=torch.int64)
    topk = raw % written.clamp(min=1)[:, None]
    u = torch.tensor(rng.random((T, top_k + 2)))
    topk = torch.where(u < 0.15, N + raw % 5, topk)  # outside the slab: the builder makes it PAD
    topk = torch.where(u > 0.9, PAD, topk).to(I32)
    idx, lens = OPS["combined_indices"].reference(topk, t["query_start_loc"], t["seq_lens"], t["replay_start"],
                                                 b.W, ratio, top_k, M, N)
    S_swa = int(b.block_table.max()) * bs + bs if B else 1
    bs_c = bs // ratio if ratio else 1
    ncols = int(math.ceil(max(int(b.seq.max()) if B else 1, 1) / max(ratio, 1) / bs_c)) + 1
    cbt = torch.tensor(rng.permutation(B * ncols + 3)[: B * ncols].reshape(B, ncols), dtype=I32)
    S_cmp = (int(cbt.max()) + 1) * bs_c if B else 1
    return dict(b=b, t=t, ratio=ratio, top_k=top_k, N=N, M=M, topk=topk, idx=idx, lens=lens, S_swa=S_swa,
                cbt=cbt, bs_c=bs_c, S=S_swa + S_cmp)


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1))
def test_combined_to_plain(seed):
    c = _combined_case(seed)
    b, t, T = c["b"], c["t"], c["b"].T
    ws = combined_workspace_rows(t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W, c["M"], c["N"],
                                 t["block_table"], b.block_size, compressed_block_table=c["cbt"], ratio=c["ratio"],
                                 window_base=0, compressed_base=c["S_swa"],
                                 out=torch.full((b.B * c["M"],), POISON_INT, dtype=I32))
    K = c["idx"].shape[1]
    plain_i, plain_l = combined_to_plain(c["idx"], c["lens"], ws, out=_poison_pair(T, K))
    assert torch.equal(plain_l, c["lens"])
    # window part = the clamped SWA slots (swa_indices_and_lens), top-k part = compressed slots
    swa, swa_len = OPS["swa_indices_and_lens"].reference(t["query_start_loc"], t["seq_lens"], t["block_table"],
                                                        b.block_size, b.W, t["replay_start"], num_tokens=T)
    req = np.repeat(np.arange(b.B), b.q)
    for tok in range(T):
        n_win = int(swa_len[tok])
        n_top = int(c["lens"][tok]) - n_win
        assert plain_i[tok, n_top: n_top + n_win].tolist() == swa[tok, :n_win].tolist()
        for j in range(n_top):
            v = int(c["topk"][tok, j])
            want = PAD
            if 0 <= v < c["N"] and v < int(b.seq[req[tok]]) // c["ratio"]:
                blk = int(c["cbt"][req[tok], v // c["bs_c"]])
                want = c["S_swa"] + blk * c["bs_c"] + v % c["bs_c"]
            assert int(plain_i[tok, j]) == want, (tok, j, v)
        assert (plain_i[tok, int(c["lens"][tok]):] == PAD).all()
    if T:
        # attention over the materialised workspace == attention over the cache via plain rows
        kv = torch.randn(c["S"], 16, generator=torch.Generator().manual_seed(seed % 1000))
        # (rows holding nothing get finite garbage: no valid entry may read them)
        workspace = torch.where((ws >= 0)[:, None], kv[ws.clamp(min=0).long()], 1e4)
        _same_attention(_attn(workspace, c["idx"], c["lens"]), _attn(kv, plain_i, plain_l))


def test_combined_validation():
    c = _combined_case(3)
    b, t = c["b"], c["t"]
    args = (t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W, c["M"], c["N"], t["block_table"], b.block_size)
    with pytest.raises(ValueError, match="compressed_block_table"):
        combined_workspace_rows(*args, ratio=2 if b.block_size % 2 == 0 else 1)
    with pytest.raises(ValueError, match="slab_stride"):
        combined_workspace_rows(*args[:4], c["N"], c["N"], *args[6:])
    ws = combined_workspace_rows(*args)
    with pytest.raises(ValueError, match="indices"):
        combined_to_plain(c["idx"].clamp(min=0) + len(ws), c["lens"].clamp(min=1), ws)
    with pytest.raises(ValueError, match="workspace_rows"):
        combined_to_plain(c["idx"], c["lens"], ws.float())


def test_combined_small_worked_example():
    """One replaying request (R 4, W 4, block 4, identity table): q 3 at positions 8..10."""
    qsl = torch.tensor([0, 3], dtype=I32)
    seq = torch.tensor([11], dtype=I32)
    R = torch.tensor([4], dtype=I32)
    table = torch.tensor([[5, 6, 7]], dtype=I32)  # positions 0..11 -> slots 20..31
    ws = combined_workspace_rows(qsl, seq, R, 4, 10, 2, table, 4)
    # gather_len = q + min(max(prefix - R, 0), W - 1) = 3 + 3 -> positions 5..10 at columns 2..7
    assert ws.tolist() == [PAD, PAD, 25, 26, 27, 28, 29, 30, PAD, PAD]
    topk = torch.zeros(3, 0, dtype=I32)
    idx, lens = OPS["combined_indices"].reference(topk, qsl, seq, R, 4, 0, 0, 10, 2)
    plain, plens = combined_to_plain(idx, lens, ws)
    # p 8 reads 5..8, p 9 reads 6..9, p 10 reads 7..10 (all >= R 4)
    assert plens.tolist() == [4, 4, 4]
    assert plain[:, :4].tolist() == [[25, 26, 27, 28], [26, 27, 28, 29], [27, 28, 29, 30]]


# ---------------------------------------------------------------------------------------
# values a converter must refuse: below PAD, a slab too narrow, a compressed table too narrow
# ---------------------------------------------------------------------------------------

#: values below PAD: just below it, further, and int32's least
BELOW_PAD = (-2, -5, -(2**31))


def _to_plain(convert):
    if convert == "compact_indices":
        return compact_indices
    return lambda idx, lens, out=None: mixed_to_plain(idx, lens, 2, window_offset=10, topk_offset=100, out=out)


@pytest.mark.parametrize("value", BELOW_PAD)
@pytest.mark.parametrize("past", [False, True], ids=["inside", "past-length"])
@pytest.mark.parametrize("convert", ["compact_indices", "mixed_to_plain"])
def test_an_index_below_pad_is_refused_and_nothing_written(convert, past, value):
    """A value below PAD is neither a row nor PAD (SPEC §5). ``mixed_to_plain`` once added its offset to
    one and handed back a real row (-5 + 10: window row 5), ``compact_indices`` counted it as readable.
    Every entry is checked, those past a token's length included, as the index-building ops check theirs
    (tests/dispatch/test_index_values_below_pad.py); PAD and 0 pass."""
    idx = torch.tensor([[3, 1, 7, PAD], [2, PAD, 4, 6]], dtype=I32)
    lens = torch.tensor([4, 2], dtype=I32)
    good = _to_plain(convert)(idx, lens)
    idx[1, 3 if past else 0] = value
    out = _poison_pair(2, 4)
    before = [o.clone() for o in out]
    with pytest.raises(ValueError) as err:
        _to_plain(convert)(idx, lens, out=out)
    assert str(err.value) == f"{convert}: indices={value}: expected values in [0, 2147483648) or PAD (-1)"
    assert all(torch.equal(o, b) for o, b in zip(out, before)), "a refused call wrote"
    idx[1, 3 if past else 0] = 0 if past else 2  # a row again: the call passes
    got = _to_plain(convert)(idx, lens)
    if not past:
        assert all(torch.equal(g, w) for g, w in zip(got, good))


def test_a_slab_too_narrow_for_its_window_part_is_refused_as_combined_indices_refuses_it():
    """``combined_workspace_rows`` once returned the map of a slab too narrow for a request's gather,
    its newest window position (the token's own) missing; it now raises ``combined_indices``' error for
    the same batch and slab, before ``out`` is written. The stride that fits maps every position."""
    qsl, seq, R = (torch.tensor(v, dtype=I32) for v in ([0, 10, 14], [10, 20], [0, 0]))
    table = torch.arange(10, dtype=I32).reshape(2, 5)  # request 1: position p -> slot 20 + p
    msg = "slab_stride=12: expected >= window_offset + the largest gather length = 13"
    out = torch.full((24,), POISON_INT, dtype=I32)
    with pytest.raises(ValueError) as err:
        combined_workspace_rows(qsl, seq, R, 8, 12, 2, table, 4, out=out)
    assert str(err.value) == f"combined_workspace_rows: {msg}"
    assert (out == POISON_INT).all(), "a refused call wrote"
    with pytest.raises(ValueError) as err:
        OPS["combined_indices"].validate(torch.zeros(14, 4, dtype=I32), qsl, seq, R, 8, 0, 4, 12, 2)
    assert str(err.value) == f"combined_indices: {msg}"
    rows = combined_workspace_rows(qsl, seq, R, 8, 13, 2, table, 4)
    # request 1: 4 queries, prefix 16 -> gather length 4 + min(16, 7) = 11, positions 9..19 at columns 2..12
    assert rows[13:].tolist() == [PAD, PAD] + [20 + p for p in range(9, 20)]
    assert rows[:13].tolist() == [PAD, PAD] + list(range(10)) + [PAD]


def test_the_compressed_table_needs_columns_for_the_entries_a_slab_reads_only():
    """The slab reads compressed entries ``c < min(seq_len // ratio, window_offset)``: a table with columns
    for those passes (it was once refused for lacking the columns of every written entry), one column
    fewer is refused, naming what it fails to cover."""
    qsl, seq, R = (torch.tensor(v, dtype=I32) for v in ([0, 10, 14], [10, 20], [0, 0]))
    table = torch.arange(10, dtype=I32).reshape(2, 5)
    one_col = torch.tensor([[0], [1]], dtype=I32)  # ratio 2, block 4: 2 entries a compressed block
    rows = combined_workspace_rows(qsl, seq, R, 8, 13, 2, table, 4, compressed_block_table=one_col, ratio=2)
    assert rows[:2].tolist() == [0, 1] and rows[13:15].tolist() == [2, 3]
    with pytest.raises(ValueError) as err:
        combined_workspace_rows(qsl, seq, R, 8, 14, 3, table, 4, compressed_block_table=one_col, ratio=2)
    assert str(err.value).endswith("expected at least 2 columns to cover the 3 compressed entries a slab reads "
                                   "(min(seq_len // ratio, window_offset)) at 2 a block")
