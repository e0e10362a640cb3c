"""A validated ``sparse_mla`` call picked for a gated variant does not wait for its value checks:
they run as one device pass (``kernels/sparse_mla_check.py``), the variant is launched behind
them gated on their flag, and only then does the host wait (for the check, not the kernel).

Here, on the CPU (the check kernel in Triton's interpreter): the device check agrees with the
validator's value checks on random and poisoned inputs; dispatch's gated path gives the
validated path's results and its exact ``ValueError`` text, reads no value on the host for a
valid call, launches nothing gated for a call whose host checks fail, and runs the next variant
(checked first) when the gated one cannot build. The Hopper kernel's gate (``gluon_ws``) is
compiled offline by the compile stage and run on the H200 by ``test_sparse_mla_gluon_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swa_backends as sb
from swa_backends import dispatch
from swa_backends.common import validation
from swa_backends.common.errors import KernelUnavailable
from swa_backends.common.ops import OPS
from swa_backends.common.ops import sparse_mla as op
from swa_backends.common.registry import Variant

pytest.importorskip("triton")
from swa_backends.kernels import sparse_mla_check  # noqa: E402

ME = __name__
SEEN: list = []  # (variant, gate flag at launch)


def toy_gated(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None, return_lse=True,
              gate=None):
    """A gated variant as the Hopper kernel is one: reads the flag first; set, it computes
    nothing (reads no index); clear, the reference's result."""
    flag = None if gate is None else int(gate.item())
    SEEN.append(("toy_gated", flag))
    if flag:
        T, H, _ = q.shape
        return torch.full((T, H, d_v), float("nan"), dtype=q.dtype), None
    return op.reference(q, kv, indices, lens, sm_scale, d_v, sink=sink, return_lse=return_lse)


def toy_unbuildable(*args, gate=None, **kwargs):
    SEEN.append(("toy_unbuildable", None))
    raise KernelUnavailable("does not compile here (a test)", whole_variant=False)


GATED = Variant(op="sparse_mla", name="toy_gated", impl=f"{ME}:toy_gated", platforms=("cpu",), gated=True)
UNBUILDABLE = Variant(op="sparse_mla", name="toy_unbuildable", impl=f"{ME}:toy_unbuildable", platforms=("cpu",),
                      gated=True)


def backend(*chain, checked=True):
    b = sb.select("cpu")
    chains = dict(b._chains)
    chains["sparse_mla"] = (*chain, OPS["sparse_mla"].reference_variant)
    return dispatch.Backend(b.device, chains, b.capabilities, b._explanation, checked=checked)


def call(T=5, H=4, D=16, S=40, K=24, sink=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, D, generator=g).to(torch.bfloat16)
    kv = torch.randn(S, D, generator=g).to(torch.bfloat16)
    idx = torch.randint(-1, S, (T, K), generator=g, dtype=torch.int32)
    lens = torch.randint(0, K + 1, (T,), generator=g, dtype=torch.int32)
    s = torch.randn(H, generator=g) if sink else None
    return (q, kv, idx, lens, 0.25, D), {"sink": s}


def host_error(args, kwargs) -> str | None:
    """The validated default path's error (reference only: the host read)."""
    try:
        sb.select("cpu").sparse_mla(*args, **kwargs)
    except ValueError as exc:
        return str(exc)
    return None


POISON = {
    "index past the rows": lambda a, k: a[2].__setitem__((3, 7), 40),
    "index below PAD": lambda a, k: a[2].__setitem__((0, 0), -2),
    "index int32 min": lambda a, k: a[2].__setitem__((4, 23), -2**31),
    "index past lens (still checked)": lambda a, k: (a[3].__setitem__(1, 2), a[2].__setitem__((1, 20), 99)),
    "lens above K": lambda a, k: a[3].__setitem__(2, 25),
    "lens negative": lambda a, k: a[3].__setitem__(0, -1),
    "sink NaN": lambda a, k: k["sink"].__setitem__(1, float("nan")),
    "sink +inf": lambda a, k: k["sink"].__setitem__(3, float("inf")),
}


