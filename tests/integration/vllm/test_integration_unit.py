"""The vLLM integration's pieces that need no vLLM: layering, the version gate and the
switch, the capability decision from a vLLM-shaped config, and the call-convention adapters
against the pack's own reference. Runs in the main suite too."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

import _cases
import _configs
from swa_backends import reference_backend, select
from swa_backends.integrations import vllm as integration
from swa_backends.integrations.vllm import config as icfg
from swa_backends.integrations.vllm import runtime


# ---------------------------------------------------------------------------------------
# layering
# ---------------------------------------------------------------------------------------


def test_importing_the_pack_imports_no_integration_and_no_vllm():
    """(tests/package/test_architecture.py checks the import direction in the source.)"""
    code = ("import sys, swa_backends, swa_backends.plugin; "
            "bad = sorted(m for m in sys.modules if m.startswith(('swa_backends.integrations', 'vllm'))); "
            "print(bad); assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert res.returncode == 0, res.stderr[-2000:]


# ---------------------------------------------------------------------------------------
# version gate and switch
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version,ok", [("0.33.0", True), ("0.33.1", True), ("0.33.1.dev12+gabc", True),
                                        ("0.33.0+cu130", True), ("0.32.2", False), ("0.34.0", True),
                                        ("0.34.1rc1", True), ("0.35.0", False), ("1.33.0", False), ("garbage", False), (None, False)])
def test_supported_versions_are_declared_once(version, ok):
    assert integration.supported(version) is ok
    assert integration.release_series(integration.TESTED_VLLM) in integration.RELEASES


@pytest.mark.parametrize("value,mode", [(None, "auto"), ("", "auto"), ("1", "auto"), ("0", "off"), ("off", "off"),
                                        ("False", "off"), ("force", "force")])
def test_env_switch(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv(integration.ENV, raising=False)
    else:
        monkeypatch.setenv(integration.ENV, value)
    assert integration.mode() == mode


@pytest.fixture
def fresh(monkeypatch, caplog):
    integration._reset_for_tests()
    caplog.set_level(logging.INFO, logger="vllm.swa_backends")
    yield caplog
    integration._reset_for_tests()


def test_switch_off_leaves_vllm_untouched(monkeypatch, fresh):
    monkeypatch.setenv(integration.ENV, "0")
    monkeypatch.setattr(integration, "vllm_version", lambda: pytest.fail("the switch is read first"))
    st = integration.install()
    assert not st.installed and st.mode == "off" and "plugin is off" in st.reason
    assert integration.install() is st
    assert [r.levelno for r in fresh.records] == [logging.INFO]


def test_unsupported_vllm_is_left_untouched_with_one_warning(monkeypatch, fresh):
    monkeypatch.delenv(integration.ENV, raising=False)
    monkeypatch.setattr(integration, "vllm_version", lambda: "0.35.2")
    st = integration.install()
    integration.install()
    assert not st.installed and st.vllm_version == "0.35.2" and "not a supported release" in st.reason
    assert "0.33.x, 0.34.x" in st.reason and st.release is None
    assert [r.levelno for r in fresh.records] == [logging.WARNING]


def test_no_vllm(monkeypatch, fresh):
    monkeypatch.setattr(integration, "vllm_version", lambda: None)
    st = integration.install()
    assert not st.installed and "not importable" in st.reason


def test_any_failure_is_one_warning(monkeypatch, fresh):
    def boom():
        raise RuntimeError("kaput")

    monkeypatch.setattr(integration, "_install", boom)
    st = integration.install()
    assert not st.installed and "kaput" in st.reason
    assert [r.levelno for r in fresh.records] == [logging.WARNING]


# ---------------------------------------------------------------------------------------
# the decision from a vLLM-shaped config
# ---------------------------------------------------------------------------------------


def test_serving_config_mapping(as_release):
    cfg = icfg.serving_config(_configs.vllm_config())
    assert cfg.model_runner == "v2" and cfg.graph_mode == "full_and_piecewise" and cfg.window == 128
    assert cfg.cut_layer == 20 and cfg.async_scheduling and not cfg.engram_after_cut and cfg.drafter_window is None
    cfg = icfg.serving_config(_configs.vllm_config(
        use_v2_model_runner=False, parallel_config__prefill_context_parallel_size=2,
        parallel_config__decode_context_parallel_size=4, parallel_config__data_parallel_size=2,
        parallel_config__use_ubatching=True, compilation_config__cudagraph_mode=_configs.CUDAGraphMode.FULL_DECODE_ONLY,
        scheduler_config__async_scheduling=False, lora_config=object(), kv_transfer_config=object(),
        model_config__hf_text_config__engram_layer_ids=[20]))
    has_v1 = as_release.RELEASE.startswith("0.33.")  # 0.34 removed model runner V1
    assert (cfg.model_runner, cfg.prefill_context_parallel_size, cfg.decode_context_parallel_size,
            cfg.data_parallel_size) == ("v1" if has_v1 else "v2", 2, 4, 2)
    assert cfg.microbatching and cfg.graph_mode == "decode_only" and not cfg.async_scheduling
    assert cfg.lora and cfg.kv_connector_owns_scheduling and cfg.engram_after_cut  # an Engram layer AT the cut counts
    assert cfg.kv_connector and not cfg.mega_moe and cfg.drafter == "none"
    assert icfg.serving_config(_configs.vllm_config(model_config__enforce_eager=True)).graph_mode == "none"
    sp = _configs.vllm_config(parallel_config__enable_expert_parallel=True, parallel_config__tensor_parallel_size=8,
                              parallel_config__data_parallel_size=2)
    assert icfg.serving_config(sp).sequence_parallel_moe
    sp.parallel_config.pipeline_parallel_size = 2  # 0.34's _use_sequence_parallel dropped its PP-1 condition
    assert icfg.sequence_parallel_moe(sp) is not has_v1


@pytest.mark.parametrize("draft,expected", [
    (None, None), (dict(window=128), 128), (dict(window=64), 64),
    (dict(window=256), 256), (dict(window=128, layer_types=("full_attention",)), 65536), (dict(window=None), 65536)])
def test_drafter_window(draft, expected):
    spec = None if draft is None else _configs.drafter(**draft)
    assert icfg.serving_config(_configs.vllm_config(speculative_config=spec)).drafter_window == expected


@pytest.mark.parametrize("method,kind", [
    ("dspark", "dspark"), ("mtp", "mtp"), ("deepseek_mtp", "mtp"), ("eagle", "eagle"), ("eagle3", "eagle3"),
    ("dflash", "dflash"), ("draft_model", "draft_model"), ("ngram", "ngram"), ("ngram_gpu", "ngram"),
    ("suffix", "suffix"), ("custom_class", "other"), ("extract_hidden_states", "other"), (None, "other")])
def test_drafter_kind(method, kind):
    cfg = icfg.serving_config(_configs.vllm_config(speculative_config=_configs.drafter(method=method)))
    assert cfg.drafter == kind and cfg.drafter_window == 128


def test_ngram_drafter_has_no_window_and_keeps_decoder_replay():
    """An n-gram drafter has no draft model (no hidden states read): no window to judge, so
    decoder replay stays on; a DSpark drafter without a draft model config is an unknown window."""
    from types import SimpleNamespace

    def decide(method):
        spec = SimpleNamespace(method=method, draft_model_config=None)
        return icfg.decide(_configs.vllm_config(speculative_config=spec), "cuda:sm90", platform="cuda")

    ngram = decide("ngram")
    assert (ngram.config.drafter, ngram.config.drafter_window) == ("ngram", None)
    assert ngram.capabilities.decoder_replay.enabled, ngram.capabilities.decoder_replay.reasons
    bare = decide("dspark")
    assert [r.split("]")[0] for r in bare.capabilities.decoder_replay.reasons] == ["[drafter-window-unknown"]


@pytest.mark.parametrize("backend,mega", [("auto", False), ("triton", False), ("deep_gemm", False),
                                          ("deep_gemm_mega_moe", True), ("flashinfer_moe_ep_cutedsl", True),
                                          ("flashinfer_moe_ep_mega_deep_gemm", True), ("aiter_mega_moe", True)])
def test_mega_moe(backend, mega):
    assert icfg.serving_config(_configs.vllm_config(kernel_config__moe_backend=backend)).mega_moe is mega


def test_pcp_refusals_become_reasons():
    """vLLM refuses PCP with a KV connector, a drafter, microbatching or MegaMoE; the pack's
    decision says which, from the same config (SPEC §4)."""
    pcp = dict(parallel_config__prefill_context_parallel_size=2, model_config__enforce_eager=True,
               scheduler_config__async_scheduling=False)
    for over, rule in ((dict(kv_transfer_config=object()), "pcp-connector"),
                       (dict(speculative_config=_configs.drafter()), "pcp-drafter"),
                       (dict(parallel_config__use_ubatching=True), "pcp-microbatching"),
                       (dict(kernel_config__moe_backend="deep_gemm_mega_moe"), "pcp-megamoe")):
        d = _decide(**pcp, **over)
        assert not d.capabilities.encoder_replay.enabled
        assert [r for r in d.capabilities.encoder_replay.reasons if r.startswith(f"[{rule}]")], over


def test_ascend_decision_from_a_vllm_config(as_release):
    """On an Ascend row the same config gives vllm-ascend's gate: model runner v2, graph mode
    NONE or FULL_DECODE_ONLY, DSpark only."""
    ok = dict(compilation_config__cudagraph_mode=_configs.CUDAGraphMode.FULL_DECODE_ONLY)
    assert _decide("ascend:910b", platform="other", **ok).capabilities.decoder_replay.enabled
    v1 = ((dict(use_v2_model_runner=False), "[ascend-runner]"),) if as_release.RELEASE.startswith("0.33.") else ()
    for over, rule in (*v1,
                       (dict(speculative_config=_configs.drafter(method="eagle")), "[ascend-drafter]"),
                       (dict(compilation_config__cudagraph_mode=_configs.CUDAGraphMode.PIECEWISE), "[ascend-graph]")):
        caps = _decide("ascend:910b", platform="other", **{**ok, **over}).capabilities
        assert any(r.startswith(rule) for r in caps.decoder_replay.reasons), (over, caps.decoder_replay.reasons)


def _decide(device="cuda:sm90", platform="cuda", **over):
    return icfg.decide(_configs.vllm_config(**over), device, platform=platform)


def test_decide_default_both_on():
    d = _decide()
    assert d.capabilities.encoder_replay.enabled and d.capabilities.decoder_replay.enabled
    assert d.vllm_encoder and d.encoder and d.must_keep_encoder is None
    assert d.as_dict()["serving_config"]["window"] == 128


def test_decide_pack_off_where_vllm_is_on():
    d = _decide(parallel_config__decode_context_parallel_size=2)
    assert d.vllm_encoder and not d.capabilities.encoder_replay.enabled and not d.encoder
    assert any("decode context parallel" in r for r in d.capabilities.encoder_replay.reasons)
    assert not d.capabilities.decoder_replay.enabled and d.must_keep_encoder is None


def test_decide_pcp_with_prefix_caching_cannot_turn_encoder_off():
    d = _decide(parallel_config__prefill_context_parallel_size=2)
    assert not d.capabilities.encoder_replay.enabled  # graphs and async scheduling under PCP
    assert d.must_keep_encoder and "prefix caching" in d.must_keep_encoder
    eager = _decide(parallel_config__prefill_context_parallel_size=2, model_config__enforce_eager=True,
                    scheduler_config__async_scheduling=False)
    assert eager.capabilities.encoder_replay.enabled and eager.encoder
    assert not eager.capabilities.decoder_replay.enabled  # the pack keeps decoder trimming off under PCP


def test_decide_vllm_off_on_rocm_pack_on(rocm_turn_on):
    d = _decide(device="rocm:gfx942", platform="rocm")
    assert d.capabilities.encoder_replay.enabled and not d.vllm_encoder and not d.encoder
    assert "ROCm" in d.vllm_encoder_reason
    assert d.vllm_off_for_rocm_only and d.encoder_on_rocm is None  # the pack turns it on after the build
    shown = d.as_dict()
    assert shown["pack_turns_encoder_on_on_rocm"] and shown["encoder_on_rocm_blocked_by"] is None


@pytest.mark.parametrize("over,needle", [
    (dict(speculative_config=_configs.drafter()), "drafter"),
    (dict(parallel_config__decode_context_parallel_size=2), "the pack turns encoder replay off"),
])
def test_decide_rocm_turn_on_blocked(rocm_turn_on, over, needle):
    d = _decide(device="rocm:gfx950", platform="rocm", **over)
    assert d.vllm_off_for_rocm_only and needle in d.encoder_on_rocm
    assert not d.as_dict()["pack_turns_encoder_on_on_rocm"]


@pytest.mark.parametrize("over", [dict(use_v2_model_runner=False), dict(cache_config__swa_bounded_replay=False)])
def test_decide_rocm_other_vllm_reasons_stand(as_release, over):
    """vLLM's other reasons for off (model runner v1, the flag off) are not ROCm's: never overridden."""
    if "use_v2_model_runner" in over and not as_release.RELEASE.startswith("0.33."):
        pytest.skip(f"vLLM {as_release.RELEASE} has model runner V2 only")
    d = _decide(device="rocm:gfx942", platform="rocm", **over)
    assert not d.vllm_encoder and not d.vllm_off_for_rocm_only and d.encoder_on_rocm is not None


@pytest.mark.parametrize("over,needle", [
    (dict(model_config__hf_text_config__engram_layer_ids=[30]), "Engram"),
    (dict(speculative_config=_configs.drafter(window=256)), "drafter window"),
    (dict(parallel_config__use_ubatching=True), "microbatching"),
    (dict(use_v2_model_runner=False), "requires encoder replay"),
])
def test_decide_decoder_off(as_release, over, needle):
    if "use_v2_model_runner" in over and not as_release.RELEASE.startswith("0.33."):
        pytest.skip(f"vLLM {as_release.RELEASE} has model runner V2 only")
    d = _decide(**over)
    assert not d.capabilities.decoder_replay.enabled
    assert any(needle in r for r in d.capabilities.decoder_replay.reasons), d.capabilities.decoder_replay.reasons


def test_decide_v1_runner(with_v1):
    d = _decide(use_v2_model_runner=False)
    assert not d.vllm_encoder and not d.capabilities.encoder_replay.enabled


def test_decide_rocm_from_0_34(as_release):
    """From vLLM 0.34 its attention layer keeps encoder replay on on ROCm for CDNA 3 and 4 (gfx942,
    gfx950), with its own clamped prefill attention: the pack routes the replay metadata there as
    on CUDA and never turns encoder replay on itself."""
    if as_release.config.PACK_TURNS_ROCM_ENCODER_ON:
        pytest.skip(f"vLLM {as_release.RELEASE} keeps encoder replay off on ROCm (the pack turns it on)")
    for arch in ("gfx942", "gfx950"):
        d = _decide(device=f"rocm:{arch}", platform="rocm")
        assert d.vllm_encoder and d.encoder and d.vllm_encoder_reason is None and not d.vllm_off_for_rocm_only
        assert d.capabilities.decoder_replay.enabled
    # another ROCm arch: vLLM's own "off", which the pack never overrides
    assert icfg.vllm_encoder_replay(_configs.vllm_config(), platform="rocm", arch="gfx90a") == (
        False, as_release.config.rocm_replay_off("gfx90a"))
    assert "CDNA 3 and 4" in as_release.config.rocm_replay_off("gfx90a")
    d = _decide(device="rocm:gfx942", platform="rocm", speculative_config=_configs.drafter())
    assert d.vllm_encoder and not d.vllm_off_for_rocm_only  # a drafter no longer matters to vLLM's ROCm gate


# ---------------------------------------------------------------------------------------
# the adapters against the pack's reference on the whole batch (no vLLM kernel involved)
# ---------------------------------------------------------------------------------------


BACKENDS = ["reference", "triton"]


@pytest.mark.parametrize("variant", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_swa_rows_with_token_offset_equal_the_whole_batch(variant, seed):
    """vLLM writes decode rows (offset 0) and prefill rows (offset D) into two buffers; the
    adapter shifts query_start_loc. Together they equal the op over the whole batch."""
    be = select("cpu", prefer=variant)
    ref = reference_backend()
    for name, b in _cases.mixed_batches(seed):
        N, D = b.T_pad, b.num_decode_tokens
        valid = b.slots[1] >= 0
        want_idx, want_lens = ref.swa_indices_and_lens(b.qsl, b.seq, b.block_tables[1], b.block_size, b.W, b.R_t,
                                                       valid=valid, num_tokens=N)
        for off, n in ((0, D), (D, N - D)):
            buf = torch.full((N + 2, 1, b.W), 77, dtype=torch.int32)
            lens = torch.full((N + 2,), 77, dtype=torch.int32)
            assert runtime.swa_indices_and_lens(be, buf, lens, b.W, b.W, b.qsl, b.seq, valid, b.block_tables[1],
                                                b.block_size, b.R_t, num_tokens=n, token_offset=off)
            assert torch.equal(buf[:n, 0], want_idx[off: off + n]), name
            assert torch.equal(lens[:n], want_lens[off: off + n]), name
            assert (buf[n:] == 77).all() and (lens[n:] == 77).all()


def test_swa_rows_layout_check():
    buf = torch.zeros(8, 2, 16, dtype=torch.int32)
    assert runtime.swa_rows(buf, 4, 16) is None  # not [N, 1, W]
    assert runtime.swa_rows(torch.zeros(8, 1, 16, dtype=torch.int32), 4, 12) is None  # width mismatch
    assert runtime.swa_rows(torch.zeros(8, 1, 16, dtype=torch.int32), 4, 16).shape == (4, 16)


@pytest.mark.parametrize("variant", BACKENDS)
def test_gather_into_a_strided_persistent_buffer(variant):
    """vLLM's ``_kept_slot_mappings`` is [G, max_tokens]; the adapter writes vLLM's own
    [:, :n_pad] view of it (row-strided), as vLLM's kernel does. The sub-batch equals the
    pack's own plan on the batch, and nothing outside the view is written."""
    be = select("cpu", prefer=variant)
    b = dict(_cases.mixed_batches(0))["mixed"]
    kept = b.kept_lens
    n = int(kept.sum())
    G = b.slots.shape[0]
    big = torch.full((G, 4096), 5, dtype=torch.int64)
    view = big[:, : n + 2]
    assert view.stride() == (4096, 1) and view.data_ptr() == big.data_ptr()
    plan = runtime.replay_plan(kept, b.qsl_np, n + 2, b.W)
    out = {"rows": torch.empty(n + 2, dtype=torch.int64), "query_start_loc": torch.empty(b.B_all + 1, dtype=torch.int32),
           "positions": torch.empty(n + 2, dtype=torch.int64), "slot_mappings": view,
           "kv_start": torch.empty(b.B_all, dtype=torch.int32)}
    runtime.gather_replay_batch(be, plan, b.qsl, b.seq, b.R_t, b.positions, b.slots, b.W, out)
    want = reference_backend().gather_replay_batch(plan, b.qsl, b.seq, b.R_t, b.positions, b.slots, b.W)
    for key in out:
        assert torch.equal(out[key], getattr(want, key)), key
    assert (big[:, n + 2:] == 5).all()  # nothing written past the view
    dropped = torch.from_numpy(runtime.dropped_before(kept, b.qsl_np))
    assert torch.equal(plan.dropped_before, dropped)
    assert torch.equal(dropped[1:] > dropped[:-1], plan.trimmed)  # what the kernels derive trimmed from


