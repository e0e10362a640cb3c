"""Kernel launches per serving step, counted in real vLLM 0.33 steps: vLLM's replay-metadata
kernels with vLLM alone, the pack's kernels with the pack installed (and vLLM's, which must then
launch none).

Each step runs twice through ``DeepseekV41ModelState.prepare_attn`` (the harness of
``test_vllm_differential.py``: real sparse-SWA builders, real replay layers, vLLM's sub-batch
builds); the second run is counted (the first one warms up), and its metadata must be vLLM's
bit for bit. vLLM's four kernels are counted
where Triton is asked to run them (``JITFunction.run`` without ``warmup``): the slot padding,
the window rows (``_compute_swa_indices_and_lens_kernel``, one launch per non-empty decode or
prefill part of each build), the prefill gather lengths (one per build with prefills) and the
sub-batch gather. The pack's are its Triton kernels' own counters (``Kernel.launches``, the
interpreter here). What a step launches follows from its shape, which each test states as a
formula before it compares it with the pinned table README quotes (:data:`TABLE`):

* vLLM: ``pad`` when a request replays; per window group's build one window-rows launch per
  non-empty part (decode rows, prefill rows) and one gather-lengths launch when the batch has
  prefills; when the decoder keeps a sub-batch, its gather and its builds: one per window group
  (the replay layers' metadata) and one more for the first replay layer, each like a main build.
* the pack, where the step's one launch engages (eager and PIECEWISE steps; the first window
  group's builder FlashMLA's or FlashInfer's): ``prepare_replay_step`` once for the padding, that
  group's rows and gather lengths, the sub-batch gather and that group's sub-batch builds (the
  replay layers' and the first replay layer's); a second window group's rows and its replay
  layers' sub-batch build in one more launch of it (its gather lengths are answered: same window,
  same batch).
* elsewhere (FULL graphs, graph captures): one pack launch per vLLM launch.

Needs vLLM (the CI stage's venv); skipped without it.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

import numpy as np  # noqa: E402

import _cases  # noqa: E402
import _vllm_harness as h  # noqa: E402
from swa_backends import select  # noqa: E402
from swa_backends.integrations.vllm import runtime  # noqa: E402
from swa_backends.kernels import _launch  # noqa: E402
from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse, flashmla  # noqa: E402
from _release import installed  # noqa: E402

release = installed()  # the installed vLLM's release subpackage (skips this module where there is none)
patches = release.patches
Route, model_state_class = release.model.Route, release.model.model_state_class

FlashInfer = flashinfer_sparse.DeepseekSparseSWAFlashInferBackend
FlashMLA = flashmla.DeepseekSparseSWAFlashMLABackend
SPEC, W = 3, 16  # speculative tokens (decode threshold 4), window

#: vLLM's replay-metadata kernels (the ``@triton.jit`` functions behind its call sites: the release's
#: ``kernels.INSTALLED_KERNELS``) under the names the counts below use
VLLM_KERNELS = {"pad": "pad", "gather": "gather", "swa": "swa", "gather_lens": "prefill"}


def _vllm_kernel(key: str):
    import importlib

    module, qualname = release.kernels.INSTALLED_KERNELS[key].split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj

#: step type -> (vLLM's launches, the pack's launches) per step; README's table
TABLE = {
    "eager, trimmed, 1 window group": (11, 1),
    "eager, trimmed, prefills only": (8, 1),
    "eager, untrimmed, 1 window group": (4, 1),
    "eager, trimmed, 2 window groups": (17, 2),
    "eager, untrimmed, 2 window groups": (7, 2),
    "PIECEWISE, sub-batch in a replay graph": (11, 1),
    "FULL, padded requests": (1, 1),
    "decodes only": (1, 1),
    "FlashInfer builder, eager, trimmed": (11, 1),
}


@dataclass
class Case:
    batch: object
    mode: object = CUDAGraphMode.NONE
    backends: tuple = (FlashMLA,)
    full: bool = False
    graphs: bool = False  # PIECEWISE replay graphs the sub-batch runs in


def _windows(batch, n: int):
    """``batch`` with ``n`` window groups: 1 (group 1) or 2 (groups 1 and 3 of four)."""
    if n == 2:
        batch.cacheable = [0, 2]
    return batch


def _cases_by_name() -> dict[str, Case]:
    rng = np.random.default_rng(11)
    mixed = lambda groups=3: _cases.make_batch(rng, W=W, spec=SPEC, num_decodes=3, groups=groups,  # noqa: E731
                                               kinds=("replay", "long", "cold"))
    # every prefill at most W rows: nothing to trim
    short = lambda groups=3: _cases.explicit_batch([2, 1, 10, 7], [40, 33, 20, 0], [0, 0, 20, 0], W=W,  # noqa: E731
                                                    block_size=8, groups=groups, spec=SPEC, num_decodes=2, rng=rng)
    return {
        "eager, trimmed, 1 window group": Case(mixed()),
        "eager, trimmed, prefills only": Case(_cases.make_batch(rng, W=W, spec=SPEC, num_decodes=0,
                                                                kinds=("replay", "long"))),
        "eager, untrimmed, 1 window group": Case(short()),
        "eager, trimmed, 2 window groups": Case(_windows(mixed(4), 2), backends=(FlashMLA, FlashMLA)),
        "eager, untrimmed, 2 window groups": Case(_windows(short(4), 2), backends=(FlashMLA, FlashMLA)),
        "PIECEWISE, sub-batch in a replay graph": Case(mixed(), mode=CUDAGraphMode.PIECEWISE, graphs=True),
        "FULL, padded requests": Case(_cases.make_batch(rng, W=W, spec=SPEC, num_decodes=5, kinds=(), pad_reqs=3,
                                                        pad_tokens=6), mode=CUDAGraphMode.FULL, full=True),
        "decodes only": Case(_cases.make_batch(rng, W=W, spec=1, num_decodes=5, kinds=(), pad_tokens=3)),
        "FlashInfer builder, eager, trimmed": Case(mixed(), backends=(FlashInfer,)),
    }


CASES = _cases_by_name()


@pytest.fixture(autouse=True)
def _stubs(monkeypatch):
    h.install_cpu_stubs(monkeypatch)
    yield
    patches.restore()


@pytest.fixture
def vllm_launches(monkeypatch):
    """A counter of vLLM's replay-metadata kernel launches (compiles for warmup not counted)."""
    counts: collections.Counter = collections.Counter()
    for name, key in VLLM_KERNELS.items():
        kernel = _vllm_kernel(key)
        run = kernel.run

        def counted(*args, _name=name, _run=run, **kwargs):
            if not kwargs.get("warmup"):
                counts[_name] += 1
            return _run(*args, **kwargs)

        monkeypatch.setattr(kernel, "run", counted, raising=False)
    return counts