@pytest.mark.parametrize("case", sorted(POISON))
def test_check_kernel_and_gated_dispatch_fail_as_the_host_does(case):
    args, kwargs = call()
    args = list(args)
    POISON[case](args, kwargs)
    want = host_error(args, kwargs)
    assert want is not None
    assert sparse_mla_check.gate(*args, **kwargs).failed()
    SEEN.clear()
    with pytest.raises(ValueError) as exc:
        backend(GATED).sparse_mla(*args, **kwargs)
    assert str(exc.value) == want
    assert SEEN == [("toy_gated", 1)]  # launched behind the check, which had set the flag


def test_valid_call_reads_no_value_on_the_host(monkeypatch):
    args, kwargs = call()
    kwargs["sink"][0] = float("-inf")  # allowed: a head without a sink
    reads = []
    real = validation.to_host
    monkeypatch.setattr(validation, "to_host", lambda ts: reads.append(len(ts)) or real(ts))
    SEEN.clear()
    out, lse = backend(GATED).sparse_mla(*args, **kwargs)
    assert reads == [] and SEEN == [("toy_gated", 0)]
    want_out, want_lse = op.reference(*args, **kwargs)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    # the same call on the host-read path: one read (its three checked tensors in one transfer)
    sb.select("cpu").sparse_mla(*args, **kwargs)
    assert len(reads) == 1


def test_host_checks_fail_before_any_launch():
    args, kwargs = call()
    SEEN.clear()
    with pytest.raises(ValueError, match="indices"):
        backend(GATED).sparse_mla(args[0], args[1], args[2].to(torch.int64), *args[3:], **kwargs)
    with pytest.raises(ValueError, match="sm_scale"):
        backend(GATED).sparse_mla(*args[:4], float("nan"), args[5], **kwargs)
    assert SEEN == []


def test_unbuildable_gated_variant_checks_before_the_next_one():
    args, kwargs = call()
    SEEN.clear()
    with pytest.warns(RuntimeWarning, match="cannot build this call"):
        out, _ = backend(UNBUILDABLE).sparse_mla(*args, **kwargs)
    assert torch.equal(out, op.reference(*args, **kwargs)[0]) and SEEN == [("toy_unbuildable", None)]
    args = list(args)
    args[2][0, 0] = 999
    with pytest.warns(RuntimeWarning, match="cannot build this call"):
        with pytest.raises(ValueError, match="indices") as exc:
            backend(UNBUILDABLE).sparse_mla(*args, **kwargs)
    assert str(exc.value) == host_error(args, kwargs)


def test_unchecked_and_validation_off_launch_no_check():
    args, kwargs = call()
    args = list(args)
    args[3][0] = 0
    SEEN.clear()
    backend(GATED, checked=False).sparse_mla(*args, **kwargs)
    with validation.validation(False):
        backend(GATED).sparse_mla(*args, **kwargs)
    assert SEEN == [("toy_gated", None), ("toy_gated", None)]


def test_values_on_device_skips_value_checks_only():
    args, kwargs = call()
    args = list(args)
    args[2][0, 0] = 999  # a value error: skipped inside
    with validation.values_on_device():
        OPS["sparse_mla"].validate(*args, **kwargs)
        with pytest.raises(ValueError, match="d_v"):
            OPS["sparse_mla"].validate(*args[:5], 0, **kwargs)
    with pytest.raises(ValueError, match="indices"):
        OPS["sparse_mla"].validate(*args, **kwargs)


def test_explain_shows_the_gated_variant():
    text = str(sb.explain("cuda:sm90"))
    assert "kernels.sparse_mla_check:gate" in text


@settings(max_examples=60, deadline=None)
@given(T=st.integers(0, 70), K=st.integers(0, 300), S=st.integers(1, 50), H=st.integers(1, 130),
       sink=st.booleans(), strided=st.booleans(), seed=st.integers(0, 2**31 - 1),
       poison=st.sampled_from([None, "idx_high", "idx_low", "lens_high", "lens_low", "sink_nan", "sink_inf",
                               "sink_neginf"]))
