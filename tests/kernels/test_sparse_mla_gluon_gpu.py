"""The Gluon (Hopper) sparse-MLA kernels -- variants ``gluon_ws`` and ``gluon`` -- on an sm90 GPU
(``-m gpu``), against the fp32 torch reference: random data (never zeros), PAD holes inside
the length, whole PAD tiles, lens 0, short rows, odd T, H 64 / 96 / 128, with and without
sink, bf16 and fp16, poisoned outputs, both gather widths of the ws kernel, scores whose running
max moves far between tiles; and the dispatch: which calls take which kernel, what
``explain()`` says, graph capture, warmup, and a kernel that fails to build.

    python -m pytest -q -m gpu tests/kernels/test_sparse_mla_gluon_gpu.py
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

from swa_backends import KernelUnavailable, select
from swa_backends.common.device import cuda_l2_bytes
from swa_backends.testing.conformance import MOVING_MAX_PATTERNS, poisoned_allocations, sparse_mla_moving_max_case

from _sparse_mla_cases import D, cache, capture, case, check  # noqa: F401  (cache: a fixture)

pytestmark = pytest.mark.gpu
VARIANTS = ("gluon_ws", "gluon")
MODULES = {"gluon_ws": "swa_backends.kernels.sparse_mla_gluon_ws", "gluon": "swa_backends.kernels.sparse_mla_gluon"}


@pytest.fixture(scope="module")
def mods():
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("needs an sm90 (Hopper) GPU")
    return {name: importlib.import_module(path) for name, path in MODULES.items()}


def _poison(fn):
    """Run a variant with torch.empty returning NaN-poisoned buffers: unwritten outputs show
    (integer ones left alone: a validated call allocates its gate flag)."""
    with poisoned_allocations(ints=False):
        out = fn()
    torch.cuda.synchronize()
    return out


def _run(mods, which, args, kw):
    return _poison(lambda: mods[which].sparse_mla(*args, **kw))


@pytest.mark.parametrize("H", [64, 128, 96])
@pytest.mark.parametrize("K", [640, 1152, 128, 77])
@pytest.mark.parametrize("which", VARIANTS)
def test_both_kernels(mods, cache, H, K, which):
    for sink in (False, True):
        args, kw = case(cache, 300, H, K, torch.bfloat16, sink=sink, seed=H + K)
        check(_run(mods, which, args, kw), args, kw)


@pytest.mark.parametrize("H", [64, 128, 96])
@pytest.mark.parametrize("K", [640, 77])
@pytest.mark.parametrize("wide", [False, True])
def test_ws_both_gather_widths(mods, cache, monkeypatch, H, K, wide):
    """The ws kernel's two producers (128 or 256 contiguous bytes of a row per warp instruction),
    each forced on the same calls: the width changes the gathers' shape, never the result."""
    monkeypatch.setattr(mods["gluon_ws"], "wide_gathers", lambda kv: wide)
    for sink in (False, True):
        args, kw = case(cache, 300, H, K, torch.bfloat16, sink=sink, seed=H + K + wide)
        check(_run(mods, "gluon_ws", args, kw), args, kw)


@pytest.mark.parametrize("which", VARIANTS)
def test_each_launch_key_maps_to_one_compiled_kernel(mods, cache, monkeypatch, which):
    """The Gluon kernels launch through the pack's ``Kernel`` (a compiled key's launcher, no
    binding): with ``check_keys`` every launch takes Triton's path and fails if one of the pack's
    keys (the meta and ``_launch.specialization``) met two compiled kernels; index widths with
    and without 16 | K, with and without a sink, both gather widths; then the same calls through
    the compiled launchers give the same results."""
    from swa_backends.kernels import _launch

    calls = []
    for K in (640, 77, 128):
        for sink in (False, True):
            calls.append(case(cache, 300, 64, K, torch.bfloat16, sink=sink, seed=K + sink))
    widths = (False, True) if which == "gluon_ws" else (None,)
    for checked in (True, False):
        monkeypatch.setattr(_launch, "check_keys", checked)
        for wide in widths:
            if wide is not None:
                monkeypatch.setattr(mods["gluon_ws"], "wide_gathers", lambda kv, wide=wide: wide)
            for args, kw in calls:
                check(_run(mods, which, args, kw), args, kw)