@pytest.mark.parametrize("variant", BACKENDS)
def test_warm_up_launches_each_op(variant):
    be = select("cpu", prefer=variant)
    ran = runtime.warm_up(be, "cpu", pad=True, swa=True, gather_lens=True, gather=True, step=True, num_groups=3,
                          window=16, block_size=8, rows=(((64,), torch.bfloat16), ((), torch.int64)))
    assert ran == ["pad_replayed_slots", "swa_indices_and_lens", "prefill_gather_lens", "gather_replay_batch",
                   "prepare_replay_step", "gather_rows", "scatter_rows"]


def _pad_call(be, b, slots):
    runtime.pad_replayed_slots(be, slots, torch.tensor(sorted(b.cacheable), dtype=torch.int32), b.qsl, b.positions,
                               b.R_t, b.W, b.num_reqs)


def test_a_held_pad_runs_when_no_step_launch_takes_it():
    """The open step holds vLLM's pad call for its one launch; if that launch never comes, the
    pad still runs (at ``flush_step`` / ``end_step``), before anything reads the slots, and a
    second pad call in the same step runs after the held one (the calls keep their order)."""
    be = select("cpu", prefer="reference")
    b = dict(_cases.mixed_batches(0))["mixed"]
    want = b.slots.clone()
    _pad_call(be, b, want)  # no step open: it runs at once
    assert not torch.equal(want, b.slots)
    for close in (runtime.flush_step, runtime.end_step):
        slots = b.slots.clone()
        runtime.begin_step()
        try:
            _pad_call(be, b, slots)
            assert torch.equal(slots, b.slots)  # held
            close()
            assert torch.equal(slots, want)
        finally:
            runtime.end_step()
    slots, second = b.slots.clone(), b.slots.clone()
    runtime.begin_step()
    try:
        _pad_call(be, b, slots)
        _pad_call(be, b, second)  # the held one launches first, then this one
        assert torch.equal(slots, want) and torch.equal(second, want)
    finally:
        runtime.end_step()


