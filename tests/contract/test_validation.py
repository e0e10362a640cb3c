"""SPEC §5: every public op validates before launching; errors name argument, value and
expectation. The switch turns validation off (tested both ways)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import swa_backends as sb
from swa_backends.testing.conformance import case_for, random_batch

BE = sb.select("cpu")
i32, i64 = torch.int32, torch.int64


def _swa_args():
    qsl = torch.tensor([0, 4, 6], dtype=i32)
    seq = torch.tensor([10, 2], dtype=i32)
    table = torch.arange(4, dtype=i32).repeat(2, 1)
    R = torch.tensor([6, 0], dtype=i32)
    return [qsl, seq, table, 4, 8, R], {"num_tokens": 6}


def _pad_args():
    qsl = torch.tensor([0, 4, 6], dtype=i32)
    positions = torch.tensor([6, 7, 8, 9, 0, 1], dtype=i64)
    slots = torch.arange(12, dtype=i64).reshape(2, 6)
    return [slots, torch.tensor([0], dtype=i32), qsl, positions, torch.tensor([6, 0], dtype=i32), 4], {}


def _mla_args():
    q = torch.randn(3, 2, 8)
    kv = torch.randn(5, 8)
    idx = torch.tensor([[0, 1], [2, -1], [4, 3]], dtype=i32)
    return [q, kv, idx, torch.tensor([2, 1, 2], dtype=i32), 0.35, 8], {}


def _set(args, i, value):
    args = list(args)
    args[i] = value
    return args


CASES = [
    # (op, builder, argument index or kw name, bad value factory, argument named in the error)
    ("swa_indices_and_lens", _swa_args, 0, lambda a: a[0].to(i64), "query_start_loc"),  # dtype
    ("swa_indices_and_lens", _swa_args, 1, lambda a: a[1].to("meta"), "seq_lens"),  # device
    ("swa_indices_and_lens", _swa_args, 1, lambda a: a[1][:1], "seq_lens"),  # shape
    ("swa_indices_and_lens", _swa_args, 0, lambda a: torch.tensor([0, 6, 4], dtype=i32), "query_start_loc"),  # monotonic
    ("swa_indices_and_lens", _swa_args, 5, lambda a: torch.tensor([-1, 0], dtype=i32), "replay_start"),  # R >= 0
    ("swa_indices_and_lens", _swa_args, 4, lambda a: 0, "W"),  # W > 0
    ("swa_indices_and_lens", _swa_args, 2, lambda a: a[2][:, :2], "block_table"),  # table too short
    ("pad_replayed_slots", _pad_args, 1, lambda a: torch.tensor([2], dtype=i32), "cacheable_groups"),  # group range
    ("pad_replayed_slots", _pad_args, 4, lambda a: torch.tensor([-1, 0], dtype=i32), "replay_start"),  # R >= 0
    ("pad_replayed_slots", _pad_args, 0, lambda a: a[0].to(i32), "slot_mappings"),
    ("pad_replayed_slots", _pad_args, 3, lambda a: a[3][:3], "query_start_loc"),  # qsl beyond tokens
    ("pad_replayed_slots", _pad_args, 5, lambda a: -1, "Wr"),
    ("sparse_mla", _mla_args, 2, lambda a: torch.tensor([[0, 5], [2, -1], [4, 3]], dtype=i32), "indices"),  # slot range
    ("sparse_mla", _mla_args, 2, lambda a: torch.tensor([[0, -2], [2, -1], [4, 3]], dtype=i32), "indices"),  # not PAD
    ("sparse_mla", _mla_args, 3, lambda a: torch.tensor([2, 3, 2], dtype=i32), "lens"),
    ("sparse_mla", _mla_args, 1, lambda a: a[1].half(), "kv"),
    ("sparse_mla", _mla_args, 4, lambda a: -1.0, "sm_scale"),
    ("sparse_mla", _mla_args, 5, lambda a: 9, "d_v"),
]


@pytest.mark.parametrize("op, build, where, bad, name", CASES, ids=[f"{c[0]}-{c[4]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_names_the_argument(op, build, where, bad, name):
    args, kw = build()
    getattr(BE, op)(*args, **kw)  # the unbroken case is valid
    args, kw = build()
    args = _set(args, where, bad(args))
    with pytest.raises(ValueError) as err:
        getattr(BE, op)(*args, **kw)
    msg = str(err.value)
    assert msg.startswith(f"{op}: {name}") and "expected" in msg, msg


def test_token_windows_and_request_slices_are_checked():
    args, kw = _swa_args()
    BE.swa_indices_and_lens(*args, num_tokens=2, token_offset=4)  # the second request's rows: valid
    with pytest.raises(ValueError, match=r"swa_indices_and_lens: token_offset=-1: expected"):
        BE.swa_indices_and_lens(*args, num_tokens=2, token_offset=-1)
    qsl, seq, _, _, W, R = args
    BE.prefill_gather_lens(qsl[1:], seq[1:], R[1:], W)  # a slice of requests: qsl may start above 0
    with pytest.raises(ValueError, match=r"prefill_gather_lens: query_start_loc=.*expected query_start_loc\[0\] >= 0"):
        BE.prefill_gather_lens(torch.tensor([-2, 2], dtype=i32), seq[1:], R[1:], W)
    with pytest.raises(ValueError, match=r"prefill_gather_lens: query_start_loc=.*non-decreasing"):
        BE.prefill_gather_lens(torch.tensor([6, 4, 5], dtype=i32), seq, R, W)
    with pytest.raises(ValueError, match=r"swa_indices_and_lens: query_start_loc=.*== 0"):
        BE.swa_indices_and_lens(qsl[1:], seq[1:], args[2], 4, W, R[1:], num_tokens=2)


def test_every_op_rejects_a_non_tensor_first_argument():
    for op in sb.OPS:
        args, kw = case_for(op, np.random.default_rng(1), "cpu")
        with pytest.raises(ValueError, match=f"^{op}: "):
            getattr(BE, op)("not a tensor", *args[1:], **kw)


def test_out_buffers_are_checked():
    args, _ = _swa_args()
    with pytest.raises(ValueError, match=r"out\[0\]"):
        BE.swa_indices_and_lens(*args, num_tokens=6, out=(torch.empty(6, 7, dtype=i32), torch.empty(6, dtype=i32)))
    with pytest.raises(ValueError, match="scatter_rows: out"):
        BE.scatter_rows(torch.ones(2, 3), torch.tensor([0, 1]), 4, out=torch.empty(4, 2))


def test_host_ops_validate():
    with pytest.raises(ValueError, match="admit_prefix_hit: block_size"):
        sb.admit_prefix_hit(10, 0, 32, 0)
    with pytest.raises(ValueError, match="admit_prefix_hit: local_hit"):
        sb.admit_prefix_hit(-1, 0, 32, 16)
    with pytest.raises(ValueError, match="plan_replay_batch: query_start_loc_host"):
        sb.plan_replay_batch([0, 5, 3], [True, True], [False, False], 4, trim_threshold=0)
    with pytest.raises(ValueError, match="plan_replay_batch: is_prefilling"):
        sb.plan_replay_batch([0, 5], [True, True], [False], 4, trim_threshold=0)
    with pytest.raises(ValueError, match="plan_replay_batch: pad_to"):
        sb.plan_replay_batch([0, 500], [True], [False], 128, pad_to=64, trim_threshold=0)
    with pytest.raises(ValueError, match="plan_replay_batch: query_start_loc_host"):
        sb.plan_replay_batch(torch.tensor([0, 5], device="meta"), [True], [False], 4, trim_threshold=0)
    with pytest.raises(ValueError, match="gather_replay_batch: plan"):
        BE.gather_replay_batch(None, *[torch.zeros(1)] * 5, 4)


def test_validation_can_be_switched_off_and_back():
    args, kw = _swa_args()
    args = _set(args, 0, torch.tensor([0, 6, 4], dtype=i32))  # non-monotonic
    assert sb.validation_enabled()
    with sb.validation(False):
        assert not sb.validation_enabled()
        BE.swa_indices_and_lens(*args, **kw)  # garbage in, no ValueError: the hot path skips checks
    assert sb.validation_enabled()
    with pytest.raises(ValueError):
        BE.swa_indices_and_lens(*args, **kw)
    previous = sb.set_validation(False)
    try:
        BE.swa_indices_and_lens(*args, **kw)
    finally:
        sb.set_validation(previous)


def test_validation_env_switch_read_on_first_use():
    code = ("import swa_backends as sb, torch;"
            "assert not sb.validation_enabled();"
            "sb.select('cpu').prefill_gather_lens(torch.tensor([0,6,4],dtype=torch.int32),"
            "torch.tensor([6,4],dtype=torch.int32),torch.zeros(2,dtype=torch.int32),4);print('ok')")
    env = dict(os.environ, SWA_BACKENDS_VALIDATE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_env_switch_is_the_one_parser_of_the_packs_switches(monkeypatch):
    from swa_backends.common.validation import OFF_WORDS, env_setting, env_switch

    monkeypatch.delenv("SWA_TEST_SWITCH", raising=False)
    assert env_switch("SWA_TEST_SWITCH") is None
    for word in (*OFF_WORDS, " Off ", "DISABLED"):
        monkeypatch.setenv("SWA_TEST_SWITCH", word)
        assert env_switch("SWA_TEST_SWITCH") is False, word
    for word in ("1", "yes", "on", "force"):
        monkeypatch.setenv("SWA_TEST_SWITCH", word)
        assert env_switch("SWA_TEST_SWITCH") is True, word
    monkeypatch.setenv("SWA_BACKENDS_VALIDATE", "disable")
    assert env_setting() is False


def _plan_case():
    """A trimming plan and the rest of a valid ``gather_replay_batch`` call."""
    rng = np.random.default_rng(4)
    for _ in range(50):
        b = random_batch(rng, W=4, long_prefill=True)
        plan = sb.plan_replay_batch(b.qsl, b.prefilling, np.zeros(b.B, bool), b.W, trim_threshold=0)
        if plan is not None:
            break
    t = b.tensors("cpu")
    return plan, (t["query_start_loc"], t["seq_lens"], t["replay_start"], t["positions"], t["slot_mappings"], b.W)


def test_a_plan_whose_trimmed_disagrees_with_its_rows_is_rejected():
    """The device side reads only ``dropped_before`` (a request is trimmed where it grows): a
    plan whose ``trimmed`` says otherwise is refused, not half-believed."""
    import dataclasses

    plan, args = _plan_case()
    BE.gather_replay_batch(plan, *args)
    bad = dataclasses.replace(plan, trimmed=~plan.trimmed)  # caches of its own (init=False fields)
    with pytest.raises(ValueError, match=r"gather_replay_batch: plan.trimmed='plan.trimmed\[\d+\]=\w+': expected kept < q"):
        BE.gather_replay_batch(bad, *args)


def _two_request_step() -> tuple:
    """``prepare_replay_step``'s positional arguments for a decode (q 1, seq 9) and a replaying
    prefill (q 4, seq 12, R 8), W 8, Wr 4, block 4, three slot groups (group 0 cacheable): SPEC
    §3.6's worked example."""
    return (torch.tensor([0, 8], dtype=i32), torch.tensor([0, 1], dtype=i32), torch.tensor([False, True]),
            torch.tensor([0, 1, 5], dtype=i32), torch.tensor([9, 12], dtype=i32),
            torch.tensor([8, 8, 9, 10, 11], dtype=i64), torch.arange(15, dtype=i64).reshape(3, 5),
            torch.tensor([0], dtype=i32), torch.arange(8, dtype=i32).reshape(2, 4), 4, 8, 4)


