"""A caller's odd views and arguments at the entry of the ops, on the reference and the Triton
variants: each gives the reference's result or the pack's ``ValueError`` naming the argument,
never a torch error from inside, and never a write before it.

- tensors torch calls contiguous whose dimensions of size 1 carry any stride (a one-row slice,
  a transposed column): rows move as bytes, and a byte view needs the last stride 1;
- a 0-dim tensor where a 1-D one is expected reaches the validated fast path's quick host
  checks, which read row counts before the validator would refuse it;
- a plan made from strided host arrays, or handed a device copy of its ``dropped_before``
  (``ReplayPlan.from_kept``): the kernels read that copy as it is.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import swa_backends as sb
from swa_backends.common.types import ReplayPlan

I32, I64 = torch.int32, torch.int64
REF = sb.select("cpu")
TRI = sb.select("cpu", prefer={"gather_rows": "triton", "scatter_rows": "triton", "gather_replay_batch": "triton",
                               "prepare_replay_step": "triton"})
TRI_UNCHECKED = sb.select("cpu", prefer="triton", checked=False)
BACKENDS = {"reference": REF, "triton": TRI}


@pytest.mark.parametrize("name", BACKENDS)
def test_scatter_of_rows_with_odd_strides_on_their_size_one_dimensions(name):
    be = BACKENDS[name]
    buf = torch.arange(12, dtype=I64)
    y = buf[1::2][:1]  # shape [1], stride 2: contiguous to torch
    assert y.is_contiguous() and y.stride() == (2,)
    assert be.scatter_rows(y, torch.tensor([2]), 4).tolist() == [0, 0, 1, 0]
    y2 = buf.view(6, 2)[1:2, ::2]  # [1, 1], strides (2, 2)
    assert be.scatter_rows(y2, torch.tensor([0]), 2).tolist() == [[2], [0]]
    out = torch.full((3, 3), 9, dtype=I64)[1:2, :].t()  # [3, 1], strides (1, 3): written through
    got = be.scatter_rows(torch.tensor([[5], [6]]), torch.tensor([0, 2]), 3, out=out)
    assert got is out and out.flatten().tolist() == [5, 0, 6]


ROW_BACKENDS = {"reference": REF, "triton": TRI, "triton_unchecked": TRI_UNCHECKED}


@pytest.mark.parametrize("dtype", [torch.complex64, torch.uint16, torch.uint64, torch.int64])
@pytest.mark.parametrize("name", ROW_BACKENDS)
def test_rows_of_a_byte_moved_dtype_with_a_strided_size_one_last_dimension(name, dtype):
    # a [1, N] row transposed is a [N, 1] column with strides (1, N), contiguous to torch: the kernels move
    # complex and wide unsigned rows as bytes, and a byte view taken by `view` needs the last stride 1
    be = ROW_BACKENDS[name]
    wide = torch.complex64 if dtype.is_complex else I64  # the values compared in a dtype torch indexes on a CPU
    vals = torch.arange(1, 6, dtype=I64)
    vals = vals + 1j * vals if dtype.is_complex else vals
    col = vals.to(dtype)[None, :].t()
    assert col.is_contiguous() and col.stride() == (1, 5)
    rows = torch.tensor([4, 0, 2])
    assert be.gather_rows(col, rows).to(wide).flatten().tolist() == vals[rows].tolist()
    out = torch.zeros(1, 3, dtype=dtype).t()
    assert be.gather_rows(col, rows, out=out) is out and out.to(wide).flatten().tolist() == vals[rows].tolist()
    back = torch.full((1, 5), 7, dtype=dtype).t()
    got = be.scatter_rows(col[:3], rows, 5, out=back)
    want = torch.zeros(5, dtype=vals.dtype)
    want[rows] = vals[:3]
    assert got is back and back.to(wide).flatten().tolist() == want.tolist()


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
@pytest.mark.parametrize("name", ROW_BACKENDS)
def test_one_dimensional_rows_of_the_wide_unsigned_types(name, dtype):
    # torch's index_select has no CPU kernel for them: the reference moves rows as bytes, as the kernels do
    be = ROW_BACKENDS[name]
    x = torch.arange(5, dtype=I64).to(dtype)
    rows = torch.tensor([4, 0, 2])
    assert be.gather_rows(x, rows).to(I64).tolist() == [4, 0, 2]
    out = torch.full((3,), 9, dtype=I64).to(dtype)
    assert be.gather_rows(x, rows, out=out) is out and out.to(I64).tolist() == [4, 0, 2]
    assert be.scatter_rows(x[:3], rows, 5).to(I64).tolist() == [1, 0, 2, 0, 0]


def _step():
    """decoder_trim.py's step: a decode, a 900-token prefill, a 100-token replaying chunk (W 128)."""
    qsl_host = np.array([0, 1, 901, 1001], dtype=np.int32)
    positions = torch.cat([torch.tensor([999]), torch.arange(900), torch.arange(200, 300)])
    args = (torch.tensor(qsl_host), torch.tensor([1000, 900, 300], dtype=I32), torch.tensor([0, 0, 50], dtype=I32),
            positions, torch.stack([positions + 1000, positions + 5000]), 128)
    plan = sb.plan_replay_batch(qsl_host, np.array([False, True, True]), np.zeros(3, dtype=bool), 128)
    return qsl_host, plan, args


