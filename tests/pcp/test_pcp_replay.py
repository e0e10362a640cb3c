"""Encoder replay under PCP (SPEC §6), in one process: the worked example, property tests
against the single-process ``pad_replayed_slots``, bad input, the capability decision.
The real collective over several processes is in ``test_pcp_distributed.py``."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _pcp_cases import (
    SPEC_EXAMPLE_AFTER,
    CountingBackend,
    Step,
    long_example,
    oracle_global,
    oracle_laid_out,
    random_step,
    simulated_gather,
    spec_example,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from swa_backends import (
    PAD,
    ServingConfig,
    capabilities,
    pcp_gather_columns,
    pcp_pad_own_block,
    pcp_pad_replayed_slots,
    pcp_partition,
    reference_backend,
    select,
    validation,
)
from swa_backends.dispatch import variant


def test_spec_worked_example_padding():
    step = spec_example()
    parts = [step.partition(r) for r in range(2)]
    before = step.gathered_before(parts[0])
    assert before[0].tolist() == [116, 117, 118, 125, PAD, PAD, 119, 120, 121, 122, 123, 124]
    after = simulated_gather(step, parts)
    assert after[0].tolist() == SPEC_EXAMPLE_AFTER
    assert torch.equal(after[1], before[1])  # the window group is untouched
    assert torch.equal(after, oracle_laid_out(step, parts))
    assert torch.equal(after, oracle_global(step, parts[0]))


def test_spec_long_example_rank1_has_no_replayed_token_and_launches_nothing():
    step = long_example(P=2)
    parts = [step.partition(r) for r in range(2)]
    before = step.gathered_before(parts[0])
    counting = [CountingBackend(reference_backend()) for _ in parts]
    blocks = [pcp_pad_own_block(before, step.cacheable, p, step.R, step.Wr, backend=c) for p, c in zip(parts, counting)]
    assert counting[0].calls == ["batch_replay_start", "pad_replayed_slots"]
    assert counting[1].calls == []  # nothing to pad on rank 1 ...
    own1 = before[step.cacheable.to(torch.int64)][:, parts[1].own_columns]
    assert torch.equal(blocks[1], own1)  # ... its block is published unchanged (it still joins the gather)
    after = simulated_gather(step, parts)
    assert int((after[0] == PAD).sum() - (before[0] == PAD).sum()) == 128  # exactly the window [896, 1024)
    assert torch.equal(after, oracle_global(step, parts[0]))
    assert torch.equal(after, oracle_laid_out(step, parts))


def test_stale_replay_start_pads_nothing_on_any_rank():
    """SPEC §0 under PCP: the worked example's request restarted in place (10 tokens from
    position 10, its old R 16 kept) replays nothing, though rank 1's row {16, 17, 18} and rank
    0's row {19} start at or above R: staleness is the request's (its first position), not a
    local row's."""
    step = spec_example()
    step.nc = [10]
    parts = [step.partition(r) for r in range(2)]
    before = step.gathered_before(parts[0])
    assert torch.equal(simulated_gather(step, parts), before)
    assert torch.equal(simulated_gather(step, parts), oracle_global(step, parts[0]))
    with validation(False):
        assert torch.equal(simulated_gather(step, parts), before)


# SWA_PCP_PREFER=triton: run through select("cpu", prefer="triton") (the interpreter; set
# only in the subprocess of test_pcp_property_through_the_triton_variant_in_the_interpreter).
_PREFER = os.environ.get("SWA_PCP_PREFER")


@settings(max_examples=120)
@given(seed=st.integers(0, 2**32 - 1), P=st.sampled_from([2, 4]))
def test_gathered_mapping_equals_single_process_pad(seed, P):
    backend = select("cpu", prefer=_PREFER) if _PREFER else None
    if backend is not None:
        assert backend.variants["pad_replayed_slots"] == (_PREFER,), backend.variants
    step = random_step(np.random.default_rng(seed), P)
    parts = [step.partition(r) for r in range(P)]
    before = step.gathered_before(parts[0])
    got = simulated_gather(step, parts, backend)
    assert torch.equal(got, oracle_laid_out(step, parts))
    assert torch.equal(got, oracle_global(step, parts[0]))
    window = [g for g in range(before.shape[0]) if g not in step.cacheable.tolist()]
    assert torch.equal(got[window], before[window])


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1))
def test_selected_cpu_backend_and_validation_off_agree(seed):
    step = random_step(np.random.default_rng(seed), 4)
    parts = [step.partition(r) for r in range(4)]
    want = simulated_gather(step, parts, reference_backend())
    assert torch.equal(simulated_gather(step, parts, select("cpu")), want)
    with validation(False):
        assert torch.equal(simulated_gather(step, parts), want)