def test_prepare_replay_step_serving_keywords_are_checked():
    """``prefill_from`` / ``gather_lens_from`` in range, ``valid_group`` a row that is never
    padded, their ``out=`` buffers present: each refused with the argument named, nothing
    written (the slot mappings stay as they were)."""
    from swa_backends.common.ops.prepare_replay_step import allocate_out

    args = _two_request_step()
    slots = args[6]
    kw = {"prefill_from": 1, "gather_lens_from": 1, "valid_group": 2}
    got = BE.prepare_replay_step(*args, **kw)
    assert got.swa_indices.shape == (1, 8) and got.prefill_swa_indices.shape == (4, 8)
    assert got.gather_lens.tolist() == [4 + 0]  # the prefill: 4 queries, replay start 8 = its prefix
    before = slots.clone()
    bad = [({"prefill_from": 6}, "prefill_from"), ({"prefill_from": -1}, "prefill_from"),
           ({"gather_lens_from": 3}, "gather_lens_from"), ({"valid_group": 0}, "valid_group"),
           ({"valid_group": 3}, "valid_group"),
           ({"out": allocate_out(2, 5, 8, "cpu")}, "out")]  # no buffers for the split rows / gather lengths
    short = allocate_out(2, 5, 8, "cpu", prefill_from=1, gather_lens_from=1)
    short["prefill_swa_lens"] = short["prefill_swa_lens"][:3]  # 4 prefill tokens
    bad.append(({"out": short}, r"out\['prefill_swa_lens'\]"))
    for change, name in bad:
        with pytest.raises(ValueError, match=rf"^prepare_replay_step: {name}=.*expected"):
            BE.prepare_replay_step(*args, **(kw | change))
        assert torch.equal(slots, before)
    # persistent buffers, longer than the step (SPEC §3.6): the leading rows written, the rest untouched
    long = allocate_out(2, 5, 8, "cpu", prefill_from=1, gather_lens_from=1)
    long = {k: torch.full((v.shape[0] + 3, *v.shape[1:]), -77, dtype=v.dtype) for k, v in long.items()}
    done = BE.prepare_replay_step(*args, **kw, out=long)
    for name in long:
        assert getattr(done, name) is long[name]
        n = getattr(got, name).shape[0]
        assert torch.equal(long[name][:n], getattr(got, name)) and (long[name][n:] == -77).all(), name


