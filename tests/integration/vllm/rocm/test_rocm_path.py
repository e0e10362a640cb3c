"""Encoder replay through vLLM's ROCm DeepSeek-V4.1 path, on a faked gfx942 / gfx950.

vLLM 0.33 builds encoder replay off on ROCm. The pack turns it on (``model._encoder_on_rocm``) when
everything that makes or reads the clamped window runs through it; this file checks, with
vLLM's own ROCm modules imported (``conftest.py`` fakes the arch):

* the ROCm patch (``rocm_sparse_attn_prefill``) applies against the installed vLLM, and the
  vLLM code the integration relies on there is the pinned one;
* the pack's consumer equals vLLM's ROCm Triton prefill kernel on random calls (PAD holes,
  short and empty rows, a sink longer than the local heads, d_v 448 and 512), and on gfx950
  the >= 1024-query calls go to AITER's OPUS prefill (its contract double) on CSR;
* after a prefix hit, vLLM's ROCm prefill (``DeepseekV41ROCMAiterMLAAttention._forward_prefill``,
  run for real: its dequantizing gather of the V4 records, ``combine_topk_swa_indices``, the
  consumer) over the metadata vLLM's ROCm SWA builder makes through the pack gives the replayed
  and the new tokens the cold run's output over the same clamped window, bit for bit, with
  every window-cache block below the replay start poisoned;
* the model class turns encoder replay on in the window caches vLLM built (their KV-cache spec
  then replays), and leaves it off, with the reason, where it cannot (0.33); with 0.34, which
  keeps encoder replay on on CDNA 3 and 4 itself, it routes the replay metadata and switches
  nothing.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import textwrap
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.models.deepseek_v41.amd import rocm as amd_rocm  # noqa: E402
from vllm.models.deepseek_v41.common.ops import cache_utils  # noqa: E402
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache  # noqa: E402
from vllm.v1.attention.ops import rocm_aiter_mla_sparse as vllm_ops  # noqa: E402
from vllm.v1.worker import workspace  # noqa: E402

import _cases  # noqa: E402
import _configs  # noqa: E402
import _vllm_harness as h  # noqa: E402
from swa_backends import select  # noqa: E402
from swa_backends.common.ops import _records as R  # noqa: E402
from swa_backends.integrations.vllm import config as icfg  # noqa: E402
from swa_backends.integrations.vllm import runtime  # noqa: E402
from swa_backends.testing.emulation import rocm as rocm_em  # noqa: E402
from _release import installed  # noqa: E402

release = installed()  # the installed vLLM's release subpackage (skips this module where there is none)
m, patches = release.model, release.patches

ARCH = os.environ["SWA_TEST_FAKE_GCN"]
DEVICE = f"rocm:{ARCH}"
FP8 = "e4m3fnuz" if ARCH == "gfx942" else "e4m3fn"  # vLLM's SWA cache: FNUZ on gfx942 only
D, NOPE, ROPE = 512, 448, 64


pytestmark = pytest.mark.usefixtures("clean_integration")


@pytest.fixture
def be(monkeypatch):
    """The faked device's backend (as runtime.backend_for would select it there), its AITER
    double installed."""
    with rocm_em.contract_doubles(DEVICE):
        backend = select(DEVICE, checked=False)
        monkeypatch.setattr(runtime, "backend_for", lambda device: backend)
        yield backend


def test_the_fake_is_the_arch():
    from vllm.platforms import rocm

    assert (rocm._ON_GFX942, rocm._ON_GFX950) == (ARCH == "gfx942", ARCH == "gfx950")


def test_every_patch_applies_on_rocm_and_restores():
    status = patches.apply(platform="rocm")
    assert status == {p.name: "applied" for p in patches.PATCHES}, status
    assert isinstance(amd_rocm.rocm_sparse_attn_prefill, patches.RocmSparsePrefillShim)
    patches.restore()
    assert amd_rocm.rocm_sparse_attn_prefill is vllm_ops.rocm_sparse_attn_prefill


def _source_hash(obj) -> str:
    return hashlib.sha256(textwrap.dedent(inspect.getsource(obj)).encode()).hexdigest()[:16]


def test_the_rocm_seams_are_the_pinned_ones():
    """The release's seams on ROCm (the call site, the replaced function, the flag the pack sets
    and the spec reading it, the ROCm SWA builder, ...) read from the live objects -- vLLM's ROCm
    modules import here, on the faked arch -- and through the unchanged files: what
    ``install()`` checks on ROCm."""
    import importlib

    from swa_backends.integrations.vllm import seams

    table = release.seams
    for module in dict.fromkeys(s.module for s in table.SEAMS if s.platform == "rocm"):
        importlib.import_module(module)
    assert seams.check(table.SEAMS, platform="rocm", live=True) == []
    assert seams.check(table.SEAMS, files=table.FILES, platform="rocm") == []


#: the launch :func:`_vllm_prefill` restates (on a mismatch: read vLLM's diff, adapt it, update the hash)
MIRRORED = {"vllm_ops._rocm_sparse_attn_prefill_ragged_triton": "08bcd3db8116a63d"}


@pytest.mark.parametrize("path", sorted(MIRRORED))
def test_the_mirrored_launch_is_vllms(path):
    head, *rest = path.split(".")
    obj = {"vllm_ops": vllm_ops}[head]
    for part in rest:
        obj = getattr(obj, part)
    assert _source_hash(obj) == MIRRORED[path], f"{path}: {_source_hash(obj)}"


# ---------------------------------------------------------------------------------------
# the consumer against vLLM's ROCm prefill kernel
# ---------------------------------------------------------------------------------------


def _vllm_prefill(q, kv, indices, lens, scale, sink, out):
    """vLLM's ``rocm_sparse_attn_prefill`` Triton path (``_rocm_sparse_attn_prefill_triton`` ->
    ``_rocm_sparse_attn_prefill_ragged_triton``) on CPU tensors: its wrapper asserts a GPU
    tensor, so the launch is repeated here (MIRRORED above); vLLM's CSR builder and kernel run as
    they are. fp32 tensors: Triton 3.8's interpreter (vLLM 0.33's) returns garbage from this
    kernel in bf16 (|out| ~ 5e8 where the reference gives ~0.1), exact agreement in fp32."""
    T, H, _ = q.shape
    kv = kv.squeeze(1)
    rag, ptr = vllm_ops.build_ragged_indices_from_dense(indices, lens, num_rows=kv.shape[0])
    has_sink = sink is not None
    sink = sink[:H].contiguous() if has_sink else torch.empty(1, dtype=torch.float32)
    vllm_ops._sparse_attn_prefill_ragged_kernel[(T, -(-H // 16))](
        q, kv, rag, ptr, sink, out, *q.stride(), *kv.stride(), *out.stride(), H, q.shape[2], kv.shape[0], float(scale),
        HAS_ATTN_SINK=has_sink, OUT_DV=out.shape[-1], BLOCK_H=16, BLOCK_D=512, BLOCK_K=16)


def _consumer_case(seed, T, H, K, S):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, D, generator=g).to(torch.bfloat16)
    kv = torch.randn(S, 1, D, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, S, (T, K), generator=g, dtype=torch.int32)
    idx[torch.rand(T, K, generator=g) < 0.2] = -1  # PAD holes inside the length
    lens = torch.randint(0, K + 1, (T,), generator=g, dtype=torch.int32)
    lens[0] = 0  # nothing to read
    if T > 1:
        idx[1] = -1  # only PAD
        lens[-1] = K
    sink = torch.randn(H + 4, generator=g, dtype=torch.float32)  # vLLM reads the first H
    return q, kv, idx, lens, sink


@pytest.mark.parametrize("d_v", [D, NOPE])
@pytest.mark.parametrize("H", [16, 20])
def test_consumer_equals_vllms_rocm_prefill_kernel(be, d_v, H):
    q, kv, idx, lens, sink = _consumer_case(7 + H + d_v, T=19, H=H, K=160, S=300)
    scale = 512 ** -0.5
    want = torch.full((q.shape[0], H, d_v), float("nan"))
    _vllm_prefill(q.float(), kv.float(), idx, lens, scale, sink, want)
    h.route_to(be, ("rocm_sparse_attn_prefill",), platform="rocm")
    out = torch.full((q.shape[0], H, d_v), float("nan"), dtype=torch.bfloat16)
    before = runtime.CALLS["rocm_sparse_prefill"]
    assert amd_rocm.rocm_sparse_attn_prefill(q, kv, idx, lens, scale, D, NOPE, ROPE, sink, out) is None
    assert runtime.CALLS["rocm_sparse_prefill"] == before + 1 and patches.routes()["rocm_sparse_attn_prefill"]
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_large_prefills_take_aiter_on_gfx950_only(be):
    """>= 1024 queries: AITER's OPUS prefill (its double) on gfx950, on CSR, with the reference's
    result; the Triton kernel on gfx942 (compared above on smaller calls)."""
    q, kv, idx, lens, sink = _consumer_case(3, T=1024, H=16, K=64, S=200)
    chosen = be.variant_for("sparse_mla", q, kv[:, 0], idx, lens, 0.05, D, sink=sink[:16], return_lse=False)
    assert chosen == ("aiter_opus" if ARCH == "gfx950" else "triton"), chosen
    if ARCH != "gfx950":
        return
    h.route_to(be, ("rocm_sparse_attn_prefill",), platform="rocm")
    out = torch.empty(q.shape, dtype=torch.bfloat16)
    amd_rocm.rocm_sparse_attn_prefill(q, kv, idx, lens, 0.05, D, NOPE, ROPE, sink, out)
    ref, _ = select("cpu", prefer="reference").sparse_mla(q, kv[:, 0], idx, lens, 0.05, D, sink=sink[:16])
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_other_call_forms_stay_vllms(be):
    """Ragged indices (vLLM's own CSR) go to vLLM's function, unchanged."""
    calls = []
    h.route_to(be, ("rocm_sparse_attn_prefill",), platform="rocm")
    shim = patches.RocmSparsePrefillShim(lambda *a, **k: calls.append(k))
    q, kv, idx, lens, sink = _consumer_case(1, T=4, H=16, K=32, S=40)
    out = torch.empty(q.shape, dtype=torch.bfloat16)
    rag, ptr = vllm_ops.build_ragged_indices_from_dense(idx, lens, num_rows=40)
    before = runtime.CALLS["rocm_sparse_prefill"]
    shim(q, kv, idx, lens, 0.1, D, NOPE, ROPE, sink, out, ragged_indices=rag, ragged_indptr=ptr)
    assert len(calls) == 1 and calls[0]["ragged_indices"] is rag
    assert runtime.CALLS["rocm_sparse_prefill"] == before


# ---------------------------------------------------------------------------------------
# replay == cold through vLLM's ROCm prefill
# ---------------------------------------------------------------------------------------

W, BS, H_RUN = 16, 8, 16
SWA_GROUP = 1
# (prompt length L, prefix hit H): the replay step recomputes [H - W, L)
PROMPTS = ((70, 48), (45, 24), (33, 32))


def _tables(poison_below=None):
    """Each request's window-cache block table (group 1) and dummy tables for the others;
    ``poison_below``: per request, blocks wholly below this position point at the poisoned
    block 0 (vLLM frees window blocks outside the window)."""
    cols = 12
    table = np.arange(1, 1 + len(PROMPTS) * cols, dtype=np.int32).reshape(len(PROMPTS), cols)
    if poison_below is not None:
        for i, r in enumerate(poison_below):
            table[i, : r // BS] = 0
    other = np.zeros_like(table)
    return [other, table, other]


def _metadata(be, batch):
    """vLLM's ROCm SWA builder's metadata for ``batch`` (the model state's prepare_attn with
    the pack's routes, the prefill consumer's included), as objects (not snapshots)."""
    h.route_to(be, (*h.METADATA_ROUTES, "rocm_sparse_attn_prefill"), platform="rocm")
    setup = h.make_setup(batch, spec=0, decoder=False, backends=[amd_rocm.DeepseekV41ROCMAiterSparseSWABackend])
    route = m.Route(None, encoder=True, builders=True)
    state = h.make_state(m.model_state_class(h.VllmState), setup, {"swa_backends_route": route})
    h.add_requests(state, batch)
    ib = h.make_input_batch(batch, h.InputBuffers(32, 2048, h.DEV))
    md = state.prepare_attn(ib, h.CUDAGraphMode.NONE, tuple(batch.block_tables), batch.slots.clone(),
                            setup.attn_groups, setup.kv_cache_config)
    swa = md[h.LAYER.format(SWA_GROUP) + ".swa_cache"]
    assert isinstance(swa, amd_rocm.DeepseekV41ROCMAiterSparseSWAMetadata)
    return swa


def _attention_layer(sink, max_tokens):
    """The fields ``_forward_prefill`` reads of a SWA-only DeepSeek-V4.1 ROCm attention layer."""
    cls = amd_rocm.DeepseekV41ROCMAiterMLAAttention
    layer = SimpleNamespace(
        _use_aiter_sparse_mla=False, topk_indices_buffer=torch.empty(max_tokens, 0, dtype=torch.int32),
        max_model_len=512, compress_ratio=1, window_size=W, max_num_batched_tokens=max_tokens,
        PREFILL_CHUNK_SIZE=cls.PREFILL_CHUNK_SIZE, scale=D ** -0.5, head_dim=D, nope_head_dim=NOPE,
        rope_head_dim=ROPE, attn_sink=sink, n_local_heads=H_RUN)
    layer._prefill_workspace_shapes = functools.partial(cls._prefill_workspace_shapes, layer)
    return layer


def _run_prefill(layer, swa, q, cache):
    out = torch.full((q.shape[0], H_RUN, D), float("nan"), dtype=torch.bfloat16)
    amd_rocm.DeepseekV41ROCMAiterMLAAttention._forward_prefill(
        layer, q, None, None, cache, out, None, swa)
    return out


def test_replay_equals_cold_through_vllms_rocm_prefill(be, monkeypatch):
    """The consumer is the pack's ``sparse_mla`` (the patch routed: what the pack turns on with
    vLLM 0.33). vLLM 0.34's own consumer, which 0.34 runs on CDNA 3 and 4 over the same clamped
    window, asserts device tensors (its ragged Triton path): it cannot run on this CPU machine."""
    h.install_cpu_stubs(monkeypatch)
    workspace.init_workspace_manager(torch.device("cpu"))
    # vLLM's platform on this CPU machine is UnspecifiedPlatform: the prefill reads the SWA cache's
    # FP8 flavour and the gather picks its ROCm kernel (and not CuTeDSL) from the platform
    rocm = SimpleNamespace(is_rocm=lambda: True, is_cuda=lambda: False, is_fp8_fnuz=lambda: FP8 == "e4m3fnuz")
    monkeypatch.setattr(amd_rocm, "current_platform", rocm)
    monkeypatch.setattr(cache_utils, "current_platform", rocm)
    monkeypatch.setattr(cache_utils, "has_cutedsl", lambda: False)
    g = torch.Generator().manual_seed(11)
    lens_ = [L for L, _ in PROMPTS]
    rows = [torch.randn(L, D, generator=g).to(torch.bfloat16) for L in lens_]
    qs = [torch.randn(L, H_RUN, D, generator=g).to(torch.bfloat16) for L in lens_]
    sink = torch.randn(H_RUN, generator=g, dtype=torch.float32)
    starts = [hit - W for _, hit in PROMPTS]

    def cache_for(tables, poison):
        # e4m3 NaN bytes everywhere (vLLM's gather scrubs NaN to 0: a read below the replay
        # start shows as a wrong row)
        kv = R.new_cache(48, BS, "v4_fp8", fill=0x7F if FP8 == "e4m3fn" else 0x80)
        for i, L in enumerate(lens_):
            pos = torch.arange(L)
            if poison:
                pos = pos[pos >= starts[i]]  # the window cache holds nothing below the replay start
            slots = torch.as_tensor(tables[SWA_GROUP][i], dtype=torch.int64)[pos // BS] * BS + pos % BS
            R.write(kv, rows[i][pos], slots, "v4_fp8", FP8)
        return kv

    # cold: every prompt from position 0
    cold_tables = _tables()
    cold = _cases.explicit_batch(lens_, [0] * len(lens_), [0] * len(lens_), W=W, block_size=BS, tables=cold_tables)
    cold_kv = cache_for(cold_tables, poison=False)
    layer = _attention_layer(sink, 2048)
    cold_out = _run_prefill(layer, _metadata(be, cold), torch.cat(qs), cold_kv)
    patches.restore()

    # after the prefix hits: prefix = replay start, the step recomputes [R, L)
    rep_tables = _tables(poison_below=starts)
    rep = _cases.explicit_batch([L - r for L, r in zip(lens_, starts)], starts, starts, W=W, block_size=BS,
                                tables=rep_tables)
    rep_kv = cache_for(rep_tables, poison=True)
    before = runtime.CALLS["rocm_sparse_prefill"]
    rep_out = _run_prefill(layer, _metadata(be, rep), torch.cat([q[r:] for q, r in zip(qs, starts)]), rep_kv)
    assert runtime.CALLS["rocm_sparse_prefill"] > before  # the consumer was the pack's
    assert not rep_out.isnan().any()

    cold_at = np.concatenate([[0], np.cumsum(lens_)])
    rep_at = np.concatenate([[0], np.cumsum([L - r for L, r in zip(lens_, starts)])])
    ref = select("cpu", prefer="reference")
    for i, (L, r) in enumerate(zip(lens_, starts)):
        got = rep_out[rep_at[i]: rep_at[i + 1]]
        # new tokens (from the hit on): the cold run's output, bit for bit
        assert torch.equal(got[W:], cold_out[cold_at[i] + r + W: cold_at[i + 1]]), i
        # replayed tokens: the cold cache's rows over the window clamped at the replay start
        p = torch.arange(r, L)
        lo = torch.maximum(p - W + 1, torch.full_like(p, r))
        idx = torch.full((L - r, W), -1, dtype=torch.int32)
        for t in range(L - r):
            idx[t, : int(p[t] - lo[t] + 1)] = torch.arange(int(lo[t]), int(p[t]) + 1, dtype=torch.int32)
        want, _ = ref.sparse_mla(qs[i][r:], R.dequantize(cold_kv, _slots(cold_tables, i, L), "v4_fp8", FP8), idx,
                                 (p - lo + 1).to(torch.int32), D ** -0.5, D, sink=sink)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def _slots(tables, i, L):
    pos = torch.arange(L)
    return torch.as_tensor(tables[SWA_GROUP][i], dtype=torch.int64)[pos // BS] * BS + pos % BS


# ---------------------------------------------------------------------------------------
# the model class turns encoder replay on
# ---------------------------------------------------------------------------------------


class _Model(torch.nn.Module):
    """vLLM's built model as far as the switch reads it: real window caches (vLLM built them
    with ``bounded_replay=False`` on ROCm) and the replay layers' owner."""

    def __init__(self, n=3):
        super().__init__()
        cfg = MagicMock()
        cfg.compilation_config.static_forward_context = {}
        cache_cfg = SimpleNamespace(cache_dtype="fp8_ds_mla")
        with set_current_vllm_config(cfg):
            self.caches = torch.nn.ModuleList(
                DeepseekV4SWACache(head_dim=D, window_size=128, dtype=torch.uint8, prefix=f"layers.{i}.swa_cache",
                                   cache_config=cache_cfg, block_size=32, bounded_replay=False) for i in range(n))
        self.model = SimpleNamespace(decoder_replay_layers=None, decoder_replay_start=43, end_layer=43)


