"""A validated call of plain tensors to an op whose kernel tests its own values
(``OpSpec.quick_check`` + ``Variant.self_checked``): quick host checks, then the kernel, which
tests every value the validator tests (in every program before it stores, or in checker programs
its other programs wait for: ``kernels/range_check.py``), writes nothing when one fails and leaves
its verdict in one word; dispatch waits for that verdict and, when it is bad,
raises the validator's own ``ValueError``.

Here, on the CPU (the kernels in Triton's interpreter): the quick checks are never looser than the
validator's host checks (every adversarial call of the fuzz suite), the kernels' verdicts agree
with the validator on random calls with poisoned values and write nothing on a bad one, and
dispatch takes the path for plain calls only, with the validator's errors (and, with toy forms,
what dispatch does with a form that declines, fails, passes or is contradicted by the validator).
The same agreement on the GPU (the verdict a pinned host word on CUDA) is this file's ``gpu`` test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swa_backends as sb
from swa_backends.common.ops import OPS
from swa_backends.common.registry import load_attr
from swa_backends.common.types import MAX_POSITION, ReplayPlan
from swa_backends.common import validation
from swa_backends.common.validation import one_read
from swa_backends.testing.conformance import case_for, mismatch, repeated_scatter_mismatch, scatter_repeats

pytest.importorskip("triton")
from swa_backends.kernels import METADATA_KERNELS, SELF_CHECKED, _launch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_cases import cases_for  # noqa: E402

QUICK = sorted(op for op, spec in OPS.items() if spec.quick_check is not None)
CHECKED = sorted(SELF_CHECKED)
INT32_MAX = 2**31 - 1
#: the values a poisoned element takes: each side of every bound the validators use
EDGES = (-(2**40), -2, -1, 0, 1, 2, 3, 5, 17, 64, 127, 128, 129, MAX_POSITION, MAX_POSITION + 1, INT32_MAX, 2**40)


def test_every_self_checked_op_has_a_quick_check():
    assert CHECKED and set(CHECKED) <= set(QUICK)


def _host_checks_pass(op: str, args, kwargs) -> tuple[str, str] | None:
    """None when the validator's host checks and check_writes pass the call, else ``(which, error)``
    (which: "validate" or "writes")."""
    spec = OPS[op]
    try:
        with one_read():
            validation._state.capturing = True  # as under a graph capture: no value is read
            spec.validate(*args, **kwargs)
    except ValueError as exc:
        return "validate", str(exc)
    try:
        spec.check_writes(args, kwargs)
    except ValueError as exc:
        return "writes", str(exc)
    return None


def _form_refuses(op: str, args, kwargs) -> bool:
    """The op's self-checked form, on the call itself (aliases kept), declines it (the validator
    then refuses it) or refuses it: its verdict is ``FAIL`` and no written buffer changed."""
    before = [w.clone() for w in _written(op, args, kwargs)]
    done = load_attr(f"swa_backends.kernels.{SELF_CHECKED[op]}")(None, *args, **kwargs)  # (home: any device)
    return done is None or (done[1].failed()
                            and all(torch.equal(w, b) for w, b in zip(_written(op, args, kwargs), before)))


@pytest.mark.parametrize("op", QUICK)
def test_quick_check_is_never_looser_than_the_host_checks(op):
    """Every adversarial call of the fuzz suite (mutations of dtypes, shapes, devices, strides,
    views, lazy bits, aliasing, scalars) on several valid calls: a call the quick check passes
    passes the validator's host checks, and check_writes too unless the op leaves those to its
    kernel (``OpSpec.writes_on_device``), whose self-checked form then refuses the call and
    writes nothing; and most valid calls pass it (the path is taken)."""
    taken = 0
    for seed in range(6):
        rng = np.random.default_rng([seed, 38])
        args, kwargs = case_for(op, rng, "cpu")
        taken += bool(OPS[op].quick_check(*args, **kwargs))
        for label, a, kw, _ in cases_for(op, rng, families=seed == 0):
            try:
                quick = OPS[op].quick_check(*a, **kw)
            except Exception as exc:  # noqa: BLE001 - a quick check must answer, never raise
                pytest.fail(f"{op} {label}: quick_check raised {type(exc).__name__}: {exc}")
            if quick:
                refused = _host_checks_pass(op, a, kw)
                if refused is not None and refused[0] == "writes" and OPS[op].writes_on_device:
                    assert _form_refuses(op, a, kw), f"{op} {label}: the kernel took a call check_writes refuses"
                    continue
                assert refused is None, f"{op} {label}: quick_check passed a call the host checks refuse: {refused}"
    assert taken >= 4, f"{op}: the quick check passed {taken} of 6 valid calls"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_pad_replayed_slots_kernel_tests_the_overlap_of_its_writes(device):
    """``pad_replayed_slots`` leaves check_writes to its kernel (``OpSpec.writes_on_device``): slot
    rows sliced from a wider buffer that also holds one input, in a row's own slots (refused:
    the validator's error, nothing written) or in the gap past a row (taken: the inputs lie apart,
    though inside the slots' span), for each input and through dispatch, validated. On the GPU the
    kernel decides each; in Triton's interpreter, which copies each tensor in and out, the form
    declines them all and the validator decides."""
    be = _backend() if device == "cpu" else sb.select("cuda")
    T, G = 24, 3
    R = torch.tensor([4, 0], dtype=torch.int32, device=device)
    from swa_backends.kernels import pad_replayed_slots as k

    checked = k._K_CHECKED
    launches = checked.launches

    def call(where: str, hit: bool):
        buf = torch.zeros(G, 64, dtype=torch.int64, device=device)
        slots = buf[:, :T]  # rows of T slots, 64 apart: the gap is [T, 64) of each row
        start = 2 if hit else T + 4
        as32 = buf.view(torch.int32)[1, 2 * start:]  # int32 words of row 1 from `start` on
        parts = {"positions": torch.cat([torch.arange(12), torch.arange(12)]).to(device),
                 "cacheable_groups": torch.tensor([0, 2], dtype=torch.int32, device=device),
                 "query_start_loc": torch.tensor([0, 12, T], dtype=torch.int32, device=device),
                 "replay_start": R.clone()}
        t = parts[where]
        if t.dtype == torch.int64:
            view = buf[1, start:start + t.numel()]
        else:
            view = as32[: t.numel()]
        view.copy_(t)
        parts[where] = view
        buf[:, :T] = torch.arange(T, device=device)  # the slots (a hit's input is overwritten: set it again)
        view.copy_(t)
        return slots, parts

    for where in ("positions", "cacheable_groups", "query_start_loc", "replay_start"):
        for hit in (True, False):
            slots, p = call(where, hit)
            args = (slots, p["cacheable_groups"], p["query_start_loc"], p["positions"], p["replay_start"], 8)
            assert OPS["pad_replayed_slots"].quick_check(*args), (where, hit)
            before = slots.clone()
            if hit:
                with pytest.raises(ValueError, match="pad_replayed_slots: slot_mappings.*shares no memory"):
                    be.pad_replayed_slots(*args)
                assert torch.equal(slots, before), f"{where}: a refused call wrote"
            else:
                want = OPS["pad_replayed_slots"].reference(_copy(slots, "cpu"), *(_copy(a, "cpu") for a in args[1:]))
                assert torch.equal(be.pad_replayed_slots(*args).cpu(), want), where
    # on the GPU every call went to the kernel; in the interpreter none did
    assert checked.launches == launches + (8 if device == "cuda" else 0)


def _int_tensors(args, kwargs):
    """The integer tensors a poison may hit: the arguments' and a replay plan's (its kept rows and
    drops: a plan of ``from_kept`` makes its tensors as views of its arrays, so both change)."""
    out = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, ReplayPlan):
            out += [t for t in (v.kept, v.dropped_before) if t.numel()]
        elif isinstance(v, torch.Tensor) and not v.is_floating_point() and v.dtype != torch.bool and v.numel():
            out.append(v)
    return out


def _written(op: str, args, kwargs) -> list[torch.Tensor]:
    bound = OPS[op].signature.bind(*args, **kwargs).arguments
    found = []
    for n in ("out", *OPS[op].mutates):
        v = bound.get(n)
        found += [t for t in (v if isinstance(v, tuple) else (v,)) if isinstance(t, torch.Tensor)]
    return found


def _poisoned_call(op: str, seed: int, poison: int, edge: int, with_out: bool, device="cpu"):
    """A valid call, then (``poison`` > 0) one element of one integer argument set to ``edge``."""
    rng = np.random.default_rng(seed)
    args, kwargs = case_for(op, rng, "cpu", poison=with_out)
    ints = _int_tensors(args, kwargs)
    if poison and ints:
        t = ints[int(rng.integers(len(ints)))].view(-1)
        t[int(rng.integers(t.numel()))] = max(min(edge, torch.iinfo(t.dtype).max), torch.iinfo(t.dtype).min)
    def move(v):
        if isinstance(v, tuple):
            return tuple(move(x) for x in v)
        if isinstance(v, dict):
            return {k: move(x) for k, x in v.items()}
        return v.to(device) if isinstance(v, torch.Tensor) else v

    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def _copy(v, device=None):
    """``v`` with every tensor (in tuples and dicts too) cloned, onto ``device`` when given."""
    if isinstance(v, tuple):
        return tuple(_copy(x, device) for x in v)
    if isinstance(v, dict):
        return {k: _copy(x, device) for k, x in v.items()}
    if isinstance(v, torch.Tensor):
        return (v if device is None else v.to(device)).clone()
    return v


@pytest.mark.parametrize("op", CHECKED)
def test_a_form_declines_every_call_its_quick_check_does_not_pass(op):
    """Dispatch calls a self-checked form with nothing checked before it but the home device
    (``Variant.self_checked``): the form screens its own call with the op's quick check. Every
    adversarial call of the fuzz suite that the quick check does not pass, the form declines (None)
    and writes nothing; and the quick check's answer is the same on the form's path (its facts)."""
    form = load_attr(f"swa_backends.kernels.{SELF_CHECKED[op]}")
    declined = 0
    for seed in range(3):
        rng = np.random.default_rng([seed, 39])
        for label, a, kw, _ in cases_for(op, rng, families=seed == 0):
            if OPS[op].quick_check(*a, **kw):
                continue
            try:  # (what has values to compare: no meta, sparse or nested buffer)
                written = [(w, w.clone()) for w in _written(op, a, kw)
                           if w.device.type != "meta" and w.layout is torch.strided and not w.is_nested]
            except TypeError:  # arguments that do not bind
                written = []
            assert form(None, *a, **kw) is None, f"{op} {label}: the form took a call its quick check does not pass"
            assert all(torch.equal(w, b) for w, b in written), f"{op} {label}: a declined call wrote"
            declined += 1
    assert declined, f"{op}: no adversarial call was declined"


@pytest.mark.parametrize("op", CHECKED)
def test_a_form_declines_a_call_off_the_backends_device_and_dispatch_names_it(op, monkeypatch):
    """The form screens the backend's device itself (``home``, what dispatch passes it; the quick
    check's device against it), in place of a home check of its own before it: a call whose tensors
    are elsewhere is declined before any launch, and dispatch's home check, run then, raises its
    ``ValueError`` with nothing written. (``meta`` stands in for a GPU no host tensor is on.)"""
    form = load_attr(f"swa_backends.kernels.{SELF_CHECKED[op]}")
    rng = np.random.default_rng([CHECKED.index(op), 41])
    for _ in range(20):  # a call the form takes on its own device
        args, kwargs = case_for(op, rng, "cpu")
        done = form(torch.device("cpu"), *_copy(args), **_copy(kwargs))
        if done is not None:
            break
    assert done is not None and not done[1].failed(), f"{op}: no call the form takes"
    launched = _launches(op)
    assert form(torch.device("meta"), *args, **kwargs) is None
    assert _launches(op) == launched
    monkeypatch.setattr(dispatch, "home_device", lambda device: torch.device("meta"))
    be = sb.select("cpu", prefer="triton")
    be = dispatch.Backend(be.device, dict(be._chains), be.capabilities, be._explanation)  # (made with meta as home)
    before = [(t, t.clone()) for _, t in validation._tensors("call", (args, kwargs))]
    with pytest.raises(ValueError, match="the backend's device"):
        getattr(be, op)(*args, **kwargs)
    assert _launches(op) == launched, f"{op}: a kernel launched on tensors off the backend's device"
    assert all(torch.equal(t, was) for t, was in before), f"{op} wrote into a refused call's tensors"


def agrees(op: str, args, kwargs) -> str:
    """Runs the op's self-checked form on the call and checks it against the validator: the
    verdict is the validator's; a bad call leaves every written buffer as it was; a good one gives
    what the plain (unvalidated) kernel gives on the same call, and the reference's result wherever
    the plain kernel does (a poisoned value the validator lets through may reach a corner where the
    two differ: ``prepare_replay_step`` takes a replay start as stale by ``seq_lens``,
    ``pad_replayed_slots``' reference by the positions, which a poison can make disagree). Returns
    "bad", "good" or "declined"."""
    try:
        OPS[op].validate(*args, **kwargs)
        bad = False
    except ValueError:
        bad = True
    before = [w.clone() for w in _written(op, args, kwargs)]
    plain_args, plain_kwargs = _copy(args), _copy(kwargs)
    done = load_attr(f"swa_backends.kernels.{SELF_CHECKED[op]}")(None, *args, **kwargs)  # (home: any device)
    if done is None:
        return "declined"  # a call the form does not take: dispatch validates it as usual
    result, gate = done
    assert gate.failed() == bad
    if bad:
        for w, b in zip(_written(op, args, kwargs), before):
            assert torch.equal(w, b), "a refused call wrote"
        return "bad"
    if op == "scatter_rows" and scatter_repeats(plain_args, plain_kwargs):
        # a repeated row keeps an unspecified one of its values (the op's contract): any of them
        why = repeated_scatter_mismatch(result, plain_args, plain_kwargs)
        assert why is None, why
        return "good"
    plain = load_attr(f"swa_backends.kernels.{METADATA_KERNELS[op][0]}")(*plain_args, **plain_kwargs)
    why = mismatch(op, result, plain)
    assert why is None, f"the checked form differs from the plain kernel: {why}"
    ref_args, ref_kwargs = _copy(args, "cpu"), _copy(kwargs, "cpu")
    for w, b in zip(_written(op, ref_args, ref_kwargs), before):
        w.copy_(b.cpu())
    want = OPS[op].reference(*ref_args, **ref_kwargs)
    if op != "prepare_replay_step" or mismatch(op, _copy(plain, "cpu"), want) is None:
        why = mismatch(op, result, want)
        assert why is None, why
    return "good"


def test_a_repeated_scatter_is_compared_with_every_answer_the_op_allows():
    # the comparison the self-checked agreement and the sanitizer use where a row is scattered twice:
    # either writer's value, zero where nothing is scattered, nothing past the count
    y, rows = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([1, 1, 0])
    assert scatter_repeats((y, rows, 3), {})
    for ok in ([[3.0], [1.0], [0.0]], [[3.0], [2.0], [0.0]]):
        assert repeated_scatter_mismatch(torch.tensor(ok), (y, rows, 3), {}) is None
    none_of_its = repeated_scatter_mismatch(torch.tensor([[3.0], [0.0], [0.0]]), (y, rows, 3), {})
    assert "row 1: holds the value of none" in none_of_its
    assert "row 2: no row of y" in repeated_scatter_mismatch(torch.tensor([[3.0], [2.0], [5.0]]), (y, rows, 3), {})
    assert "(3, 1)" in repeated_scatter_mismatch(torch.zeros(3, 2), (y, rows, 3), {})
    count = {"count": torch.tensor([2], dtype=torch.int32)}
    assert repeated_scatter_mismatch(torch.tensor([[0.0], [2.0], [0.0]]), (y, rows, 3), count) is None
    assert "row 0: no row of y" in repeated_scatter_mismatch(torch.tensor([[3.0], [2.0], [0.0]]), (y, rows, 3), count)
    # a sub-batch's padding past its count repeats row 0 unwritten: compared with the reference exactly
    assert not scatter_repeats((y, torch.tensor([0, 1, 0, 0]), 3), {"count": torch.tensor([2])})
    assert not scatter_repeats((y, rows, 3), {"count": torch.tensor([1], dtype=torch.int64)})


@pytest.mark.parametrize("op", CHECKED)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), poison=st.integers(0, 3), edge=st.sampled_from(EDGES),
       with_out=st.booleans())
def test_self_checked_kernel_agrees_with_the_validator(op, seed, poison, edge, with_out):
    agrees(op, *_poisoned_call(op, seed, poison, edge, with_out))


@pytest.mark.gpu
@pytest.mark.parametrize("op", CHECKED)
def test_self_checked_kernel_agrees_with_the_validator_on_gpu(op):
    """The same on the GPU (the verdict a pinned host word on CUDA), 200 calls in a row on one
    thread's word, then on a second stream: both verdicts seen."""
    seen = []
    for i in range(200):
        seen.append(agrees(op, *_poisoned_call(op, i, i % 4, EDGES[i % len(EDGES)], i % 2 == 0, "cuda")))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(20):
            seen.append(agrees(op, *_poisoned_call(op, 1000 + i, i % 2, -1, False, "cuda")))
    torch.cuda.synchronize()
    assert "bad" in seen and "good" in seen


def _backend():
    return sb.select("cpu", prefer="triton")


def _launches(op: str) -> int:
    """Launches so far of the kernels that test the op's values (its own checked kernels)."""
    module, _, fn = SELF_CHECKED[op].partition(":")
    return sum(k.launches for name, k in _launch.KERNELS.items()
               if name.startswith(f"{module}.") and name.endswith("_checked"))


@pytest.mark.parametrize("op", CHECKED)
def test_dispatch_takes_the_self_checked_path_for_plain_validated_calls(op):
    be = _backend()
    rng = np.random.default_rng(7)
    args, kwargs = case_for(op, rng, "cpu")
    n = _launches(op)
    got = getattr(be, op)(*args, **kwargs)
    assert _launches(op) == n + 1, "a validated call of plain tensors runs the kernel that checks itself"
    assert mismatch(op, got, OPS[op].reference(*args, **kwargs)) is None
    with sb.validation(False):
        getattr(be, op)(*args, **kwargs)
    assert _launches(op) == n + 1, "an unvalidated call runs the plain kernel"
    unchecked = sb.select("cpu", prefer="triton", checked=False)
    getattr(unchecked, op)(*args, **kwargs)
    assert _launches(op) == n + 1, "a backend that never validates runs the plain kernel"


def test_batch_replay_start_errors_are_the_validators_and_nothing_is_written():
    be = _backend()
    R = torch.tensor([5, 7, 9], dtype=torch.int32)
    pre = torch.tensor([True, False, True])
    out = torch.full((3,), -7, dtype=torch.int32)
    n = _launches("batch_replay_start")
    for idx, R_bad, message in (
        (torch.tensor([2, 0, 3], dtype=torch.int32), R, "idx_mapping=3: expected values in [0, 3)"),
        (torch.tensor([2, 0, -1], dtype=torch.int64), R, "idx_mapping=-1: expected values in [0, 3)"),
        (torch.tensor([2, 0, 1], dtype=torch.int32), torch.tensor([5, MAX_POSITION + 1, 9], dtype=torch.int64),
         f"R_per_request={MAX_POSITION + 1}: expected values in [0, {MAX_POSITION + 1})"),
    ):
        with pytest.raises(ValueError) as err:
            be.batch_replay_start(R_bad, idx, pre, out=out)
        assert str(err.value) == f"batch_replay_start: {message}"
        assert torch.equal(out, torch.full((3,), -7, dtype=torch.int32))
    assert _launches("batch_replay_start") == n + 3, "each refused call ran the checking kernel, then the validator"
    # a strided view: the quick check cannot tell, the validator runs and the plain kernel computes
    idx = torch.tensor([2, 9, 0, 9, 1, 9], dtype=torch.int32)[::2]
    got = be.batch_replay_start(R, idx, pre)
    assert _launches("batch_replay_start") == n + 3 and got.tolist() == [9, 0, 7]
    with pytest.raises(ValueError, match=r"idx_mapping=9: expected values in \[0, 3\)"):
        be.batch_replay_start(R, torch.tensor([2, 9, 9, 9, 1, 9], dtype=torch.int32)[1::2], pre)
    # an out= that aliases an input: the quick check refuses it, the validator names it
    shared = torch.tensor([2, 0, 1, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match="shares no memory with the input 'idx_mapping'"):
        be.batch_replay_start(R, shared[:3], pre, out=shared[1:])


def test_batch_replay_start_checked_declines_what_it_does_not_take():
    from swa_backends.kernels import batch_replay_start as k

    R = torch.zeros(k.CHECKED_MAX, dtype=torch.int32)
    none, one = torch.zeros(0, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    assert k.batch_replay_start_checked(None, R, none, torch.zeros(0, dtype=torch.bool)) is None
    assert k.batch_replay_start_checked(None, R, one, torch.ones(1, dtype=torch.bool)) is None
    be = _backend()
    got = be.batch_replay_start(R, torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.bool))
    assert got.tolist() == [0]  # validated on the host, computed by the plain kernel


def test_a_verdict_word_left_unset_is_an_error_not_a_pass():
    from swa_backends.kernels._verdict import FAIL, PASS, open_verdict

    v = open_verdict(torch.device("cpu"))
    with pytest.raises(RuntimeError, match="left no verdict"):
        v.failed()
    v.word.fill_(PASS)
    assert not v.failed()
    v.word.fill_(FAIL)
    assert v.failed()


@pytest.mark.gpu
def test_a_verdict_left_unread_makes_the_next_call_wait_for_the_device_on_gpu(monkeypatch):
    """A call that stops between its launch and its wait (an exception, an interrupt) leaves its
    mapped word unread, and its kernel may still be queued: the next call on that word waits for
    the device before it zeroes the word, so the old kernel's verdict cannot land in the new call's."""
    from swa_backends.kernels import pad_replayed_slots as k

    dev = torch.device("cuda", torch.cuda.current_device())
    syncs = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: (syncs.append(d), real(d))[1])
    T = 64
    slots = torch.zeros(2, T, dtype=torch.int64, device=dev)
    call = (slots, torch.tensor([0], dtype=torch.int32, device=dev), torch.tensor([0, T], dtype=torch.int32, device=dev),
            torch.arange(T, device=dev), torch.tensor([8], dtype=torch.int32, device=dev), 16)
    torch.cuda._sleep(10**8)  # the device busy: the first call's kernel still queued when it "stops"
    _, first = k.pad_replayed_slots_checked(dev, *call)
    assert first.unread and not syncs
    _, again = k.pad_replayed_slots_checked(dev, *call)  # the next call on the word waits first
    assert again is first and syncs == [dev]
    assert not again.failed() and not again.unread
    _, third = k.pad_replayed_slots_checked(dev, *call)  # a word read: no wait
    assert not third.failed() and syncs == [dev]


@pytest.mark.gpu
def test_the_capture_query_on_gpu():
    """What a validated call asks before its self-checked form (``dispatch.capture_query``): False
    on the default stream (CUDA never captures it; answered from the stream's handle alone) and on a
    side stream that is not capturing, True inside a capture. Its handle is the current device's
    current stream."""
    be = sb.select("cuda")
    capturing = dispatch.capture_query(be.device)
    assert torch._C._cuda_getCurrentRawStream(-1) == torch.cuda.current_stream().cuda_stream == 0
    assert capturing() is False
    side = torch.cuda.Stream()
    seen = []
    with torch.cuda.stream(side):
        assert torch._C._cuda_getCurrentRawStream(-1) == side.cuda_stream != 0
        seen.append(capturing())
    graph = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device="cuda")
    with torch.cuda.graph(graph):
        seen.append(capturing())
        x += 1
    graph.replay()
    torch.cuda.synchronize()
    assert seen == [False, True] and x.tolist() == [1.0] * 4