def test_prepare_replay_step_checks_its_stale_replay_buffer():
    """``out['stale_replay']``, the one output none of the parts' validators sees, is checked like
    the others: an int8 buffer (the kernel stores int32: past its bytes), an int64 one or a strided
    view is refused, naming it, before anything is written."""
    from swa_backends.common.ops.prepare_replay_step import allocate_out

    args = _two_request_step()
    slots = args[6]
    before = slots.clone()
    for bad in (torch.zeros(2, dtype=torch.int8), torch.zeros(2, dtype=i64), torch.zeros(4, dtype=i32)[::2]):
        out = allocate_out(2, 5, 8, "cpu")
        out["stale_replay"] = bad
        with pytest.raises(ValueError, match=r"^prepare_replay_step: out\['stale_replay'\]=.*expected"):
            BE.prepare_replay_step(*args, out=out)
        assert torch.equal(slots, before) and not bad.any()


def test_prepare_replay_step_sub_batch_builds_are_checked():
    """``kept_windows`` 0-2 and only with a plan, its split points in range (and None without
    it), a buffer dict per build with every buffer at least as long as the step writes, int32 on
    the device, no two sharing memory: each refused with the argument named, nothing written."""
    import numpy as np

    from swa_backends.common.ops.prepare_replay_step import allocate_out
    from swa_backends.common.types import ReplayPlan

    args = _two_request_step()
    slots = args[6]
    plan = ReplayPlan.from_kept(np.array([1, 2], dtype=np.int32), np.array([0, 1, 5], dtype=np.int32), 3, 8)
    kw = {"prefill_from": 1, "gather_lens_from": 1, "valid_group": 2, "plan": plan, "kept_windows": 2,
          "kept_prefill_from": 1, "kept_gather_lens_from": 1}
    shape = dict(prefill_from=1, gather_lens_from=1, kept_windows=2, kept_prefill_from=1, kept_gather_lens_from=1)
    got = BE.prepare_replay_step(*args, **kw, out=allocate_out(2, 5, 8, "cpu", plan, 3, **shape))
    assert got.kept_first_windows.prefill_swa_lens.tolist() == [3, 4]
    before = slots.clone()
    no_first = allocate_out(2, 5, 8, "cpu", plan, 3, **(shape | {"kept_windows": 1}))
    short = allocate_out(2, 5, 8, "cpu", plan, 3, **shape)
    short["kept_windows"]["prefill_swa_indices"] = short["kept_windows"]["prefill_swa_indices"][:1]
    wrong = allocate_out(2, 5, 8, "cpu", plan, 3, **shape)
    wrong["kept_first_windows"]["gather_lens"] = torch.zeros(1, dtype=i64)
    shared = allocate_out(2, 5, 8, "cpu", plan, 3, **shape)
    shared["kept_first_windows"]["swa_lens"] = shared["kept_windows"]["swa_lens"]
    bad = [({"kept_windows": 3}, "kept_windows"), ({"kept_windows": -1}, "kept_windows"),
           ({"plan": None}, "kept_windows"), ({"kept_prefill_from": 4}, "kept_prefill_from"),
           ({"kept_gather_lens_from": 3}, "kept_gather_lens_from"),
           ({"kept_windows": 0}, "kept_prefill_from"),  # a split point without the builds it splits
           ({"out": no_first}, "out"), ({"out": short}, r"out\['kept_windows'\]\['prefill_swa_indices'\]"),
           ({"out": wrong}, r"out\['kept_first_windows'\]\['gather_lens'\]"), ({"out": shared}, r"out\['kept_first_windows'\]\['swa_lens'\]")]
    for change, name in bad:
        with pytest.raises(ValueError, match=rf"^prepare_replay_step: {name}.*expected"):
            BE.prepare_replay_step(*args, **(kw | change))
        assert torch.equal(slots, before)