def test_ws_gather_width_follows_the_cache_size(mods, cache):
    ws = mods["gluon_ws"]
    row = D * 2  # bf16 bytes per row
    fit = cuda_l2_bytes(torch.cuda.current_device()) // row  # rows that fit in L2
    assert ws.wide_gathers(cache.to(torch.bfloat16))  # 200K rows: 200 MB
    assert not ws.wide_gathers(torch.empty(fit, D, dtype=torch.bfloat16, device="cuda"))
    assert ws.wide_gathers(torch.empty(fit + 1, D, dtype=torch.bfloat16, device="cuda"))
    assert not ws.wide_gathers(torch.empty(fit, D, dtype=torch.float16, device="cuda")[:16])


@pytest.mark.parametrize("which", VARIANTS)
def test_fp16(mods, cache, which):
    args, kw = case(cache, 300, 64, 640, torch.float16, sink=True, seed=3)
    check(_run(mods, which, args, kw), args, kw)


@pytest.mark.parametrize("which", VARIANTS)
def test_all_valid_long_rows(mods, cache, which):
    args, kw = case(cache, 264, 128, 2048, torch.bfloat16, sink=True, seed=4, pads=False)
    check(_run(mods, which, args, kw), args, kw)


@pytest.mark.parametrize("H", [64, 128])
def test_ws_many_tokens_with_runs_of_empty_ones(mods, cache, H):
    """The persistent ws kernel over many more (token, head block) items than SMs (many items
    per program): runs of empty items (no pairs: Q freed at once, the row sums' alternate
    slots), lengths that end inside a pair or on its edge; and every item empty."""
    args, kw = case(cache, 1500, H, 640, torch.bfloat16, sink=True, seed=H + 11)
    g = torch.Generator(device="cuda").manual_seed(H)
    choices = torch.tensor([0, 1, 63, 64, 65, 128, 129, 640], device="cuda", dtype=torch.int32)
    lens = choices[torch.randint(0, len(choices), (1500,), generator=g, device="cuda")]
    lens[200:700] = 0  # several empty items in a row for every program
    args = args[:3] + (lens,) + args[4:]
    check(_run(mods, "gluon_ws", args, kw), args, kw)
    empty = args[:3] + (torch.zeros_like(lens),) + args[4:]
    out, lse = _run(mods, "gluon_ws", empty, kw)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


@pytest.mark.parametrize("which", VARIANTS)
def test_large_scores_and_all_empty(mods, cache, which):
    """Scores far from 0 (the online max moves a lot) and a batch where nothing is valid."""
    args, kw = case(cache, 200, 64, 640, torch.bfloat16, sink=True, seed=5)
    q = args[0] * 8
    args = (q,) + args[1:]
    check(_run(mods, which, args, kw), args, kw)
    empty = (args[0], args[1], torch.full_like(args[2], -1), args[3], args[4], args[5])
    out, lse = _run(mods, which, empty, kw)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))



@pytest.mark.parametrize("pattern", MOVING_MAX_PATTERNS)
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("which", VARIANTS)
def test_running_max_moving_between_tiles(mods, monkeypatch, pattern, H, which):
    """Scores whose running max jumps at every 64-row tile, falls, or moves by the first or the
    second tile of a pair, per row differently (``moving_max_case``): each rescale of the ws
    kernel's consumers (consumer 0 moving the max for tile A, consumer 1 for tile B, P_A rescaled
    to m_B), with and without a sink, both gather widths."""
    widths = (False, True) if which == "gluon_ws" else (None,)
    for K in (200, 640, 1152):
        for sink in (False, True):
            args, kw = sparse_mla_moving_max_case(pattern, "cuda", T=96, H=H, K=K, tile=64, sink=sink, seed=H + K)
            for wide in widths:
                if wide is not None:
                    monkeypatch.setattr(mods["gluon_ws"], "wide_gathers", lambda kv, wide=wide: wide)
                got = _run(mods, which, args, kw)
                assert torch.isfinite(got[0]).all()
                check(got, args, kw)