def test_explain_names_every_self_checked_form():
    """The one dispatch, shown completely: each variant with a self-checked form says so, with the
    form's path, on a device whose backend takes it (CUDA) and on one emulated (ROCm), but for an
    op whose platform has an input check of its own (ROCm's gather_rows / scatter_rows: their
    validated calls take the validator, and the explanation does not name the form)."""
    from swa_backends.dispatch import platform_input_check

    own_checks = set()
    for device in ("cuda:sm90", "rocm:gfx942"):
        text = str(sb.explain(device)).replace("\n", "").replace(" ", "")
        for op, path in SELF_CHECKED.items():
            named = f"swa_backends.kernels.{path}" in text
            if platform_input_check(device.split(":")[0], op) is None:
                assert named, (device, op)
            else:
                assert not named, (device, op)
                own_checks.add((device, op))
    assert own_checks == {("rocm:gfx942", "gather_rows"), ("rocm:gfx942", "scatter_rows")}


# --- dispatch's handling of a self-checked form, with toy forms (any op, any platform) -----------

from swa_backends import dispatch  # noqa: E402
from swa_backends.common.registry import Variant  # noqa: E402

SEEN: list = []


class _Word:
    def __init__(self, failed: bool):
        self._failed = failed

    def failed(self) -> bool:
        return self._failed


