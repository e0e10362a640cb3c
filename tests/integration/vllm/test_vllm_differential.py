"""vLLM's DeepSeek-V4.1 replay-metadata preparation, run twice: with vLLM's own kernels and
through the pack. Every metadata tensor must be bit-identical.

The same mixed batches (``_cases``: prefix hits with replay, later replay chunks, chunked and
cold prefills, long prefills the decoder side trims, decodes, speculative-decode rows,
prompt-logprob requests, graph padding of requests and tokens; three or four KV-cache groups,
two of them window groups with FlashMLA's and FlashInfer's builders) go through
``DeepseekV41ModelState.prepare_attn`` -- slot padding, the sparse-SWA builders (clamped
window indices and lengths for decode and prefill rows, prefill gather lengths), the decoder
sub-batch and its own metadata builds -- once on vLLM's state with vLLM's kernels (no patch
applied) and once on the pack's state (``model_state_class``) with the patches applied and
routed, for the pack's torch reference and for its Triton kernels (interpreter on the CPU).
Modes: eager, PIECEWISE with replay graphs (graph-padded sub-batch), FULL (padded requests),
and the replay-graph capture path (dummy batches).

Needs vLLM (the CI stage's venv); skipped without it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

import torch  # noqa: E402

import _cases  # noqa: E402
import _vllm_harness as h  # noqa: E402
from swa_backends import select  # noqa: E402
from swa_backends.integrations.vllm import runtime  # noqa: E402
from _release import installed  # noqa: E402

release = installed()  # the installed vLLM's release subpackage (skips this module where there is none)
patches = release.patches
Route, model_state_class = release.model.Route, release.model.model_state_class
from vllm.config import CUDAGraphMode  # noqa: E402

ROUTES = h.METADATA_ROUTES
SPEC = 3  # speculative tokens: decode threshold 4


@pytest.fixture(autouse=True)
def _stubs(monkeypatch):
    h.install_cpu_stubs(monkeypatch)
    yield
    patches.restore()


@pytest.fixture(params=["reference", "triton"])
def be(request, monkeypatch):
    backend = select("cpu", prefer=request.param, checked=False)  # as runtime.backend_for selects it
    monkeypatch.setattr(runtime, "backend_for", lambda device: backend)
    return backend


def _vllm_run(batch, step, **kw):
    patches.restore()  # vLLM's own module globals
    setup = h.make_setup(batch, spec=SPEC)
    state = h.make_state(h.VllmState, setup)
    return step(state, setup, batch, **kw)


def _pack_run(be, batch, step, **kw):
    h.route_to(be, ROUTES)
    setup = h.make_setup(batch, spec=SPEC)
    route = Route(None, encoder=True, builders=True, decoder=True)
    state = h.make_state(model_state_class(h.VllmState), setup, {"swa_backends_route": route})
    assert state._swa_backend is be
    before = dict(runtime.CALLS)
    try:
        snap = step(state, setup, batch, **kw)
        # no routed call fell back to vLLM's kernel (a shim turns its route off when the pack raises)
        assert all(patches.routes()[name] for name in ROUTES), patches.routes()
        assert state._swa_gather
    finally:
        for name in ROUTES:
            patches.route(name, None)
    called = {k: runtime.CALLS[k] - before.get(k, 0) for k in runtime.CALLS}
    return snap, called


def _eager(state, setup, batch):
    h.add_requests(state, batch)
    return h.run_step(state, setup, batch)


def _compare(want, got):
    problems = h.diff(want, got)
    assert not problems, "\n".join(problems[:20])
    return h.count_tensors(want)


CASES = [(seed, name) for seed in (0, 1, 2) for name, _ in _cases.mixed_batches(seed)]


@pytest.mark.parametrize("seed,name", CASES, ids=[f"{n}-{s}" for s, n in CASES])
def test_eager_step_bit_identical(be, seed, name):
    batch = dict(_cases.mixed_batches(seed))[name]
    want = _vllm_run(batch, _eager)
    got, called = _pack_run(be, batch, _eager)
    n = _compare(want, got)
    assert n > 10
    # the step went through the pack in one launch (runtime.prepare_step): the pad held for it,
    # the first window group's decode rows, prefill rows and gather lengths, the sub-batch and
    # that group's two sub-batch builds (the replay layers', the first replay layer's) answered
    # by it; a second window group's builds come from one more launch (none of these batches has one:
    # test_launch_counts.py counts those)
    assert called.get("prepare_step", 0) == 1
    D = int(batch.qsl_np[batch.num_decodes])
    T = int(batch.qsl_np[batch.num_reqs])
    sub = want["replay"] is not None
    n = want["replay"]["rows"].numel() if sub else 0
    assert called.get("swa_indices_and_lens.answered", 0) == (D > 0) + (T > D) + 2 * sub * ((D > 0) + (n > D))
    assert called.get("prepare_step.second", 0) == int(batch.slots.shape[0] - len(batch.cacheable) > 1)
    assert called.get("swa_indices_and_lens", 0) == 0
    if batch.R[: batch.num_reqs].any():
        assert called.get("pad_replayed_slots.held", 0) == 1 and called.get("pad_replayed_slots", 0) == 0
        assert not torch.equal(want["slot_mappings"], batch.slots)
    if batch.num_decodes < batch.num_reqs:  # the batch's, and the sub-batch's two builds'
        assert called.get("gather_lens.answered", 0) == 1 + 2 * sub
    trims = (batch.q > batch.W)[batch.num_decodes: batch.num_reqs] & ~batch.keeps_rows[batch.num_decodes: batch.num_reqs]
    assert (want["replay"] is not None) == bool(trims.any())
    if want["replay"] is not None:
        assert called.get("gather_replay_batch.answered", 0) == 1 and called.get("gather_replay_batch", 0) == 0


@pytest.mark.parametrize("name", ["mixed", "graph-padding", "spec-decode+replay"])
def test_eager_step_with_validation_on(name, monkeypatch):
    """``SWA_BACKENDS_VALIDATE=1`` (the debug switch: ``backend_for`` selects a checked
    backend): the pack validates vLLM's real inputs on the hot path and accepts them all (no
    route falls back), with the same results."""
    monkeypatch.setattr(runtime, "VALIDATE", True)
    monkeypatch.setenv(runtime.PREFER_ENV, "triton")
    be = runtime.backend_for("cpu")
    assert be.checked
    monkeypatch.setattr(runtime, "backend_for", lambda device: be)
    batch = dict(_cases.mixed_batches(8))[name]
    want = _vllm_run(batch, _eager)
    got, called = _pack_run(be, batch, _eager)
    _compare(want, got)
    # through the validated backend: the step's one launch, and every other routed call answered or launched
    assert called.get("prepare_step", 0) == 1
    assert called.get("swa_indices_and_lens", 0) + called.get("swa_indices_and_lens.answered", 0) > 0


def _eager_resized(state, setup, batch, *, host_q):
    h.add_requests(state, batch)
    return h.run_step(state, setup, batch, host_q=host_q)


@pytest.mark.parametrize("validate", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_eager_step_with_device_resized_decodes(seed, validate, monkeypatch):
    """Adaptive verification: the host counts each speculative decode at one length, the device
    ``query_start_loc`` at another (the total unchanged, vLLM's own invariant); vLLM plans from
    the host copy and its kernels follow the device's. Through the pack (checked: the debug
    switch's validating backend accepts the batch) every metadata tensor is the same."""
    import numpy as np

    monkeypatch.setattr(runtime, "VALIDATE", validate)
    monkeypatch.setenv(runtime.PREFER_ENV, "triton")
    be = runtime.backend_for("cpu")
    assert be.checked == validate
    monkeypatch.setattr(runtime, "backend_for", lambda device: be)
    rng = np.random.default_rng(40 + seed)
    batch = _cases.make_batch(rng, spec=SPEC, num_decodes=4, kinds=("replay", "long", "replay_chunk", "long"))
    host_q = batch.q.copy()
    nd = batch.num_decodes
    for _ in range(int(rng.integers(1, 4))):  # move rows between decodes: the same total, other lengths
        j = int(rng.choice(np.flatnonzero(host_q[:nd] > 1))) if (host_q[:nd] > 1).any() else None
        i = int(rng.integers(0, nd))
        if j is not None and i != j:
            host_q[j] -= 1
            host_q[i] += 1
    if np.array_equal(host_q[:nd], batch.q[:nd]):
        pytest.skip("every decode verifies one row: nothing to move between them")
    assert host_q[:nd].sum() == batch.q[:nd].sum() and (host_q[:nd] >= 1).all()
    assert not np.array_equal(host_q[:nd], batch.q[:nd])
    want = _vllm_run(batch, _eager_resized, host_q=host_q)
    got, called = _pack_run(be, batch, _eager_resized, host_q=host_q)
    _compare(want, got)
    assert want["replay"] is not None  # the long prefills trim: the sub-batch is gathered


def _piecewise(state, setup, batch, *, extra: int):
    h.add_requests(state, batch)
    kept = sum(min(int(q), batch.W) if (i >= batch.num_decodes and not batch.keeps_rows[i]) else int(q)
               for i, q in enumerate(batch.q[: batch.num_reqs]))
    state.replay_cudagraphs = h.FakeReplayGraphs([kept + extra, 4 * kept + 64])
    setup.layers.trim_threshold = batch.W + 1  # every graph of more than W tokens breaks out to the replay batch
    return h.run_step(state, setup, batch, mode=CUDAGraphMode.PIECEWISE)


def _graph_step(state, setup, batch, *, mode, threshold):
    h.add_requests(state, batch)
    if mode == CUDAGraphMode.PIECEWISE:
        state.replay_cudagraphs = h.FakeReplayGraphs([4 * batch.T_pad + 64])
        setup.layers.trim_threshold = threshold
    return h.run_step(state, setup, batch, mode=mode, full=mode == CUDAGraphMode.FULL)


def _rows_kept(batch, replay) -> list[int]:
    """The full batch's rows the replay layers run on (vLLM's sub-batch rows, or all of them)."""
    return list(range(int(batch.qsl_np[batch.num_reqs]))) if replay is None else replay["rows"].tolist()


def _planned_rows(batch, plan) -> list[int]:
    qsl = batch.qsl_np[: batch.num_reqs + 1]
    if plan is None:
        return list(range(int(qsl[-1])))
    return [r for i, k in enumerate(plan.kept.tolist()) for r in range(int(qsl[i + 1]) - k, int(qsl[i + 1]))]


@pytest.mark.parametrize("name", [n for n, _ in _cases.mixed_batches(0)])
def test_the_public_planner_keeps_the_rows_vllm_keeps(name):
    """``plan_replay_batch`` (SPEC §3.5) against vLLM's own ``_prepare_replay_batch``: the same rows
    run the replay layers in every graph mode. Eager steps: vLLM trims whatever the step's size, the
    planner with ``trim_threshold=0`` (its default threshold also holds small eager steps whole:
    SPEC §3.5's rule, checked here as the one difference); PIECEWISE: from vLLM's threshold, on the
    padded size, on both sides of it; FULL: never."""
    import swa_backends as sb

    batch = dict(_cases.mixed_batches(0))[name]
    B = batch.num_reqs
    qsl, pre, keeps = batch.qsl_np[: B + 1], batch.is_prefilling[:B], batch.keeps_rows[:B]
    cases = [(CUDAGraphMode.NONE, 0, dict(graph_mode="none", trim_threshold=0)),
             (CUDAGraphMode.FULL, 0, dict(graph_mode="full", trim_threshold=0))]
    cases += [(CUDAGraphMode.PIECEWISE, t, dict(graph_mode="piecewise", trim_threshold=t, num_tokens=batch.T_pad))
              for t in (batch.W + 1, batch.T_pad, batch.T_pad + 1)]
    for mode, threshold, kw in cases:
        want = _vllm_run(batch, _graph_step, mode=mode, threshold=threshold)["replay"]
        plan = sb.plan_replay_batch(qsl, pre, keeps, batch.W, **kw)
        assert _planned_rows(batch, plan) == _rows_kept(batch, want), (mode, threshold)
    # the planner's default keeps an eager step under its 768 tokens whole, where vLLM trims it
    eager = _vllm_run(batch, _graph_step, mode=CUDAGraphMode.NONE, threshold=0)["replay"]
    default = sb.plan_replay_batch(qsl, pre, keeps, batch.W)
    if int(qsl[-1]) < sb.TRIM_THRESHOLD:
        assert default is None
        assert (eager is not None) == bool(((batch.q[:B] > batch.W) & pre & ~keeps).any())
    else:
        assert _planned_rows(batch, default) == _rows_kept(batch, eager)


@pytest.mark.parametrize("extra", [0, 5])
@pytest.mark.parametrize("name", ["mixed", "spec-decode+replay", "prefill-only"])
def test_piecewise_replay_graph_padding(be, name, extra):
    batch = dict(_cases.mixed_batches(3))[name]
    want = _vllm_run(batch, _piecewise, extra=extra)
    got, called = _pack_run(be, batch, _piecewise, extra=extra)
    assert want["replay"] is not None and want["replay"]["run_graph"]
    assert want["replay"]["num_padded"] == want["replay"]["rows"].numel() + extra
    _compare(want, got)
    # the graph breaks out to the sub-batch: predicted, padded size included, and gathered by the step's launch
    assert called.get("gather_replay_batch.answered", 0) == 1 and called.get("gather_replay_batch", 0) == 0
    assert called.get("prepare_step", 0) == 1


def _full(state, setup, batch):
    h.add_requests(state, batch)
    return h.run_step(state, setup, batch, mode=CUDAGraphMode.FULL, full=True)


def test_full_graph_padded_requests(be):
    batch = _cases.make_batch(_cases.np.random.default_rng(5), spec=SPEC, num_decodes=5, kinds=(), pad_reqs=3,
                              pad_tokens=6)
    want = _vllm_run(batch, _full)
    got, called = _pack_run(be, batch, _full)
    assert want["replay"] is None  # FULL graphs never trim
    _compare(want, got)
    assert called.get("swa_indices_and_lens", 0) > 0


def _capture(state, setup, batch):
    """vLLM's replay-graph capture: ``capture_inner_cudagraphs`` prepares a dummy batch for
    each graph size; snapshot after every prepare."""
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    h.add_requests(state, batch)
    h.run_step(state, setup, batch)  # first prepare_attn: lazy buffers + warmup
    snaps = []
    graphs = h.FakeReplayGraphs([batch.W, 3 * batch.W, 4 * batch.W + 3])
    state.replay_cudagraphs = graphs
    orig = graphs.capture_replay_graphs

    def capture(prepare, *stream):  # 0.34 passes the model graphs' capture stream
        def recording(desc):
            prepare(desc)
            snaps.append(h.snapshot_replay(state, setup))
        orig(recording)

    graphs.capture_replay_graphs = capture
    bufs = InputBuffers(setup.cfg.scheduler_config.max_num_seqs, setup.cfg.scheduler_config.max_num_batched_tokens,
                        h.DEV)
    tables = h.FakeBlockTables(batch.block_tables, batch.slots.shape[0], 4096)
    state.capture_inner_cudagraphs(bufs, tables, setup.attn_groups, setup.kv_cache_config)
    return {"captures": snaps}


def test_replay_graph_capture_dummy_batches(be):
    batch = dict(_cases.mixed_batches(4))["mixed"]
    want = _vllm_run(batch, _capture)
    got, called = _pack_run(be, batch, _capture)
    assert len(want["captures"]) == 3 and all(s["replay"] is not None for s in want["captures"])
    _compare(want, got)
    assert called.get("gather_replay_batch", 0) >= 3


def test_two_steps_reuse_the_persistent_buffers(be):
    """A second step on the same states (other batch sizes): the pack writes into the same
    persistent buffers vLLM's kernels do, and the results stay identical."""
    b1, b2 = (dict(_cases.mixed_batches(s))["mixed"] for s in (6, 7))

    def two(state, setup, batch):
        h.add_requests(state, b1)
        first = h.run_step(state, setup, b1)
        h.add_requests(state, b2)
        return {"first": first, "second": h.run_step(state, setup, b2)}

    want = _vllm_run(b1, two)
    got, _ = _pack_run(be, b1, two)
    _compare(want, got)


def test_repeated_steps_reuse_the_sub_batch_views(be):
    """Steps of the same sizes one after another (a long prefill's chunks) hand vLLM's builders
    the same sub-batch views of its buffers (made once: ``_swa_kept_views``); a step of other
    sizes gets its own, and every step's metadata stays vLLM's."""
    b1, b2 = (dict(_cases.mixed_batches(s))["mixed"] for s in (6, 7))
    heads = []

    def steps(state, setup, batch):
        out = {}
        for i, b in enumerate((b1, b1, b2, b1)):
            h.add_requests(state, b)
            out[str(i)] = h.run_step(state, setup, b)
            heads.append(getattr(state, "_swa_heads", None))
        return out

    want = _vllm_run(b1, steps)
    heads.clear()
    got, _ = _pack_run(be, b1, steps)
    _compare(want, got)
    views = [hd[6] for hd in heads]
    assert all(a is b for a, b in zip(views[0], views[1]))  # the same sizes: the same objects
    for (B, n, G, qsl, pos, slots, v) in heads:  # each step's: vLLM's slices of its buffers
        for got_view, want_view in zip(v, (qsl[: B + 1], pos[:n], slots[:G, :n])):
            assert (got_view.data_ptr(), got_view.shape, got_view.stride()) == (
                want_view.data_ptr(), want_view.shape, want_view.stride())
    assert heads[2][:2] != heads[1][:2] and not any(a is b for a, b in zip(views[2], views[3]))


def test_predicted_split_is_vllms_split():
    """``runtime.predicted_split`` (the one-launch step's prediction) against vLLM's own
    ``split_decodes_and_prefills`` on random decode-first batches: decodes, short extends and
    prefills, thresholds 1-5, ``max_query_len`` as the batch's or a larger scheduled bound; batch
    sizes on both sides of ``runtime.SMALL_BATCH``."""
    from types import SimpleNamespace

    import numpy as np
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    rng = np.random.default_rng(7)
    for _ in range(300):
        th = int(rng.integers(1, 6))
        B = int(rng.integers(1, 3 * runtime.SMALL_BATCH))
        nd = int(rng.integers(0, B + 1))
        q = np.concatenate([rng.integers(1, th + 1, nd), rng.integers(1, 40, B - nd)]).astype(np.int32)
        qsl = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
        T = int(qsl[-1])
        mql = int(q.max()) + int(rng.integers(0, 3) == 0) * int(rng.integers(0, 8))
        cm = SimpleNamespace(max_query_len=mql, num_reqs=B, num_actual_tokens=T,
                             query_start_loc_cpu=torch.from_numpy(qsl), is_prefilling=None)
        d, _, D, _ = split_decodes_and_prefills(cm, decode_threshold=th)
        assert runtime.predicted_split(runtime.query_lens(qsl, B), qsl, T, mql, th) == (d, D), (q.tolist(), th, mql)


@pytest.mark.parametrize("wrong", ["split", "kept"])
def test_a_wrong_prediction_costs_launches_not_values(be, monkeypatch, wrong):
    """The one-launch step predicts vLLM's decode/prefill split and its trim; when a
    prediction is wrong (forced here), the calls it answered for do not match what vLLM passes,
    so they launch: the same bit-identical metadata, more launches."""
    import numpy as np

    batch = dict(_cases.mixed_batches(0))["mixed"]
    want = _vllm_run(batch, _eager)
    if wrong == "split":
        monkeypatch.setattr(runtime, "predicted_split", lambda q, qsl, T, mql, th: (0, 0))
    else:
        real = runtime.predicted_kept
        monkeypatch.setattr(runtime, "predicted_kept",
                            lambda *a, **kw: None if (k := real(*a, **kw)) is None else np.maximum(k - 1, 1))
    got, called = _pack_run(be, batch, _eager)
    _compare(want, got)
    assert called.get("prepare_step", 0) == 1
    if wrong == "split":
        assert called.get("swa_indices_and_lens.answered", 0) == 0 and called.get("gather_lens.answered", 0) == 0
    else:
        assert called.get("gather_replay_batch.answered", 0) == 0 and called.get("gather_replay_batch", 0) == 1