@pytest.mark.gpu
def test_own_block_padding_on_the_gpu_backend_matches_the_cpu_oracle():
    """CUDA tensors through the backend ``select`` picks for the GPU (Triton compiled once
    issue 3 lands), every rank simulated in one process."""
    dev = torch.device("cuda", torch.cuda.current_device())
    be = select(str(dev))
    rng = np.random.default_rng(11)
    for i in range(60):
        step = random_step(rng, (2, 4)[i % 2])
        parts = [step.partition(r) for r in range(step.P)]
        before = step.gathered_before(parts[0]).to(dev)
        cache = step.cacheable.to(dev)
        blocks = [pcp_pad_own_block(before, cache, p, step.R, step.Wr, backend=be) for p in parts]
        got = before.clone()
        if cache.numel():
            got[cache.to(torch.int64)] = torch.cat(blocks, dim=1)
        assert torch.equal(got.cpu(), oracle_global(step, parts[0]))
    print("pad_replayed_slots variant:", be.variants["pad_replayed_slots"])


# ---------------------------------------------------------------------------------------
# the full call over a real (single-process, P = 1) gloo group
# ---------------------------------------------------------------------------------------


@pytest.fixture
def gloo_world_of_one():
    fd, path = tempfile.mkstemp(prefix="swa_pcp_store_")
    os.close(fd)
    os.unlink(path)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
        if os.path.exists(path):
            os.unlink(path)


def test_p1_real_group_matches_single_process(gloo_world_of_one):
    rng = np.random.default_rng(7)
    for _ in range(20):
        step = random_step(rng, 1)
        part = step.partition(0)
        got = pcp_pad_replayed_slots(step.gathered_before(part), step.cacheable, part, step.R, step.Wr,
                                     group=gloo_world_of_one)
        assert torch.equal(got, oracle_global(step, part))


def test_group_of_the_wrong_size_is_named(gloo_world_of_one):
    step = spec_example()
    part = step.partition(1)
    with pytest.raises(ValueError, match=r"pcp_pad_replayed_slots: group.size=1: expected P=2 \(the PCP group\)"):
        pcp_pad_replayed_slots(step.gathered_before(part), step.cacheable, part, step.R, step.Wr)


def test_without_a_process_group_is_named():
    assert not dist.is_initialized()
    step = spec_example()
    part = step.partition(0)
    with pytest.raises(ValueError, match=r"pcp_pad_replayed_slots: group=None: expected an initialised torch.distributed"):
        pcp_pad_replayed_slots(step.gathered_before(part), step.cacheable, part, step.R, step.Wr)


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------


def _args(step=None, rank=0):
    step = step or spec_example()
    part = step.partition(rank)
    return [step.gathered_before(part), step.cacheable, part, list(step.R), step.Wr]


def _bad(index, value):
    args = _args()
    args[index] = value
    return args


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (_bad(2, "rank 0"), r"partition='rank 0': expected a PCPPartition"),
        (_bad(3, [16, 0]), r"replay_start=\[16, 0\]: expected a tensor or sequence of 1 ints"),
        (_bad(3, torch.tensor([16.0])), r"replay_start=tensor\(.*\): expected dtype int32 or int64"),
        (_bad(3, [-2]), r"replay_start=-2: expected values in \[0, 1073741825\)"),
        (_bad(4, -1), r"Wr=-1: expected an int >= 0"),
        (_bad(0, torch.zeros(2, 11, dtype=torch.int64)), r"slot_mappings=.*expected at least P \* padded = 2 \* 6 = 12 columns"),
        (_bad(0, torch.zeros(2, 12, dtype=torch.int32)), r"slot_mappings=.*expected dtype int64"),
        (_bad(1, torch.tensor([2], dtype=torch.int32)), r"cacheable_groups=2: expected values in \[0, 2\)"),
        (_bad(0, torch.arange(24, dtype=torch.int64).view(2, 12)), r"slot_mappings\[0, 4\]=4: expected PAD: column 4 publishes no token"),
    ],
)
def test_bad_input_names_the_argument(args, match):
    with pytest.raises(ValueError, match=r"pcp_pad_replayed_slots: " + match):
        pcp_pad_own_block(*args)
    with pytest.raises(ValueError, match=r"pcp_pad_replayed_slots: " + match):
        pcp_pad_replayed_slots(*args)  # validated before the group is looked at


def test_replay_on_false_while_a_request_replays():
    with pytest.raises(ValueError, match=r"pcp_pad_replayed_slots: replay_on=False: expected True or None: request 0 replays"):
        pcp_pad_replayed_slots(*_args(), replay_on=False)