def test_check_kernel_agrees_with_the_validator(T, K, S, H, sink, strided, seed, poison):
    """Random shapes (tiles partly filled, several column tiles, more heads than a sink tile),
    strided index views, one poisoned value or none: the device flag is set exactly when the
    validator's value checks raise."""
    g = torch.Generator().manual_seed(seed)
    D = 8
    q = torch.zeros(T, H, D, dtype=torch.bfloat16)
    kv = torch.zeros(S, D, dtype=torch.bfloat16)
    base = torch.randint(-1, S, (T, 2 * K if strided else K), generator=g, dtype=torch.int32)
    idx = base[:, ::2] if strided else base
    lens = torch.randint(0, K + 1, (T,), generator=g, dtype=torch.int32)
    s = torch.randn(H, generator=g) if sink else None
    at = lambda n: int(torch.randint(0, n, (1,), generator=g)) if n else None  # noqa: E731
    if poison == "idx_high" and T and K:
        idx[at(T), at(K)] = S + at(3)
    elif poison == "idx_low" and T and K:
        idx[at(T), at(K)] = -2 - at(5)
    elif poison == "lens_high" and T:
        lens[at(T)] = K + 1
    elif poison == "lens_low" and T:
        lens[at(T)] = -1
    elif poison and poison.startswith("sink") and sink:
        s[at(H)] = {"sink_nan": float("nan"), "sink_inf": float("inf"), "sink_neginf": float("-inf")}[poison]
    try:
        op.validate(q, kv, idx, lens, 0.5, D, sink=s)
        want = False
    except ValueError:
        want = True
    assert sparse_mla_check.gate(q, kv, idx, lens, 0.5, D, sink=s).failed() == want


CHECK_HUGE = r'''
import sys, torch
sys.path.insert(0, sys.argv[1])
from huge_strides import spread
from swa_backends.kernels.sparse_mla_check import gate
from swa_backends.common.ops import sparse_mla as op

g = torch.Generator().manual_seed(3)
q, kv = torch.zeros(3, 2, 8, dtype=torch.bfloat16), torch.zeros(50, 8, dtype=torch.bfloat16)
base = torch.randint(-1, 50, (3, 5), generator=g, dtype=torch.int32)
for dim in (0, 1):  # index rows, then index columns, 2**31 elements apart
    idx, lens, sink = spread(base, dim), spread(torch.tensor([5, 0, 3], dtype=torch.int32), 0), spread(torch.randn(2), 0)
    assert not gate(q, kv, idx, lens, 0.5, 8, sink=sink).failed()
    idx[2, 4] = 50  # the far corner, past the rows
    assert gate(q, kv, idx, lens, 0.5, 8, sink=sink).failed()
    idx[2, 4] = -1
    lens[2] = 6  # the far length, past K
    assert gate(q, kv, idx, lens, 0.5, 8, sink=sink).failed()
    lens[2] = 3
    sink[1] = float("nan")
    assert gate(q, kv, idx, lens, 0.5, 8, sink=sink).failed()
print("ok")
'''