def test_an_answer_matches_only_its_own_call():
    """``prepare_step`` answers a later call only when the call writes into the step's own
    buffer (matched by address: vLLM hands a fresh slice of it) and reads the inputs the step
    read (the same tensor objects, or others at the same address); another buffer, other
    inputs, other sizes or another dtype launch as before. What an answered call finds is what
    the pack's op writes for it."""
    be = select("cpu", prefer="reference")
    b = dict(_cases.mixed_batches(0))["mixed"]
    W, B, T, D, d = b.W, b.num_reqs, b.T, b.num_decode_tokens, b.num_decodes
    P = B - d
    rs, table, i32 = b.R_t[:B], b.block_tables[1], torch.int32
    dec, pre = torch.full((T, 1, W), -7, dtype=i32), torch.full((T, 1, W), -7, dtype=i32)
    lens = torch.full((T,), -7, dtype=i32), torch.full((T,), -7, dtype=i32)
    target = runtime.WindowTarget(1, table, b.block_size, W, d, D, dec[:, 0], lens[0], pre[:, 0], lens[1])
    n = B + 1
    scratch = {"arange": torch.arange(n, dtype=i32), "ones": torch.ones(n, dtype=torch.bool),
               "replay_start": torch.zeros(n, dtype=i32), "stale_replay": torch.zeros(n, dtype=i32),
               "gather_lens": torch.zeros(n, dtype=i32), "no_groups": torch.zeros(0, dtype=i32), "views": {}}
    want_rows, want_lens = be.swa_indices_and_lens(b.qsl, b.seq[:B], table, b.block_size, W, rs, index_width=W,
                                                   valid=b.slots[1] >= 0, num_tokens=T)
    want_gl = be.prefill_gather_lens(b.qsl[d:], b.seq[d:B], rs[d:], W)
    assert 0 < D < T and P > 0
    runtime.begin_step()
    try:
        assert runtime.prepare_step(be, target, b.qsl, b.seq[:B], b.positions[:T], b.slots.clone(), rs, B, T, scratch)
        answered = runtime.answered_swa
        assert answered(dec, b.qsl, rs, table, D, 0)  # the persistent buffer itself, the step's inputs
        assert answered(pre[: T - D], b.qsl[:], rs[:], table[:], T - D, D)  # slices: other objects, same addresses
        assert torch.equal(dec[:D, 0], want_rows[:D]) and torch.equal(lens[0][:D], want_lens[:D])
        assert torch.equal(pre[: T - D, 0], want_rows[D:]) and torch.equal(lens[1][: T - D], want_lens[D:])
        assert not answered(pre, b.qsl, rs, table, D, 0)  # another builder's buffer
        assert not answered(dec, b.qsl.clone(), rs, table, D, 0)
        assert not answered(dec, b.qsl, rs.clone(), table, D, 0)
        assert not answered(dec, b.qsl, rs, b.block_tables[0], D, 0)
        assert not answered(dec, b.qsl, rs, table, D - 1, 0)
        assert not answered(pre, b.qsl, rs, table, T - D, D - 1)
        gl = torch.empty(P, dtype=i32)
        assert runtime.answered_gather_lens(gl, b.qsl, rs, P, d, W) and torch.equal(gl, want_gl)
        for args in ((torch.empty(P, dtype=i32), b.qsl.clone(), rs, P, d, W),
                     (torch.empty(P, dtype=i32), b.qsl, rs.clone(), P, d, W),
                     (torch.empty(P, dtype=torch.int64), b.qsl, rs, P, d, W),
                     (torch.empty(P + 1, dtype=i32), b.qsl, rs, P, d, W),
                     (torch.empty(P, dtype=i32), b.qsl, rs, P, d, W + 1)):
            assert not runtime.answered_gather_lens(*args)
    finally:
        runtime.end_step()
    assert not runtime.answered_swa(dec, b.qsl, rs, table, D, 0)  # the step is closed


