"""A validated call on an accelerator's backend takes tensors on that device only.

The validator compares every tensor of a call with one of the call's (``check_tensor(device=...)``);
dispatch compares that one (``OpSpec.anchor``) with the backend's device first. Without it a CUDA
backend handed host tensors throughout would pass validation (they agree with each other) and
launch its kernels on host addresses: memory outside their tensors.

On the CPU the backend's device is a runnable stand-in (``meta``: no host tensor is on it); the
``gpu`` test hands every op's host tensors to the real CUDA backend.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import swa_backends as sb
from swa_backends.common import validation
from swa_backends.common.device import parse_device, resolve_device
from swa_backends.common.ops import OPS
from swa_backends.dispatch import home_device
from swa_backends.testing.conformance import case_for, mismatch, to_device

OPS_SORTED = sorted(OPS)


def _snapshot(args, kwargs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(t, t.clone()) for _, t in validation._tensors("call", (args, kwargs))]  # (validation's own walk)


def _refused_unwritten(be, op: str, args, kwargs) -> None:
    before = _snapshot(args, kwargs)
    with pytest.raises(ValueError) as err:
        getattr(be, op)(*args, **kwargs)
    text = str(err.value)
    assert text.startswith(f"{op}: {OPS[op].anchor}=") and "the backend's device" in text, text
    assert all(torch.equal(t, was) for t, was in before), f"{op} wrote into a refused call's tensors"


def test_home_device_is_a_real_accelerators():
    fake = parse_device("cuda:sm90")
    assert home_device(fake) is None  # the CPU suite's fake accelerators run host tensors
    assert home_device(resolve_device("cpu")) is None
    real = dataclasses.replace(fake, fake=False, torch_device="cuda:0")
    assert home_device(real) == torch.device("cuda:0")


def test_every_anchor_is_a_required_tensor_argument():
    for op, spec in OPS.items():
        pos, name = spec.anchor_at
        params = list(spec.signature.parameters.values())
        assert params[pos].name == name and params[pos].default is params[pos].empty, op
        assert spec.scalar_type(name) == "Tensor", op
    assert OPS["gather_replay_batch"].anchor == "query_start_loc"  # (its first argument is the plan)


@pytest.mark.parametrize("op", OPS_SORTED)
def test_validated_call_refuses_tensors_off_the_backends_device(op):
    # a runnable stand-in accelerator whose device no host tensor is on; the reference serves every op
    info = dataclasses.replace(parse_device("cuda:sm90"), fake=False, torch_device="meta")
    be = sb.select(info, prefer="reference")
    rng = np.random.default_rng(OPS_SORTED.index(op))
    args, kwargs = case_for(op, rng, "cpu", poison=True)
    _refused_unwritten(be, op, args, kwargs)
    named = OPS[op].signature.bind(*args, **kwargs).arguments  # every argument by name: the anchor too
    _refused_unwritten(be, op, (), dict(named))
    with sb.validation(False):  # validation off: the caller vouches for the devices (the reference runs)
        args, kwargs = case_for(op, np.random.default_rng(1), "cpu")
        getattr(be, op)(*args, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS_SORTED)
def test_cuda_backend_refuses_host_tensors(op):
    be = sb.select("cuda")
    rng = np.random.default_rng(100 + OPS_SORTED.index(op))
    args, kwargs = case_for(op, rng, "cpu", poison=True)
    _refused_unwritten(be, op, args, kwargs)
    torch.cuda.synchronize()  # nothing launched on host addresses: the device still works
    args, kwargs = case_for(op, np.random.default_rng(7), "cuda")
    getattr(be, op)(*args, **kwargs)
    torch.cuda.synchronize()


def test_explain_shows_where_validated_calls_want_their_tensors():
    real = sb.explain(dataclasses.replace(parse_device("cuda:sm90"), fake=False, torch_device="cuda:0"))
    assert real.home == "cuda:0" and real.as_dict()["home"] == "cuda:0"
    assert "tensors on: cuda:0" in str(real)
    fake = sb.explain("cuda:sm90")
    assert fake.home is None and "tensors on: any one device" in str(fake)


@pytest.mark.parametrize("device", ["cpu", "cuda:sm90", "rocm:gfx942", "meta"])
def test_a_backends_explanation_is_explains(device):
    # select(d).explain() is the whole decision explain(d) shows, the device validated calls want included
    info = (dataclasses.replace(parse_device("cuda:sm90"), fake=False, torch_device="meta") if device == "meta"
            else device)
    be = sb.select(info)
    assert be.explain().as_dict() == sb.explain(info).as_dict()
    assert str(be.explain()) == str(sb.explain(info))
    if device == "meta":
        assert be.explain().home == "meta" and "tensors on: meta" in str(be.explain())


class _CurrentDevice:
    """A stand-in for ``torch.cuda.device`` over a fake current-device index (no GPU needed)."""

    def __init__(self, state: dict, index: int):
        self.state, self.index = state, index

    def __enter__(self):
        self.state["entered"].append(self.index)
        self.before, self.state["current"] = self.state["current"], self.index

    def __exit__(self, *exc):
        self.state["current"] = self.before


@pytest.mark.parametrize("chain", ["direct", "per-call pick"])
def test_a_validated_call_runs_with_the_backends_gpu_current(monkeypatch, chain):
    """Triton launches on the thread's current CUDA device, not on its tensors': a validated call on
    a backend of one GPU, from a thread whose current device is another, runs with the backend's
    current (``dispatch._device_switch``; torch's ops and FlashMLA follow their tensors the same
    way), and gives the same result. With the backend's GPU current nothing is switched; with
    validation off the caller keeps it current (README's contract). Two GPUs stand in here: the
    switch's reader and ``torch.cuda.device`` are fakes over one index; the GPU test below runs the
    real thing where a machine has two."""
    from swa_backends import dispatch

    state = {"current": 0, "entered": []}
    monkeypatch.setattr(dispatch, "_device_switch", lambda home: (lambda: state["current"], 1))
    monkeypatch.setattr(torch.cuda, "device", lambda index: _CurrentDevice(state, index))
    b = sb.select("cpu")
    chains = dict(b._chains)
    op = "batch_replay_start"
    if chain != "direct":  # two variants: the per-call pick's path
        chains[op] = (chains[op][0], dataclasses.replace(chains[op][0], name="second"))
    be = dispatch.Backend(b.device, chains, b.capabilities, b._explanation)
    assert dispatch._direct(be._chains[op]) == (chain == "direct")
    args, kwargs = case_for(op, np.random.default_rng(3), "cpu", poison=False)
    want = OPS[op].reference(*args, **kwargs).clone()
    got = getattr(be, op)(*args, **kwargs)
    assert state["entered"] == [1] and state["current"] == 0 and torch.equal(got, want)
    state["current"] = 1  # the backend's GPU current: no switch
    assert torch.equal(getattr(be, op)(*args, **kwargs), want) and state["entered"] == [1]
    state["current"] = 0
    with sb.validation(False):  # validation off: the caller's current device, as it is
        assert torch.equal(getattr(be, op)(*args, **kwargs), want) and state["entered"] == [1]


WARMED: list = []


def _record_warmup(backend, **kwargs):
    WARMED.append(kwargs["state"]["current"])


def test_warmup_runs_with_the_backends_gpu_current(monkeypatch):
    """``Backend.warmup`` compiles what the serving path launches, for the current device (Triton's):
    it runs with the backend's GPU current, whatever the thread's (fakes over one index, as above)."""
    from swa_backends import dispatch

    state = {"current": 0, "entered": []}
    monkeypatch.setattr(torch.cuda, "device", lambda index: _CurrentDevice(state, index))
    monkeypatch.setattr(dispatch, "home_device", lambda device: torch.device("cuda", 1))
    b = sb.select("cpu")
    op = "batch_replay_start"
    chains = dict(b._chains)
    chains[op] = (dataclasses.replace(chains[op][0], warmup=f"{__name__}:_record_warmup"),)
    be = dispatch.Backend(b.device, chains, b.capabilities, b._explanation, checked=False)
    WARMED.clear()
    assert be.warmup(ops=(op,), state=state) == [f"{__name__}:_record_warmup"]
    assert WARMED == [1] and state["entered"] == [1] and state["current"] == 0


@pytest.mark.gpu
def test_a_validated_call_on_the_second_gpu_from_the_first_on_gpu():
    """The real corner (needs a machine with two GPUs): a ``select("cuda:1")`` backend called from a
    thread whose current device is cuda:0 gives the reference's results for every op's case, and
    cuda:0 is current again after the call."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    be = sb.select("cuda:1")
    ref = sb.select("cpu")
    torch.cuda.set_device(0)
    for op in OPS_SORTED:
        args, kwargs = case_for(op, np.random.default_rng(11), "cpu", poison=False)
        on_gpu = to_device((args, kwargs), "cuda:1")  # (the same values, drawn once: ops may write in place)
        want = getattr(ref, op)(*args, **kwargs)
        got = getattr(be, op)(*on_gpu[0], **on_gpu[1])
        torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0, op
        assert mismatch(op, got, want) is None, op