def _step(state, setup, case: Case) -> dict:
    batch = case.batch
    if case.graphs:
        kept = int(batch.kept_lens[: batch.num_reqs].sum())
        state.replay_cudagraphs = h.FakeReplayGraphs([kept + 3, 4 * kept + 64])
        setup.layers.trim_threshold = batch.W + 1  # the graph breaks out to the sub-batch
    return h.run_step(state, setup, batch, mode=case.mode, full=case.full)


def _count(case: Case, vllm_launches, monkeypatch, pack) -> tuple[dict, dict, dict]:
    """``(vLLM's launches, the pack's launches, the metadata)`` by kernel in the second of two steps."""
    if pack:
        be = select("cpu", prefer="triton", checked=False)  # as runtime.backend_for selects it (interpreter)
        monkeypatch.setattr(runtime, "backend_for", lambda device: be)
        h.route_to(be, h.METADATA_ROUTES)
    else:
        patches.restore()
    setup = h.make_setup(case.batch, spec=SPEC, backends=list(case.backends))
    if pack:
        route = Route(None, encoder=True, builders=True, decoder=True)
        state = h.make_state(model_state_class(h.VllmState), setup, {"swa_backends_route": route})
        assert state._swa_backend is be
    else:
        state = h.make_state(h.VllmState, setup)
    h.add_requests(state, case.batch)
    try:
        _step(state, setup, case)  # warmup (the first prepare_attn) and a step
        vllm_launches.clear()
        before = {name: k.launches for name, k in _launch.KERNELS.items()}
        snap = _step(state, setup, case)
        if pack:  # no route fell back to vLLM's kernel
            assert all(patches.routes()[name] for name in h.METADATA_ROUTES), patches.routes()
    finally:
        for name in h.METADATA_ROUTES:
            patches.route(name, None)
    ours = collections.Counter()
    for name, k in _launch.KERNELS.items():
        if k.launches != before.get(name, 0):
            ours[name.split(".")[0]] += k.launches - before.get(name, 0)
    return dict(vllm_launches), dict(ours), snap


def _expected(case: Case) -> tuple[dict, dict]:
    """The launches of ``case`` by kernel, from its shape (the module docstring's rules)."""
    b = case.batch
    B, d = b.num_reqs, b.num_decodes
    D, T = int(b.qsl_np[d]), int(b.qsl_np[B])
    windows = b.slots.shape[0] - len(b.cacheable)
    replays = bool(b.R[:B].any())
    trims = bool((b.kept_lens[:B] < b.q[:B])[d:].any())
    sub = not case.full and (trims or case.graphs)  # FULL graphs keep the whole batch
    rows = (D > 0) + (T > D)  # window-rows launches of one build
    lens = int(B > d)  # gather-lengths launches of one build
    builds = windows + (windows + 1) * sub  # the main builds, then the sub-batch's
    vllm = {"pad": int(replays), "swa": builds * rows, "gather_lens": builds * lens, "gather": int(sub)}
    fused = not case.full
    if not fused:
        pack = {"pad_replayed_slots": int(replays), "swa_indices_and_lens": builds * rows,
                "prefill_gather_lens": builds * lens, "gather_replay_batch": int(sub)}
    else:
        # one launch per window group: the first makes that group's builds, the batch's and the sub-batch's (the
        # replay layers' and the first replay layer's), a second group's launch its own rows and its replay layers'
        # sub-batch build (its gather lengths are answered: the same window over the same boundaries)
        pack = {"prepare_replay_step": windows}
    return ({k: v for k, v in vllm.items() if v}, {k: v for k, v in pack.items() if v})


@pytest.mark.parametrize("name", list(CASES))
def test_launches_per_step(name, vllm_launches, monkeypatch):
    case = CASES[name]
    want_vllm, want_pack = _expected(case)
    got_vllm, _, want = _count(case, vllm_launches, monkeypatch, pack=False)
    assert got_vllm == want_vllm
    vllm_in_pack, got_pack, got = _count(case, vllm_launches, monkeypatch, pack=True)
    problems = h.diff(want, got)  # the same metadata, bit for bit
    assert not problems, "\n".join(problems[:20])
    assert vllm_in_pack == {}, f"vLLM's kernels launched with the pack on: {vllm_in_pack}"
    assert got_pack == want_pack
    assert (sum(got_vllm.values()), sum(got_pack.values())) == TABLE[name]


def test_the_table_covers_every_case():
    assert set(TABLE) == set(CASES)
