"""Every worked example of SPEC.md §1-§4, through the public API (the CPU backend)."""

from __future__ import annotations

import pytest
import numpy as np
import torch

import swa_backends as sb
from swa_backends import PAD

i32 = torch.int32
i64 = torch.int64


@pytest.fixture(scope="module")
def be():
    return sb.select("cpu")


# --- §1 scheduler -----------------------------------------------------------------------

def test_mark_prefix_replay():
    assert sb.mark_prefix_replay(96, 32) == (32, 64)
    assert sb.mark_prefix_replay(20, 32) == (20, 0)
    assert sb.mark_prefix_replay(500, 0) == (0, 0)


PROMPT = 100


@pytest.mark.parametrize(
    "local, external, hit, R, computed, schedules, load",
    [
        (96, 0, 96, 64, 64, 36, False),  # local hit 96 -> R 64, computed 64, schedules 36
        (0, 63, 48, 16, 16, 84, True),  # external match 63 -> cut to 48 -> R 16
        (0, 64, 64, 32, 32, 68, True),  # external 64 -> R 32, schedules 68
        (32, 0, 0, 0, 0, 100, False),  # hit 32 -> dropped, schedules 100
        (16, 0, 0, 0, 0, 100, False),  # hit 16 -> dropped
        (0, 0, 0, 0, 0, 100, False),  # hit 0 -> R 0
    ],
)
def test_admit_prefix_hit_worked_numbers(local, external, hit, R, computed, schedules, load):
    a = sb.admit_prefix_hit(local, external, 32, 16)
    assert (a.hit, a.replay_start, a.num_computed, a.start_async_load) == (hit, R, computed, load)
    assert PROMPT - a.num_computed == schedules
    assert a.replays == (R > 0)
    assert a.dropped == (0 < local + external - (external % 16) <= 32)


@pytest.mark.parametrize("local, external", [(20, 0), (0, 63), (96, 7), (0, 0)])
def test_admit_prefix_hit_without_replay(local, external):
    # Wr 0: nothing replays; the whole hit counts, no block cut, nothing dropped (a short hit too)
    a = sb.admit_prefix_hit(local, external, 0, 16)
    hit = local + external
    assert (a.hit, a.replay_start, a.num_computed, a.replays, a.dropped) == (hit, 0, hit, False, False)
    assert a.start_async_load == (external > 0)


def test_admit_prefix_hit_short_external_cut_to_zero_starts_no_load():
    a = sb.admit_prefix_hit(0, 15, 32, 16)
    assert (a.hit, a.start_async_load, a.external_hit) == (0, False, 0)


def test_admit_prefix_hit_loads_window_never_replays():
    a = sb.admit_prefix_hit(0, 63, 32, 16, loads_window=True)
    assert (a.hit, a.replay_start, a.num_computed, a.start_async_load) == (63, 0, 63, True)
    short = sb.admit_prefix_hit(16, 0, 32, 16, loads_window=True)
    assert (short.hit, short.replay_start, short.dropped) == (16, 0, False)  # hits <= Wr kept


def test_admit_prefix_hit_boundary_retained_keeps_partial_block():
    a = sb.admit_prefix_hit(0, 63, 32, 16, boundary_retained=True)
    assert (a.hit, a.replay_start) == (63, 31)


def test_replay_block_is_live_matches_the_block_cut():
    # external 63 uncut would put R = 31 in block 1, freed once 63 tokens are computed
    assert not sb.replay_block_is_live(63, 32, 16)
    assert sb.replay_block_is_live(63, 32, 16, retained=True)
    for hit in (48, 64, 96):  # the admitted (block-aligned) hits of the worked numbers
        assert sb.replay_block_is_live(hit, 32, 16)
    assert sb.replay_block_is_live(20, 32, 16)  # R = 0: nothing to check


def test_replay_layer_ids():
    assert list(sb.replay_layer_ids(40, range(21))) == list(range(21, 40))  # V4.1-Flash: 21..39
    assert list(sb.replay_layer_ids(40, [3, 20, 7], trim_cut_layer=True)) == list(range(20, 40))


# --- §2 encoder side ----------------------------------------------------------------------

def test_batch_replay_start(be):
    R_all = torch.tensor([0, 16, 200, 64], dtype=i32)
    out = torch.full((3,), -5, dtype=i32)
    res = be.batch_replay_start(R_all, torch.tensor([3, 1, 2], dtype=i32), torch.tensor([True, False, True]), out=out)
    assert res.data_ptr() == out.data_ptr()
    assert res.tolist() == [64, 0, 200]


