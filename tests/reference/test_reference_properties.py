"""Property tests of the torch references: >= 500 random serving-like batches per op.

Each op is compared with the loop oracle of tests/reference/oracles.py (written from SPEC alone)
and with the invariants SPEC states: every SWA index decodes to a position in [lo(p), p];
no token in [R, R + Wr) keeps a slot in a cacheable group; kept rows sum to n; PAD is -1,
never 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracles
import swa_backends as sb
from swa_backends import PAD
from swa_backends.testing.conformance import case_for, random_batch

EXAMPLES = 500
BE = sb.select("cpu")
i32, i64 = torch.int32, torch.int64

seeds = st.integers(0, 2**32 - 1)
batch_knobs = dict(
    W=st.sampled_from([1, 2, 5, 8, 16, 128]),
    block_size=st.sampled_from([1, 2, 16, 64]),
)


def _batch(seed, W, block_size, **kw):
    return random_batch(np.random.default_rng(seed), W=W, block_size=block_size, **kw)


def _decode_slot(slot, table_row, bs):
    """Inverse of the block-table translation: a slot back to its logical position."""
    block, off = divmod(int(slot), bs)
    (col,) = np.nonzero(np.asarray(table_row) == block)[0][:1]
    return int(col) * bs + off


@settings(max_examples=EXAMPLES)
@given(seed=seeds, **batch_knobs)
def test_pad_replayed_slots(seed, W, block_size):
    b = _batch(seed, W, block_size)
    t = b.tensors("cpu")
    slots = t["slot_mappings"]
    before = slots.clone()
    pos = t["positions"][: b.T]
    BE.pad_replayed_slots(slots, t["cacheable_groups"], t["query_start_loc"], pos, t["replay_start"], b.Wr)
    want = oracles.pad_replayed_slots(before.numpy(), b.cacheable, b.qsl, b.positions, b.R, b.Wr)
    assert np.array_equal(slots.numpy(), want)
    # invariant: no replayed token keeps a cacheable slot (a stale replay start replays nothing);
    # window groups and padding untouched
    req = np.repeat(np.arange(b.B), b.q)
    for t_ in range(b.T):
        R = b.R[req[t_]]
        first = b.positions[b.qsl[req[t_]]]
        if 0 < R <= first and R <= b.positions[t_] < R + b.Wr:
            assert all(slots[g, t_] == PAD for g in b.cacheable)
    window = [g for g in range(b.num_groups) if g not in set(b.cacheable.tolist())]
    assert torch.equal(slots[window], before[window])
    assert torch.equal(slots[:, b.T:], before[:, b.T:])


@settings(max_examples=EXAMPLES)
@given(seed=seeds, **batch_knobs, ratio=st.sampled_from([1, 2, 4, 16]))
def test_compressed_slot_mapping(seed, W, block_size, ratio):
    if block_size % ratio:
        ratio = 1
    b = _batch(seed, W, block_size)
    t = b.tensors("cpu")
    tok = t["slot_mappings"][0, : b.T].clone()
    rng = np.random.default_rng(seed)
    if b.T:
        tok[torch.from_numpy(rng.random(b.T) < 0.3)] = PAD
    out = BE.compressed_slot_mapping(tok, t["query_start_loc"], t["seq_lens"], t["block_table"], block_size, ratio)
    want = oracles.compressed_slot_mapping(tok.numpy(), b.qsl, b.seq, b.block_table, block_size, ratio)
    assert np.array_equal(out.numpy(), want)
    if ratio > 1:  # only closing positions write, and padded tokens never do
        closing = (b.positions + 1) % ratio == 0
        assert np.all(out.numpy()[~closing] == PAD)
        assert np.all(out.numpy()[tok.numpy() == PAD] == PAD)


@settings(max_examples=EXAMPLES)
@given(seed=seeds, **batch_knobs, extra_width=st.integers(0, 3), masked=st.booleans())
def test_swa_indices_and_lens(seed, W, block_size, extra_width, masked):
    b = _batch(seed, W, block_size)
    t = b.tensors("cpu")
    T = b.T + b.num_padded
    valid = torch.from_numpy(np.random.default_rng(seed).random(T) < 0.8) if masked else None
    idx, lens = BE.swa_indices_and_lens(t["query_start_loc"], t["seq_lens"], t["block_table"], block_size, W,
                                        t["replay_start"], index_width=W + extra_width, num_tokens=T, valid=valid)
    w_idx, w_lens = oracles.swa_indices_and_lens(b.qsl, b.seq, b.block_table, block_size, W, b.R, W + extra_width, T,
                                                 None if valid is None else valid.numpy())
    assert np.array_equal(idx.numpy(), w_idx) and np.array_equal(lens.numpy(), w_lens)
    assert idx.dtype == i32 and lens.dtype == i32
    # invariant: every index decodes to a position in [lo(p), p]; PAD (never 0) after the length
    req = np.repeat(np.arange(b.B), b.q)
    for t_ in range(b.T):
        if valid is not None and not valid[t_]:
            continue
        r = req[t_]
        p, R = int(b.positions[t_]), oracles.live(b.R[r], b.seq[r], int(b.q[r]))
        n = int(lens[t_])
        assert 1 <= n <= W
        if len(set(b.block_table[r].tolist())) == b.block_table.shape[1]:  # not a null-block dummy: decodable
            decoded = [_decode_slot(s, b.block_table[r], block_size) for s in idx[t_, :n].tolist()]
            assert decoded == list(range(oracles.lo(p, W, R), p + 1))
        assert all(v == PAD for v in idx[t_, n:].tolist())
    assert lens[b.T:].eq(0).all() and idx[b.T:].eq(PAD).all()


@settings(max_examples=EXAMPLES)
@given(seed=seeds, **batch_knobs, data=st.data())
def test_token_windows_and_request_slices_are_slices_of_the_whole(seed, W, block_size, data):
    """``token_offset`` rows are the whole batch's rows from that token on (vLLM builds its
    decode and prefill rows so); ``prefill_gather_lens`` of a slice of requests (query_start_loc
    not from 0) is that slice of the whole result."""
    b = _batch(seed, W, block_size)
    t = b.tensors("cpu")
    T = b.T + b.num_padded
    valid = torch.from_numpy(np.random.default_rng(seed).random(T) < 0.8)
    args = (t["query_start_loc"], t["seq_lens"], t["block_table"], block_size, W, t["replay_start"])
    idx, lens = BE.swa_indices_and_lens(*args, num_tokens=T, valid=valid)
    off = data.draw(st.integers(0, T))
    n = data.draw(st.integers(0, T - off))
    w_idx, w_lens = BE.swa_indices_and_lens(*args, num_tokens=n, token_offset=off, valid=valid[off: off + n])
    assert torch.equal(w_idx, idx[off: off + n]) and torch.equal(w_lens, lens[off: off + n])
    if off <= b.T:  # T resolved from query_start_loc: the rest of the batch's tokens
        r_idx, _ = BE.swa_indices_and_lens(*args, token_offset=off)
        assert torch.equal(r_idx, BE.swa_indices_and_lens(*args)[0][off:])
    gl = BE.prefill_gather_lens(t["query_start_loc"], t["seq_lens"], t["replay_start"], W)
    d = data.draw(st.integers(0, b.B))
    p = data.draw(st.integers(0, b.B - d))
    part = BE.prefill_gather_lens(t["query_start_loc"][d: d + p + 1], t["seq_lens"][d: d + p],
                                  t["replay_start"][d: d + p], W)
    assert torch.equal(part, gl[d: d + p])


@settings(max_examples=EXAMPLES)
@given(seed=seeds, **batch_knobs)
def test_prefill_gather_lens_covers_every_clamped_window(seed, W, block_size):
    b = _batch(seed, W, block_size)
    t = b.tensors("cpu")
    gl = BE.prefill_gather_lens(t["query_start_loc"], t["seq_lens"], t["replay_start"], W)
    assert np.array_equal(gl.numpy(), oracles.prefill_gather_lens(b.qsl, b.seq, b.R, W))
    for i in range(b.B):  # the gather starts exactly at the lowest lo(p) of the chunk
        first = int(b.seq[i] - b.q[i])
        assert b.seq[i] - int(gl[i]) == oracles.lo(first, W, oracles.live(b.R[i], b.seq[i], int(b.q[i])))


@settings(max_examples=EXAMPLES)
@given(seed=seeds, **batch_knobs, ratio=st.sampled_from([0, 1, 4, 128]), top_k=st.sampled_from([0, 3, 16]))
def test_combined_indices(seed, W, block_size, ratio, top_k):
    b = _batch(seed, W, block_size)
    t = b.tensors("cpu")
    rng = np.random.default_rng(seed)
    N = int(rng.integers(1, 40))
    gl = oracles.prefill_gather_lens(b.qsl, b.seq, b.R, W)
    M = N + max(1, int(gl.max()) if b.B else 1)
    topk = torch.from_numpy(rng.integers(-2, N + 3, size=(b.T, top_k)).astype(np.int32))
    idx, lens = BE.combined_indices(topk, t["query_start_loc"], t["seq_lens"], t["replay_start"], W, ratio, top_k, M, N)
    w_idx, w_lens = oracles.combined_indices(topk.numpy(), b.qsl, b.seq, b.R, W, ratio, top_k, M, N)
    assert np.array_equal(idx.numpy(), w_idx) and np.array_equal(lens.numpy(), w_lens)
    assert idx.shape[1] % 128 == 0
    # invariant: every non-PAD entry stays inside its own request's slab
    req = np.repeat(np.arange(b.B), b.q)
    for t_ in range(b.T):
        row = idx[t_].numpy()
        live = row[row != PAD]
        assert np.all(live // M == req[t_])


@settings(max_examples=EXAMPLES)
@given(seed=seeds, **batch_knobs, K=st.integers(0, 9))
def test_mixed_and_plain_indices(seed, W, block_size, K):
    b = _batch(seed, W, block_size)
    t = b.tensors("cpu")
    swa, swa_lens = BE.swa_indices_and_lens(t["query_start_loc"], t["seq_lens"], t["block_table"], block_size, W,
                                            t["replay_start"], num_tokens=b.T)
    rng = np.random.default_rng(seed)
    topk = torch.from_numpy(rng.integers(-1, 500, size=(b.T, K)).astype(np.int32))
    tl = torch.from_numpy(rng.integers(0, K + 1, size=b.T).astype(np.int32))
    m_idx, m_lens = BE.mixed_indices(swa, topk, tl)
    w = oracles.mixed_indices(swa.numpy(), topk.numpy(), tl.numpy())
    assert np.array_equal(m_idx.numpy(), w[0]) and np.array_equal(m_lens.numpy(), w[1])
    assert (m_idx.shape[1] - W) % 4 == 0
    to, wo = int(rng.integers(0, 9)), int(rng.integers(0, 9))
    p_idx, p_lens = BE.plain_indices(swa, swa_lens, topk, tl, topk_offset=to, window_offset=wo)
    w = oracles.plain_indices(swa.numpy(), swa_lens.numpy(), topk.numpy(), tl.numpy(), to, wo)
    assert np.array_equal(p_idx.numpy(), w[0]) and np.array_equal(p_lens.numpy(), w[1])
    # the CSR form drops every PAD, inside or past the length
    indptr, values = BE.indices_to_csr(p_idx, p_lens)
    w_ptr, w_val = oracles.indices_to_csr(p_idx.numpy(), p_lens.numpy())
    assert np.array_equal(indptr.numpy(), w_ptr) and np.array_equal(values.numpy(), w_val)
    assert not (values[: int(indptr[-1])] == PAD).any()


@settings(max_examples=EXAMPLES)
@given(seed=seeds, W=st.sampled_from([1, 4, 16, 128]), block_size=st.sampled_from([1, 16]),
       keep_p=st.floats(0, 0.5), pad_extra=st.none() | st.integers(0, 9), resize=st.booleans())
def test_plan_and_gather_replay_batch(seed, W, block_size, keep_p, pad_extra, resize):
    """The plan from the host query lengths; the gather on the device's, whose decodes
    adaptive verification may have resized (``resize``: the host counts each decode at 1-4 rows)."""
    b = _batch(seed, W, block_size, long_prefill=True)
    t = b.tensors("cpu")
    rng = np.random.default_rng(seed)
    keeps = rng.random(b.B) < keep_p
    host_q = b.q.copy()
    if resize:
        host_q[~b.prefilling] = rng.integers(1, 5, int((~b.prefilling).sum()))
    host_qsl = np.concatenate([[0], np.cumsum(host_q)])
    kept = np.where(b.prefilling & ~keeps, np.minimum(host_q, W), host_q)
    n = int(kept.sum())
    n_dev = n - int(host_q[~b.prefilling].sum()) + int(b.q[~b.prefilling].sum())
    pad_to = None if pad_extra is None and n_dev <= n else max(n, n_dev) + (pad_extra or 0)
    want = oracles.plan_and_gather(host_qsl, b.prefilling, keeps, W, b.qsl, b.seq, b.R, t["positions"].numpy(),
                                   b.slots, pad_to)
    plan = sb.plan_replay_batch(host_qsl, b.prefilling, keeps, W, pad_to=pad_to, trim_threshold=0)
    if want is None:
        assert plan is None
        return
    assert plan.num_rows == want["num_rows"] == int(plan.kept.sum())
    rb = BE.gather_replay_batch(plan, t["query_start_loc"], t["seq_lens"], t["replay_start"], t["positions"],
                                t["slot_mappings"], W)
    for key in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start"):
        assert np.array_equal(getattr(rb, key).numpy(), want[key]), key
    # the device's kept rows; every prefill trimmed to exactly min(q, W)
    assert int(rb.query_start_loc[-1]) == n_dev


@settings(max_examples=EXAMPLES)
@given(seed=seeds, **batch_knobs)
def test_batch_replay_start(seed, W, block_size):
    b = _batch(seed, W, block_size)
    rng = np.random.default_rng(seed)
    n_req = b.B + int(rng.integers(0, 4))
    R_all, idx = rng.integers(0, 500, n_req), rng.permutation(n_req)[: b.B]
    got = BE.batch_replay_start(torch.tensor(R_all, dtype=i32), torch.tensor(idx, dtype=i32),
                                torch.tensor(b.prefilling))
    assert np.array_equal(got.numpy(), oracles.batch_replay_start(R_all, idx, b.prefilling))
    assert got.dtype == i32


@settings(max_examples=EXAMPLES)
@given(seed=seeds, **batch_knobs, extra_width=st.integers(0, 3), data=st.data())
def test_prepare_replay_step(seed, W, block_size, extra_width, data):
    """The step against the loops of its parts: the batch's replay starts behind a request map,
    a token and a request split, a validity group, and half the time a plan with its window builds."""
    with_plan = data.draw(st.booleans())
    b = _batch(seed, W, block_size, long_prefill=with_plan)
    t = b.tensors("cpu")
    rng = np.random.default_rng(seed)
    n_req = b.B + int(rng.integers(0, 3))
    idx = rng.permutation(n_req)[: b.B]
    R_all = rng.integers(0, 500, n_req)
    R_all[idx] = b.R
    kw = {"index_width": W + extra_width}
    if data.draw(st.booleans()):
        kw["prefill_from"] = int(b.qsl[data.draw(st.integers(0, b.B))])
    if data.draw(st.booleans()):
        kw["gather_lens_from"] = data.draw(st.integers(0, b.B))
    window = [g for g in range(b.num_groups) if g not in set(b.cacheable.tolist())]
    if window and data.draw(st.booleans()):
        kw["valid_group"] = window[0]
    plan_from = None
    if with_plan:
        keeps = rng.random(b.B) < 0.3
        n = int(np.where(b.prefilling & ~keeps, np.minimum(b.q, W), b.q).sum())
        pad_to = data.draw(st.none() | st.integers(n, n + 5))
        kw["plan"] = sb.plan_replay_batch(b.qsl, b.prefilling, keeps, W, pad_to=pad_to, trim_threshold=0)
        plan_from = (b.qsl, b.prefilling, keeps, W, pad_to)
        if kw["plan"] is not None:
            kw["kept_windows"] = data.draw(st.integers(0, 2))
    slots = t["slot_mappings"]
    want = oracles.prepare_replay_step(R_all, idx, b.prefilling, b.qsl, b.seq, t["positions"].numpy(), slots.numpy(),
                                       b.cacheable, b.block_table, block_size, W, b.Wr, W + extra_width,
                                       kw.get("prefill_from"), kw.get("gather_lens_from"), kw.get("valid_group"),
                                       plan_from, kw.get("kept_windows", 0))
    got = BE.prepare_replay_step(torch.tensor(R_all, dtype=i32), torch.tensor(idx, dtype=i32), t["is_prefilling"],
                                 t["query_start_loc"], t["seq_lens"], t["positions"], slots, t["cacheable_groups"],
                                 t["block_table"], block_size, W, b.Wr, **kw)
    for name in ("replay_start", "stale_replay", "slot_mappings", "swa_indices", "swa_lens", "prefill_swa_indices",
                 "prefill_swa_lens", "gather_lens"):
        value = getattr(got, name)
        if want[name] is None:  # not asked for
            assert value is None or value.numel() == 0, name
        else:
            assert np.array_equal(value.numpy(), want[name]), name
    if want["replay_batch"] is None:
        assert got.replay_batch is None
        return
    for name in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start"):
        assert np.array_equal(getattr(got.replay_batch, name).numpy(), want["replay_batch"][name]), name
    for build in ("kept_windows", "kept_first_windows")[: kw["kept_windows"]]:
        rows = getattr(got, build)
        assert np.array_equal(rows.swa_indices.numpy(), want[build][0]), build
        assert np.array_equal(rows.swa_lens.numpy(), want[build][1]), build
        assert rows.prefill_swa_indices.numel() == 0 and rows.gather_lens.numel() == 0


@settings(max_examples=EXAMPLES)
@given(seed=seeds)
def test_gather_scatter_rows(seed):
    rng = np.random.default_rng(seed)
    for op in ("gather_rows", "scatter_rows"):
        args, kw = case_for(op, rng, "cpu")
        got = getattr(BE, op)(*args, **kw)
        if op == "gather_rows":
            x, rows = args
            want = torch.stack([x[int(r)] for r in rows]) if len(rows) else x[:0]
        else:
            y, rows, N = args
            want = torch.zeros((N, *y.shape[1:]), dtype=y.dtype)
            count = int(kw["count"][0]) if "count" in kw else len(rows)  # rows past it: padding, not written
            for i, r in enumerate(rows.tolist()[:count]):
                want[r] = y[i]
        assert torch.equal(got, want)


@settings(max_examples=EXAMPLES)
@given(seed=seeds)
def test_sparse_mla_against_float64_loops(seed):
    rng = np.random.default_rng(seed)
    from swa_backends.testing.conformance import sparse_mla_case

    (q, kv, idx, lens, scale, d_v), kw = sparse_mla_case(rng, "cpu", T=int(rng.integers(0, 5)),
                                                        dtype=torch.float32, K=int(rng.integers(1, 20)))
    out, lse = BE.sparse_mla(q, kv, idx, lens, scale, d_v, **kw)
    sink = kw.get("sink")
    w_out, w_lse = oracles.sparse_mla(q.numpy(), kv.numpy(), idx.numpy(), lens.numpy(), scale, d_v,
                                      None if sink is None else sink.numpy())
    assert np.allclose(out.numpy(), w_out, rtol=1e-4, atol=1e-5)
    assert np.array_equal(np.isneginf(lse.numpy()), np.isneginf(w_lse))
    fin = np.isfinite(w_lse)
    assert np.allclose(lse.numpy()[fin], w_lse[fin], rtol=1e-5, atol=1e-5)
    assert not np.isnan(out.numpy()).any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sparse_mla_low_precision_output_dtype(dtype):
    rng = np.random.default_rng(3)
    from swa_backends.testing.conformance import sparse_mla_case

    (q, kv, idx, lens, scale, d_v), kw = sparse_mla_case(rng, "cpu", T=6, dtype=dtype)
    out, lse = BE.sparse_mla(q, kv, idx, lens, scale, d_v, **kw)
    assert out.dtype == dtype and lse.dtype == torch.float32


OUT_OPS = [op for op, spec in sb.OPS.items() if "out" in spec.signature.parameters]


@pytest.mark.parametrize("op", OUT_OPS)
@settings(max_examples=60)
@given(seed=seeds)
def test_out_form_writes_every_element(op, seed):
    """Every op's ``out=`` form, its buffers poisoned (``POISON_INT``, never a valid output), gives
    its functional form's result (which the tests above hold to the oracles): an element the
    reference leaves unwritten shows. (The variant tests hand the
    reference and the variant the same poisoned buffers, so they cannot see it there.)"""
    from swa_backends.testing.conformance import mismatch, to_device

    args, kw = case_for(op, np.random.default_rng(seed), "cpu", poison=True, exact_out=True)
    assert kw.get("out") is not None
    functional = {k: v for k, v in to_device(kw, "cpu").items() if k != "out"}
    want = getattr(BE, op)(*to_device(args, "cpu"), **functional)
    got = getattr(BE, op)(*args, **kw)
    why = mismatch(op, got, want)
    assert why is None, f"{op}: {why}"
