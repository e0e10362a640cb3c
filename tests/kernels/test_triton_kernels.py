"""The portable Triton kernels of the metadata and data-movement ops, run on the CPU under
Triton's interpreter (``select("cpu", prefer="triton")``) against the torch reference.

Bit-for-bit: every op here is integer bookkeeping or a data copy. Cases come from
``common.conformance`` (serving-like batches, poisoned ``out=`` buffers half the time),
driven by hypothesis seeds; explicit tests cover odd sizes, stray writes, unaligned and
strided rows, validation and warmup. Interpreter runs are kept small (the whole file runs
in well under a minute on two cores).

The interpreter is process-wide (``TRITON_INTERPRET=1``), so on a machine with a GPU these
tests are skipped: there the same kernels run compiled (tests/kernels/test_triton_gpu.py).
"""

from __future__ import annotations

import inspect
import os
import zlib

import numpy as np
import pytest
from _tritons import NO_TRITON
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swa_backends import SelectionError, select
from swa_backends.testing.conformance import ODD_BATCHES, POISON_INT, case_for, mismatch, random_batch, run_op
from swa_backends.common.ops import OPS
from swa_backends.dispatch import all_variants
from swa_backends.common.types import PAD, SLOT_DTYPE
from swa_backends.common.validation import validation
from swa_backends.kernels import METADATA_KERNELS

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(),
                       reason="interpreter tests run in CPU-only processes (TRITON_INTERPRET is process-wide); "
                              "the GPU runs the compiled kernels in tests/kernels/test_triton_gpu.py"),
    pytest.mark.skipif(NO_TRITON is not None, reason=str(NO_TRITON)),
]

KERNEL_OPS = tuple(METADATA_KERNELS)  # this module's ops, straight from the declarations
# Interpreter cost per case differs ~20x between ops: more examples where they are cheap.
EXAMPLES = {"combined_indices": 30, "prepare_replay_step": 40, "swa_indices_and_lens": 40, "mixed_indices": 40,
            "plain_indices": 40, "indices_to_csr": 40}


@pytest.fixture(scope="module")
def tb():
    """The CPU backend with every Triton variant (interpreted)."""
    return select("cpu", prefer="triton")


def _check(tb, op, args, kwargs):
    got, want = run_op(op, getattr(tb, op), args, kwargs, "cpu")
    why = mismatch(op, got, want)
    assert why is None, f"{op}: {why}"
    return got, want


# --------------------------------------------------------------------------- selection


def test_prefer_triton_selects_every_kernel(tb):
    for op in KERNEL_OPS:
        assert tb.variants[op] == ("triton",), op
    plain = select("cpu")
    table = {(c.op, c.variant): c for c in plain.explain().table}
    for op in KERNEL_OPS:
        assert plain.variants[op] == ("reference",)
        cand = table[(op, "triton")]
        assert cand.status == "rejected" and any("interpreter" in r for r in cand.reasons), cand
        assert cand.verified == "emulated"