def test_pad_replayed_slots_worked_example(be):
    # Wr = 12; request (R 16, q 14, seq 30) and a cold request (q 2)
    qsl = torch.tensor([0, 14, 16], dtype=i32)
    positions = torch.cat([torch.arange(16, 30), torch.arange(0, 2)]).to(i64)
    cacheable_row = 1000 + positions
    swa_row = 5000 + positions
    slots = torch.stack([cacheable_row, swa_row])
    be.pad_replayed_slots(slots, torch.tensor([0], dtype=i32), qsl, positions, torch.tensor([16, 0], dtype=i32), 12)
    assert slots[0].tolist() == [PAD] * 12 + [1028, 1029] + [1000, 1001]
    assert torch.equal(slots[1], swa_row)  # the SWA group row is unchanged


def test_pad_replayed_slots_leaves_padding_columns_alone(be):
    qsl = torch.tensor([0, 4], dtype=i32)
    positions = torch.arange(8, 12, dtype=i64)
    slots = torch.arange(12, dtype=i64).reshape(2, 6) + 100  # 2 padded columns past the batch
    before = slots.clone()
    be.pad_replayed_slots(slots, torch.tensor([0, 1], dtype=i32), qsl, positions, torch.tensor([8], dtype=i32), 2)
    assert slots[:, :2].eq(PAD).all() and torch.equal(slots[:, 2:], before[:, 2:])


def _identity_table(B, blocks):
    return torch.arange(blocks, dtype=i32).repeat(B, 1)


def test_swa_indices_and_lens_worked_example(be):
    # W 8, block 64, identity table: seq [40,12,30], q [24,12,10], R [12,0,0]
    qsl = torch.tensor([0, 24, 36, 46], dtype=i32)
    seq = torch.tensor([40, 12, 30], dtype=i32)
    R = torch.tensor([12, 0, 0], dtype=i32)
    idx, lens = be.swa_indices_and_lens(qsl, seq, _identity_table(3, 1), 64, 8, R, num_tokens=46)
    t16 = 16 - 16  # request 0 starts at position 40 - 24 = 16
    assert lens[t16].item() == 5 and idx[t16, :5].tolist() == [12, 13, 14, 15, 16]
    assert idx[t16, 5:].tolist() == [PAD] * 3
    t39 = 23
    assert lens[t39].item() == 8 and idx[t39].tolist() == list(range(32, 40))
    assert lens[24].item() == 1 and idx[24, 0].item() == 0  # request 1 position 0: its own slot 0


def test_swa_indices_padded_tokens_are_all_pad(be):
    qsl = torch.tensor([0, 3], dtype=i32)
    idx, lens = be.swa_indices_and_lens(qsl, torch.tensor([3], dtype=i32), _identity_table(1, 1), 16, 4,
                                        torch.tensor([0], dtype=i32), num_tokens=5,
                                        valid=torch.tensor([True, False, True, True, True]))
    assert lens.tolist() == [1, 0, 3, 0, 0]
    assert idx[1].eq(PAD).all() and idx[3:].eq(PAD).all()


def test_prefill_gather_lens_worked_example(be):
    qsl = torch.tensor([0, 24, 36, 46], dtype=i32)
    lens = be.prefill_gather_lens(qsl, torch.tensor([40, 12, 30], dtype=i32), torch.tensor([12, 0, 0], dtype=i32), 8)
    assert lens.tolist() == [28, 12, 17]


def test_first_replay_chunk_gathers_exactly_from_R(be):
    # prefix == R: the gather starts at R, not W - 1 positions earlier
    qsl = torch.tensor([0, 10], dtype=i32)
    seq, R = torch.tensor([74], dtype=i32), torch.tensor([64], dtype=i32)
    (gl,) = be.prefill_gather_lens(qsl, seq, R, 32).tolist()
    assert 74 - gl == 64


def test_compressed_slot_mapping_inherits_padding(be):
    # ratio 4, block 16 (4 compressed entries per block); one request, positions 0..15
    qsl = torch.tensor([0, 16], dtype=i32)
    seq = torch.tensor([16], dtype=i32)
    table = torch.tensor([[7]], dtype=i32)
    token_slots = torch.arange(112, 128, dtype=i64)
    token_slots[:8] = PAD  # replayed tokens (padded by pad_replayed_slots)
    out = be.compressed_slot_mapping(token_slots, qsl, seq, table, 16, 4)
    expect = [PAD] * 16
    expect[11], expect[15] = 7 * 4 + 2, 7 * 4 + 3  # closing positions 11 and 15 -> entries 2, 3
    assert out.tolist() == expect
    assert torch.equal(be.compressed_slot_mapping(token_slots, qsl, seq, table, 16, 1), token_slots)