def test_predicted_kept_is_vllms_trim_rule():
    """``runtime.predicted_kept`` against vLLM 0.33's rule written out (``_prepare_replay_batch``
    without PCP: a request keeping its rows keeps all, every other request its last ``W``;
    eagerly no sub-batch unless a prefill not keeping rows is longer than ``W``; forced
    (PIECEWISE breaking out) a sub-batch whenever a request prefills), on random batches;
    ``keeps_rows=None`` is the same as no request keeping rows. Batch sizes on both sides of
    ``runtime.SMALL_BATCH`` (Python lists below it, numpy above)."""
    import numpy as np

    rng = np.random.default_rng(11)
    W = 8
    for _ in range(400):
        B = int(rng.integers(1, 3 * runtime.SMALL_BATCH))
        q = rng.integers(1, 3 * W, B).astype(np.int32)
        pre = rng.random(B) < 0.6
        keeps = rng.random(B) < rng.choice([0.0, 0.3])
        want_kept = np.where(keeps, q, np.minimum(q, W))
        lens = runtime.query_lens(np.concatenate([[0], np.cumsum(q)]).astype(np.int32), B)
        assert isinstance(lens, list) == (B <= runtime.SMALL_BATCH) and np.array_equal(np.asarray(lens), q)
        for forced in (False, True):
            if forced:
                want = want_kept if pre.any() else None
            else:
                want = want_kept if ((q > W) & pre & ~keeps).any() else None
            got = runtime.predicted_kept(lens, keeps, pre, W, forced=forced)
            assert (got is None) == (want is None) and (got is None or np.array_equal(got, want)), (q, pre, keeps)
            assert got is None or got.dtype == np.int32
            if not keeps.any():
                none = runtime.predicted_kept(lens, None, pre, W, forced=forced)
                assert (none is None) == (want is None) and (none is None or np.array_equal(none, want))