@pytest.mark.parametrize("name", BACKENDS)
def test_a_zero_dim_tensor_where_a_row_count_is_read_is_named(name):
    be = BACKENDS[name]
    x = torch.arange(12.0).view(4, 3)
    with pytest.raises(ValueError, match=r"gather_rows: rows=.*expected 1 dimension"):
        be.gather_rows(x, torch.tensor(2))
    with pytest.raises(ValueError, match=r"gather_rows: out=.*expected shape \[1\]"):
        be.gather_rows(torch.arange(5), torch.tensor([3]), out=torch.zeros((), dtype=I64))
    out = torch.full((), 7, dtype=I64)
    with pytest.raises(ValueError, match=r"scatter_rows: out=.*expected shape \[1\]"):
        be.scatter_rows(torch.tensor([5]), torch.tensor([0]), 1, out=out)
    assert int(out) == 7
    _, plan, args = _step()
    with pytest.raises(ValueError, match=r"gather_replay_batch: query_start_loc=.*expected 1 dimension"):
        be.gather_replay_batch(plan, torch.tensor(0, dtype=I32), *args[1:])


def test_a_plan_of_strided_host_arrays_gives_the_same_sub_batch():
    qsl_host, plan, args = _step()
    want = REF.gather_replay_batch(plan, *args)
    kept = np.zeros((3, 2), dtype=np.int32)
    kept[:, 0] = plan.kept.numpy()
    dropped = np.zeros((4, 2), dtype=np.int32)
    dropped[:, 0] = plan.dropped_before.numpy()
    for be in (REF, TRI, TRI_UNCHECKED):
        strided = ReplayPlan.from_kept(kept[:, 0], qsl_host, plan.num_rows_padded, 128, dropped_before=dropped[:, 0],
                                       is_prefilling=[False, True, True])
        got = be.gather_replay_batch(strided, *args)
        for field in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize("device_copy", [torch.zeros(8, dtype=I32)[::2], torch.zeros(2, dtype=I32),
                                         torch.tensor(0, dtype=I32), torch.zeros(4, dtype=I64), [0, 0, 0, 0]],
                         ids=["strided", "short", "0-dim", "int64", "list"])
def test_a_device_copy_of_dropped_before_the_kernels_cannot_read_as_it_is_is_refused(device_copy):
    qsl_host, plan, _ = _step()
    with pytest.raises(ValueError, match=r"ReplayPlan.from_kept: device_dropped_before=.*expected a contiguous int32 "
                                         r"tensor of shape \[4\]"):
        ReplayPlan.from_kept(plan.kept.numpy(), qsl_host, plan.num_rows_padded, 128, device_dropped_before=device_copy)
    good = plan.dropped_before.clone()
    made = ReplayPlan.from_kept(plan.kept.numpy(), qsl_host, plan.num_rows_padded, 128, device_dropped_before=good)
    assert made.device_dropped_before(torch.device("cpu")) is good



@pytest.mark.parametrize("be", [REF, TRI], ids=["reference", "triton"])
def test_a_device_copy_of_dropped_before_with_other_values_is_named(be):
    # the kernels read the device copy, the host checks read the host values: a copy that disagrees
    # (a stale upload, a graph buffer rewritten for another step) is named, before anything is written
    qsl_host, plan, args = _step()
    stale = plan.dropped_before.clone()
    stale[-1] += 1
    made = ReplayPlan.from_kept(plan.kept.numpy(), qsl_host, plan.num_rows_padded, 128, device_dropped_before=stale)
    from swa_backends.common.ops.gather_replay_batch import allocate_out

    out = allocate_out(plan, args[4].shape[0], "cpu")
    for t in out.values():
        t.fill_(-7)
    with pytest.raises(ValueError, match=r"gather_replay_batch: plan.device_dropped_before='its entry 3=\d+': expected "
                                         r"plan.dropped_before\[3\]=\d+: the device copy"):
        be.gather_replay_batch(made, *args, out=out)
    assert all(bool((t == -7).all()) for t in out.values())
    same = ReplayPlan.from_kept(plan.kept.numpy(), qsl_host, plan.num_rows_padded, 128,
                                device_dropped_before=plan.dropped_before.clone())
    want = REF.gather_replay_batch(plan, *args)
    got = be.gather_replay_batch(same, *args)
    assert torch.equal(got.rows, want.rows) and torch.equal(got.query_start_loc, want.query_start_loc)