def test_combined_layout_out_of_slab_topk_stays_pad(be):
    # one token at p 7 (ratio 4 -> 2 top-k entries), N 10, M 100, two requests
    qsl = torch.tensor([0, 1, 2], dtype=i32)
    seq = torch.tensor([8, 8], dtype=i32)
    R = torch.zeros(2, dtype=i32)
    topk = torch.tensor([[3, -1], [10, 4]], dtype=i32)  # -1 and N are outside [0, N)
    idx, lens = be.combined_indices(topk, qsl, seq, R, 4, 4, 2, 100, 10)
    assert idx.shape == (2, 128)
    assert lens.tolist() == [2 + 4, 2 + 4]
    assert idx[0, :2].tolist() == [3, PAD]  # never M*b - 1 = -1 for b = 0 ...
    assert idx[1, :2].tolist() == [PAD, 104]  # ... nor 99 (the previous slab) for b = 1
    # window part: gather covers positions 4..7 (gather_len 4), so columns N + 0..3 of each slab
    assert idx[0, 2:6].tolist() == [10, 11, 12, 13]
    assert idx[1, 2:6].tolist() == [110, 111, 112, 113]
    assert idx[:, 6:].eq(PAD).all()


# --- §3 decoder side ----------------------------------------------------------------------

def test_gather_replay_batch_worked_example(be):
    # W 128: decode (q 1, seq 500), prefill (q 300, seq 300), prefill (q 100, seq 300, R 50)
    qsl_host = [0, 1, 301, 401]
    plan = sb.plan_replay_batch(qsl_host, [False, True, True], [False, False, False], 128, trim_threshold=0)
    assert plan is not None and plan.num_rows == 229
    assert plan.dropped_before.tolist() == [0, 0, 172, 172]
    qsl = torch.tensor(qsl_host, dtype=i32)
    seq = torch.tensor([500, 300, 300], dtype=i32)
    R = torch.tensor([0, 0, 50], dtype=i32)
    positions = torch.cat([torch.tensor([499]), torch.arange(0, 300), torch.arange(200, 300)]).to(i64)
    slots = torch.stack([positions * 3, positions + 7])
    rb = be.gather_replay_batch(plan, qsl, seq, R, positions, slots, 128)
    assert rb.rows.tolist() == [0, *range(173, 301), *range(301, 401)]
    assert rb.query_start_loc.tolist() == [0, 1, 129, 229]
    assert rb.kv_start.tolist() == [0, 172, 50]
    assert torch.equal(rb.positions, positions[rb.rows])
    assert torch.equal(rb.slot_mappings, slots[:, rb.rows])


def test_gather_replay_batch_padding_gathers_row0_with_pad_slots(be):
    plan = sb.plan_replay_batch([0, 200], [True], [False], 128, pad_to=[64, 256, 512], trim_threshold=0)
    assert (plan.num_rows, plan.num_rows_padded) == (128, 256)
    positions = torch.arange(200, dtype=i64)
    slots = positions[None] + 1000
    rb = be.gather_replay_batch(plan, torch.tensor([0, 200], dtype=i32), torch.tensor([200], dtype=i32),
                                torch.tensor([0], dtype=i32), positions, slots, 128)
    assert rb.rows[128:].eq(0).all() and rb.slot_mappings[:, 128:].eq(PAD).all()
    assert rb.slot_mappings[:, :128].ne(PAD).all()


@pytest.mark.parametrize("variant, checked", [("reference", True), ("triton", True), ("triton", False)])
@pytest.mark.parametrize("B", [0, 1])
def test_a_step_with_no_token_rows_is_all_graph_padding(variant, checked, B):
    # no token row at all (no request, or a request of 0 tokens) and a sub-batch padded to a graph size:
    # every row is padding, position 0 (there is no row 0 to read), every slot PAD, in every variant
    ops = {"gather_replay_batch": variant, "prepare_replay_step": variant}
    b = sb.select("cpu", prefer=ops if variant == "triton" else None, checked=checked)
    plan = sb.ReplayPlan.from_kept(np.zeros(B, np.int32), np.zeros(B + 1, np.int64), 2, 8,
                                   is_prefilling=np.zeros(B, bool))
    qsl, seq = torch.zeros(B + 1, dtype=i32), torch.full((B,), 14, dtype=i32)
    positions, slots = torch.zeros(0, dtype=i64), torch.zeros(2, 0, dtype=i64)
    rb = b.gather_replay_batch(plan, qsl, seq, torch.zeros(B, dtype=i32), positions, slots, 8)
    assert rb.rows.tolist() == [0, 0] and rb.positions.tolist() == [0, 0] and rb.query_start_loc.tolist() == [0] * (B + 1)
    assert rb.slot_mappings.eq(PAD).all() and rb.slot_mappings.shape == (2, 2)
    if B:
        st = b.prepare_replay_step(torch.tensor([20], dtype=i32), torch.zeros(B, dtype=i32), torch.ones(B, dtype=torch.bool),
                                   qsl, seq, positions, slots, torch.tensor([0], dtype=i32), torch.zeros(B, 4, dtype=i32),
                                   4, 8, 8, plan=plan)
        assert st.replay_start.tolist() == [0] and st.stale_replay.tolist() == [1]
        assert st.replay_batch.rows.tolist() == [0, 0] and st.replay_batch.positions.tolist() == [0, 0]
        assert st.replay_batch.slot_mappings.eq(PAD).all()