#: vLLM 0.33 builds encoder replay off on ROCm and the pack turns it on; 0.34 keeps it on itself (CDNA 3, 4)
turns_on = pytest.mark.skipif(not release.config.PACK_TURNS_ROCM_ENCODER_ON,
                              reason=f"vLLM {release.RELEASE} keeps encoder replay on on ROCm itself")


def _rocm_decide(monkeypatch):
    real = icfg.decide
    monkeypatch.setattr(m, "decide", lambda c: real(c, DEVICE, platform="rocm"))


def _messages(caplog):
    return [r.getMessage() for r in caplog.records]


@turns_on
def test_model_turns_encoder_replay_on(caplog, monkeypatch):
    _rocm_decide(monkeypatch)
    patches.apply(platform="rocm")
    cfg = _configs.vllm_config()
    route = m._before_build(cfg)
    assert route.encoder and route.rocm
    model = _Model()
    route = m._after_build(model, route)
    assert route.encoder and route.rocm and route.builders
    assert all(patches.routes().values()), patches.routes()
    specs = [c.get_kv_cache_spec(None) for c in model.caches]
    assert all(c.bounded_replay for c in model.caches)
    assert all(not s.prefix_cacheable and s.prefix_replay_tokens == 128 for s in specs)
    assert any("encoder replay turned on on" in s and "3 window caches" in s for s in _messages(caplog))