def test_check_kernel_on_huge_strides():
    """The check kernel on views whose elements lie 2**31 elements apart (its offsets are 64-bit;
    a wrapped one would crash the worker or miss the far value)."""
    import subprocess
    import sys
    from pathlib import Path

    kernels = Path(__file__).resolve().parents[1] / "kernels"
    out = subprocess.run([sys.executable, "-c", CHECK_HUGE, str(kernels)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-2000:]


@pytest.mark.parametrize("checked", [True, False])
def test_gluon_ws_warmup_builds_the_gated_kernels_for_a_validating_backend(monkeypatch, checked):
    """The ws kernel's warmup hook (run on the CPU with its compile recorded, not made): a
    validating backend also gets the gated specialisations and the device check compiled (its
    validated calls launch them), an unchecked one only what serving launches."""
    pytest.importorskip("triton.experimental.gluon")
    from types import SimpleNamespace

    from swa_backends.kernels import _launch, sparse_mla_gluon_ws as ws

    if ws.api_reason():
        pytest.skip(ws.api_reason())
    built = []
    monkeypatch.setattr(ws._shared, "build", lambda name, kernel, meta, *a: built.append(meta))
    backend = SimpleNamespace(
        checked=checked, variants={"sparse_mla": ("gluon_ws", "reference")},
        device=SimpleNamespace(runnable=True, torch_device="cpu"),
        variant_for=lambda op, *a, **k: "gluon_ws")
    checks = ("sparse_mla_check._sparse_mla_check", "sparse_mla_check._sparse_mla_check_flat")
    before = {k: _launch.KERNELS[k].launches for k in checks}
    assert ws.warmup(backend, num_heads=(64,), attn_sink=(False, True)) == ["sparse_mla"]
    gated = sorted((m["HAS_SINK"], m["WIDE"]) for m in built if m["GATED"])
    plain = sorted((m["HAS_SINK"], m["WIDE"]) for m in built if not m["GATED"])
    every = [(False, False), (False, True), (True, False), (True, True)]
    assert plain == every and gated == (every if checked else [])
    for k in checks:  # each form once per sink setting
        assert _launch.KERNELS[k].launches - before[k] == (2 if checked else 0), k


def toy_plain(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None, return_lse=True):
    SEEN.append(("toy_plain", None))
    return op.reference(q, kv, indices, lens, sm_scale, d_v, sink=sink, return_lse=return_lse)


PLAIN = Variant(op="sparse_mla", name="toy_plain", impl=f"{ME}:toy_plain", platforms=("cpu",))


def test_ungated_pick_in_a_gated_chain_checks_once(monkeypatch):
    """A chain with a gated variant whose pick for this call is not gated (sm90's decode-sized
    calls): the host checks run once, the held value checks are read once, errors as ever."""
    args, kwargs = call()
    shapes, reads = [], []
    real_check, real_read = op.check_tensor, validation.to_host
    monkeypatch.setattr(op, "check_tensor", lambda *a, **k: shapes.append(a[1]) or real_check(*a, **k))
    monkeypatch.setattr(validation, "to_host", lambda ts: reads.append(len(ts)) or real_read(ts))
    SEEN.clear()
    out, _ = backend(PLAIN, GATED).sparse_mla(*args, **kwargs)
    assert torch.equal(out, op.reference(*args, **kwargs)[0]) and SEEN == [("toy_plain", None)]
    assert sorted(shapes) == ["indices", "kv", "lens", "q", "sink"] and len(reads) == 1
    args = list(args)
    args[3][4] = -3
    with pytest.raises(ValueError) as exc:
        backend(PLAIN, GATED).sparse_mla(*args, **kwargs)
    assert str(exc.value) == host_error(args, kwargs) and SEEN == [("toy_plain", None)]


def test_held_checks_keep_their_label():
    """A held value check run later raises under the op name its validator ran under."""
    t = torch.tensor([5], dtype=torch.int32)
    with validation.labelled("prepare_replay_step", ("swa_indices_and_lens",)):
        with validation.values_on_device() as held:
            validation.check_range("swa_indices_and_lens", "R", t, low=0, high=3)
    with pytest.raises(ValueError, match=r"^prepare_replay_step: R=5"):
        validation.run_held(held)


@pytest.mark.parametrize("K", [0, 1, 3])
@pytest.mark.parametrize("offset", [0, 1])
def test_flat_check_reads_every_length_and_entry(K, offset):
    """A contiguous index tensor is read flat (``sparse_mla_check.flat``), a program's span of the
    entries and of the lengths alike: with more tokens than a program's span, a bad value in the
    last length or the last entry is found, whatever K (0: no entry, the lengths alone), from a
    16-byte aligned base or not (``offset``: one entry into its storage)."""
    T, S, D = 2 * sparse_mla_check.BLOCK + 5, 40, 8
    q, kv = torch.zeros(T, 1, D, dtype=torch.bfloat16), torch.zeros(S, D, dtype=torch.bfloat16)
    idx = torch.randint(-1, S, (T * K + offset,), dtype=torch.int32)[offset:].view(T, K)
    lens = torch.randint(0, K + 1, (T,), dtype=torch.int32)
    assert sparse_mla_check.flat(idx)
    assert not sparse_mla_check.gate(q, kv, idx, lens, 0.5, D).failed()
    lens[T - 1] = K + 1
    assert sparse_mla_check.gate(q, kv, idx, lens, 0.5, D).failed()
    lens[T - 1] = K
    if K:
        idx[T - 1, K - 1] = S
        assert sparse_mla_check.gate(q, kv, idx, lens, 0.5, D).failed()


def test_flat_is_for_contiguous_runs_an_i32_can_count():
    assert not sparse_mla_check.flat(torch.zeros(4, 6, dtype=torch.int32)[:, ::2])
    assert not sparse_mla_check.flat(torch.empty(2**16, 2**16, dtype=torch.int32, device="meta"))
    assert sparse_mla_check.flat(torch.empty(2**15, 2**15, dtype=torch.int32, device="meta"))