def test_interpreter_mode_is_the_processes_own():
    """The product never switches Triton's mode: on a CPU the suite starts interpreted
    (conftest), and the compiled ``triton`` probe says why it does not apply."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from swa_backends.common.registry import probe

    assert probe("triton_interpreter") is None
    assert "TRITON_INTERPRET=1" in probe("triton")
    with pytest.raises(SelectionError, match="TRITON_INTERPRET=1 is set"):
        select("cuda:sm90", prefer="triton")


@pytest.mark.parametrize("op", KERNEL_OPS)
def test_same_signature_as_reference(tb, op):
    impl = all_variants()[op]["triton"].load()
    assert inspect.signature(impl) == inspect.signature(OPS[op].reference)


# --------------------------------------------------------------------------- conformance


@pytest.mark.parametrize("op", KERNEL_OPS)
def test_conformance_random_batches(tb, op):
    @settings(max_examples=EXAMPLES.get(op, 60))
    @given(seed=st.integers(0, 2**32 - 1))
    def run(seed):
        rng = np.random.default_rng(seed)
        args, kwargs = case_for(op, rng, "cpu")
        _check(tb, op, args, kwargs)

    run()


# A validated call of plain tensors runs the op's self-checked kernel (tests/dispatch/test_self_checked.py);
# the plain kernel, what serving runs with validation off, only where that form declines the call. The
# odd-size and poisoned-output tests run both ways.
VALIDATED = pytest.mark.parametrize("validated", [True, False], ids=["validated", "unvalidated"])


@VALIDATED
@pytest.mark.parametrize("op", KERNEL_OPS)
def test_poisoned_out_is_fully_written(tb, op, validated):
    rng = np.random.default_rng(7)
    with validation(validated):
        for _ in range(3):
            args, kwargs = case_for(op, rng, "cpu", poison=True)
            got, _ = _check(tb, op, args, kwargs)




@VALIDATED
@pytest.mark.parametrize("name", list(ODD_BATCHES))
@pytest.mark.parametrize("op", [op for op in KERNEL_OPS if op not in ("gather_rows", "scatter_rows", "indices_to_csr")])
def test_odd_sizes(tb, op, name, validated):
    rng = np.random.default_rng(zlib.crc32(f"{op}/{name}".encode()))
    for i in range(2):
        kw = dict(ODD_BATCHES[name])
        if op == "gather_replay_batch" or (op == "prepare_replay_step" and rng.random() < 0.5):
            kw["long_prefill"] = True
            kw["max_reqs"] = max(1, kw.get("max_reqs", 6))
            kw["max_q"] = max(kw.get("max_q", 48), 2 * kw.get("W", 128) + 2)
            kw["W"] = kw.get("W", int(rng.choice([1, 3, 8])))
        batch = random_batch(rng, **kw)
        if op == "gather_replay_batch" and not (batch.prefilling & (batch.q > batch.W)).any():
            continue
        args, kwargs = case_for(op, rng, "cpu", batch=batch, poison=bool(i))
        with validation(validated):
            _check(tb, op, args, kwargs)


@VALIDATED
@pytest.mark.parametrize("T,K", [(0, 5), (3, 0), (1, 1), (17, 129), (70, 3)])
def test_indices_to_csr_shapes(tb, T, K, validated):
    rng = np.random.default_rng(T * 131 + K)
    idx = torch.tensor(rng.integers(-1, 9, size=(T, K)), dtype=torch.int32)
    lens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=torch.int32)
    with validation(validated):
        _check(tb, "indices_to_csr", (idx, lens), {})
        _check(tb, "indices_to_csr", (idx, lens),
               {"out": (torch.full((T + 1,), POISON_INT, dtype=torch.int32),
                        torch.full((T * K,), POISON_INT, dtype=torch.int32))})


# --------------------------------------------------------------------------- stray writes


def test_pad_replayed_slots_writes_only_replayed_cacheable_slots(tb):
    """Columns past query_start_loc[B] (with positions inside the last request's replay
    window, to tempt a kernel that mis-assigns them), window groups and tokens outside
    [R, R + Wr) keep their exact values; only the reference's PADs appear."""
    rng = np.random.default_rng(11)
    for _ in range(6):
        b = random_batch(rng, max_reqs=5, max_q=40, num_groups=4, max_padded=0)
        if not (b.R > 0).any():
            continue
        t = b.tensors("cpu")
        extra = 9
        G = b.num_groups
        slots = torch.tensor(rng.integers(10**6, 2 * 10**6, size=(G, b.T + extra + 4)), dtype=SLOT_DTYPE)
        slots[:, : b.T] = t["slot_mappings"][:, : b.T]
        last_R = int(b.R[-1]) if b.B else 0
        positions = torch.cat([t["positions"][: b.T], torch.full((extra,), max(last_R, 1), dtype=SLOT_DTYPE)])
        cacheable = torch.tensor([g for g in range(G) if g % 2 == 0], dtype=torch.int32)
        args = (slots, cacheable, t["query_start_loc"], positions, t["replay_start"], b.Wr)
        got, want = _check(tb, "pad_replayed_slots", args, {})
        changed = got != slots
        assert not changed[:, b.T:].any()
        assert not changed[1::2].any()  # window groups untouched
        assert (got[changed] == PAD).all()


def plan_for_batch(b):
    from swa_backends.common.ops import plan_replay_batch

    return plan_replay_batch(b.qsl, b.prefilling, np.zeros(b.B, bool), b.W, trim_threshold=0)


def test_gather_replay_batch_graph_padding_is_pad(tb):
    rng = np.random.default_rng(5)
    from swa_backends.common.ops import plan_replay_batch

    b = random_batch(rng, long_prefill=True, max_reqs=4, W=8, max_q=30)
    t = b.tensors("cpu")
    pre = b.prefilling
    plan = plan_replay_batch(b.qsl, pre, np.zeros(b.B, bool), b.W, pad_to=[4096], trim_threshold=0)
    assert plan.num_rows_padded == 4096
    got, _ = _check(tb, "gather_replay_batch",
                    (plan, t["query_start_loc"], t["seq_lens"], t["replay_start"], t["positions"], t["slot_mappings"], b.W),
                    {})
    n = plan.num_rows
    assert (got.slot_mappings[:, n:] == PAD).all() and (got.rows[n:] == 0).all()