def toy_plain(R_per_request, idx_mapping, is_prefilling, *, out=None):
    SEEN.append("plain")
    return OPS["batch_replay_start"].reference(R_per_request, idx_mapping, is_prefilling, out=out)


def toy_declines(home, *args, **kwargs):
    SEEN.append("declines")


def toy_fails(home, *args, **kwargs):
    SEEN.append("fails")
    return None, _Word(True)


def toy_passes(home, *args, **kwargs):
    if not OPS["batch_replay_start"].quick_check(*args, **kwargs):
        return None  # a form screens its own call (Variant.self_checked)
    SEEN.append("passes")
    return "the form's result", _Word(False)


def _toy_backend(form: str, checked: bool = True):
    b = sb.select("cpu")
    chains = dict(b._chains)
    chains["batch_replay_start"] = (Variant(op="batch_replay_start", name="toy", impl=f"{__name__}:toy_plain",
                                            platforms=("cpu",), self_checked=f"{__name__}:{form}"),)
    return dispatch.Backend(b.device, chains, b.capabilities, b._explanation, checked=checked)


def _brs_call(idx=(2, 0)):
    return (torch.tensor([5, 7, 9], dtype=torch.int32), torch.tensor(idx, dtype=torch.int32),
            torch.tensor([True, False]))


