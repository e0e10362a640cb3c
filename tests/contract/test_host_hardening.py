"""Host helpers under bad arguments: the PCP partition and its column helpers, the PCP
composite's host arguments, the index-layout converters' counts, the scheduler helpers,
``plan_replay_batch``'s argument checks and ``agree_across_dp``'s group.

Every wrong argument is the pack's ``ValueError("<op>: <arg>=<value>: expected ...")`` --
never an IndexError / AttributeError / OverflowError / TypeError -- and every count is
bounded, so an absurd one is refused at once instead of looping for minutes. (Host code runs
no kernel: the cases share one process.)
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import swa_backends as sb
from swa_backends import PAD
from swa_backends.common.ops.layouts import combined_workspace_rows, csr_to_plain
from swa_backends.common.ops.pcp_partition import MAX_PCP_SIZE, MAX_RANK_REQUESTS
from swa_backends.common.types import MAX_POSITION, MAX_WINDOW

I32 = torch.int32


def i32(*values):
    return torch.tensor(values, dtype=I32)


# ---------------------------------------------------------------------------------------
# the family sweep: every argument of every host helper, each with values it must refuse
# ---------------------------------------------------------------------------------------

NOT_INT = [None, "x", 2.5, float("nan"), True, object(), [1, 2], {"a": 1}, torch.tensor(3), np.int64(3)]
NOT_BOOL = [None, "x", 2.5, 1, object(), [True], torch.tensor(True), torch.zeros(2)]
NOT_TENSOR = ["x", 2.5, True, 7, object(), {"a": 1}]
NOT_INTS = [None, "x", 2.5, object(), {"a": 1}, [[1, 2]], ["a", "b"], [1.5, 2.5], [2**70, 1], [True, False],
            torch.zeros(2), np.array([[1, 2]]), torch.zeros(2, device="meta", dtype=torch.int64)]
NOT_FLAGS = [None, "x", 2.5, object(), [1, 0], [[True]], torch.zeros(2), torch.ones(2, dtype=I32)]
NOT_PARTITION = [None, "x", 7, object(), {"P": 2}, torch.zeros(2)]
NOT_DIM = [None, "x", 2.5, True, 2, -3, 2**31, 2**63, 10**30, [0], torch.tensor(0)]


def _partition():
    return sb.pcp_partition([4, 4], [0, 8], 2, 0, is_prefilling=[True, True])


def _helpers():
    """``(op name in messages, fn, args, kwargs, {argument: values it must refuse})``;
    positional arguments are named by their index."""
    part = _partition()
    x = torch.arange(8, dtype=torch.int64)[None]
    gathered = sb.pcp_gather_columns(x, part)
    slots = torch.zeros(2, part.num_columns, dtype=torch.int64)
    return [
        ("pcp_partition", sb.pcp_partition, ([4, 4], [0, 8], 2, 0), {"is_prefilling": [True, True]},
         {0: NOT_INTS, 1: NOT_INTS, 2: NOT_INT + [0, -1, MAX_PCP_SIZE + 1, 2**31 - 1, 2**63],
          3: NOT_INT + [-1, 2, 2**31], "is_prefilling": NOT_FLAGS[1:] + [[True]]}),
        ("pcp_gather_columns", sb.pcp_gather_columns, (x, part), {"dim": -1, "fill": PAD},
         {0: [None] + NOT_TENSOR + [torch.tensor(1)], 1: NOT_PARTITION, "dim": NOT_DIM,
          "fill": [None, "x", 2.5, True, object(), [1], 2**63, -(2**63) - 1, 10**30, torch.tensor(1)]}),
        ("pcp_restore_tokens", sb.pcp_restore_tokens, (gathered, part), {"dim": -1},
         {0: [None] + NOT_TENSOR + [torch.tensor(1)], 1: NOT_PARTITION, "dim": NOT_DIM}),
        ("pcp_pad_replayed_slots", sb.pcp_pad_own_block, (slots, i32(0), part, [0, 0], 4), {"backend": None},
         {0: [None] + NOT_TENSOR + [torch.zeros(2, 8)], 1: [None] + NOT_TENSOR, 2: NOT_PARTITION,
          3: [None, "x", 2.5, object(), [0], [0.5, 1.5], [[0, 0]], torch.zeros(2), torch.zeros(2, device="meta",
                                                                                              dtype=I32)],
          4: NOT_INT + [-1, MAX_WINDOW + 1], "backend": ["x", 7, object(), {"pad_replayed_slots": 1}]}),
        ("admit_prefix_hit", sb.admit_prefix_hit, (100, 0, 16, 8), {"boundary_retained": False, "loads_window": False},
         {0: NOT_INT + [-1, MAX_POSITION + 1], 1: NOT_INT + [-1, MAX_POSITION + 1], 2: NOT_INT + [-1, MAX_WINDOW + 1],
          3: NOT_INT + [0, MAX_WINDOW + 1], "boundary_retained": NOT_BOOL, "loads_window": NOT_BOOL}),
        ("mark_prefix_replay", sb.mark_prefix_replay, (100, 16), {},
         {0: NOT_INT + [-1, MAX_POSITION + 1], 1: NOT_INT + [-1, MAX_WINDOW + 1]}),
        ("replay_block_is_live", sb.replay_block_is_live, (100, 16, 8, False), {"Wr": 16},
         {0: NOT_INT + [-1, MAX_POSITION + 1], 1: NOT_INT + [0, MAX_WINDOW + 1], 2: NOT_INT + [0, MAX_WINDOW + 1],
          3: NOT_BOOL, "Wr": NOT_INT[1:] + [-1, MAX_WINDOW + 1]}),
        ("replay_layer_ids", sb.replay_layer_ids, (10, [3, 4]), {"trim_cut_layer": False},
         {0: NOT_INT + [0, 2**31], 1: [None, 2.5, 7, object(), "34", [], [10], [-1], ["3"], [2.5], [True]],
          "trim_cut_layer": NOT_BOOL}),
        ("plan_replay_batch", sb.plan_replay_batch, ([0, 5, 20], [True, True], [False, False], 4), {"pad_to": None},
         {0: NOT_INTS + [[5, 20], [0, 5, 3], [0, MAX_POSITION + 1], torch.tensor([0, 5.0], requires_grad=True)],
          1: NOT_FLAGS + [[True]], 2: NOT_FLAGS + [[False]], 3: NOT_INT + [0, MAX_WINDOW + 1],
          "pad_to": ["x", 2.5, True, object(), 0, [0], [2.5], 2**40]}),
        ("agree_across_dp", sb.agree_across_dp, (True, 3), {"group": None},
         {0: NOT_BOOL, 1: NOT_INT + [-1, 2**31]}),
        ("csr_to_plain", csr_to_plain, (i32(0, 1, 2), i32(5, 6), 3), {},
         {0: [None] + NOT_TENSOR, 1: [None] + NOT_TENSOR, 2: NOT_INT + [-1, MAX_WINDOW + 1, 2**31 - 1]}),
    ]


def _sweep_cases():
    for op, fn, args, kwargs, refuse in _helpers():
        for where, values in refuse.items():
            for value in values:
                yield pytest.param(op, fn, args, kwargs, where, value, id=f"{op}-{where}-{type(value).__name__}")


def _call(fn, args, kwargs, where, value):
    a, k = list(args), dict(kwargs)
    if isinstance(where, int):
        a[where] = value
    else:
        k[where] = value
    return fn(*a, **k)


@pytest.mark.parametrize("op, fn, args, kwargs, where, value", list(_sweep_cases()))
def test_every_bad_argument_is_the_packs_value_error(op, fn, args, kwargs, where, value):
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as err:
        _call(fn, args, kwargs, where, value)
    assert str(err.value).startswith(f"{op}: "), str(err.value)
    assert ": expected " in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert time.perf_counter() - t0 < 2.0


def test_the_valid_calls_of_the_sweep_run():
    for op, fn, args, kwargs, _ in _helpers():
        if op == "agree_across_dp":  # needs a process group (tests/pcp/test_agree_across_dp.py)
            continue
        fn(*args, **kwargs)


# ---------------------------------------------------------------------------------------
# combined_workspace_rows: compressed block ids
# ---------------------------------------------------------------------------------------


def _workspace_case(cbt):
    """One request (4 queries, seq 40), no replay, W 8, block 8, ratio 4 (compressed block size 2):
    the slab's first N = 6 columns are compressed entries 0..5 (blocks 0..2 of the table), then
    the 11 window positions it gathers (a slab of 17 columns)."""
    args = (i32(0, 4), i32(40), i32(0), 8, 17, 6, torch.arange(5, dtype=I32)[None], 8)
    return combined_workspace_rows(*args, compressed_block_table=cbt, ratio=4, window_base=0, compressed_base=100)


def test_negative_compressed_block_id_is_refused():
    """A negative id made rows that point before the compressed cache: into the window cache
    when both share one kv tensor (compressed_base > 0)."""
    cbt = torch.tensor([[0, -1, 2, 3, 4]], dtype=I32)
    with pytest.raises(ValueError, match=r"combined_workspace_rows: compressed_block_table="
                                         r"'compressed_block_table\[0, 1\]=-1': expected a block id >= 0"):
        _workspace_case(cbt)
    with pytest.raises(ValueError, match="compressed_block_table"):
        _workspace_case(torch.tensor([[0, 1, 2**30, 3, 4]], dtype=I32))  # slots past int32


def test_compressed_ids_the_slab_never_reads_may_be_anything():
    """Blocks past the slab's N columns are not read: a negative id there is no error, and
    every row of the result points into its cache."""
    good = _workspace_case(torch.tensor([[7, 8, 9, 0, 0]], dtype=I32))
    same = _workspace_case(torch.tensor([[7, 8, 9, -5, -1]], dtype=I32))
    assert torch.equal(good, same)
    rows = good[good != PAD]
    assert rows.numel() and bool((rows >= 0).all())
    assert good[:6].tolist() == [100 + 7 * 2, 100 + 7 * 2 + 1, 100 + 8 * 2, 100 + 8 * 2 + 1, 100 + 9 * 2,
                                 100 + 9 * 2 + 1]


@pytest.mark.parametrize("which", ["seq_lens", "replay_start"])
def test_combined_workspace_rows_requires_its_tensors(which):
    args = [i32(0, 4), i32(40), i32(0), 8, 16, 6, torch.arange(5, dtype=I32)[None], 8]
    args[1 if which == "seq_lens" else 2] = None
    with pytest.raises(ValueError, match=f"combined_workspace_rows: {which}=None: expected a torch.Tensor"):
        combined_workspace_rows(*args)


@pytest.mark.parametrize("name, value", [("W", MAX_WINDOW + 1), ("block_size", MAX_WINDOW + 1), ("ratio", 16)])
def test_combined_workspace_rows_counts_are_bounded(name, value):
    kw = dict(W=8, block_size=8, ratio=0)
    kw[name] = value
    with pytest.raises(ValueError, match=f"combined_workspace_rows: {name}="):
        combined_workspace_rows(i32(0, 4), i32(40), i32(0), kw["W"], 16, 6, torch.arange(5, dtype=I32)[None],
                                kw["block_size"], ratio=kw["ratio"],
                                compressed_block_table=torch.zeros(1, 5, dtype=I32))


# ---------------------------------------------------------------------------------------
# pcp_partition: counts
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("P", [2**31 - 1, 10**6, MAX_PCP_SIZE + 1])
def test_absurd_rank_count_is_refused_at_once(P):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=f"pcp_partition: P={P}: expected an int <= {MAX_PCP_SIZE}"):
        sb.pcp_partition([8], [0], P, 0)
    assert time.perf_counter() - t0 < 0.5


def test_ranks_times_requests_is_bounded():
    B = MAX_RANK_REQUESTS // MAX_PCP_SIZE + 1
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"pcp_partition: query_lens=.*expected P \* requests"):
        sb.pcp_partition([1] * B, [3] * B, MAX_PCP_SIZE, 0)
    assert time.perf_counter() - t0 < 2.0


def test_largest_group_still_partitions():
    part = sb.pcp_partition([3000, 1], [0, 7], MAX_PCP_SIZE, MAX_PCP_SIZE - 1, is_prefilling=[True, False])
    assert part.P == MAX_PCP_SIZE and part.num_columns == MAX_PCP_SIZE * part.padded
    assert int(part.publishes.sum()) == part.num_tokens - 1  # the decode is published by rank 0 only


@pytest.mark.parametrize("dtype, fill, ok", [
    (torch.int8, -1, True), (torch.int8, 127, True), (torch.int8, 128, False), (torch.int32, 2**31, False),
    (torch.float16, 1e5, False), (torch.float16, float("nan"), True), (torch.float32, -1, True),
    (torch.bool, False, True), (torch.bool, 0, False),
])
def test_gather_fill_must_fit_the_dtype(dtype, fill, ok):
    part = _partition()
    x = torch.zeros(1, 8, dtype=dtype)
    if ok:
        out = sb.pcp_gather_columns(x, part, fill=fill)
        assert out.dtype == dtype and out.shape == (1, part.num_columns)
    else:
        with pytest.raises(ValueError, match="pcp_gather_columns: fill="):
            sb.pcp_gather_columns(x, part, fill=fill)


def test_gather_and_restore_along_any_dim():
    part = _partition()
    x = torch.arange(3 * 8, dtype=torch.int64).reshape(3, 8)
    g = sb.pcp_gather_columns(x, part)
    assert torch.equal(sb.pcp_gather_columns(x, part, dim=1), g)
    assert torch.equal(sb.pcp_gather_columns(x.t().contiguous(), part, dim=0), g.t())
    assert torch.equal(sb.pcp_gather_columns(x.t().contiguous(), part, dim=-2), g.t())
    assert torch.equal(sb.pcp_restore_tokens(g, part, dim=-1), x)
    assert torch.equal(sb.pcp_restore_tokens(g.t().contiguous(), part, dim=0), x.t())


# ---------------------------------------------------------------------------------------
# scheduler helpers, plan_replay_batch, agree_across_dp
# ---------------------------------------------------------------------------------------


def test_admit_prefix_hit_bounds_the_total_hit():
    with pytest.raises(ValueError, match=r"admit_prefix_hit: local_hit \+ external_hit="):
        sb.admit_prefix_hit(MAX_POSITION, 1, 16, 8)


def test_replay_layer_ids_refuses_an_endless_iterator_at_once():
    import itertools

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="replay_layer_ids: kv_source_layer_ids="):
        sb.replay_layer_ids(10, itertools.cycle([1, 2]))
    assert time.perf_counter() - t0 < 2.0
    assert sb.replay_layer_ids(10, (i for i in (1, 3))) == range(4, 10)  # a finite iterator is fine


def test_plan_replay_batch_takes_host_tensors_and_refuses_a_grad_float_one():
    qsl = torch.tensor([0, 5, 20])
    plan = sb.plan_replay_batch(qsl, torch.tensor([True, True]), torch.tensor([False, False]), 4, trim_threshold=0)
    assert plan.kept.tolist() == [4, 4] and plan.num_rows == 8
    with pytest.raises(ValueError, match="plan_replay_batch: query_start_loc_host=.*expected integers"):
        sb.plan_replay_batch(torch.tensor([0.0, 5.0], requires_grad=True), [True], [False], 4)


@pytest.mark.parametrize("group", ["x", 3, object(), [1], True])
def test_a_group_that_is_not_a_process_group_is_refused_before_any_collective(group, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    with pytest.raises(ValueError, match="agree_across_dp: group=.*expected None .* or a torch.distributed "
                                         "ProcessGroup"):
        sb.agree_across_dp(True, 3, group)
    part = sb.pcp_partition([4], [0], 1, 0)
    with pytest.raises(ValueError, match="pcp_pad_replayed_slots: group="):
        sb.pcp_pad_replayed_slots(torch.zeros(1, part.num_columns, dtype=torch.int64), i32(0), part, [0], 4,
                                  group=group)