def test_a_step_is_per_thread():
    """A step opened on one thread holds nothing of another thread's calls."""
    import threading

    be = select("cpu", prefer="reference")
    b = dict(_cases.mixed_batches(0))["mixed"]
    slots = b.slots.clone()
    runtime.begin_step()
    try:
        t = threading.Thread(target=_pad_call, args=(be, b, slots))
        t.start()
        t.join()
        assert not torch.equal(slots, b.slots)  # padded on the other thread at once
    finally:
        runtime.end_step()


def test_hot_path_validation_is_off_unless_asked(monkeypatch):
    """``backend_for`` selects an unchecked backend (no validation, whatever the process
    switch says) unless ``SWA_BACKENDS_VALIDATE`` is true; ``"cuda"``-style names without an
    index share one backend per device."""
    from swa_backends import validation_enabled

    i32 = torch.int32
    # query_start_loc starting below 0: validation rejects it; the kernel reads only differences
    bad = (torch.tensor([-2, 1], dtype=i32), torch.tensor([3], dtype=i32), torch.tensor([0], dtype=i32), 4)
    for validate in (False, True):
        monkeypatch.setattr(runtime, "VALIDATE", validate)
        be = runtime.backend_for("cpu")
        assert be.checked is validate and runtime.backend_for(torch.device("cpu")) is be
        assert validation_enabled()  # the process switch is on either way
        if validate:
            with pytest.raises(ValueError, match="prefill_gather_lens: query_start_loc"):
                be.prefill_gather_lens(*bad)
        else:
            assert be.prefill_gather_lens(*bad).tolist() == [3]
            assert be.prefill_gather_lens(*bad).tolist() == [3]  # the loaded variant itself, from now on
    assert "unchecked" in repr(select("cpu", checked=False))
    with pytest.raises(ValueError, match="select: checked=1"):
        select("cpu", checked=1)