def test_dispatch_returns_a_passing_forms_result_and_runs_nothing_else():
    SEEN.clear()
    assert _toy_backend("toy_passes").batch_replay_start(*_brs_call()) == "the form's result"
    assert SEEN == ["passes"]


def test_a_declining_form_leaves_the_call_to_the_validator_and_the_plain_variant():
    SEEN.clear()
    got = _toy_backend("toy_declines").batch_replay_start(*_brs_call())
    assert got.tolist() == [9, 0] and SEEN == ["declines", "plain"]
    SEEN.clear()
    with pytest.raises(ValueError, match=r"batch_replay_start: idx_mapping=3: expected values in \[0, 3\)"):
        _toy_backend("toy_declines").batch_replay_start(*_brs_call((3, 0)))
    assert SEEN == ["declines"]  # the validator refused: the plain variant never ran


def test_a_failing_form_raises_the_validators_error_or_says_the_input_changed():
    SEEN.clear()
    with pytest.raises(ValueError, match=r"batch_replay_start: idx_mapping=3: expected values in \[0, 3\)"):
        _toy_backend("toy_fails").batch_replay_start(*_brs_call((3, 0)))
    # a device verdict the validator then contradicts: never a silent result
    with pytest.raises(ValueError, match="a value check on the device failed and the same check on the host passed"):
        _toy_backend("toy_fails").batch_replay_start(*_brs_call())
    assert SEEN == ["fails", "fails"]