@pytest.mark.parametrize("mapping", ["identity", "fixed_points"])
def test_prepare_replay_start_identity_and_fixed_points(tb, mapping):
    """``prepare_replay_step``'s replay starts through an identity ``idx_mapping`` (the vLLM
    integration's call: its replay starts come per batch row) and through a mapping whose last
    row maps elsewhere with ``R_per_request`` one entry shorter than the batch; the same replay
    start per row as the generated case."""
    rng = np.random.default_rng(3 if mapping == "identity" else 4)
    done = 0
    while done < 4:
        b = random_batch(rng, W=8, max_q=30, max_reqs=6, long_prefill=True)
        args, kwargs = case_for("prepare_replay_step", rng, "cpu", batch=b)
        R_all, idx, pre = args[0], args[1], args[2]
        B = idx.shape[0]
        row_R = torch.where(pre, R_all[idx.long()], torch.zeros_like(R_all[idx.long()]))
        new_idx = torch.arange(B, dtype=idx.dtype)
        R = row_R.clone()
        if mapping == "fixed_points":
            if B < 2:
                continue
            R = row_R[: B - 1].clone()
            if bool(pre[B - 1]):
                same = torch.nonzero(R == row_R[B - 1]).flatten()
                free = torch.nonzero(~pre[: B - 1]).flatten()
                if same.numel():
                    new_idx[B - 1] = same[0]
                elif free.numel():  # a row that reads no replay start carries the value
                    R[free[0]] = row_R[B - 1]
                    new_idx[B - 1] = free[0]
                else:
                    continue
            else:
                new_idx[B - 1] = 0
        _check(tb, "prepare_replay_step", (R, new_idx) + tuple(args[2:]), kwargs)
        done += 1


@pytest.mark.parametrize("tile", ["small", "other"])
def test_prepare_replay_step_each_launch_tile(tb, tile):
    """Both launch tiles of ``prepare_replay_step`` (each forced on small steps, as warmup
    launches them) against the reference, windows one and several column blocks wide (W 8: one
    block of either tile; W 130: three of the small tile's 64 columns, two of the other's 128)."""
    from swa_backends.kernels import prepare_replay_step as kp

    forced = kp.SMALL_TILE if tile == "small" else kp.TILE
    rng = np.random.default_rng(61 if tile == "small" else 62)
    for W in (8, 130):
        b = random_batch(rng, W=W, max_q=140, max_reqs=4, long_prefill=True)
        args, kwargs = case_for("prepare_replay_step", rng, "cpu", batch=b, poison=True)
        with kp.forced_tile(forced):
            _check(tb, "prepare_replay_step", args, kwargs)
    with pytest.raises(ValueError, match=r"forced_tile: tile=\(8, 32, 4\): expected one of"):
        with kp.forced_tile((8, 32, 4)):
            pass
    assert kp._forced_tile is None