def test_prepare_replay_step_sub_batch_buffers_may_be_persistent():
    """``out["replay_batch"]`` as a serving engine keeps it (SPEC §3.6): buffers longer than the
    step, slot mappings with more groups and columns, are written in their leading extents and
    returned as given; one smaller than the step writes is refused naming it, nothing written."""
    import numpy as np

    from swa_backends.common.ops.prepare_replay_step import allocate_out
    from swa_backends.common.types import ReplayPlan

    args = _two_request_step()
    slots = args[6]
    plan = ReplayPlan.from_kept(np.array([1, 2], dtype=np.int32), np.array([0, 1, 5], dtype=np.int32), 4, 8)
    got = BE.prepare_replay_step(*args, plan=plan)
    exact = got.replay_batch
    extents = {"rows": (4,), "query_start_loc": (3,), "positions": (4,), "slot_mappings": (3, 4), "kv_start": (2,)}
    for name, ext in extents.items():
        assert tuple(getattr(exact, name).shape) == ext, name
    out = allocate_out(2, 5, 8, "cpu", plan, 3)
    rb = out["replay_batch"]
    out["replay_batch"] = {k: torch.full(tuple(n + 2 for n in v.shape), -77, dtype=v.dtype) for k, v in rb.items()}
    slots.copy_(torch.arange(15, dtype=i64).reshape(3, 5))
    done = BE.prepare_replay_step(*args, plan=plan, out=out)
    for name, ext in extents.items():
        buf = out["replay_batch"][name]
        assert getattr(done.replay_batch, name) is buf, name
        lead = buf[: ext[0]] if len(ext) == 1 else buf[: ext[0], : ext[1]]
        assert torch.equal(lead, getattr(exact, name)), name
        rest = buf.clone()
        if len(ext) == 1:
            rest[: ext[0]] = -77
        else:
            rest[: ext[0], : ext[1]] = -77
        assert (rest == -77).all(), name
    # gather_replay_batch alone takes them exact: leading_out cuts views of the same memory, exact ones kept
    from swa_backends.common.ops.gather_replay_batch import leading_out

    cut = leading_out(out["replay_batch"], plan, 3)
    exact_out = leading_out(rb, plan, 3)
    for name, ext in extents.items():
        assert tuple(cut[name].shape) == ext and cut[name].data_ptr() == out["replay_batch"][name].data_ptr(), name
        assert exact_out[name] is rb[name], name
    for name, ext in extents.items():
        short = allocate_out(2, 5, 8, "cpu", plan, 3)
        cut = tuple(n - 1 if i == len(ext) - 1 else n for i, n in enumerate(ext))
        short["replay_batch"][name] = torch.zeros(cut, dtype=short["replay_batch"][name].dtype)
        before = slots.clone()
        with pytest.raises(ValueError, match=rf"^prepare_replay_step: out\['replay_batch'\]\['{name}'\]=.*expected a "
                                             rf"{len(ext)}-D tensor of at least"):
            BE.prepare_replay_step(*args, plan=plan, out=short)
        assert torch.equal(slots, before), name