@turns_on
def test_model_leaves_it_off_without_the_consumer_route(caplog, monkeypatch):
    _rocm_decide(monkeypatch)
    cfg = _configs.vllm_config()
    route = m._before_build(cfg)  # patches.apply() on this CPU machine: the ROCm patch does not apply
    assert route.rocm and patches.status()["rocm_sparse_attn_prefill"].startswith("not applied")
    model = _Model()
    route = m._after_build(model, route)
    assert not route.encoder and not route.rocm and not any(c.bounded_replay for c in model.caches)
    assert not any(patches.routes().values()), patches.routes()
    assert any("encoder replay stays off" in s and "rocm_sparse_attn_prefill" in s for s in _messages(caplog))


@turns_on
def test_model_leaves_it_off_with_a_drafter(caplog, monkeypatch):
    _rocm_decide(monkeypatch)
    patches.apply(platform="rocm")
    cfg = _configs.vllm_config(speculative_config=_configs.drafter())
    route = m._before_build(cfg)
    assert not route.encoder and not route.rocm
    model = _Model()
    m._after_build(model, route)
    assert not any(c.bounded_replay for c in model.caches)
    assert any("encoder replay stays off" in s and "drafter" in s for s in _messages(caplog))


@pytest.mark.skipif(release.config.PACK_TURNS_ROCM_ENCODER_ON,
                    reason=f"vLLM {release.RELEASE} keeps encoder replay off on ROCm (the pack turns it on)")
def test_model_keeps_vllms_rocm_replay(caplog, monkeypatch):
    """vLLM 0.34 keeps encoder replay on on CDNA 3 and 4 with its own prefill attention: the
    model routes the slot padding, window indices and gather lengths through the pack, leaves
    the window caches as vLLM built them and the prefill patch unrouted."""
    _rocm_decide(monkeypatch)
    patches.apply(platform="rocm")
    cfg = _configs.vllm_config()
    route = m._before_build(cfg)
    assert route.encoder and not route.rocm and cfg.cache_config.swa_bounded_replay is True
    model = _Model()
    route = m._after_build(model, route)
    assert route.encoder and route.builders and not route.rocm
    assert patches.routes() == {"pad_replayed_slots": True, "swa_indices_and_lens": True, "prefill_gather_lens": True,
                                "rocm_sparse_attn_prefill": False}
    assert not any(c.bounded_replay for c in model.caches)  # as vLLM built them: the pack switched nothing
    assert not any("encoder replay turned on" in s for s in _messages(caplog))
