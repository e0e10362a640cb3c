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


def test_a_plan_whose_trimmed_disagrees_with_its_rows_is_rejected():
    """The device side reads only ``dropped_before`` (a request is trimmed where it grows): a
    plan whose ``trimmed`` says otherwise is refused, not half-believed."""
    import dataclasses

    rng = np.random.default_rng(4)
    for _ in range(50):
        b = random_batch(rng, W=4, long_prefill=True)
        plan = sb.plan_replay_batch(b.qsl, b.prefilling, np.zeros(b.B, bool), b.W, trim_threshold=0)
        if plan is not None:
            break
    t = b.tensors("cpu")
    args = (t["query_start_loc"], t["seq_lens"], t["replay_start"], t["positions"], t["slot_mappings"], b.W)
    BE.gather_replay_batch(plan, *args)
    bad = dataclasses.replace(plan, trimmed=~plan.trimmed, _device_cache={}, _launch_cache={})
    with pytest.raises(ValueError, match=r"gather_replay_batch: plan.trimmed='plan.trimmed\[\d+\]=\w+': expected kept < q"):
        BE.gather_replay_batch(bad, *args)


def test_prepare_replay_step_serving_keywords_are_checked():
    """``prefill_from`` / ``gather_lens_from`` in range, ``valid_group`` a row that is never
    padded, their ``out=`` buffers present: each refused with the argument named, nothing
    written (the slot mappings stay as they were)."""
    from swa_backends.common.ops.prepare_replay_step import allocate_out

    qsl = torch.tensor([0, 1, 5], dtype=i32)
    seq = torch.tensor([9, 12], dtype=i32)
    positions = torch.tensor([8, 8, 9, 10, 11], dtype=i64)
    slots = torch.arange(15, dtype=i64).reshape(3, 5)
    table = torch.arange(8, dtype=i32).reshape(2, 4)
    args = (torch.tensor([0, 8], dtype=i32), torch.tensor([0, 1], dtype=i32), torch.tensor([False, True]), qsl, seq,
            positions, slots, torch.tensor([0], dtype=i32), table, 4, 8, 4)
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