def test_register_never_raises(monkeypatch, caplog):
    """vLLM calls register() in every process: a failure to define the custom ops (e.g. a
    torch whose schema parser rejects one) is one warning, and the vLLM integration still
    installs."""
    import swa_backends
    from swa_backends import plugin

    monkeypatch.setattr(plugin, "_registered", None)
    monkeypatch.delattr(swa_backends, "torch_ops", raising=False)
    monkeypatch.setitem(sys.modules, "swa_backends.torch_ops", None)  # its import raises ImportError
    installs = []
    monkeypatch.setattr(plugin, "_install_vllm", lambda: installs.append(1))
    caplog.set_level(logging.WARNING, logger=plugin.logger.name)
    assert plugin.register() == () and plugin.register() == ()
    assert installs == [1]
    assert sum("defining torch.ops.swa_backends failed" in r.getMessage() for r in caplog.records) == 1


def test_a_shim_keeps_its_backend_until_the_route_changes():
    """The shim keeps the backend of its last routed call (no device parsing per call) and
    asks the route again when the route or the device changes."""
    from swa_backends.testing.vllm_shims import routed_shims

    asked = []
    ref, tri = select("cpu", prefer="reference"), select("cpu", prefer="triton")
    route_a = lambda device: asked.append(("a", device)) or ref  # noqa: E731
    with routed_shims(route_a) as shims:
        shim = shims["swa_indices_and_lens"]
        dev = torch.device("cpu")
        assert shim._backend(dev) is ref and shim._backend(torch.device("cpu")) is ref
        assert asked == [("a", dev)]
        assert shim._backend(torch.device("meta")) is ref and len(asked) == 2  # another device: asked again
        from swa_backends.integrations.vllm import patches

        patches._routes["swa_indices_and_lens"] = lambda device: tri
        assert shim._backend(dev) is tri  # another route
        patches._routes["swa_indices_and_lens"] = None
        assert shim._backend(dev) is None  # route off: vLLM's kernel


