"""The pack's DeepSeek-V4.1 model class around vLLM's (needs vLLM).

* the decision applied before the layers are built (encoder side) and after (decoder side),
  with its log lines, on vLLM-shaped configs;
* the replay layers' row gather/scatter and the replay graphs' row gather through the pack,
  bit-identical to vLLM's ``DecoderReplayLayers._run`` / ``DecoderReplayCudaGraphManager.run``;
* warmup: after the model state's first ``prepare_attn`` (vLLM's warmup), a serving step
  with replay, trimming and replay layers launches no pack kernel specialisation that the
  warmup did not launch.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.forward_context import BatchDescriptor, create_forward_context  # noqa: E402
from vllm.models.deepseek_v41.decoder_replay_layers import DecoderReplayLayers, ReplayBatch  # noqa: E402
from vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph import DecoderReplayCudaGraphManager  # noqa: E402

import _cases  # noqa: E402
import _configs  # noqa: E402
import _vllm_harness as h  # noqa: E402
from swa_backends import select  # noqa: E402
from swa_backends.integrations.vllm import config as icfg  # noqa: E402
from swa_backends.integrations.vllm import runtime  # noqa: E402
from _release import installed  # noqa: E402

release = installed()  # the installed vLLM's release subpackage (skips this module where there is none)
m, patches = release.model, release.patches


pytestmark = pytest.mark.usefixtures("clean_integration")


def _messages(caplog, level=None):
    return [r.getMessage() for r in caplog.records if level is None or r.levelno == level]


def _fake_model(window=128, end_layer=43, with_layers=True):
    layers = DecoderReplayLayers(window, h._no_layers, h._no_layers, {"a"}, "a") if with_layers else None
    inner = SimpleNamespace(decoder_replay_layers=layers, decoder_replay_start=20 if with_layers else end_layer,
                            end_layer=end_layer)
    return SimpleNamespace(language_model=SimpleNamespace(model=inner)), inner


def test_both_sides_on_route_everything(caplog):
    cfg = _configs.vllm_config()
    route = m._before_build(cfg)
    assert route.encoder and cfg.cache_config.swa_bounded_replay is True
    model, inner = _fake_model()
    route = m._after_build(model, route)
    assert route.encoder and route.builders and route.decoder
    assert type(inner.decoder_replay_layers).__name__ == "SwaBackendsDecoderReplayLayers"
    assert isinstance(inner.decoder_replay_layers, DecoderReplayLayers)
    assert patches.routes() == {"pad_replayed_slots": True, "swa_indices_and_lens": True, "prefill_gather_lens": True,
                                "rocm_sparse_attn_prefill": False}
    assert any("run through the pack" in s for s in _messages(caplog, logging.INFO))


def test_pack_turns_encoder_off_before_the_layers_are_built(caplog):
    cfg = _configs.vllm_config(parallel_config__decode_context_parallel_size=2)
    route = m._before_build(cfg)
    assert not route.encoder and cfg.cache_config.swa_bounded_replay is False
    warn = _messages(caplog, logging.WARNING)
    assert len(warn) == 1 and "encoder replay turned off" in warn[0] and "decode context parallel" in warn[0]
    model, inner = _fake_model()
    route = m._after_build(model, route)
    assert inner.decoder_replay_layers is None and inner.decoder_replay_start == inner.end_layer
    assert not route.any and patches.routes() == dict.fromkeys(patches.routes(), False)
    m._before_build(cfg)  # a second model in the process: no second log line
    assert len([s for s in _messages(caplog, logging.WARNING) if "encoder replay turned off" in s]) == 1


def test_pcp_with_prefix_caching_keeps_vllm_encoder(caplog):
    cfg = _configs.vllm_config(parallel_config__prefill_context_parallel_size=2)
    route = m._before_build(cfg)
    assert not route.encoder and cfg.cache_config.swa_bounded_replay is True  # vLLM would raise without it
    assert any("stays on, through vLLM's own kernels" in s for s in _messages(caplog, logging.WARNING))


def test_pack_turns_decoder_off_after_the_build(caplog):
    cfg = _configs.vllm_config(model_config__hf_text_config__engram_layer_ids=[25])
    route = m._before_build(cfg)
    model, inner = _fake_model()
    route = m._after_build(model, route)
    assert route.encoder and route.builders and not route.decoder
    assert inner.decoder_replay_layers is None and inner.decoder_replay_start == 43
    assert any("decoder replay turned off" in s and "Engram" in s for s in _messages(caplog, logging.WARNING))


def test_vllm_off_pack_on_is_logged_not_changed(caplog, monkeypatch):
    """ROCm with a drafter: the pack would run encoder replay, vLLM builds it off, and the pack
    does not turn it on (it would switch only the target's window caches)."""
    if not release.config.PACK_TURNS_ROCM_ENCODER_ON:
        pytest.skip(f"vLLM {release.RELEASE} keeps encoder replay on on ROCm itself (gfx942)")
    cfg = _configs.vllm_config(speculative_config=_configs.drafter())
    real = icfg.decide
    monkeypatch.setattr(m, "decide", lambda c: real(c, "rocm:gfx942", platform="rocm"))
    route = m._before_build(cfg)
    assert not route.encoder and not route.rocm and cfg.cache_config.swa_bounded_replay is True
    assert any("the pack would turn it on, vLLM does not" in s and "ROCm" in s and "drafter" in s
               for s in _messages(caplog, logging.INFO))
    model, inner = _fake_model(with_layers=False)
    route = m._after_build(model, route)
    assert not route.decoder and any("decoder replay stays off" in s for s in _messages(caplog, logging.INFO))


def test_rocm_turn_on_needs_the_rocm_patch(caplog, monkeypatch):
    """On ROCm the pack turns encoder replay on after the build; where the consumer's patch
    does not apply (here: not ROCm) it stays off and every route goes back to vLLM."""
    if not release.config.PACK_TURNS_ROCM_ENCODER_ON:
        pytest.skip(f"with vLLM {release.RELEASE} the pack does not turn encoder replay on on ROCm")
    cfg = _configs.vllm_config()
    real = icfg.decide
    monkeypatch.setattr(m, "decide", lambda c: real(c, "rocm:gfx942", platform="rocm"))
    route = m._before_build(cfg)
    assert route.encoder and route.rocm
    model, inner = _fake_model()
    route = m._after_build(model, route)
    # encoder replay stayed off, so decoder replay goes too (SPEC §4: it requires encoder replay)
    assert not route.encoder and not route.rocm and not route.decoder and not route.builders
    assert patches.routes() == dict.fromkeys(patches.routes(), False)
    assert inner.decoder_replay_layers is None and inner.decoder_replay_start == inner.end_layer
    warn = _messages(caplog, logging.WARNING)
    assert any("encoder replay stays off on rocm:gfx942" in s and "rocm_sparse_attn_prefill" in s for s in warn)
    assert any("decoder replay turned off" in s and "[needs-encoder]" in s for s in warn)


def test_replay_layers_go_where_vllm_keeps_encoder_replay_off(caplog, monkeypatch):
    """vLLM's AMD model builds its replay layers from the config flag alone, also where its
    attention keeps encoder replay off and the pack does not turn it on (0.33: ROCm with a drafter;
    0.34: a ROCm arch outside CDNA 3 and 4): the pack removes them, as vLLM's rule and SPEC §4's
    say (decoder replay requires encoder replay), and routes nothing."""
    turns_on = release.config.PACK_TURNS_ROCM_ENCODER_ON
    cfg = _configs.vllm_config(speculative_config=_configs.drafter()) if turns_on else _configs.vllm_config()
    device = "rocm:gfx942" if turns_on else "rocm:gfx90a"
    real = icfg.decide
    monkeypatch.setattr(m, "decide", lambda c: real(c, device, platform="rocm"))
    route = m._before_build(cfg)
    assert not route.encoder and not route.rocm
    model, inner = _fake_model()
    route = m._after_build(model, route)
    assert not route.any and patches.routes() == dict.fromkeys(patches.routes(), False)
    assert inner.decoder_replay_layers is None and inner.decoder_replay_start == inner.end_layer
    assert any("decoder replay turned off" in s and "[needs-encoder]" in s and "off in vLLM" in s
               for s in _messages(caplog, logging.WARNING))


def test_rocm_replay_kept_on_by_vllm(caplog, monkeypatch):
    """vLLM 0.34 keeps encoder replay on on ROCm for CDNA 3 and 4: the pack routes the replay
    metadata as on CUDA, leaves vLLM's window caches and prefill attention alone and never pins
    a route (vLLM's own kernels stay its fallback)."""
    if release.config.PACK_TURNS_ROCM_ENCODER_ON:
        pytest.skip(f"vLLM {release.RELEASE} keeps encoder replay off on ROCm (the pack turns it on)")
    cfg = _configs.vllm_config()
    real = icfg.decide
    monkeypatch.setattr(m, "decide", lambda c: real(c, "rocm:gfx942", platform="rocm"))
    route = m._before_build(cfg)
    assert route.encoder and not route.rocm and cfg.cache_config.swa_bounded_replay is True
    model, inner = _fake_model()
    route = m._after_build(model, route)
    assert route.encoder and not route.rocm and route.decoder and route.builders
    assert patches.routes() == {"pad_replayed_slots": True, "swa_indices_and_lens": True, "prefill_gather_lens": True,
                                "rocm_sparse_attn_prefill": False}
    assert not any("encoder replay turned on" in s for s in _messages(caplog, logging.WARNING))


def test_decision_failure_is_vllms_path(caplog, monkeypatch):
    def boom(cfg):
        raise RuntimeError("no device")

    monkeypatch.setattr(m, "decide", boom)
    route = m._before_build(_configs.vllm_config())
    assert route.decision is None and not route.any
    assert any("capability decision failed" in s for s in _messages(caplog, logging.WARNING))


def test_model_state_class_keeps_vllms_choice():
    from vllm.models.deepseek_v41.nvidia.model_state import DeepseekV41ModelState
    from vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.model_state import (
        DeepseekV41SpecializedDecodeModelState,
    )

    for base in (DeepseekV41ModelState, DeepseekV41SpecializedDecodeModelState):
        cls = m.model_state_class(base)
        assert issubclass(cls, base) and issubclass(cls, m.ModelStateMixin)
        assert cls.__mro__[1] is m.ModelStateMixin and m.model_state_class(base) is cls
        assert cls._kept_input_batch is m.ModelStateMixin._kept_input_batch


# ---------------------------------------------------------------------------------------
# replay layers: row gather / scatter
# ---------------------------------------------------------------------------------------


def _inputs(T, seed=0):
    g = torch.Generator().manual_seed(seed)
    hid, hc = h.HIDDEN, h.HC
    return (torch.randn(T, hid, generator=g).to(torch.bfloat16), torch.arange(T, dtype=torch.int64) * 3,
            torch.randint(0, 1000, (T,), generator=g, dtype=torch.int32), torch.randn(T, hc, generator=g), None,
            torch.randn(T, hc, hc, generator=g), torch.randn(T, hc, hid, generator=g).to(torch.bfloat16))


def _run_layers(hidden, positions, ids, pre, post, res, residual):
    assert post is None
    return (hidden * 2 + residual.sum(1).to(hidden.dtype), pre + positions[:, None].float(), ids.float()[:, None] * res[:, 0])


@pytest.fixture(params=["reference", "triton"])
def be(request, monkeypatch):
    backend = select("cpu", prefer=request.param, checked=False)  # as runtime.backend_for selects it
    monkeypatch.setattr(runtime, "backend_for", lambda device: backend)
    return backend


def _ctx(n_pad):
    return create_forward_context({}, h.make_config(W=16, spec=0), batch_descriptor=BatchDescriptor(num_tokens=n_pad))


def test_replay_layers_eager_bit_identical(be):
    T = 50
    rows = torch.tensor([0, *range(10, 26), *range(30, 50)], dtype=torch.int64)
    inputs = _inputs(T)
    before = dict(runtime.CALLS)
    outs = []
    for swap in (False, True):
        layers = DecoderReplayLayers(16, _run_layers, h._no_layers, {"a"}, "a")
        if swap:
            layers.__class__ = m._swapped(DecoderReplayLayers, m.ReplayLayersMixin)
        layers.replay_batch = ReplayBatch(rows, _ctx(rows.numel()))
        outs.append(layers._run(*inputs))
    assert len(outs[0]) == 3
    for a, b in zip(*outs):
        assert a.dtype == b.dtype and torch.equal(a, b)
    # the pack's run: one gather per non-None input, one scatter per output
    assert runtime.CALLS["gather_rows"] - before.get("gather_rows", 0) == 6
    assert runtime.CALLS["scatter_rows"] - before.get("scatter_rows", 0) == 3


class _Runner:
    def __call__(self, *bufs):
        return _run_layers(*bufs[:4], None, *bufs[5:])


def _graphs(n_max):
    graphs = object.__new__(DecoderReplayCudaGraphManager)
    shapes = [t.shape[1:] if t is not None else (h.HC, 1) for t in _inputs(1)]
    dtypes = [t.dtype if t is not None else torch.float32 for t in _inputs(1)]
    graphs.input_buffers = [torch.zeros(n_max, *s, dtype=d) for s, d in zip(shapes, dtypes)]
    graphs.breakable_cg_runner = _Runner()
    return graphs


def test_replay_graph_row_gather_bit_identical(be):
    T, n_pad = 60, 48
    rows = torch.tensor([*range(3, 20), *range(40, 60)], dtype=torch.int64)
    inputs = list(_inputs(T, seed=1))
    inputs[4] = torch.zeros(T, h.HC, 1)  # graphs need every input
    outs = []
    for swap in (False, True):
        graphs = _graphs(64)
        if swap:
            graphs.__class__ = m._swapped(DecoderReplayCudaGraphManager, m.ReplayGraphsMixin)
        layers = DecoderReplayLayers(16, _run_layers, h._no_layers, {"a"}, "a")
        if swap:
            layers.__class__ = m._swapped(DecoderReplayLayers, m.ReplayLayersMixin)
        layers.replay_batch = ReplayBatch(rows, _ctx(n_pad), graphs.run)
        outs.append((layers._run(*inputs), [b.clone() for b in graphs.input_buffers]))
    (out_v, bufs_v), (out_p, bufs_p) = outs
    for a, b in zip(out_v, out_p):
        assert torch.equal(a, b)
    for a, b in zip(bufs_v, bufs_p):
        assert torch.equal(a[: rows.numel()], b[: rows.numel()])


# ---------------------------------------------------------------------------------------
# warmup
# ---------------------------------------------------------------------------------------


def _started(monkeypatch, be, batch, route):
    """The pack's model state on vLLM's (its metadata launches routed to ``be``) for the
    KV-cache groups of ``batch`` (None: the startup batch's), and vLLM's startup batch (a
    prefill without replay and four decodes): ``(startup, setup, state)``."""
    monkeypatch.setattr(runtime, "backend_for", lambda device: be)
    h.install_cpu_stubs(monkeypatch)
    h.route_to(be)
    startup = _cases.make_batch(np.random.default_rng(0), num_decodes=4, kinds=("cold",))
    setup = h.make_setup(startup if batch is None else batch, spec=0)
    state = h.make_state(m.model_state_class(h.VllmState), setup, {"swa_backends_route": route})
    return startup, setup, state


def test_warmup_covers_every_serving_launch(monkeypatch):
    """The pack's Triton kernels (interpreter): vLLM's startup (the first prepare_attn, on a
    batch that neither replays nor trims) launches every specialisation; a serving step with
    replay, trimming and the replay layers' row moves then launches no new one."""
    from swa_backends.kernels import _launch

    be = select("cpu", prefer="triton")
    serving = dict(_cases.mixed_batches(9))["mixed"]
    startup, setup, state = _started(monkeypatch, be, serving, m.Route(None, encoder=True, builders=True,
                                                                       decoder=True))
    _launch.LAUNCHED.clear()
    h.add_requests(state, startup)
    h.run_step(state, setup, startup)  # vLLM's first prepare_attn: warms up
    setup.layers.__class__ = m._swapped(DecoderReplayLayers, m.ReplayLayersMixin)
    warmed = set(_launch.LAUNCHED)
    assert {name.split(".")[0] for name, _ in warmed} >= {"pad_replayed_slots", "swa_indices_and_lens",
                                                         "prefill_gather_lens", "gather_replay_batch", "rows"}
    h.add_requests(state, serving)
    snap = h.run_step(state, setup, serving)
    assert snap["replay"] is not None
    setup.layers.run_layers = _run_layers
    setup.layers._run(*_inputs(serving.T))
    new = set(_launch.LAUNCHED) - warmed
    assert not new, f"launched after warmup: {sorted(new)}"


def test_warmup_on_rocm_compiles_the_prefill_attention(monkeypatch):
    """Where the pack turned encoder replay on (ROCm), vLLM's startup also compiles the pack's
    sparse_mla for the prefill attention: this shard's heads, D 512, bf16, with a sink."""
    be = select("cpu", prefer="triton")
    calls = []
    monkeypatch.setattr(be, "warmup", lambda ops=None, **kw: calls.append((ops, kw)) or [])
    startup, setup, state = _started(monkeypatch, be, None, m.Route(None, encoder=True, builders=True,
                                                                    decoder=True, rocm=True))
    setup.cfg.model_config.hf_text_config.num_attention_heads = 64
    setup.cfg.parallel_config.tensor_parallel_size = 4
    h.add_requests(state, startup)
    h.run_step(state, setup, startup)  # vLLM's first prepare_attn: warms up
    assert calls == [(("sparse_mla",), dict(num_heads=(16,), qk_head_dim=512, v_head_dim=512,
                                            attn_dtypes=(torch.bfloat16,), attn_sink=(True,)))]