@pytest.mark.parametrize("variant, checked", [("reference", True), ("triton", True), ("triton", False)])
@pytest.mark.parametrize("with_plan", [False, True])
def test_prepare_step_pads_as_its_parts_when_positions_and_seq_lens_disagree(variant, checked, with_plan):
    # R = 8 is live by seq_lens (seq 12 - q 4) and stale by the first position (7): the step is the
    # composition of its parts (SPEC §3.6), and pad_replayed_slots judges R against the first
    # position (SPEC §0), so nothing is padded, in the batch's slots or the sub-batch's gathered ones
    ops = {"prepare_replay_step": variant, "pad_replayed_slots": variant}
    b = sb.select("cpu", prefer=ops if variant == "triton" else None, checked=checked)
    qsl, seq, positions = torch.tensor([0, 4], dtype=i32), torch.tensor([12], dtype=i32), torch.arange(7, 11, dtype=i64)
    slots = torch.stack([torch.arange(100, 104, dtype=i64), torch.arange(200, 204, dtype=i64)])
    alone = slots.clone()
    b.pad_replayed_slots(alone, torch.tensor([0], dtype=i32), qsl, positions, torch.tensor([8], dtype=i32), 8)
    plan = sb.ReplayPlan.from_kept(np.array([2], np.int32), np.array([0, 4], np.int64), 2, 2) if with_plan else None
    st = b.prepare_replay_step(torch.tensor([8], dtype=i32), torch.tensor([0], dtype=i32), torch.tensor([True]), qsl,
                               seq, positions, slots, torch.tensor([0], dtype=i32),
                               torch.arange(4, dtype=i32).reshape(1, 4), 4, 2 if with_plan else 8, 8, plan=plan)
    assert torch.equal(slots, alone) and slots[0].tolist() == [100, 101, 102, 103]
    assert st.replay_start.tolist() == [8] and st.stale_replay.tolist() == [0]
    if with_plan:
        assert st.replay_batch.slot_mappings.tolist() == [[102, 103], [202, 203]]


def test_plan_none_when_nothing_trims():
    assert sb.plan_replay_batch([0, 1, 2, 130], [False, False, True], [False, False, False], 128, trim_threshold=0) is None
    assert sb.plan_replay_batch([0, 300], [True], [True], 128, trim_threshold=0) is None  # keeps all rows (prompt logprobs)
    assert sb.plan_replay_batch([0, 300], [False], [False], 128, trim_threshold=0) is None  # decode/spec rows never trim
    assert sb.plan_replay_batch([0], [], [], 128, trim_threshold=0) is None  # an empty batch (plain lists)


def test_gather_and_scatter_rows_roundtrip(be):
    x = torch.randn(10, 3, 4)
    rows = torch.tensor([1, 4, 9], dtype=i64)
    y = be.gather_rows(x, rows)
    assert torch.equal(y, x[rows])
    back = be.scatter_rows(y, rows, 10)
    assert torch.equal(back[rows], x[rows])
    mask = torch.ones(10, dtype=torch.bool)
    mask[rows] = False
    assert back[mask].eq(0).all()  # trimmed rows of the scatter output are zero


def test_sparse_mla_sink_joins_the_denominator_not_the_lse(be):
    q, kv = torch.randn(1, 2, 8), torch.randn(4, 8)
    idx = torch.tensor([[0, 2, PAD, 3]], dtype=i32)
    sink = torch.tensor([0.5, float("-inf")])
    out, lse = be.sparse_mla(q, kv, idx, torch.tensor([3], dtype=i32), 0.3, 8, sink=sink)
    scores = (q[0] @ kv[[0, 2]].T) * 0.3  # [H, 2]: the valid indices (PAD and j >= lens skipped)
    assert torch.allclose(lse[0], torch.logsumexp(scores, dim=-1), atol=1e-5)
    denom = torch.exp(scores).sum(-1) + torch.exp(sink)  # exp(-inf) = 0: no sink for head 1
    assert torch.allclose(out[0], (torch.exp(scores) / denom[:, None]) @ kv[[0, 2]], atol=1e-5)


def test_sparse_mla_nothing_valid_gives_zeros_and_neg_inf(be):
    q = torch.randn(2, 3, 8)
    kv = torch.randn(5, 8)
    idx = torch.tensor([[PAD, PAD], [1, PAD]], dtype=i32)
    out, lse = be.sparse_mla(q, kv, idx, torch.tensor([2, 0], dtype=i32), 0.3, 8, sink=torch.randn(3))
    assert out.eq(0).all() and torch.isneginf(lse).all()