def test_host_helpers_equal_numpy_and_dataclasses():
    """The model state's per-step host helpers give what the calls they stand for give:
    ``kept_query_start_loc`` = vLLM's ``np.zeros`` + ``np.cumsum`` (both sides of
    :data:`runtime.SMALL_BATCH`), ``same_lens`` = ``np.array_equal`` (dtypes, shapes, values),
    ``replaced`` = ``dataclasses.replace`` (field for field, an attribute set after construction
    left out as ``replace`` leaves it; a class with ``__post_init__``, ``__slots__`` or an
    ``init=False`` field, or a change that is not a field, through ``replace`` itself)."""
    import dataclasses

    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(200):
        B = int(rng.integers(0, 3 * runtime.SMALL_BATCH))
        kept = rng.integers(0, 300, B).astype(rng.choice([np.int32, np.int64]))
        want = np.zeros(B + 1, dtype=np.int32)
        np.cumsum(kept, out=want[1:])
        got = runtime.kept_query_start_loc(kept)
        assert got.dtype == np.int32 and np.array_equal(got, want)
        other = kept.copy()
        if B and rng.random() < 0.5:
            other[int(rng.integers(0, B))] += 1
        if rng.random() < 0.3:
            other = other.astype(np.int64 if other.dtype == np.int32 else np.int32)
        if rng.random() < 0.2:
            other = other[: max(B - 1, 0)]
        assert runtime.same_lens(kept, other) == np.array_equal(kept, other)

    @dataclasses.dataclass
    class Plain:
        a: int
        b: list
        c: object = None
        d: list = dataclasses.field(default_factory=list)

    x = Plain(1, [2], d=[3])
    x.cached = "set after construction"
    y = runtime.replaced(x, a=5, c="c")
    z = dataclasses.replace(x, a=5, c="c")
    assert type(y) is Plain and vars(y) == vars(z) and y.b is x.b and y.d is x.d and not hasattr(y, "cached")

    @dataclasses.dataclass
    class Post(Plain):
        def __post_init__(self):
            self.d = self.d + ["post"]

    @dataclasses.dataclass
    class NoInit(Plain):
        e: int = dataclasses.field(default=7, init=False)

    @dataclasses.dataclass(slots=True)
    class Slotted:
        a: int
        b: int = 0

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        a: int
        b: int = 0

    for obj in (Post(1, [2]), NoInit(1, [2]), Slotted(1), Frozen(1)):
        assert runtime.replaced(obj, a=9) == dataclasses.replace(obj, a=9)
    with pytest.raises(TypeError):
        runtime.replaced(x, not_a_field=1)  # dataclasses.replace's own error