# ---------------------------------------------------------------------------------------
# overlap by address: exact where a closed form or a list of runs decides, conservative past it
# ---------------------------------------------------------------------------------------


def _bytes_of(t: torch.Tensor) -> set[int]:
    """Every byte address a tensor's elements occupy (the oracle: a loop over its indices)."""
    import itertools

    e, out = t.element_size(), set()
    for idx in itertools.product(*[range(n) for n in t.shape]):
        a = t.data_ptr() + sum(i * s for i, s in zip(idx, t.stride())) * e
        out.update(range(a, a + e))
    return out


def test_overlap_and_self_overlap_are_exact_for_small_layouts():
    """Random ``as_strided`` views (strides 0 included) of random dtypes over one buffer: both
    answers equal the byte-set oracle (every layout here has few runs, so nothing is left to the
    conservative answer)."""
    from swa_backends.common.validation import overlaps, self_overlaps

    rng = np.random.default_rng(0)
    buf = torch.zeros(2048, dtype=torch.int8)
    both = [0, 0]
    for _ in range(400):
        views = []
        for _ in range(2):
            dtype = (torch.int8, torch.int16, torch.int32, torch.int64)[rng.integers(4)]
            nd = int(rng.integers(1, 4))
            shape = tuple(int(x) for x in rng.integers(0, 5, nd))
            stride = tuple(int(x) for x in rng.integers(0, 12, nd))
            off = int(rng.integers(0, 48)) // dtype.itemsize * dtype.itemsize
            views.append(buf[off:].view(dtype).as_strided(shape, stride))
        a, b = views
        truth = bool(_bytes_of(a) & _bytes_of(b))
        both[truth] += 1
        assert overlaps(a, b) == truth == overlaps(b, a), (a.shape, a.stride(), b.shape, b.stride())
        repeated = len(_bytes_of(a)) < a.numel() * a.element_size()
        assert self_overlaps(a) == repeated, (a.shape, a.stride())
    assert min(both) > 60  # both answers were exercised


def test_overlap_across_storages_and_interleaved_columns():
    """Two storages over one numpy array overlap when their bytes do; column slices of one
    buffer interleave without sharing a byte, which the one-period form decides exactly at any
    row count (far past the run list's limit)."""
    from swa_backends.common.validation import ENUMERATE_RUNS, overlaps

    arr = np.zeros(64, dtype=np.float32)
    a, b = torch.from_numpy(arr[:40]), torch.from_numpy(arr[39:50])
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert overlaps(a, b) and not overlaps(a, torch.from_numpy(arr[40:50]))
    rows = 4 * ENUMERATE_RUNS
    m = torch.empty(rows, 8, dtype=torch.int32)
    assert not overlaps(m[:, :3], m[:, 3:])
    assert overlaps(m[:, :4], m[:, 3:])
    assert not overlaps(m[::2, :], m[1::2, :])  # every other row
    assert not overlaps(m[:, 0], m[:, 1]) and overlaps(m[:, 1], m[1:, 1])


def test_overlap_is_conservative_past_the_run_limit(monkeypatch):
    """A layout of two strided dims whose byte ranges intersect: decided exactly while its runs
    can be listed, counted as overlapping past the limit (a refusal errs on the safe side)."""
    from swa_backends.common import validation as v

    buf = torch.zeros(4096, dtype=torch.int32)
    a = buf.as_strided((8, 8), (64, 2))  # even words of the even 64-word rows
    b = buf[1:].as_strided((8, 8), (64, 2))  # their odd neighbours
    assert not v.overlaps(a, b) and not v.self_overlaps(buf.as_strided((8, 8), (5, 1)).t()[:1])
    odd = buf.as_strided((3, 3), (2, 3))  # addresses 0,2,3,4,5,6,7,8,10: apart, though no stride proves it
    assert not v.self_overlaps(odd)
    monkeypatch.setattr(v, "ENUMERATE_RUNS", 4)
    assert v.overlaps(a, b) and v.self_overlaps(odd)


def test_written_buffers_that_overlap_themselves_are_refused():
    """An in-place buffer with repeated addresses (an expanded or as_strided view) is refused
    before anything is written; the same values in a buffer whose rows lie apart are padded."""
    args, _ = _pad_args()
    slots = args[0]
    for bad in (slots[:1].expand(2, 6), slots[:, :1].expand(2, 6), slots.reshape(-1).clone().as_strided((2, 6), (3, 1))):
        before = bad.clone()
        with pytest.raises(ValueError, match=r"^pad_replayed_slots: slot_mappings=.*expected a buffer whose elements "
                                             r"do not overlap each other"):
            BE.pad_replayed_slots(bad, *args[1:])
        assert torch.equal(bad, before)
    apart = torch.full((2, 9), 5, dtype=i64)[:, :6]
    apart.copy_(slots)
    assert torch.equal(BE.pad_replayed_slots(apart, *args[1:]), BE.pad_replayed_slots(slots.clone(), *args[1:]))