def test_prepare_replay_step_worked_example(be):
    # SPEC §3.6: W 8, Wr 4, block 4; a decode (q 1, seq 9) and a replaying prefill (q 4, seq 12, R 8)
    qsl = torch.tensor([0, 1, 5], dtype=i32)
    seq = torch.tensor([9, 12], dtype=i32)
    positions = torch.tensor([8, 8, 9, 10, 11], dtype=i64)
    slots = torch.arange(15, dtype=i64).reshape(3, 5) + 100  # group 0 cacheable, group 2 the window's
    table = torch.arange(8, dtype=i32).reshape(2, 4)
    got = be.prepare_replay_step(torch.tensor([0, 8], dtype=i32), torch.tensor([0, 1], dtype=i32),
                                 torch.tensor([False, True]), qsl, seq, positions, slots, torch.tensor([0], dtype=i32),
                                 table, 4, 8, 4, prefill_from=1, gather_lens_from=1, valid_group=2)
    assert got.swa_indices.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]] and got.swa_lens.tolist() == [8]
    assert got.prefill_swa_lens.tolist() == [1, 2, 3, 4]
    assert got.prefill_swa_indices[3].tolist() == [24, 25, 26, 27, PAD, PAD, PAD, PAD]  # block 6 of request 1
    assert got.gather_lens.tolist() == [4]
    assert slots[0].tolist() == [100, PAD, PAD, PAD, PAD] and slots[1, 1:].ne(PAD).all()
    # the sub-batch's builds: a plan keeping the decode's row and the prefill's last two
    from swa_backends.common.types import ReplayPlan

    plan = ReplayPlan.from_kept(np.array([1, 2], dtype=np.int32), np.array([0, 1, 5], dtype=np.int32), 3, 8)
    slots = torch.arange(15, dtype=i64).reshape(3, 5) + 100
    got = be.prepare_replay_step(torch.tensor([0, 8], dtype=i32), torch.tensor([0, 1], dtype=i32),
                                 torch.tensor([False, True]), qsl, seq, positions, slots, torch.tensor([0], dtype=i32),
                                 table, 4, 8, 4, prefill_from=1, gather_lens_from=1, valid_group=2, plan=plan,
                                 kept_windows=2, kept_prefill_from=1, kept_gather_lens_from=1)
    assert got.replay_batch.kv_start.tolist() == [0, 8]
    for build in (got.kept_windows, got.kept_first_windows):
        assert build.swa_indices.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]] and build.swa_lens.tolist() == [8]
        assert build.prefill_swa_lens.tolist() == [3, 4]
        assert build.prefill_swa_indices.tolist() == [[24, 25, 26] + [PAD] * 5, [24, 25, 26, 27] + [PAD] * 4]
        assert build.gather_lens.tolist() == [4]


# --- the seeds' corners: stale replay starts (§0), the null block (§2.3), device-resized
# --- decodes (§3.2), the trim policy (§3.5) -----------------------------------------------

def test_stale_replay_start_counts_as_no_replay(be):
    # SPEC §0: W 8, block 64, identity table; positions 4..7 (q 4, seq 8) with a stale R = 6
    qsl, seq, R = torch.tensor([0, 4], dtype=i32), torch.tensor([8], dtype=i32), torch.tensor([6], dtype=i32)
    table = torch.arange(4, dtype=i32).reshape(1, 4)
    idx, lens = be.swa_indices_and_lens(qsl, seq, table, 64, 8, R, num_tokens=4)
    cold_idx, cold_lens = be.swa_indices_and_lens(qsl, seq, table, 64, 8, torch.zeros(1, dtype=i32), num_tokens=4)
    assert lens.tolist() == cold_lens.tolist() == [5, 6, 7, 8] and torch.equal(idx, cold_idx)
    assert be.prefill_gather_lens(qsl, seq, R, 8).tolist() == [8]
    positions = torch.arange(4, 8, dtype=i64)
    slots = torch.stack([positions + 100, positions + 200])
    be.pad_replayed_slots(slots, torch.tensor([0], dtype=i32), qsl, positions, R, 8)
    assert slots[0].tolist() == [104, 105, 106, 107]  # nothing padded
    got = be.prepare_replay_step(R, torch.tensor([0], dtype=i32), torch.tensor([True]), qsl, seq, positions,
                                 slots, torch.tensor([0], dtype=i32), table, 64, 8, 8)
    assert got.replay_start.tolist() == [0] and got.stale_replay.tolist() == [1]
    assert torch.equal(got.swa_indices, cold_idx) and slots[0].tolist() == [104, 105, 106, 107]
    # §2.2: any_replay=False says every R as given is 0; a stale R > 0 is still one (the host flag
    # cannot know it is stale)
    with pytest.raises(ValueError, match="any_replay"):
        be.pad_replayed_slots(slots, torch.tensor([0], dtype=i32), qsl, positions, R, 8, any_replay=False)
    with pytest.raises(ValueError, match="any_replay"):
        be.prepare_replay_step(R, torch.tensor([0], dtype=i32), torch.tensor([True]), qsl, seq, positions, slots,
                               torch.tensor([0], dtype=i32), table, 64, 8, 8, any_replay=False)