def test_a_plan_from_kept_is_the_dataclass_it_constructs():
    """``ReplayPlan.from_kept`` fills the frozen dataclass's fields straight into its
    ``__dict__``: every field is set, to what the constructor would hold, for lists and arrays
    of other dtypes alike; its three host tensors are made on first use, once each (the sizes
    and the longest kept run read none of them)."""
    import dataclasses

    import numpy as np

    from swa_backends.common.types import ReplayPlan

    qsl = np.array([0, 1, 300, 302, 700], dtype=np.int32)
    for kept, pre in (([1, 128, 2, 128], [False, True, True, True]),
                      (np.array([1, 128, 2, 128], dtype=np.int64), np.array([0, 1, 1, 1])),
                      (np.array([1, 128, 2, 128], dtype=np.int32), np.array([False, True, True, True])),
                      (np.array([1, 128, 2, 128], dtype=np.int32), None)):
        dev = torch.arange(5, dtype=torch.int32)
        plan = ReplayPlan.from_kept(kept, qsl, 300, 128, device_dropped_before=dev, is_prefilling=pre)
        lazy = {"kept", "trimmed", "dropped_before"}
        assert set(vars(plan)) == {f.name for f in dataclasses.fields(ReplayPlan)} - lazy | {"_host"}
        assert (plan.num_reqs, plan.longest_kept()) == (4, 128) and not lazy & set(vars(plan))
        with pytest.raises(AttributeError, match="no attribute 'kept_lens'"):
            plan.kept_lens  # noqa: B018 - an unknown name is not made
        assert plan.kept is plan.kept and plan.trimmed is plan.trimmed and plan.dropped_before is plan.dropped_before
        assert set(vars(plan)) == {f.name for f in dataclasses.fields(ReplayPlan)} | {"_host"}
        dropped = qsl - np.concatenate([[0], np.cumsum(kept)])
        want = ReplayPlan(torch.tensor(np.asarray(kept), dtype=torch.int32),
                          torch.from_numpy(dropped[1:] > dropped[:-1]), torch.tensor(dropped, dtype=torch.int32),
                          int(np.sum(kept)), 300, 128,
                          None if pre is None else torch.tensor(np.asarray(pre), dtype=torch.bool))
        for f in ("kept", "trimmed", "dropped_before", "prefilling"):
            a, b = getattr(plan, f), getattr(want, f)
            assert (a is None) == (b is None) and (a is None or (a.dtype == b.dtype and torch.equal(a, b))), f
        assert (plan.num_rows, plan.num_rows_padded, plan.window) == (want.num_rows, 300, 128)
        assert plan.trimmed.tolist() == [False, True, False, True]
        assert plan.device_dropped_before(torch.device("cpu")) is dev and plan._launch_cache == {}
        with pytest.raises(dataclasses.FrozenInstanceError):
            plan.num_rows = 0
    # a plan whose tensors are not made yet copies, pickles and is replaced as any other
    import copy
    import pickle

    fresh = ReplayPlan.from_kept(np.array([1, 128, 2, 128], dtype=np.int32), qsl, 300, 128)
    for other in (copy.copy(fresh), pickle.loads(pickle.dumps(fresh)),
                  dataclasses.replace(fresh, num_rows_padded=301)):
        assert other.kept.tolist() == [1, 128, 2, 128] and other.trimmed.tolist() == [False, True, False, True]
        assert other.dropped_before.tolist() == [0, 0, 171, 171, 441] and other.num_reqs == 4
        assert other.longest_kept() == 128
    assert "kept=tensor([  1, 128,   2, 128]" in repr(fresh)