def test_out_may_not_alias_the_plan_or_an_input_through_another_storage():
    from swa_backends.common.ops.gather_replay_batch import allocate_out
    from swa_backends.common.types import ReplayPlan

    plan, args = _plan_case()
    out = allocate_out(plan, args[4].shape[0], "cpu")
    BE.gather_replay_batch(plan, *args, out=out)
    for key, value in (("query_start_loc", plan.dropped_before), ("kv_start", plan.kept)):
        with pytest.raises(ValueError, match=rf"out\['{key}'\]=.*shares no memory with the input 'plan\.(dropped_before|kept)'"):
            BE.gather_replay_batch(plan, *args, out=out | {key: value})
    upload = plan.dropped_before.clone()  # an engine's own device copy, held by the plan
    qsl_host = np.concatenate([[0], np.cumsum(plan.kept.numpy())]) + plan.dropped_before.numpy()
    own = ReplayPlan.from_kept(plan.kept.numpy(), qsl_host, plan.num_rows_padded, plan.window,
                               device_dropped_before=upload)
    with pytest.raises(ValueError, match=r"plan\._device_cache\['cpu'\]"):
        BE.gather_replay_batch(own, *args, out=out | {"query_start_loc": upload})
    # rows through two storages over one numpy array
    arr = np.zeros(64, dtype=np.float32)
    x = torch.from_numpy(arr[:40]).view(10, 4)
    x.copy_(torch.arange(40.0).view(10, 4))
    with pytest.raises(ValueError, match=r"gather_rows: out=.*shares no memory with the input 'x'"):
        BE.gather_rows(x, torch.tensor([0, 1]), out=torch.from_numpy(arr[36:44]).view(2, 4))
    got = BE.gather_rows(x, torch.tensor([9, 1]), out=torch.from_numpy(arr[40:48]).view(2, 4))
    assert torch.equal(got, torch.arange(40.0).view(10, 4)[[9, 1]])


# ---------------------------------------------------------------------------------------
# scalars in the kernels' dtypes, every dtype and layout
# ---------------------------------------------------------------------------------------


def test_sm_scale_is_checked_in_fp32():
    """1e39 is a finite Python float and inf in fp32; 1e-39 a subnormal; 2**1024 an int no
    float holds: each a ValueError naming sm_scale. The range's ends are accepted."""
    from swa_backends.common.ops.sparse_mla import SCALE_MAX, SCALE_MIN

    args, kw = _mla_args()
    for bad in (1e39, 3e38, 1e-39, 0.0, -0.0, float("nan"), 2**1024, 10**400, True, "0.5"):
        with pytest.raises(ValueError, match=r"^sparse_mla: sm_scale=.*expected a float in"):
            BE.sparse_mla(*_set(args, 4, bad), **kw)
    for good in (SCALE_MIN, SCALE_MAX, 1, 0.125):
        BE.sparse_mla(*_set(args, 4, good), **kw)
    assert float(torch.tensor(SCALE_MAX * 1.4426950408889634, dtype=torch.float32)) < float("inf")


def test_meta_tensors_are_refused_by_every_op():
    """Validation reads values; a meta tensor has none: a ValueError, not torch's RuntimeError.
    (A call with nothing to read, every index tensor empty, is shapes only and runs.)"""
    for op in sb.OPS:
        for seed in range(2, 40):
            args, kw = case_for(op, np.random.default_rng(seed), "cpu", poison=True)
            if all(a.numel() for a in args if isinstance(a, torch.Tensor)):
                break
        meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        kmeta = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in kw.items() if k != "out"}
        with pytest.raises(ValueError, match=f"^{op}: .*expected a tensor with values"):
            getattr(BE, op)(*meta, **kmeta)


def test_lazy_conjugate_and_negative_bits():
    """Rows ops read any layout (the bits applied); every other op refuses a tensor whose lazy
    bit a kernel would not apply, and no op writes into one."""
    args, kw = _mla_args()
    with pytest.raises(ValueError, match=r"^sparse_mla: q=.*without a lazy conjugate or negative bit"):
        BE.sparse_mla(torch._neg_view(-args[0]), *args[1:], **kw)
    z = torch.randn(5, 3, dtype=torch.complex64)
    rows = torch.tensor([4, 0])
    assert torch.equal(BE.gather_rows(z.conj(), rows), z.conj().resolve_conj()[rows])
    n = torch._neg_view(torch.randn(5, 3))
    assert torch.equal(BE.scatter_rows(n[:2], rows, 5)[rows], n[:2].resolve_neg())
    with pytest.raises(ValueError, match=r"^gather_rows: out=.*without a lazy conjugate"):
        BE.gather_rows(z, rows, out=torch.empty(2, 3, dtype=torch.complex64).conj())


ROW_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64, torch.int16,
              torch.bool, torch.float64, torch.complex64, torch.complex128, torch.bfloat16)