@pytest.mark.parametrize("H", [64, 96, 128])
def test_dispatch_takes_gluon_ws_for_prefill(mods, cache, H):
    backend = select("cuda")
    args, kw = case(cache, 300, H, 640, torch.bfloat16, sink=True, seed=11)
    chain = [n for n in backend.variants["sparse_mla"] if n != "flashmla"]
    assert chain[:2] == ["gluon_ws", "gluon"], backend.variants["sparse_mla"]
    expected = backend.variants["sparse_mla"][0]  # gluon_ws: first on sm90, FlashMLA (if importable) after it
    assert backend.variant_for("sparse_mla", *args, **kw) == expected
    check(backend.sparse_mla(*args, **kw), args, kw)


def test_dispatch_sends_what_gluon_does_not_take_to_the_tl_kernel_with_reasons(mods, cache):
    backend = select("cuda", prefer={"sparse_mla": "triton"})  # the pack's own chain without FlashMLA
    chain = select("cuda")
    args, _ = case(cache, 300, 64, 640, torch.bfloat16, sink=False, seed=12)
    q, kv, idx, lens = args[:4]
    for name, call in {"decode-sized": (q[:4], kv, idx[:4], lens[:4], args[4], D),
                       "H=32": (q[:, :32].contiguous(), kv, idx, lens, args[4], D),
                       "d_v=256": (q, kv, idx, lens, args[4], 256)}.items():
        why = mods["gluon"].input_check(*call)
        assert why, name
        assert chain.variant_for("sparse_mla", *call) in ("flashmla", "triton"), name
        assert backend.variant_for("sparse_mla", *call) == "triton"
    assert chain.variant_for("sparse_mla", q.float(), kv.float(), idx, lens, args[4], D) == "reference"


@pytest.mark.parametrize("H", [64, 128])
def test_cuda_graph_capture(mods, cache, H):
    backend = select("cuda", prefer={"sparse_mla": "gluon_ws"})
    args, kw = case(cache, 264, H, 640, torch.bfloat16, sink=True, seed=9)
    want = backend.sparse_mla(*args, **kw)
    g, got = capture(lambda: backend.sparse_mla(*args, **kw))
    args[0].mul_(0.5)
    g.replay()
    torch.cuda.synchronize()
    check(got, args, kw)
    assert not torch.equal(got[0], want[0])


@pytest.mark.parametrize("H", [64, 128])
def test_warmup_compiles_what_serving_launches(mods, cache, monkeypatch, H):
    """After warmup, serving calls compile nothing: both gather widths of the ws kernel are built
    (the warm-up's own calls use small caches, serving's cache is larger than L2)."""
    backend = select("cuda")
    backend.warmup(num_heads=(H,), attn_dtypes=(torch.bfloat16,), attn_sink=(True,))
    fns = [mods["gluon_ws"]._sparse_mla_gluon_ws_fwd]
    before = [sum(len(c[0]) for c in fn.device_caches.values()) for fn in fns]
    assert all(b >= 2 for b in before) or "flashmla" in backend.variants["sparse_mla"]
    for wide in (True, False):
        monkeypatch.setattr(mods["gluon_ws"], "wide_gathers", lambda kv, wide=wide: wide)
        for T, K in ((300, 128), (2048, 640)):
            args, kw = case(cache, T, H, K, torch.bfloat16, sink=True, seed=T)
            backend.sparse_mla(*args, **kw)
    assert [sum(len(c[0]) for c in fn.device_caches.values()) for fn in fns] == before


def test_a_kernel_that_fails_to_build_is_a_reason_and_the_next_variant_runs(mods, cache, monkeypatch):
    """gluon_ws does not compile (injected): one warning, the same call runs gluon (a correct
    result), and explain() shows the failure as gluon_ws's reason from then on."""
    ws = mods["gluon_ws"]
    monkeypatch.setattr(ws, "_BUILT", set())

    def broken(*a, **k):
        raise RuntimeError("PassManager::run failed (injected by the test)")

    monkeypatch.setattr(ws._sparse_mla_gluon_ws_fwd, "warmup", broken)
    backend = select("cuda", prefer=None)
    backend._chains["sparse_mla"] = tuple(v for v in backend._chains["sparse_mla"] if v.name != "flashmla")
    args, kw = case(cache, 300, 128, 640, torch.bfloat16, sink=True, seed=21)
    with pytest.warns(RuntimeWarning, match="gluon_ws.*failed to build"):
        got = backend.sparse_mla(*args, **kw)
    check(got, args, kw)
    assert backend.variant_for("sparse_mla", *args, **kw) == "gluon"
    row = next(c for c in backend.explain().table if c.op == "sparse_mla" and c.variant == "gluon_ws")
    assert row.status == "rejected" and any("injected by the test" in r for r in row.reasons)
    with pytest.raises(KernelUnavailable):
        ws.sparse_mla(*args, **kw)
    warnings.resetwarnings()