@pytest.mark.parametrize("tile", ["small", "large"])
def test_prepare_replay_step_sub_batch_builds(tb, tile):
    """The sub-batch's window builds (``kept_windows`` 2) in each launch tile, windows one and
    several column blocks wide, against the reference; then a restarted request (SPEC §0) whose
    replay start is stale for the batch (above its first scheduled position) but not for its
    sub-batch (at or below the kept rows' first position): the first replay layer's build, which
    gets the replay start as the engine hands it, clamps there, as ``swa_indices_and_lens`` on
    the sub-batch does, and the replay layers' build (the sub-batch's ``kv_start``) does not."""
    from swa_backends.common.ops import prefill_gather_lens, swa_indices_and_lens
    from swa_backends.common.types import ReplayPlan
    from swa_backends.kernels import prepare_replay_step as kp

    forced = kp.SMALL_TILE if tile == "small" else kp.TILE
    rng = np.random.default_rng(71 if tile == "small" else 72)
    done = 0
    with kp.forced_tile(forced):
        for W in (8, 130, 8, 130):
            b = random_batch(rng, W=W, max_q=300, max_reqs=4, long_prefill=True, num_groups=3)
            for _ in range(20):
                args, kwargs = case_for("prepare_replay_step", rng, "cpu", batch=b, poison=True)
                if kwargs.get("plan") is not None and "prefill_from" in kwargs:
                    break
            else:
                continue
            kwargs |= {"kept_windows": 2, "kept_prefill_from": int(rng.integers(0, kwargs["plan"].num_rows + 1)),
                       "kept_gather_lens_from": int(rng.integers(0, b.B + 1))}
            kwargs.pop("out", None)
            _check(tb, "prepare_replay_step", args, kwargs)
            done += 1
        assert done >= 2
        # a decode (seq 50) and a 12-token prefill (seq 40) restarted at R 34: stale for the batch (first position
        # 28), live for its last 4 rows (first position 36); W 4, block 4, one cacheable group, group 1 the window's
        i32, i64 = torch.int32, torch.int64
        qsl, seq = torch.tensor([0, 1, 13], dtype=i32), torch.tensor([50, 40], dtype=i32)
        positions = torch.tensor([49, *range(28, 40)], dtype=i64)
        slots = torch.stack([positions + 1000, positions + 2000])
        table = torch.arange(26, dtype=i32).view(2, 13)
        plan = ReplayPlan.from_kept(np.array([1, 4], dtype=np.int32), np.array([0, 1, 13], dtype=np.int32), 5, 4)
        step = (torch.tensor([0, 34], dtype=i32), torch.arange(2, dtype=i32), torch.tensor([False, True]), qsl, seq,
                positions, slots, torch.tensor([0], dtype=i32), table, 4, 4, 4)
        kw = dict(plan=plan, prefill_from=1, gather_lens_from=1, valid_group=1, kept_windows=2, kept_prefill_from=1,
                  kept_gather_lens_from=1)
        want = OPS["prepare_replay_step"].reference(*[a.clone() if isinstance(a, torch.Tensor) else a for a in step],
                                                    **kw)
        got = tb.prepare_replay_step(*step, **kw)
    assert not mismatch("prepare_replay_step", got, want)
    assert got.stale_replay.tolist() == [0, 1] and got.replay_batch.kv_start.tolist() == [0, 36]
    kq = got.replay_batch.query_start_loc
    assert kq.tolist() == [0, 1, 5]
    for build, clamp in ((got.kept_windows, got.replay_batch.kv_start), (got.kept_first_windows, step[0])):
        idx, lens = swa_indices_and_lens.reference(kq, seq, table, 4, 4, clamp, num_tokens=4, token_offset=1)
        assert torch.equal(build.prefill_swa_indices, idx) and torch.equal(build.prefill_swa_lens, lens)
        assert torch.equal(build.gather_lens, prefill_gather_lens.reference(kq[1:], seq[1:], clamp[1:], 4))
    assert got.kept_windows.prefill_swa_lens.tolist() == [1, 2, 3, 4]  # clamped at kv_start 36
    assert got.kept_first_windows.prefill_swa_lens.tolist() == [3, 4, 4, 4]  # clamped at 34, live for the sub-batch