def test_live_replay_start_is_not_stale(be):
    # the same request resuming at its replay start (R = 4 = its first position) replays
    qsl, seq, R = torch.tensor([0, 4], dtype=i32), torch.tensor([8], dtype=i32), torch.tensor([4], dtype=i32)
    table = torch.arange(4, dtype=i32).reshape(1, 4)
    positions = torch.arange(4, 8, dtype=i64)
    slots = torch.stack([positions + 100, positions + 200])
    got = be.prepare_replay_step(R, torch.tensor([0], dtype=i32), torch.tensor([True]), qsl, seq, positions,
                                 slots, torch.tensor([0], dtype=i32), table, 64, 8, 8)
    assert got.replay_start.tolist() == [4] and got.stale_replay.tolist() == [0]
    assert got.swa_lens.tolist() == [1, 2, 3, 4] and slots[0].eq(PAD).all()


def test_compressed_slot_mapping_never_writes_the_null_block(be):
    # SPEC §2.3: ratio 2, block 4, an all-zero table (a graph-capture dummy), 16 tokens at positions 0..15
    qsl, seq = torch.tensor([0, 16], dtype=i32), torch.tensor([16], dtype=i32)
    zeros = torch.zeros(1, 4, dtype=i32)
    token_slots = torch.arange(16, dtype=i64)
    assert be.compressed_slot_mapping(token_slots, qsl, seq, zeros, 4, 2).eq(PAD).all()
    without = be.compressed_slot_mapping(token_slots, qsl, seq, zeros, 4, 2, null_block=None)
    assert int(without.ne(PAD).sum()) == 8  # what the null block would receive
    # an engine whose null block is another id: block 3 is skipped, block 0 is real
    table = torch.tensor([[0, 3, 1, 2]], dtype=i32)
    got = be.compressed_slot_mapping(token_slots, qsl, seq, table, 4, 2, null_block=3)
    assert got[1::2].tolist() == [0, 1, PAD, PAD, 2, 3, 4, 5] and got[0::2].eq(PAD).all()


def _resized(be, device_qsl, *, validate=True, T=12, pad_to=None):
    """SPEC §3.2's resized example: two decodes and a 10-token prefill, W 4, host qsl [0, 1, 2, 12]
    (``T`` tokens in the batch's buffers)."""
    plan = sb.plan_replay_batch([0, 1, 2, 12], [False, False, True], [False] * 3, 4, trim_threshold=0, pad_to=pad_to)
    assert plan.kept.tolist() == [1, 1, 4] and plan.dropped_before.tolist() == [0, 0, 0, 6]
    positions = torch.arange(100, 100 + T, dtype=i64)
    slots = torch.stack([positions + 1000, positions + 2000])
    args = (plan, torch.tensor(device_qsl, dtype=i32), torch.tensor([200, 300, 110], dtype=i32),
            torch.zeros(3, dtype=i32), positions, slots, 4)
    with sb.validation(validate):
        return be.gather_replay_batch(*args), positions, slots


def test_gather_replay_batch_follows_device_resized_decodes(be):
    rb, positions, slots = _resized(be, [0, 2, 2, 12])  # rows moved between the decodes
    assert rb.query_start_loc.tolist() == [0, 2, 2, 6] and rb.rows.tolist() == [0, 1, 8, 9, 10, 11]
    assert torch.equal(rb.positions, positions[rb.rows]) and torch.equal(rb.slot_mappings, slots[:, rb.rows])
    rb, positions, slots = _resized(be, [0, 1, 1, 11])  # one row fewer: the last row is padding
    assert rb.query_start_loc.tolist() == [0, 1, 1, 5] and rb.rows.tolist() == [0, 7, 8, 9, 10, 0]
    assert torch.equal(rb.slot_mappings[:, :5], slots[:, [0, 7, 8, 9, 10]]) and rb.slot_mappings[:, 5].eq(PAD).all()
    with pytest.raises(ValueError, match="query_start_loc.*fit"):
        _resized(be, [0, 3, 4, 14], T=14)  # two rows more than the sub-batch holds
    rb, _, _ = _resized(be, [0, 3, 4, 14], validate=False, T=14)  # unchecked: never past the buffers
    assert rb.rows.tolist() == [0, 1, 2, 3, 10, 11] and rb.rows.shape == (6,)