def test_gate_flag_is_one_host_word_per_thread_and_stream(mods, cache):
    """The device check's flag is a pinned host word the gated kernel reads, one per thread and
    stream: consecutive checks on a stream share it, another stream has its own. A check whose
    verdict was never read (a call that stopped between its check and its wait) is read by the
    next check on that word before the word is zeroed: the bad one still reports its failure, the
    gated kernel behind it ran before the word changed, and the next check's verdict is its own."""
    from swa_backends.kernels import sparse_mla_check as chk

    ws = mods["gluon_ws"]
    args, kw = case(cache, 300, 128, 640, torch.bfloat16, sink=True, seed=31)
    q, kv, idx, lens, scale, dv = args
    bad_idx = idx.clone()
    bad_idx[299, 639] = 2**31 - 1  # terabytes past the cache: a gated kernel that read it would fault
    first = chk.gate(*args, **kw)
    assert first.flag.device.type == "cpu" and first.flag.is_pinned() and not first.failed()
    bad = chk.gate(q, kv, bad_idx, lens, scale, dv, **kw)
    assert bad.flag.data_ptr() == first.flag.data_ptr()  # the same word: the stream did not change
    ws.sparse_mla(q, kv, bad_idx, lens, scale, dv, gate=bad.flag, **kw)  # computes nothing
    good = chk.gate(*args, **kw)  # reads the bad verdict first, then zeroes the word
    got = ws.sparse_mla(*args, gate=good.flag, **kw)
    assert bad.failed() and not good.failed()
    check(got, args, kw)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        other = chk.gate(q, kv, bad_idx, lens, scale, dv, **kw)
        assert other.flag.data_ptr() != good.flag.data_ptr() and other.failed()
    torch.cuda.synchronize()
    assert not chk.gate(*args, **kw).failed()  # the default stream's word, zeroed again


def test_validated_default_call_is_gated(mods, cache):
    """The validated default call (``select("cuda")``) on a gluon_ws call: its value checks run on
    the device ahead of the kernel (gated), with the unvalidated call's results; a poisoned
    index, length or sink gives the host checks' own ``ValueError``, and the gated kernel, which
    ran behind the failed check, read nothing: the poisoned index lies terabytes past the cache,
    and the device is still healthy afterwards (a read there would fault the context)."""
    from swa_backends.common.ops import OPS

    checked, unchecked = select("cuda"), select("cuda", checked=False)
    for sink in (False, True):
        args, kw = case(cache, 300, 128, 640, torch.bfloat16, sink=sink, seed=11)
        assert checked.variant_for("sparse_mla", *args, **kw) == "gluon_ws"
        got = _poison(lambda: checked.sparse_mla(*args, **kw))
        want = unchecked.sparse_mla(*args, **kw)
        torch.cuda.synchronize()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        check(got, args, kw)
    args, kw = case(cache, 300, 128, 640, torch.bfloat16, sink=True, seed=12)
    q, kv, idx, lens, scale, dv = args
    bad_idx, bad_lens, bad_sink = idx.clone(), lens.clone(), kw["sink"].clone()
    bad_idx[150, 600] = 2**31 - 1
    bad_lens[7] = idx.shape[1] + 1
    bad_sink[5] = float("nan")
    for a, k in (((q, kv, bad_idx, lens, scale, dv), kw), ((q, kv, idx, bad_lens, scale, dv), kw),
                 (args, {"sink": bad_sink})):
        with pytest.raises(ValueError) as exc:
            checked.sparse_mla(*a, **k)
        with pytest.raises(ValueError) as host:
            OPS["sparse_mla"].validate(*a, **k)
        assert str(exc.value) == str(host.value)
    torch.cuda.synchronize()
    assert torch.equal(checked.sparse_mla(*args, **kw)[0], unchecked.sparse_mla(*args, **kw)[0])