def test_replicated_decode_must_be_pad_on_ranks_above_0():
    step = long_example(P=2)
    part = step.partition(1)
    before = step.gathered_before(part)
    col = int(part.columns[~part.publishes][0])
    before[1, col] = 5
    with pytest.raises(ValueError, match=rf"slot_mappings\[1, {col}\]=5: expected PAD: .*a decode replicated on rank 1"):
        pcp_pad_own_block(before, step.cacheable, part, step.R, step.Wr)


def test_guessed_decode_at_a_replayed_position_is_refused():
    # request 1 is a one-token prefill chunk at position 20 of a request replaying from 18
    q, nc, R = [6, 1], [0, 20], [0, 18]
    guessed = pcp_partition(q, nc, 2, 0)
    assert guessed.is_prefilling.tolist() == [True, False]
    slots = torch.arange(7, dtype=torch.int64)[None] + 1
    with pytest.raises(ValueError, match=r"partition.is_prefilling='guessed .*': expected the runner's flag: .*"
                                         r"request 1 \(q 1 at position 20\) a decode, but it sits in its replayed range \[18, 22\)"):
        pcp_pad_own_block(pcp_gather_columns(slots, guessed), torch.tensor([0], dtype=torch.int32), guessed, R, 4)
    # with the flag the chunk is split (rank 0 holds it) and its slot is padded
    parts = [pcp_partition(q, nc, 2, r, is_prefilling=[True, True]) for r in range(2)]
    step = Step(2, q, nc, [True, True], R, 4, slots, torch.tensor([0], dtype=torch.int32))
    got = simulated_gather(step, parts)
    assert PAD in got[0, parts[0].own_columns].tolist()
    assert torch.equal(got, oracle_global(step, parts[0]))
    # a genuine decode (position >= R + Wr) with an old R is fine with the guess
    ok = pcp_partition([1], [30], 2, 0)
    pcp_pad_own_block(pcp_gather_columns(torch.tensor([[5]]), ok), torch.tensor([0], dtype=torch.int32), ok, [18], 4)


def test_a_partition_derived_with_replace_has_a_cache_of_its_own():
    # dataclasses.replace() copied the cache's dict into the new partition: its device tensors
    # would have been the original's (an audit of the same class of plan, 2026-12-06)
    import dataclasses

    part = pcp_partition([6, 1], [0, 20], 2, 0, is_prefilling=[True, True])
    part.device_tensors("cpu")
    other = dataclasses.replace(part, positions=part.positions + 1)
    assert other._device_cache is not part._device_cache
    assert torch.equal(other.device_tensors("cpu")["positions"], part.positions + 1)


# ---------------------------------------------------------------------------------------
# the capability decision (SPEC §4): encoder replay under PCP only on CUDA, eager,
# synchronous scheduling, PP = DP = DCP = 1, without a KV connector, a drafter,
# microbatching or MegaMoE; decoder trimming never under PCP
# ---------------------------------------------------------------------------------------

PCP_OK = dict(prefill_context_parallel_size=4, graph_mode="none", async_scheduling=False)


@pytest.mark.parametrize("device", ["cuda:sm90", "cuda:sm100", "cuda:sm80"])
def test_pcp_encoder_replay_on_where_spec_allows(device):
    caps = capabilities(device, config=ServingConfig(**PCP_OK))
    assert caps.encoder_replay.enabled, caps.encoder_replay.reasons
    assert not caps.decoder_replay.enabled
    assert caps.decoder_replay.reasons == (
        "[pcp] decoder trimming stays off under prefill context parallel; prefill_context_parallel_size=4",)