def _row_backends():
    from _tritons import NO_TRITON

    return [BE] + ([] if NO_TRITON is not None else [sb.select("cpu", prefer="triton")])


@pytest.mark.parametrize("dtype", ROW_DTYPES, ids=[str(d)[6:] for d in ROW_DTYPES])
def test_rows_ops_move_every_dtype_bit_for_bit(dtype):
    """SPEC §3.3: any dtype. Rows of random bit patterns (NaN payloads included) gathered and
    scattered exactly, on the reference and the Triton kernel."""
    g = torch.Generator().manual_seed(1)
    n, width = 7, 5
    size = torch.empty(0, dtype=dtype).element_size()
    if dtype == torch.bool:
        x = torch.randint(0, 2, (n, width), generator=g).bool()
    else:
        x = torch.randint(0, 256, (n * width * size,), dtype=torch.uint8, generator=g).view(dtype).view(n, width)
    rows = torch.tensor([6, 2, 3])

    def bits(t):
        return t.contiguous().view(torch.uint8)

    for be in _row_backends():
        assert torch.equal(bits(be.gather_rows(x, rows)), bits(x)[rows]), be
        out = be.scatter_rows(x[:3], rows, n)
        want = torch.zeros(n, width * size, dtype=torch.uint8)
        want[rows] = bits(x[:3])
        assert torch.equal(bits(out), want), be


# ---------------------------------------------------------------------------------------
# one host read per validated call
# ---------------------------------------------------------------------------------------


def test_the_counter_sees_every_kind_of_host_read():
    from swa_backends.testing.host_reads import count_host_reads

    t = torch.arange(6)
    for read in (lambda: t.sum().item(), lambda: bool((t > 3).any()), lambda: int(t[2]), lambda: t.tolist(),
                 lambda: t.numpy(), lambda: torch.nonzero(t), lambda: torch.equal(t, t), lambda: t[t > 2],
                 lambda: float(t.float().mean())):
        with count_host_reads() as n:
            read()
        assert n.reads >= 1
    with count_host_reads() as n:
        (t * 2 + 1).to(torch.int32).to("cpu")  # device work only (a host tensor staying on the host)
    assert n.reads == 0


def _layout_calls(rng):
    """A valid call of each index-layout converter (public functions, validated like the ops)."""
    from swa_backends.common.ops.combined_indices import combined_width

    b = random_batch(rng, long_prefill=True)
    t = b.tensors("cpu")
    idx, lens = BE.swa_indices_and_lens(t["query_start_loc"], t["seq_lens"], t["block_table"], b.block_size, b.W,
                                        t["replay_start"], num_tokens=b.T)
    T, K = idx.shape
    M = int(BE.prefill_gather_lens(t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W).max()) + 8
    ws = (t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W, M, 8, t["block_table"], b.block_size)
    rows = sb.combined_workspace_rows(*ws)
    topk = torch.randint(0, 8, (T, 4), dtype=i32)
    comb, clens = BE.combined_indices(topk, t["query_start_loc"], t["seq_lens"], t["replay_start"], b.W, 4, 4, M, 8)
    assert comb.shape[1] == combined_width(4, b.W)
    indptr, values = BE.indices_to_csr(idx, lens)
    return {"compact_indices": ((idx, lens), {}), "combined_to_plain": ((comb, clens, rows), {}),
            "combined_workspace_rows": (ws, {}), "mixed_to_plain": ((idx, lens, K), {"window_offset": 3}),
            "combined_workspace_rows(compressed)": (ws, {"compressed_block_table": t["block_table"], "ratio": 1}),
            "csr_to_plain": ((indptr, values, K), {})}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_validated_call_reads_the_device_once(seed):
    """Every value check of a call travels in one device->host transfer: counted on the CPU by
    ``testing.host_reads`` (every value read through torch's dispatcher or a host copy), for the
    validation itself and for the whole call against the same call unvalidated."""
    from swa_backends.common.validation import one_read
    from swa_backends.testing.host_reads import count_host_reads

    for op, spec in sb.OPS.items():
        args, kw = case_for(op, np.random.default_rng(seed), "cpu", poison=bool(seed % 2))
        with count_host_reads() as n:
            with one_read():
                spec.validate(*args, **kw)
                spec.check_writes(args, kw)
        assert n.reads <= 1, (op, n.what)
        with count_host_reads() as full:
            getattr(BE, op)(*args, **kw)
        with sb.validation(False), count_host_reads() as bare:
            getattr(BE, op)(*args, **kw)
        assert full.reads - bare.reads <= 1, (op, full.what, bare.what)
    for name, (args, kw) in _layout_calls(np.random.default_rng(seed)).items():
        fn = getattr(sb, name.split("(")[0])
        with count_host_reads() as full:
            fn(*args, **kw)
        with sb.validation(False), count_host_reads() as bare:
            fn(*args, **kw)
        assert full.reads - bare.reads <= 1, (name, full.what, bare.what)


def _fuzz_cases():
    import fuzz_module

    return fuzz_module.load("fuzz_cases_for_validation")