def test_prepare_replay_step_tile_follows_the_steps_size(tb):
    """Steps of at most ``SMALL_STEP_TOKENS`` tokens launch the small tile, longer ones the
    other (one cold prefill each), both equal to the reference."""
    from swa_backends.kernels import _launch
    from swa_backends.kernels import prepare_replay_step as kp

    i32 = torch.int32
    for T, want in ((kp.SMALL_STEP_TOKENS, kp.SMALL_TILE), (kp.SMALL_STEP_TOKENS + 1, kp.TILE)):
        bs, W = 64, 8
        positions = torch.arange(T, dtype=SLOT_DTYPE)
        args = (torch.zeros(1, dtype=i32), torch.zeros(1, dtype=i32), torch.ones(1, dtype=torch.bool),
                torch.tensor([0, T], dtype=i32), torch.tensor([T], dtype=i32), positions, positions[None].clone(),
                torch.zeros(0, dtype=i32), torch.arange(T // bs + 2, dtype=i32)[None], bs, W, 0)
        _launch.LAUNCHED.clear()
        _check(tb, "prepare_replay_step", args, {})
        keys = {key for name, key in _launch.LAUNCHED  # (the validated call's checked kernel: the same tiles)
                if name in ("prepare_replay_step._prepare_replay_step", "prepare_replay_step._prepare_replay_step_checked")}
        assert {key[-3:] for key in keys} == {want}, (T, keys)


# 3 (windows over many blocks) and 24 (a window in one or two) take the same division path:
# both for the cheap kernels, the smaller one for prepare_replay_step (its windows then span the
# most blocks), whose interpreter runs cost ten times theirs.
@pytest.mark.parametrize("op, block_size", [("swa_indices_and_lens", 3), ("swa_indices_and_lens", 24),
                                            ("combined_indices", 3), ("combined_indices", 24),
                                            ("prepare_replay_step", 3)])
def test_block_size_not_a_power_of_two(tb, op, block_size):
    """The window kernels split positions into block-table column and offset with shifts
    for power-of-two block sizes and an integer division otherwise: the second path too."""
    rng = np.random.default_rng(block_size * 7 + len(op))
    for _ in range(3):
        b = random_batch(rng, block_size=block_size, W=int(rng.choice([8, 130])), max_q=150, max_reqs=5,
                         long_prefill=op == "prepare_replay_step")
        args, kwargs = case_for(op, rng, "cpu", batch=b)
        _check(tb, op, args, kwargs)


@pytest.mark.parametrize("op", ["gather_replay_batch", "prepare_replay_step"])
def test_sub_batch_long_kept_runs_and_many_groups(tb, op):
    """A request keeping more rows than one program step (``keeps_rows`` on a long prefill:
    several programs per request) and more slot groups than one tile holds."""
    from swa_backends.common.ops import plan_replay_batch

    all_variants()[op]["triton"].load()
    from swa_backends.kernels.gather_replay_batch import BLOCK, GB

    rng = np.random.default_rng(21)
    split = False
    for num_groups in (GB + 3, 2, GB + 1):
        for _ in range(100):  # a batch where a request that keeps its rows runs past one program's block
            b = random_batch(rng, W=8, max_q=2 * BLOCK + 40, max_reqs=4, num_groups=num_groups, long_prefill=True)
            long = np.flatnonzero(b.prefilling & (b.q > b.W))
            if (b.q[long[1:]] > BLOCK).any():
                break
        keeps = np.zeros(b.B, bool)
        keeps[long[1:]] = True
        t = b.tensors("cpu")
        plan = plan_replay_batch(b.qsl, b.prefilling, keeps, b.W, pad_to=int(rng.integers(1, 300)) + b.T, trim_threshold=0)
        if op == "gather_replay_batch":
            args = (plan, t["query_start_loc"], t["seq_lens"], t["replay_start"], t["positions"],
                    t["slot_mappings"], b.W)
            kwargs = {}
        else:
            args, kwargs = case_for(op, rng, "cpu", batch=b, poison=False)
            kwargs["plan"] = plan
        _check(tb, op, args, kwargs)
        S = next(iter(plan._launch_cache.values()))[4]  # programs per request
        assert S == max(1, -(-int(plan.kept.max()) // BLOCK))
        split |= S > 1
    assert split, "no case spread a request over several programs"


@pytest.mark.parametrize("op, slot_arg", [("gather_replay_batch", 5), ("prepare_replay_step", 6)])
def test_slot_mappings_strided_along_tokens(tb, op, slot_arg):
    """``slot_mappings`` whose token stride is not 1 (a transposed ``[T, G]`` buffer): the
    kernels' general path (their usual path assumes unit token stride, a launch-key
    specialisation), against the reference."""
    rng = np.random.default_rng(31 + slot_arg)
    done = 0
    for _ in range(8):
        b = random_batch(rng, W=8, max_q=60, max_reqs=4, num_groups=3, long_prefill=True)
        args, kwargs = case_for(op, rng, "cpu", batch=b, poison=False)
        if op == "prepare_replay_step":
            kwargs["plan"] = plan_for_batch(b)
        sm = args[slot_arg]
        strided = sm.t().contiguous().t()  # same values, strides (1, G)
        if sm.shape[0] < 2 or sm.shape[1] < 2:
            continue
        assert strided.stride(1) != 1 and torch.equal(strided, sm)
        args = args[:slot_arg] + (strided,) + args[slot_arg + 1:]
        _check(tb, op, args, kwargs)
        done += 1
    assert done


@pytest.mark.parametrize("op", ["gather_replay_batch", "prepare_replay_step"])
def test_out_slot_mappings_may_be_row_strided(tb, op):
    """``out``'s sub-batch slot mappings as a ``[:, :n_pad]`` slice of a wider poisoned
    ``[G, n_pad + 7]`` buffer (vLLM's persistent ``_kept_slot_mappings``): the same values as
    the reference, nothing written past the slice."""
    from swa_backends.common.ops.gather_replay_batch import allocate_out as gather_out
    from swa_backends.common.ops.prepare_replay_step import allocate_out as prepare_out

    rng = np.random.default_rng(43)
    done = 0
    for _ in range(10):
        b = random_batch(rng, W=8, max_q=60, max_reqs=4, num_groups=3, long_prefill=True)
        plan = plan_for_batch(b)
        if plan is None:
            continue
        args, kwargs = case_for(op, rng, "cpu", batch=b, poison=False)
        slot_arg = 5 if op == "gather_replay_batch" else 6
        G, n_pad = args[slot_arg].shape[0], plan.num_rows_padded
        wide = torch.full((G, n_pad + 7), POISON_INT, dtype=SLOT_DTYPE)
        if op == "gather_replay_batch":
            args = (plan,) + args[1:]
            out = gather_out(plan, G, "cpu")
            out["slot_mappings"] = wide[:, :n_pad]
            got = tb.gather_replay_batch(*args, out=out)
            want = OPS[op].reference(*args)
            kept, kept_want = got.slot_mappings, want.slot_mappings
        else:
            # this test's own plan: the case's sub-batch builds (sized for the case's) left out
            kwargs = {**{k: v for k, v in kwargs.items() if not k.startswith("kept_")}, "plan": plan}
            out = prepare_out(args[1].shape[0], args[5].shape[0],
                              kwargs.get("index_width") or args[10], "cpu", plan, G,
                              prefill_from=kwargs.get("prefill_from"), gather_lens_from=kwargs.get("gather_lens_from"))
            out["replay_batch"]["slot_mappings"] = wide[:, :n_pad]
            ref_args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
            got = tb.prepare_replay_step(*args, **kwargs, out=out)
            want = OPS[op].reference(*ref_args, **kwargs)
            kept, kept_want = got.replay_batch.slot_mappings, want.replay_batch.slot_mappings
        assert kept.data_ptr() == wide.data_ptr() and kept.stride(0) == n_pad + 7
        assert torch.equal(kept, kept_want)
        assert (wide[:, n_pad:] == POISON_INT).all()
        done += 1
    assert done


def test_out_slot_mappings_rows_must_be_contiguous_and_apart():
    """Row-strided is allowed; overlapping rows or a non-unit inner stride are a ValueError
    naming the buffer, before anything is written."""
    from swa_backends.common.ops.gather_replay_batch import allocate_out as gather_out

    rng = np.random.default_rng(44)
    while True:
        b = random_batch(rng, W=8, max_q=60, max_reqs=4, num_groups=3, long_prefill=True)
        plan = plan_for_batch(b)
        if plan is not None and plan.num_rows_padded > 1:
            break
    args, _ = case_for("gather_replay_batch", rng, "cpu", batch=b, poison=False)
    args = (plan,) + args[1:]
    G, n_pad = args[5].shape[0], plan.num_rows_padded
    be = select("cpu")
    for bad in (torch.full((n_pad, G), 9, dtype=SLOT_DTYPE).t(),  # inner stride G
                torch.full((G * n_pad,), 9, dtype=SLOT_DTYPE).as_strided((G, n_pad), (n_pad - 1, 1))):  # rows overlap
        out = gather_out(plan, G, "cpu")
        out["slot_mappings"] = bad
        with validation(True), pytest.raises(ValueError, match=r"out\['slot_mappings'\]"):
            be.gather_replay_batch(*args, out=out)
        assert (bad == 9).all()


def test_pad_replayed_slots_no_launch_without_replay(tb):
    from swa_backends.kernels import _launch

    rng = np.random.default_rng(4)
    b = random_batch(rng, max_reqs=4)
    t = b.tensors("cpu")
    args = (t["slot_mappings"], t["cacheable_groups"], t["query_start_loc"], t["positions"][: b.T],
            torch.zeros_like(t["replay_start"]), b.Wr)
    before = _launch.total_launches()
    _check(tb, "pad_replayed_slots", args, {"any_replay": False})
    assert _launch.total_launches() == before
    _check(tb, "pad_replayed_slots", args, {"any_replay": None})  # unknown on the host: one launch
    assert _launch.total_launches() == before + (1 if b.T and len(b.cacheable) else 0)


# --------------------------------------------------------------------------- rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8,
                                   torch.uint8, torch.bool, torch.int64, torch.complex64])
@pytest.mark.parametrize("trailing", [(), (1,), (3,), (7168,), (2, 3, 5), (0,)])
def test_rows_any_trailing_shape_and_dtype(tb, dtype, trailing):
    rng = np.random.default_rng(zlib.crc32(f"{dtype}/{trailing}".encode()))
    N = 9 if trailing != (7168,) else 5
    n = 4 if trailing != (7168,) else 3
    if dtype == torch.bool:
        x = torch.tensor(rng.random((N, *trailing)) < 0.5)
    elif dtype.is_complex:
        x = torch.randn(N, *trailing, dtype=dtype)
    else:
        x = (torch.randn(N, *trailing) * 50).to(dtype)
    rows = torch.tensor(rng.permutation(N)[:n], dtype=SLOT_DTYPE)
    for validated in (True, False):  # the self-checked kernels, then the plain ones
        with validation(validated):
            _check(tb, "gather_rows", (x, rows), {})
            _check(tb, "gather_rows", (x, rows), {"out": torch.ones((n, *trailing), dtype=dtype)})
            _check(tb, "scatter_rows", (x[:n].contiguous(), rows, N), {"out": torch.ones((N, *trailing), dtype=dtype)})


def test_rows_unaligned_and_strided_inputs(tb):
    from swa_backends.kernels import rows as rows_mod

    rng = np.random.default_rng(3)
    D, N = 36, 11
    base = torch.randn(N * D + 3).to(torch.bfloat16)
    x = base[1 : 1 + N * D].view(N, D)  # 2-byte offset: moved as 2-byte words
    assert x.data_ptr() % 4 == 2
    assert rows_mod._plan(x, torch.empty(1, D, dtype=torch.bfloat16))[0] == 2
    rows = torch.tensor(rng.permutation(N)[:6], dtype=SLOT_DTYPE)
    xt = torch.randn(D, N).t()  # rows not contiguous
    # called on the views themselves (_check's run_op hands the kernel a fresh, aligned copy of each)
    ref = OPS["gather_rows"].reference
    for validated in (True, False):
        with validation(validated):
            assert torch.equal(tb.gather_rows(x, rows), ref(x.clone(), rows))
            assert torch.equal(tb.gather_rows(xt, rows), ref(xt.clone(), rows))
            assert torch.equal(tb.scatter_rows(xt[:6], rows, N), OPS["scatter_rows"].reference(xt[:6].clone(), rows, N))
            assert torch.equal(tb.scatter_rows(x[:6], rows, N), OPS["scatter_rows"].reference(x[:6].clone(), rows, N))
            out = torch.full((6, D), 3.0).to(torch.bfloat16)
            got = tb.gather_rows(x, rows, out=out)
            assert got.data_ptr() == out.data_ptr() and torch.equal(got, x[rows])


# --------------------------------------------------------------------------- validation


def test_bad_input_raises_before_any_launch(tb):
    """Bad metadata raises before any launch; a bad value before anything is written (a validated call
    of plain tensors launches the kernels that test it: the op's own, which store nothing then)."""
    from swa_backends.kernels import _launch

    rng = np.random.default_rng(2)
    b = random_batch(rng, max_reqs=3, num_groups=2)
    t = b.tensors("cpu")
    before = _launch.total_launches()
    with pytest.raises(ValueError, match="swa_indices_and_lens: W=0"):
        tb.swa_indices_and_lens(t["query_start_loc"], t["seq_lens"], t["block_table"], b.block_size, 0,
                                t["replay_start"], num_tokens=b.T)
    with pytest.raises(ValueError, match="gather_rows: rows"):
        tb.gather_rows(torch.zeros(3, 4), torch.tensor([0, 3], dtype=torch.int32))  # int32 row ids: metadata
    assert _launch.total_launches() == before
    slots = t["slot_mappings"].clone()
    with pytest.raises(ValueError, match="pad_replayed_slots: cacheable_groups=5"):
        tb.pad_replayed_slots(slots, torch.tensor([5], dtype=torch.int32), t["query_start_loc"],
                              t["positions"][: b.T], t["replay_start"], b.Wr)
    assert torch.equal(slots, t["slot_mappings"])
    out = torch.full((2, 4), 7.0)
    with pytest.raises(ValueError, match="gather_rows: rows=3"):
        tb.gather_rows(torch.zeros(3, 4), torch.tensor([0, 3]), out=out)
    assert torch.equal(out, torch.full((2, 4), 7.0))
    with validation(False):  # the hot path skips validation; valid input still matches
        args, kwargs = case_for("swa_indices_and_lens", rng, "cpu")
        _check(tb, "swa_indices_and_lens", args, kwargs)


# --------------------------------------------------------------------------- warmup


def test_warmup_of_a_validating_backend_takes_the_forms_asked_for():
    """A validating backend warms up its validated calls' self-checked kernels and its plain ones;
    ``validated=False`` (a caller serving with validation off) only the plain ones, ``True`` only
    the self-checked ones (a validated scatter's copy: the plain kernel's gated key)."""
    from swa_backends.kernels import _launch

    tb = select("cpu", prefer={"gather_rows": "triton", "scatter_rows": "triton"})

    def validated_form(name, key):
        return name.endswith("_checked") or (name == "rows._copy_rows" and key[-1] is True)

    for validated, want in ((False, {False}), (True, {True}), (None, {True, False})):
        _launch.LAUNCHED.clear()
        tb.warmup(ops=("gather_rows", "scatter_rows"), W=8, block_size=16, num_groups=1, hidden_sizes=(8,),
                  validated=validated)
        assert {validated_form(n, k) for n, k in _launch.LAUNCHED} == want, (validated, _launch.LAUNCHED)


def test_warmup_of_some_ops_runs_only_their_hooks():
    # two ops on Triton, each with its own hook (every kernel's warmup is the next test's)
    tb = select("cpu", prefer={"sparse_mla": "triton", "gather_rows": "triton"})
    assert tb.warmup(ops=("sparse_mla",), num_heads=(16,), attn_sink=(True,)) == [
        "swa_backends.kernels.sparse_mla:warmup"]
    assert tb.warmup(ops=()) == []
    assert "swa_backends.kernels.warmup:warmup" in tb.warmup(ops=("gather_rows",), W=8, block_size=16, num_groups=1,
                                                             hidden_sizes=(8,), top_k=16, compress_ratios=(4,))


def test_warmup_launches_every_kernel_and_serving_adds_no_specialisation():
    tb = select("cpu", prefer="triton")
    ran = tb.warmup(W=8, block_size=16, num_groups=3, hidden_sizes=(40,), top_k=16, compress_ratios=(4, 16))
    assert "swa_backends.kernels.warmup:warmup" in ran  # (sparse_mla's own hook runs too: nothing on a CPU)
    from swa_backends.kernels import _launch

    launched = {name for name, _ in _launch.LAUNCHED}
    # the pack's kernels (a benchmark run in this process may have registered a kernel of its own)
    pack = {n for n, k in _launch.KERNELS.items() if getattr(k.fn, "fn", k.fn).__module__.startswith("swa_backends.")}
    # but the device check of validated calls to a gated variant: the gated variant's hook (sm90's
    # gluon_ws) compiles it for a validating backend; this chain has no gated variant, nothing launches it
    pack -= {"sparse_mla_check._sparse_mla_check", "sparse_mla_check._sparse_mla_check_flat"}
    # and the value reader of validated calls (CUDA and ROCm): a CPU backend has none to warm up
    # (test_value_read.py: a backend's warmup reads through the reader it has)
    assert tb._reader is None
    pack -= {"value_read._value_read"}
    # and the sparse-MLA kernels (launched through the same Kernel once a test has run them): their
    # hook warms up by real launches on a GPU, none on a CPU (the interpreter compiles nothing)
    pack -= {"sparse_mla._sparse_mla_fwd", "sparse_mla._sparse_mla_combine",
             "sparse_mla_gluon._sparse_mla_gluon_fwd", "sparse_mla_gluon_ws._sparse_mla_gluon_ws_fwd"}
    assert launched >= pack, f"never launched: {pack - launched}"
    after_warmup = set(_launch.LAUNCHED)
    # serving-like steps of other sizes, replaying and trimming, through every op
    rng = np.random.default_rng(99)
    for op in KERNEL_OPS:
        for _ in range(2):
            if op in ("gather_rows", "scatter_rows"):
                N, n = 23, 6
                x = torch.randn(N, 40).to(torch.bfloat16)
                rows = torch.tensor(np.sort(rng.permutation(N)[:n]), dtype=SLOT_DTYPE)
                args, kwargs = ((x, rows), {}) if op == "gather_rows" else ((x[:n].clone(), rows, N), {})
                if op == "scatter_rows" and _:  # with a sub-batch's device row count (int32, as its qsl)
                    kwargs = {"count": torch.tensor([n - 1], dtype=torch.int32)}
            else:
                b = random_batch(rng, W=8, block_size=16, num_groups=3, long_prefill=True, max_q=30)
                args, kwargs = case_for(op, rng, "cpu", batch=b)
            _check(tb, op, args, kwargs)
    new = set(_launch.LAUNCHED) - after_warmup
    assert not new, f"serving-like calls launched specialisations warmup missed: {new}"