@pytest.mark.parametrize(
    ("device", "change", "reason"),
    [
        ("rocm:gfx942", {}, "[pcp-platform] under prefill context parallel only CUDA preserves cached compressed KV "
                            "and indexer keys across ranks; platform=rocm, prefill_context_parallel_size=4"),
        ("ascend:910b", {}, "[pcp-platform] under prefill context parallel only CUDA preserves cached compressed KV "
                            "and indexer keys across ranks; platform=ascend, prefill_context_parallel_size=4"),
        ("cpu", {}, "[pcp-platform] under prefill context parallel only CUDA preserves cached compressed KV "
                    "and indexer keys across ranks; platform=cpu, prefill_context_parallel_size=4"),
        ("cuda:sm90", {"graph_mode": "piecewise"},
         "[pcp-eager] under prefill context parallel needs eager execution; graph_mode=piecewise (needs none)"),
        ("cuda:sm90", {"async_scheduling": True},
         "[pcp-sync] under prefill context parallel needs synchronous scheduling; async_scheduling=True"),
        ("cuda:sm90", {"pipeline_parallel_size": 2},
         "[pcp-pp] under prefill context parallel needs pipeline_parallel_size=1; got 2"),
        ("cuda:sm90", {"data_parallel_size": 2},
         "[pcp-dp] under prefill context parallel needs data_parallel_size=1; got 2"),
        ("cuda:sm90", {"decode_context_parallel_size": 2},
         "[dcp] off under decode context parallel; decode_context_parallel_size=2 (needs 1)"),
        ("cuda:sm90", {"model_runner": "v1"},
         "[runner] needs the model runner that pads replayed cacheable writes (v2); model_runner=v1"),
        ("cuda:sm90", {"kv_connector": True}, "[pcp-connector] under prefill context parallel needs no KV connector; "
                                              "kv_connector=True"),
        ("cuda:sm90", {"drafter": "dspark", "drafter_window": 128},
         "[pcp-drafter] under prefill context parallel needs no speculative decoding; drafter=dspark (needs none)"),
        ("cuda:sm90", {"microbatching": True},
         "[pcp-microbatching] under prefill context parallel needs no microbatching; microbatching=True"),
        ("cuda:sm90", {"mega_moe": True},
         "[pcp-megamoe] under prefill context parallel needs a MoE backend other than MegaMoE; mega_moe=True"),
    ],
)
def test_pcp_encoder_replay_off_names_each_condition(device, change, reason):
    caps = capabilities(device, config=ServingConfig(**(PCP_OK | change)))
    assert caps.encoder_replay.reasons == (reason,)
    assert not caps.decoder_replay.enabled
    assert "[needs-encoder] decoder replay requires encoder replay, which is off" in caps.decoder_replay.reasons
    assert any(r.startswith("[pcp] ") for r in caps.decoder_replay.reasons)


def test_pcp_every_failing_condition_is_reported_at_once():
    cfg = ServingConfig(prefill_context_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=2,
                        decode_context_parallel_size=2)  # graph mode and async scheduling at their defaults
    ids = [r.split("]")[0] + "]" for r in capabilities("rocm:gfx950", config=cfg).encoder_replay.reasons]
    assert ids == ["[dcp]", "[pcp-platform]", "[pcp-eager]", "[pcp-sync]", "[pcp-pp]", "[pcp-dp]"]


def test_pcp_rules_do_not_apply_without_pcp():
    # the same settings without PCP: both sides on (on CUDA), no pcp-* reason anywhere
    caps = capabilities("cuda:sm90", config=ServingConfig(graph_mode="full", async_scheduling=True, kv_connector=True,
                                                          drafter="dspark", drafter_window=128, mega_moe=True))
    assert caps.encoder_replay.enabled and caps.decoder_replay.enabled


# ---------------------------------------------------------------------------------------
# the Triton variants through the interpreter (own process: TRITON_INTERPRET is per process)
# ---------------------------------------------------------------------------------------

_TRITON_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np, torch
    sys.path.insert(0, {tests!r})
    from _pcp_cases import random_step, simulated_gather, oracle_global, oracle_laid_out, long_example, spec_example
    from _pcp_cases import CountingBackend, SPEC_EXAMPLE_AFTER
    from swa_backends import select
    be = select("cpu", prefer="triton")
    assert "triton" in be.variants["pad_replayed_slots"], be.variants
    rng = np.random.default_rng(2024)
    steps = [spec_example(), long_example(2), long_example(4)] + [random_step(rng, P, max_q=24) for P in (2, 4) * 12]
    for step in steps:
        parts = [step.partition(r) for r in range(step.P)]
        got = simulated_gather(step, parts, be)
        assert torch.equal(got, oracle_global(step, parts[0])), step
        assert torch.equal(got, oracle_laid_out(step, parts)), step
    assert simulated_gather(spec_example(), [spec_example().partition(r) for r in range(2)], be)[0].tolist() == SPEC_EXAMPLE_AFTER
    print("ok", len(steps), be.variants["pad_replayed_slots"], be.variants["batch_replay_start"])
""")


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root


def _interpreter_run(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    if variant("pad_replayed_slots", "triton") is None:
        pytest.skip("no Triton variant of pad_replayed_slots is declared yet (issue 3)")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})), cwd=_ROOT)


def test_pcp_padding_through_the_triton_variant_in_the_interpreter():
    tests = os.path.dirname(os.path.abspath(__file__))
    proc = _interpreter_run(["-c", _TRITON_SCRIPT.format(tests=tests)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok"), proc.stdout


def test_pcp_property_through_the_triton_variant_in_the_interpreter():
    """The hypothesis property test above, in its own process with SWA_PCP_PREFER=triton."""
    proc = _interpreter_run(["-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(__file__),
                             "-k", "test_gathered_mapping_equals_single_process_pad"], {"SWA_PCP_PREFER": "triton"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "1 passed" in proc.stdout, proc.stdout[-2000:]
