"""Every failure of the pack leaves vLLM on its own path with one warning (needs vLLM).

Each test injects one failure -- the integration's model module not importing, building the
pack's model class, the set-up before the build, the backend probe, the warmup (the pad
shim's and the model state's), a kernel's first call (compile) in each routed launch, the
replay layers' row gather and scatter -- and runs vLLM's real DeepSeek-V4.1 replay-metadata
preparation (``_vllm_harness``) through it: vLLM starts, every metadata tensor equals what
vLLM's own kernels make, and the integration logs exactly one warning naming what failed.
"""

from __future__ import annotations

import logging
import sys

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.models.deepseek_v41.decoder_replay_layers import DecoderReplayLayers, ReplayBatch  # noqa: E402

import _cases  # noqa: E402
import _vllm_harness as h  # noqa: E402
from swa_backends import select  # noqa: E402
from swa_backends.integrations import vllm as integration  # noqa: E402
from swa_backends.integrations.vllm import runtime  # noqa: E402
from _release import installed  # noqa: E402

release = installed()  # the installed vLLM's release subpackage (skips this module where there is none)
m, patches = release.model, release.patches

pytestmark = pytest.mark.usefixtures("clean_integration")

NONE, FULL = CUDAGraphMode.NONE, CUDAGraphMode.FULL
STARTUP = _cases.make_batch(np.random.default_rng(0), num_decodes=4, kinds=("cold",))  # vLLM's warmup step: no replay
SERVING = dict(_cases.mixed_batches(9))["mixed"]  # replay, a trimmed prefill, decodes


class Flaky:
    """The pack's backend with one op that raises (``fail``: its name), as a kernel that does
    not compile raises before it writes anything."""

    def __init__(self, be):
        self._be = be
        self.fail = None
        self.raised = 0

    def __getattr__(self, name):
        attr = getattr(self._be, name)
        if name != self.fail:
            return attr

        def broken(*args, **kwargs):
            self.raised += 1
            raise RuntimeError(f"injected: {name} does not compile")

        return broken


@pytest.fixture
def flaky(monkeypatch):
    be = Flaky(select("cpu", prefer="reference", checked=False))
    monkeypatch.setattr(runtime, "backend_for", lambda device: be)
    h.install_cpu_stubs(monkeypatch)
    yield be
    patches.restore()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "vllm.swa_backends" and r.levelno >= logging.WARNING]


def _steps(state, setup, modes) -> list[dict]:
    snaps = []
    for batch, mode in ((STARTUP, NONE), (SERVING, modes)):
        h.add_requests(state, batch)
        snaps.append(h.run_step(state, setup, batch, mode=mode, full=mode == FULL))
    return snaps


_BASELINE: dict = {}


def _vllm(mode) -> list[dict]:
    """vLLM's own run (no patch applied): vLLM's warmup step, then the serving step."""
    if mode not in _BASELINE:
        patches.restore()
        setup = h.make_setup(SERVING, spec=0)
        _BASELINE[mode] = _steps(h.make_state(h.VllmState, setup), setup, mode)
    return _BASELINE[mode]


def _pack_state(be):
    h.route_to(be)
    setup = h.make_setup(SERVING, spec=0)
    route = m.Route(None, encoder=True, builders=True, decoder=True)
    return h.make_state(m.model_state_class(h.VllmState), setup, {"swa_backends_route": route}), setup


def _same(want, got) -> None:
    for a, b in zip(want, got, strict=True):
        problems = h.diff(a, b)
        assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("op,mode", [("prepare_replay_step", NONE), ("pad_replayed_slots", FULL),
                                     ("swa_indices_and_lens", FULL), ("prefill_gather_lens", FULL)])
def test_a_kernels_first_call_fails(flaky, caplog, op, mode):
    """The warmup went well; the op's first serving call raises (a compile failure): that call
    and every later one are vLLM's kernel's, the step's metadata vLLM's own, one warning.
    ``pad_replayed_slots``: held for the step's launch, which a FULL step does not make, so its
    flush raises after vLLM's kernel padded the slots (the held call's fallback)."""
    want = _vllm(mode)
    state, setup = _pack_state(flaky)
    h.add_requests(state, STARTUP)
    got = [h.run_step(state, setup, STARTUP)]  # vLLM's warmup step
    assert not _warnings(caplog)
    flaky.fail = op
    h.add_requests(state, SERVING)
    got.append(h.run_step(state, setup, SERVING, mode=mode, full=mode == FULL))
    _same(want, got)
    warnings = _warnings(caplog)
    assert flaky.raised >= 1 and len(warnings) == 1, warnings
    assert "injected" in warnings[0] and (op in warnings[0] or "one-launch step" in warnings[0]), warnings
    if op in patches.routes():
        assert not patches.routes()[op]


@pytest.mark.parametrize("op", ["pad_replayed_slots", "prepare_replay_step"])
def test_the_warmup_fails(flaky, caplog, op):
    """The warmup (vLLM's first prepare_attn) raises in the pack: the pad shim's own warmup
    (``pad_replayed_slots``) sends that launch back to vLLM's kernel, warmed as vLLM asked; the
    model state's (``prepare_replay_step``) sends everything back. vLLM's first prepare_attn
    never sees the error, the steps are vLLM's own, one warning."""
    want = _vllm(NONE)
    flaky.fail = op
    state, setup = _pack_state(flaky)
    got = _steps(state, setup, NONE)
    _same(want, got)
    warnings = _warnings(caplog)
    assert flaky.raised >= 1 and len(warnings) == 1 and "injected" in warnings[0], warnings
    if op == "pad_replayed_slots":
        assert patches.routes()["pad_replayed_slots"] is False and patches.routes()["swa_indices_and_lens"]
    else:
        assert not any(patches.routes().values()) and not state._swa_gather and not state._swa_fuse