def test_no_form_when_validation_is_off_the_backend_never_validates_or_the_quick_check_cannot_tell():
    """Validation off, a backend that never validates, a graph capture: the form is never called;
    a call its quick check cannot pass (a view): the form declines it."""
    SEEN.clear()
    with sb.validation(False):
        _toy_backend("toy_passes").batch_replay_start(*_brs_call())
    _toy_backend("toy_passes", checked=False).batch_replay_start(*_brs_call())
    R, idx, pre = _brs_call()
    _toy_backend("toy_passes").batch_replay_start(R, torch.tensor([2, 9, 0], dtype=torch.int32)[::2], pre)  # a view
    with one_read():  # as under a graph capture: no value is read, nothing waited for
        validation._state.capturing = True
        _toy_backend("toy_passes").batch_replay_start(*_brs_call())
    assert SEEN == ["plain", "plain", "plain", "plain"]


def test_the_seeds_corners_through_the_self_checked_path():
    """Batches with every corner the seeds name -- speculative decodes (q 2-4), a prefill restarted in
    place (its replay start stale), graph-capture dummies (a block-table row all the null block),
    graph-padded token columns -- through every self-checked op validated: the kernel that checks
    itself runs and its result is the reference's, as the unvalidated call's is."""
    from swa_backends.common.ops._steps import random_batch

    be, seen, taken = _backend(), set(), 0
    for seed in range(10):
        rng = np.random.default_rng([seed, 4])
        b = random_batch(rng, max_reqs=24, max_q=48)
        prefix = b.seq - b.q
        seen |= {"spec"} if ((~b.prefilling) & (b.q > 1)).any() else set()
        seen |= {"restarted"} if (b.prefilling & (b.R > prefix)).any() else set()
        seen |= {"dummy"} if b.B and (b.block_table == 0).all(axis=1).any() else set()
        seen |= {"padded"} if b.num_padded else set()
        for op in CHECKED:
            args, kwargs = case_for(op, rng, "cpu", batch=b, poison=False)
            ref_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            ref_kwargs = dict(kwargs)
            want = OPS[op].reference(*ref_args, **ref_kwargs)
            n = _launches(op)
            with sb.validation(False):
                off = getattr(be, op)(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
            got = getattr(be, op)(*args, **kwargs)
            taken += _launches(op) > n
            assert mismatch(op, got, want) is None and mismatch(op, off, want) is None, (seed, op)
    assert seen == {"spec", "restarted", "dummy", "padded"}, seen
    assert taken >= 8 * len(CHECKED), taken  # most calls took the path (a call it declines: the validator)


@pytest.mark.gpu
def test_checker_programs_on_large_grids_on_gpu():
    """The kernels with checker programs in front of their workers (range_check.py) on grids far
    larger than the GPU holds at once, validated through dispatch, on two streams in turn: each
    result is the reference's, and a row id out of range at the very end (the last checker's
    tile) refuses the call with the validator's error and writes nothing. A worker that waited
    for a checker never scheduled would hang here."""
    be = sb.select("cuda")
    x = torch.randn(20000, 7168, device="cuda").to(torch.bfloat16)
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    for i, n in enumerate((1, 2047, 2049, 16384, 65536)):
        rows = torch.randint(0, x.shape[0], (n,), device="cuda")
        with torch.cuda.stream(streams[i % 2]):
            assert torch.equal(be.gather_rows(x, rows), x[rows])
            m = min(n, x.shape[0])
            unique = torch.randperm(x.shape[0], device="cuda")[:m]
            want = torch.zeros_like(x)
            want[unique] = x[:m]
            assert torch.equal(be.scatter_rows(x[:m], unique, x.shape[0]), want)
            out = torch.full((n, 7168), 3.0, device="cuda").to(torch.bfloat16)
            bad = rows.clone()
            bad[-1] = x.shape[0]
            with pytest.raises(ValueError, match=f"gather_rows: rows={x.shape[0]}"):
                be.gather_rows(x, bad, out=out)
            assert bool((out == 3.0).all()), "a refused call wrote"
    torch.cuda.synchronize()
    T, SW = 40000, 128
    swa = torch.randint(-1, 1000, (T, SW), dtype=torch.int32, device="cuda")
    lens = torch.randint(0, SW + 1, (T,), dtype=torch.int32, device="cuda")
    want = OPS["plain_indices"].reference(swa.cpu(), lens.cpu())
    got = be.plain_indices(swa, lens)
    assert mismatch("plain_indices", tuple(t.cpu() for t in got), want) is None
    swa[-1, -1] = -2
    with pytest.raises(ValueError, match="plain_indices: swa_indices"):
        be.plain_indices(swa, lens)


@pytest.mark.gpu
def test_mixed_indices_on_a_grid_larger_than_the_gpu_holds_on_gpu():
    """``mixed_indices`` validated through dispatch at 16K tokens of 640 indices (its checker
    programs capped, ``range_check.MAX_CHECKERS``, each taking several tiles) and at 1000: the
    reference's result, and a bad value in the last checker's tile refuses the call and writes
    nothing."""
    be = sb.select("cuda")
    for T in (16384, 1000):
        swa = torch.randint(-1, 1000, (T, 128), dtype=torch.int32, device="cuda")
        topk = torch.randint(-1, 1000, (T, 512), dtype=torch.int32, device="cuda")
        tlens = torch.randint(0, 513, (T,), dtype=torch.int32, device="cuda")
        want = OPS["mixed_indices"].reference(swa.cpu(), topk.cpu(), tlens.cpu())
        got = be.mixed_indices(swa, topk, tlens)
        assert mismatch("mixed_indices", tuple(t.cpu() for t in got), want) is None, T
        out = (torch.full((T, 640), 7, dtype=torch.int32, device="cuda"),
               torch.full((T,), 7, dtype=torch.int32, device="cuda"))
        topk[-1, -1] = -2
        with pytest.raises(ValueError, match="mixed_indices: topk_slots"):
            be.mixed_indices(swa, topk, tlens, out=out)
        assert bool((out[0] == 7).all()) and bool((out[1] == 7).all()), f"T {T}: a refused call wrote"


@pytest.mark.parametrize("wide", [False, True])
def test_plain_indices_checkers_read_rows_sliced_from_wider_buffers(wide):
    """The checker programs tile index rows as one run when they are one (as allocated) and row by
    row when they are a slice of a wider buffer (``rows_bad``'s two paths): a value out of range in
    the last row's last column, or just past the slice (read by neither), decides the verdict."""
    T, SW, K = 50, 9, 300  # top-k rows wider than one tile: two column tiles per row
    rng = np.random.default_rng(5)

    def rows_of(width, high):
        full = torch.tensor(rng.integers(-1, high, size=(T, width + (7 if wide else 0))), dtype=torch.int32)
        return full, full[:, :width]

    swa_full, swa = rows_of(SW, 1000)
    topk_full, topk = rows_of(K, 1000)
    lens = torch.tensor(rng.integers(0, SW + 1, size=T), dtype=torch.int32)
    tlens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=torch.int32)
    args = (swa, lens, topk, tlens)
    assert agrees("plain_indices", args, {}) == "good"
    if wide:  # past the slice: not the op's, not read
        topk_full[-1, -1] = -5
        swa_full[-1, -1] = -5
        assert agrees("plain_indices", args, {}) == "good"
    topk[-1, -1] = -5
    assert agrees("plain_indices", args, {}) == "bad"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_bad_value_in_any_checkers_share_fails_the_call(device):
    """The checker programs settle with one atomic add each, a failure counted above the count
    (``range_check.settle``): whichever checker counts last reads every other's outcome from the
    add. A bad value in each checker's share in turn (five checkers of 4096 index values, the
    interpreter running them in order: the one that fails is never the last but once) refuses
    the call and writes nothing; the clean call passes."""
    from swa_backends.kernels import range_check

    T, SW = 160, 128
    share = range_check.BLOCK_R * range_check.BLOCK_C
    assert range_check.checkers(range_check.tiles_of(T, SW, SW, 1)) == T * SW // share == 5
    rng = np.random.default_rng(11)
    swa = torch.tensor(rng.integers(-1, 1000, size=(T, SW)), dtype=torch.int32, device=device)
    lens = torch.tensor(rng.integers(0, SW + 1, size=T), dtype=torch.int32, device=device)
    assert agrees("plain_indices", (swa, lens), {}) == "good"
    for k in range(5):
        bad = swa.clone()
        bad.view(-1)[k * share + int(rng.integers(share))] = -7
        assert agrees("plain_indices", (bad, lens), {}) == "bad", f"a bad value in checker {k}'s share passed"