@pytest.mark.parametrize("op", ["gather_replay_batch", "prepare_replay_step"])
@pytest.mark.parametrize("be", [REF, TRI], ids=["reference", "triton"])
def test_a_device_copy_that_fits_another_batch_is_named(be, op):
    # a device copy of dropped_before that disagrees with the host's but fits the device batch it meets
    # (a trimmed prefill of 10 rows whose copy drops 8, on a device batch that gives it 12): the checks
    # against query_start_loc pass, the copy's own values do not. The self-checked Triton kernels
    # tested only the former (an audit, 2026-12-05); nothing may be written
    W = 4
    plan = ReplayPlan.from_kept(np.array([4], np.int32), np.array([0, 10], np.int32), 4, W,
                                device_dropped_before=torch.tensor([0, 8], dtype=I32), is_prefilling=np.array([True]))
    qsl, seq, R = torch.tensor([0, 12], dtype=I32), torch.tensor([12], dtype=I32), torch.tensor([0], dtype=I32)
    pos, slots = torch.arange(12, dtype=I64), torch.arange(100, 112, dtype=I64)[None, :].clone()
    before = slots.clone()
    match = rf"{op}: plan.device_dropped_before='its entry 1=8': expected plan.dropped_before\[1\]=6"
    with pytest.raises(ValueError, match=match):
        if op == "gather_replay_batch":
            from swa_backends.common.ops.gather_replay_batch import allocate_out

            out = allocate_out(plan, 1, "cpu")
            for t in out.values():
                t.fill_(-7)
            try:
                be.gather_replay_batch(plan, qsl, seq, R, pos, slots, W, out=out)
            finally:
                assert all(bool((t == -7).all()) for t in out.values())
        else:
            be.prepare_replay_step(torch.tensor([0], dtype=I32), torch.tensor([0], dtype=I32), torch.tensor([True]),
                                   qsl, seq, pos, slots, torch.zeros(0, dtype=I32),
                                   torch.arange(4, dtype=I32)[None, :].clone(), 4, W, W, plan=plan)
    assert torch.equal(slots, before)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as every other element of a buffer whose other elements are garbage."""
    buf = torch.full((t.shape[0], 2), 99, dtype=t.dtype)
    buf[:, 0] = t
    return buf[:, 0]


@pytest.mark.parametrize("field", ["kept", "trimmed", "dropped_before", "expanded"])
@pytest.mark.parametrize("op", ["gather_replay_batch", "prepare_replay_step"])
@pytest.mark.parametrize("be", [TRI, TRI_UNCHECKED], ids=["triton", "triton-unchecked"])
def test_a_plan_built_field_by_field_from_strided_views_gives_the_reference(be, op, field):
    # ReplayPlan's own constructor takes host tensors in any layout; the kernels read the plan's
    # device dropped_before as a flat run, so a strided view (or an expanded one, whose .to() of its
    # own device is itself) read its garbage, or past its storage (an audit, 2026-12-06)
    W = 4
    if field == "expanded":  # a plan that keeps every row of a decode and a short prefill
        qsl, seq = torch.tensor([0, 1, 3], dtype=I32), torch.tensor([9, 3], dtype=I32)
        pos = torch.tensor([8, 1, 2], dtype=I64)
        fields = {"kept": torch.tensor([1, 2], dtype=I32), "trimmed": torch.tensor([False, False]),
                  "dropped_before": torch.zeros(1, dtype=I32).expand(3)}
        rows, padded = 3, 3
    else:  # a decode and a 10-row prefill trimmed to its last W rows
        qsl, seq = torch.tensor([0, 1, 11], dtype=I32), torch.tensor([9, 10], dtype=I32)
        pos = torch.tensor([8] + list(range(10)), dtype=I64)
        good = sb.plan_replay_batch(np.array([0, 1, 11]), np.array([False, True]), np.zeros(2, bool), W,
                                    trim_threshold=0)
        fields = {"kept": good.kept.clone(), "trimmed": good.trimmed.clone(),
                  "dropped_before": good.dropped_before.clone()}
        fields[field] = _strided(fields[field])
        rows, padded = good.num_rows, good.num_rows_padded
    slots = (torch.arange(pos.shape[0], dtype=I64) + 100)[None, :].clone()
    R = torch.zeros(2, dtype=I32)

    def run(backend):
        plan = ReplayPlan(fields["kept"], fields["trimmed"], fields["dropped_before"], rows, padded, W)
        if op == "gather_replay_batch":
            return backend.gather_replay_batch(plan, qsl, seq, R, pos, slots.clone(), W)
        return backend.prepare_replay_step(R, torch.tensor([0, 1], dtype=I32), torch.tensor([False, True]), qsl, seq,
                                           pos, slots.clone(), torch.zeros(0, dtype=I32),
                                           torch.arange(4, dtype=I32).reshape(2, 2).clone(), 8, W, W,
                                           plan=plan).replay_batch

    want, got = run(REF), run(be)
    for name in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert want.num_rows == rows


@pytest.mark.parametrize("be", [REF, TRI, TRI_UNCHECKED], ids=["reference", "triton", "triton-unchecked"])
def test_a_plan_derived_with_replace_has_caches_of_its_own(be):
    # dataclasses.replace() copied the caches' dicts into the new plan: a backend then launched the
    # derived plan with its original's device dropped_before and sizes (an audit, 2026-12-06)
    import dataclasses

    W = 4
    qsl, seq, R = torch.tensor([0, 10, 20], dtype=I32), torch.tensor([10, 10], dtype=I32), torch.zeros(2, dtype=I32)
    pos, slots = torch.arange(10, dtype=I64).repeat(2), torch.arange(100, 120, dtype=I64)[None, :].clone()
    first = sb.plan_replay_batch(np.array([0, 10, 20]), np.array([True, True]), np.zeros(2, bool), W, pad_to=8,
                                 trim_threshold=0)
    be.gather_replay_batch(first, qsl, seq, R, pos, slots, W)  # its caches filled
    fields = {"kept": torch.tensor([10, 4], dtype=I32), "trimmed": torch.tensor([False, True]),
              "dropped_before": torch.tensor([0, 0, 6], dtype=I32), "num_rows": 14, "num_rows_padded": 16}
    derived = dataclasses.replace(first, **fields)
    assert derived._device_cache is not first._device_cache and derived._launch_cache is not first._launch_cache
    want = REF.gather_replay_batch(ReplayPlan(**fields, window=W, prefilling=first.prefilling), qsl, seq, R, pos,
                                   slots, W)
    got = be.gather_replay_batch(derived, qsl, seq, R, pos, slots, W)
    for name in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


@pytest.mark.parametrize("prefer", [None, "triton"])
def test_an_unchecked_count_out_of_its_range_is_clamped(prefer):
    # with validation off a count outside [0, len(rows)] is the caller's error; the kernels clamp it and
    # stay inside the tensors, and the reference does the same
    be = sb.select("cpu", prefer={"scatter_rows": prefer} if prefer else None, checked=False)
    y, rows = torch.arange(1.0, 4.0)[:, None], torch.tensor([0, 2, 3])
    for count, want in ((-5, [0.0, 0.0, 0.0, 0.0]), (2**31 - 1, [1.0, 0.0, 2.0, 3.0])):
        got = be.scatter_rows(y, rows, 4, count=torch.tensor([count], dtype=I64))
        assert got.flatten().tolist() == want


@pytest.mark.parametrize("change, name, expected", [
    ({"kept": [[1, 2]]}, "kept", "1-D host ints"),
    ({"kept": [1, 2, 3, 4]}, "query_start_loc_host", "1-D host ints of length at least 5"),
    ({"query_start_loc_host": [[0, 1, 2, 3]]}, "query_start_loc_host", "1-D host ints"),
    ({"num_rows_padded": "x"}, "num_rows_padded", "an int"),
    ({"num_rows_padded": 1.5}, "num_rows_padded", "an int"),
    ({"window": True}, "window", "an int"),
    ({"dropped_before": [0, 0]}, "dropped_before", "1-D host ints of length 4"),
], ids=["kept-2d", "kept-longer", "qsl-2d", "padded-str", "padded-float", "window-bool", "dropped-short"])
def test_a_plan_from_mismatched_arguments_is_refused_naming_the_argument(change, name, expected):
    qsl_host, plan, _ = _step()
    args = {"kept": plan.kept.numpy(), "query_start_loc_host": qsl_host, "num_rows_padded": plan.num_rows_padded,
            "window": 128}
    args.update(change)
    with pytest.raises(ValueError, match=rf"ReplayPlan.from_kept: {name}=.*: expected {expected}"):
        ReplayPlan.from_kept(**args)
    made = ReplayPlan.from_kept(plan.kept.numpy(), qsl_host, np.int64(plan.num_rows_padded), np.int32(128))
    assert (made.num_rows, made.num_rows_padded, made.window) == (plan.num_rows, plan.num_rows_padded, 128)