def test_scatter_of_a_resized_sub_batch_leaves_its_padding_out(be):
    # SPEC §3.3's example: the sub-batch of §3.2's device qsl [0, 1, 1, 11], its last row padding (row 0)
    rb, _, _ = _resized(be, [0, 1, 1, 11])
    y = torch.arange(1.0, 7.0)[:, None].expand(6, 3).contiguous()  # row i of the sub-batch: i + 1
    got = be.scatter_rows(y, rb.rows, 12, count=rb.query_start_loc[-1:])
    want = torch.zeros(12, 3)
    want[[0, 7, 8, 9, 10]] = y[:5]
    assert torch.equal(got, want)  # row 0 is the decode's own row, not the padding's 6
    assert torch.equal(be.scatter_rows(y, rb.rows, 12, count=torch.tensor([0], dtype=i64)), torch.zeros(12, 3))
    assert torch.equal(be.scatter_rows(y[:5], rb.rows[:5], 12, count=torch.tensor([5], dtype=i64)),
                       be.scatter_rows(y[:5], rb.rows[:5], 12))  # every row: as without a count
    with pytest.raises(ValueError, match=r"scatter_rows: count=7: expected values in \[0, 7\)"):
        be.scatter_rows(y, rb.rows, 12, count=torch.tensor([7], dtype=i32))
    with pytest.raises(ValueError, match="scatter_rows: count=.*expected shape"):
        be.scatter_rows(y, rb.rows, 12, count=torch.tensor([5, 5], dtype=i32))


def test_scatter_of_a_sub_batch_the_device_grew_writes_every_kept_row(be):
    # SPEC §3.3: decodes the device grew (host [1, 1], device [2, 2]) inside a graph-padded sub-batch
    # (n_pad 8): n_dev = 8 > num_rows = 6, so the real rows run past num_rows
    rb, _, _ = _resized(be, [0, 2, 4, 14], T=14, pad_to=8)
    assert rb.num_rows == 6 and rb.rows.tolist() == [0, 1, 2, 3, 10, 11, 12, 13]
    y = torch.arange(1.0, 9.0)[:, None]
    got = be.scatter_rows(y, rb.rows, 14, count=rb.query_start_loc[-1:])
    want = torch.zeros(14, 1)
    want[[0, 1, 2, 3, 10, 11, 12, 13]] = y
    assert torch.equal(got, want)
    # only the plan's first num_rows rows: the prefill's last two are lost
    short = be.scatter_rows(y[: rb.num_rows], rb.rows[: rb.num_rows], 14)
    assert short[12:].eq(0).all() and not want[12:].eq(0).any()


@pytest.mark.parametrize("checked", [True, False])
def test_the_resized_sub_batch_round_trip_on_triton(be, checked):
    # the same corner through the Triton variants, validated and not: gather, scatter with the device count
    tb = sb.select("cpu", prefer={"gather_replay_batch": "triton", "gather_rows": "triton", "scatter_rows": "triton"},
                   checked=checked)
    rb, _, _ = _resized(tb, [0, 1, 1, 11], validate=checked)
    assert rb.rows.tolist() == [0, 7, 8, 9, 10, 0] and rb.query_start_loc.tolist() == [0, 1, 1, 5]
    h = torch.arange(1.0, 13.0)[:, None].expand(12, 3).contiguous()  # row r of the batch: r + 1
    y = tb.gather_rows(h, rb.rows) * 10
    y[5] = -1.0  # whatever the replay layers leave in the padding row
    got = tb.scatter_rows(y, rb.rows, 12, count=rb.query_start_loc[-1:])
    want = torch.zeros(12, 3)
    want[[0, 7, 8, 9, 10]] = h[[0, 7, 8, 9, 10]] * 10
    assert torch.equal(got, want)
    assert torch.equal(got, be.scatter_rows(y, rb.rows, 12, count=rb.query_start_loc[-1:]))
    # decodes the device grew inside a graph-padded sub-batch (n_dev 8 > num_rows 6): every kept row comes back
    rb, _, _ = _resized(tb, [0, 2, 4, 14], validate=checked, T=14, pad_to=8)
    assert rb.rows.tolist() == [0, 1, 2, 3, 10, 11, 12, 13]
    h = torch.arange(1.0, 15.0)[:, None].expand(14, 3).contiguous()
    got = tb.scatter_rows(tb.gather_rows(h, rb.rows) * 10, rb.rows, 14, count=rb.query_start_loc[-1:])
    want = torch.zeros(14, 3)
    want[rb.rows] = h[rb.rows] * 10
    assert torch.equal(got, want)


def test_gather_replay_batch_refuses_a_resized_prefill(be):
    with pytest.raises(ValueError, match="a trimmed request"):
        _resized(be, [0, 1, 2, 11])  # the prefill (trimmed) is a row shorter on the device
    plan = sb.plan_replay_batch([0, 1, 3, 13], [False, True, True], [False] * 3, 4, trim_threshold=0)
    assert plan.trimmed.tolist() == [False, False, True]
    positions = torch.arange(13, dtype=i64)
    with pytest.raises(ValueError, match="a prefill"):  # an untrimmed prefill resized: only decodes may be
        be.gather_replay_batch(plan, torch.tensor([0, 2, 3, 13], dtype=i32), torch.tensor([50, 60, 70], dtype=i32),
                               torch.zeros(3, dtype=i32), positions, positions[None] + 5, 4)