@pytest.mark.parametrize("cap", [None, 5])
def test_plain_indices_checks_each_tensor_with_checkers_of_its_own(monkeypatch, cap):
    """``plain_indices``' checkers are grouped by tensor (``range_check.groups``: the window
    lengths, the window rows, the top-k lengths, the top-k rows, each tile its own checker where
    they fit, else shares in proportion, ``cap``): a bad value in any tile of any of the four
    tensors refuses the call and writes nothing, in the first and the last checker of each group;
    the clean call passes, with and without top-k rows."""
    from swa_backends.kernels import range_check

    if cap is not None:
        monkeypatch.setattr(range_check, "MAX_CHECKERS", cap)
    T, SW, K = 2 * range_check.CHECK + 5, 4, 3  # three tiles of each length tensor
    share = range_check.BLOCK_R * range_check.BLOCK_C
    tiles = (3, -(-T * SW // share), 3, -(-T * K // share))
    assert tiles == (3, 5, 3, 4)
    want = tiles if cap is None else (1, 1, 1, 1)
    assert range_check.groups(tiles) == want
    assert range_check.groups((3, 3, 0, 0)) == ((3, 3, 0, 0) if cap is None else (2, 2, 0, 0))
    rng = np.random.default_rng(13)
    swa = torch.tensor(rng.integers(-1, 1000, size=(T, SW)), dtype=torch.int32)
    lens = torch.tensor(rng.integers(0, SW + 1, size=T), dtype=torch.int32)
    topk = torch.tensor(rng.integers(-1, 1000, size=(T, K)), dtype=torch.int32)
    tlens = torch.tensor(rng.integers(0, K + 1, size=T), dtype=torch.int32)
    args = (swa, lens, topk, tlens)
    assert agrees("plain_indices", args, {}) == "good"
    assert agrees("plain_indices", (swa, lens), {}) == "good"
    bads = {0: -7, 1: SW + 1, 2: -7, 3: K + 1}
    for which, tensor in enumerate(args):
        flat = tensor.view(-1)
        per = range_check.CHECK if tensor.ndim == 1 else share
        for tile in (0, -(-flat.numel() // per) - 1):  # the group's first tile and its last
            bad = [a.clone() for a in args]
            bad[which].view(-1)[min(tile * per + int(rng.integers(per)), flat.numel() - 1)] = bads[which]
            assert agrees("plain_indices", tuple(bad), {}) == "bad", f"a bad value in tensor {which}, tile {tile}"
            if which < 2:
                assert agrees("plain_indices", tuple(bad[:2]), {}) == "bad"


def test_the_count_word_holds_every_checker_and_failure():
    """``settle``'s count word: every checker count below ``FAILED`` (its failures counted above),
    the largest sum an int32."""
    from swa_backends.kernels import range_check

    failed = range_check.FAILED.value if hasattr(range_check.FAILED, "value") else range_check.FAILED
    assert range_check.checkers(10**9) == range_check.MAX_CHECKERS < failed
    assert range_check.MAX_CHECKERS * (failed + 1) < 2**31