def test_the_backend_probe_fails(flaky, caplog, monkeypatch):
    """No backend for the device (``runtime.backend_for`` raises when the model state asks):
    every route back to vLLM before the first step, one warning."""
    want = _vllm(NONE)

    def no_backend(device):
        raise RuntimeError("injected: no backend for this device")

    monkeypatch.setattr(runtime, "backend_for", no_backend)
    state, setup = _pack_state(flaky)
    got = _steps(state, setup, NONE)
    _same(want, got)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "no backend for this device" in warnings[0], warnings
    assert not any(patches.routes().values())


@pytest.mark.parametrize("op", ["gather_rows", "scatter_rows"])
@pytest.mark.parametrize("graphs", [False, True])
def test_the_replay_layers_row_moves_fail(flaky, caplog, op, graphs):
    """The replay layers' row gather or scatter through the pack raises: vLLM's ``_run`` (or
    its replay graphs' ``run``) gives the outputs, its layers run once, one warning."""
    from vllm.forward_context import BatchDescriptor, create_forward_context
    from vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph import DecoderReplayCudaGraphManager

    T, n_pad = 40, 24
    rows = torch.tensor([*range(2, 10), *range(26, 40)], dtype=torch.int64)
    g = torch.Generator().manual_seed(3)
    inputs = (torch.randn(T, h.HIDDEN, generator=g), torch.arange(T, dtype=torch.int64),
              torch.randn(T, h.HC, generator=g))
    ran = []

    def run_layers(hidden, positions, mix):
        ran.append(hidden.shape[0])
        return hidden * 3 + positions[:, None].float(), mix.flip(0)

    class Runner:
        def __call__(self, *bufs):
            return run_layers(*bufs)

    outs = []
    for pack in (False, True):
        layers = DecoderReplayLayers(16, run_layers, h._no_layers, {"a"}, "a")
        run_graph = None
        if graphs:
            mgr = object.__new__(DecoderReplayCudaGraphManager)
            mgr.input_buffers = [torch.zeros(64, *t.shape[1:], dtype=t.dtype) for t in inputs]
            mgr.breakable_cg_runner = Runner()
            if pack:
                mgr.__class__ = m._swapped(DecoderReplayCudaGraphManager, m.ReplayGraphsMixin)
            run_graph = mgr.run
        if pack:
            layers.__class__ = m._swapped(DecoderReplayLayers, m.ReplayLayersMixin)
            flaky.fail = op
        ctx = create_forward_context({}, h.make_config(W=16, spec=0),
                                     batch_descriptor=BatchDescriptor(num_tokens=n_pad))
        layers.replay_batch = ReplayBatch(rows, ctx, run_graph)
        ran.clear()
        outs.append(layers._run(*inputs))
        assert len(ran) == 1  # vLLM's layers (or graph) ran once
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
    # with graphs the rows go into the graph's buffers (ReplayGraphsMixin); the scatter is the layers' either way
    what = ("replay graphs' row gather" if graphs else "replay layers' row gather") if op == "gather_rows" \
        else "replay layers' row scatter"
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and what in warnings[0], warnings


def test_building_the_model_class_fails(caplog, monkeypatch):
    """vLLM's registry loads the pack's class path: if building the class fails, the name
    resolves to vLLM's own class (one warning), so DeepSeek-V4.1 still loads."""
    import vllm.models.deepseek_v41 as dsv41

    def broken():
        raise TypeError("injected: metaclass conflict")

    monkeypatch.setattr(m, "model_class", broken)
    assert getattr(m, "DeepseekV41ForCausalLM") is dsv41.DeepseekV41ForCausalLM
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "metaclass conflict" in warnings[0], warnings


def test_the_set_up_before_the_build_fails(caplog, monkeypatch):
    """The pack's set-up before vLLM builds the layers raises: vLLM builds its model as it
    would, nothing routed, one warning."""
    built = []

    class VllmModel:  # stands in for vLLM's class (its __init__ and model-state hook)
        def __init__(self, *, vllm_config, prefix=""):
            built.append((vllm_config, prefix))

        def get_model_state_cls(self):
            return h.VllmState

    def broken(cfg):
        raise RuntimeError("injected: the set-up failed")

    monkeypatch.setattr(m, "_before_build", broken)
    model = type("DeepseekV41ForCausalLM", (m.ModelMixin, VllmModel), {})(vllm_config="cfg", prefix="p")
    assert built == [("cfg", "p")] and not model.swa_backends_route.any
    assert model.get_model_state_cls() is h.VllmState
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "set-up before the build failed" in warnings[0], warnings


def test_the_model_module_does_not_import(caplog, monkeypatch):
    """``install()`` proves the module vLLM's registry will import (and through it the
    runtime and the patches) before it registers the class path: if it does not import, the
    registry keeps vLLM's class, one warning."""
    from vllm.model_executor.models.registry import ModelRegistry

    before = ModelRegistry.models[integration.ARCH]
    monkeypatch.setenv(integration.ENV, "force")
    # the path install() imports (0.34's names 0.33's module object) and that module: importing raises ImportError
    monkeypatch.setitem(sys.modules, integration.model_class_path(release).split(":")[0], None)
    monkeypatch.setitem(sys.modules, m.__name__, None)
    st = integration.install()
    assert not st.installed and "model module does not import" in st.reason
    assert ModelRegistry.models[integration.ARCH] is before
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "does not import" in warnings[0], warnings