def test_plan_trim_policy():
    # SPEC §3.5: W 128, a decode and a 900-token prefill (901 tokens)
    qsl, pre, keeps = [0, 1, 901], [False, True], [False, False]
    assert sb.plan_replay_batch(qsl, pre, keeps, 128).kept.tolist() == [1, 128]
    assert sb.plan_replay_batch(qsl, pre, keeps, 128, graph_mode="piecewise").kept.tolist() == [1, 128]
    assert sb.plan_replay_batch(qsl, pre, keeps, 128, graph_mode="full") is None
    assert sb.plan_replay_batch(qsl, pre, keeps, 128, trim_threshold=1000) is None
    assert sb.plan_replay_batch([0, 1, 301], pre, keeps, 128) is None  # 301 < 768 tokens
    assert sb.plan_replay_batch([0, 1, 301], pre, keeps, 128, num_tokens=1024).kept.tolist() == [1, 128]  # padded size
    assert sb.TRIM_THRESHOLD == 768
    # the threshold itself trims, a token fewer does not
    assert sb.plan_replay_batch([0, 1, 768], pre, keeps, 128).kept.tolist() == [1, 128]
    assert sb.plan_replay_batch([0, 1, 767], pre, keeps, 128) is None
    assert sb.plan_replay_batch([0, 1, 301], pre, keeps, 128, num_tokens=767) is None


# --- §4 the capability decision -----------------------------------------------------------


def _ids(decision):
    """The rule ids of a side's reasons, in order ([id] opens each reason)."""
    return [r[1:r.index("]")] for r in decision.reasons]


def test_capabilities_ascend_worked_example():
    def caps(**kw):
        return sb.capabilities("ascend:910b", config=sb.ServingConfig(graph_mode="decode_only", **kw))

    on = caps()
    assert on.encoder_replay.enabled and on.decoder_replay.enabled
    assert _ids(caps(model_runner="v1").decoder_replay) == ["ascend-runner"]
    assert _ids(caps(pipeline_parallel_size=2).decoder_replay) == ["ascend-pp"]
    dcp = caps(decode_context_parallel_size=2)
    assert _ids(dcp.encoder_replay) == ["dcp"] and _ids(dcp.decoder_replay) == ["needs-encoder", "ascend-dcp"]
    assert _ids(caps(drafter="eagle", drafter_window=128).decoder_replay) == ["ascend-drafter"]
    assert caps(drafter="dspark", drafter_window=128).decoder_replay.enabled
    assert _ids(caps(drafter="dspark", drafter_window=256).decoder_replay) == ["drafter-window"]
    assert _ids(caps(drafter="dspark").decoder_replay) == ["drafter-window-unknown"]
    piecewise = sb.capabilities("ascend:910b", config=sb.ServingConfig(graph_mode="piecewise"))
    assert _ids(piecewise.decoder_replay) == ["ascend-graph"]


def test_capabilities_takes_its_config_as_spec_writes_the_call():
    """``capabilities(device, config)`` (§4), positionally as well as by keyword, a mapping of its fields too."""
    pcp = dict(prefill_context_parallel_size=2, graph_mode="none", async_scheduling=False)
    positional = sb.capabilities("cuda:sm90", sb.ServingConfig(**pcp))
    assert positional == sb.capabilities("cuda:sm90", config=sb.ServingConfig(**pcp)) == sb.capabilities("cuda:sm90", pcp)
    assert positional.encoder_replay.enabled and _ids(positional.decoder_replay) == ["pcp"]
    with pytest.raises(ValueError, match="pcp_size"):
        sb.capabilities("cuda:sm90", {"pcp_size": 2})


def test_capabilities_pcp_worked_example():
    pcp = dict(prefill_context_parallel_size=2, graph_mode="none", async_scheduling=False)
    base = sb.capabilities("cuda:sm90", config=sb.ServingConfig(**pcp))
    assert base.encoder_replay.enabled and _ids(base.decoder_replay) == ["pcp"]
    for extra, rule in ((dict(kv_connector=True), "pcp-connector"), (dict(drafter="ngram"), "pcp-drafter"),
                        (dict(microbatching=True), "pcp-microbatching"), (dict(mega_moe=True), "pcp-megamoe")):
        caps = sb.capabilities("cuda:sm90", config=sb.ServingConfig(**pcp, **extra))
        assert _ids(caps.encoder_replay) == [rule], extra
        assert "needs-encoder" in _ids(caps.decoder_replay)
    for extra in (dict(kv_connector=True), dict(drafter="dspark", drafter_window=128), dict(mega_moe=True)):
        caps = sb.capabilities("cuda:sm90", config=sb.ServingConfig(**extra))
        assert caps.encoder_replay.enabled and caps.decoder_replay.enabled, extra