def test_device_reductions_give_the_same_errors(monkeypatch):
    """What a large device tensor takes (its min and max reduced on the device, read whole only
    to explain an error) and what a small one takes (read whole) agree on every fuzz case of the
    reference backend's first valid call of each op: the same outcome, the same message."""
    from swa_backends.common import validation
    from swa_backends.common.ops import _checks

    fuzz = _fuzz_cases()
    fns = fuzz.backend_fns("reference")
    cases = [c for c in fuzz.all_cases(0, 1) if c[0] in fns]
    assert len(cases) > 500

    def outcomes():
        return [fuzz.run_case(op, fns[op][0], args, kwargs, expect, None)
                for op, _, args, kwargs, expect in cases]

    whole = outcomes()
    for module in (validation, _checks):
        monkeypatch.setattr(module, "reads_whole", lambda t: False)
    reduced = outcomes()
    assert sum(r["outcome"] == "clear" for r in whole) > 300
    diff = [(c[:2], a, b) for c, a, b in zip(cases, whole, reduced) if a != b]
    assert not diff, diff[:5]


def test_an_earlier_arguments_value_error_comes_first():
    """Value checks are read at the end of the call's validation, yet the error a call gets is
    the one it got when each check read at once: a bad value before a bad later argument."""
    args, kw = _swa_args()
    bad_qsl = torch.tensor([0, 6, 4], dtype=i32)
    with pytest.raises(ValueError, match=r"^swa_indices_and_lens: query_start_loc=.*non-decreasing"):
        BE.swa_indices_and_lens(bad_qsl, args[1], args[2].to(i64), *args[3:], **kw)  # block_table's dtype after
    with pytest.raises(ValueError, match=r"^swa_indices_and_lens: block_table="):
        BE.swa_indices_and_lens(args[0], args[1], args[2].to(i64), *args[3:], **kw)
    # prepare_replay_step names itself in its parts' value errors, read after its validator returned
    from swa_backends.common.ops.prepare_replay_step import allocate_out  # noqa: F401 (the op's own module)

    step = _two_request_step()
    BE.prepare_replay_step(*step)
    with pytest.raises(ValueError, match=r"^prepare_replay_step: cacheable_groups=7: expected values in \[0, 3\)"):
        BE.prepare_replay_step(*step[:7], torch.tensor([7], dtype=i32), *step[8:])
    with pytest.raises(ValueError, match=r"^prepare_replay_step: positions=-1: expected values in \[0, "):
        BE.prepare_replay_step(*step[:5], torch.tensor([8, 8, 9, 10, -1], dtype=i64), *step[6:])
    with pytest.raises(ValueError, match=r"^prepare_replay_step: R_per_request=-3: expected values in \[0, "):
        BE.prepare_replay_step(torch.tensor([0, -3], dtype=i32), *step[1:5], torch.tensor([8, 8, 9, 10, -1], dtype=i64),
                               *step[6:])  # (both wrong: the earlier argument's error)


@pytest.mark.parametrize("make", [
    lambda: torch.tensor([5], dtype=i32).expand(1),  # one element, stride 0 (opcheck's layouts)
    lambda: torch.zeros(0, dtype=i32).expand(0),
    lambda: torch.arange(6, dtype=i64)[::2],
    lambda: torch.tensor(3, dtype=i64),
    lambda: torch.arange(12, dtype=i32).view(3, 4).t(),
], ids=["stride0-one", "stride0-empty", "strided", "scalar", "transposed"])
def test_the_one_read_joins_any_layout_as_bytes(make):
    """The bytes a device's one read joins (``flat_bytes``): every layout a value check may
    register, in element order."""
    from swa_backends.common.validation import flat_bytes

    t = make()
    got = flat_bytes(t)
    assert got.dtype == torch.uint8 and got.stride() == (1,)
    assert torch.equal(got.view(t.dtype), t.reshape(-1))


@pytest.mark.parametrize("prefer", ["reference", "triton"])
@pytest.mark.parametrize("op", ["pad_replayed_slots", "compressed_slot_mapping", "swa_indices_and_lens",
                                "prefill_gather_lens", "combined_indices", "gather_replay_batch", "prepare_replay_step"])
def test_a_required_batch_tensor_passed_as_none_is_named(op, prefer):
    # check_batch took a None for "this op does not take it": a caller's None for seq_lens or replay_start
    # reached the op as an AttributeError (an audit, 2026-12-05). It is a ValueError naming the argument,
    # compressed_slot_mapping's seq_lens included (ratio 1 never reads it, the signature requires it)
    import inspect

    be = BE if prefer == "reference" else sb.select("cpu", prefer="triton")
    names = list(inspect.signature(getattr(be, op)).parameters)
    tried = 0
    for seed in range(3):
        args, kwargs = case_for(op, np.random.default_rng(seed), "cpu")
        for arg in ("seq_lens", "replay_start"):
            if arg not in names or names.index(arg) >= len(args):
                continue
            bad = list(args)
            bad[names.index(arg)] = None
            with sb.validation(True), pytest.raises(ValueError, match=rf"{op}: {arg}=None: expected a torch.Tensor"):
                getattr(be, op)(*bad, **kwargs)
            tried += 1
    assert tried >= 3
