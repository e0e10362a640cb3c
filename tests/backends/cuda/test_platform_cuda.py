"""CUDA vendor wrappers against their contract doubles: FlashMLA sparse prefill (vLLM's
bundled interface) and FlashInfer's DSv4 sparse-MLA decode. Each test proves the wrapper
passes the vendor's layout, dtypes and lengths and returns exactly the reference's result."""

from __future__ import annotations

import dataclasses

import re
import sys
import types

import pytest
import torch

import swa_backends as sb
from swa_backends.backends.cuda import flashinfer, flashmla, probes
from swa_backends.testing.emulation.cuda import contract_doubles
from swa_backends.testing.emulation.cuda import flash_mla_sparse_fwd as fmla_double
from swa_backends.testing.emulation.cuda import trtllm_batch_decode_sparse_mla_dsv4 as fi_double
from swa_backends.common import registry

from platform_helpers import assert_matches_reference, spy, vendor_case

FMLA_MOD = "vllm.third_party.flashmla.flash_mla_interface"


# --- FlashMLA ----------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("seed", range(6))
def test_flashmla_equals_reference(arch, seed):
    D = 576 if seed % 3 == 2 else 512
    args, kw = vendor_case(seed, D=D, heads=(1, 5, 16, 64, 100, 128))
    with contract_doubles(f"cuda:{arch}"):
        assert_matches_reference(flashmla.sparse_mla, args, kw)


def test_flashmla_gets_its_layout_dtypes_and_lengths():
    args, kw = vendor_case(3, K=130, heads=(5,), sink=True)
    q, kv, idx, lens, scale, d_v = args
    calls = []
    with contract_doubles("cuda:sm100"), spy(FMLA_MOD, "flash_mla_sparse_fwd", calls):
        flashmla.sparse_mla(*args, **kw)
    (vq, vkv, vidx, vscale, vdv), vkw = calls[0]
    assert vq.shape == (q.shape[0], 64, 512) and torch.equal(vq[:, :5], q) and not vq[:, 5:].any()
    assert vkv.shape == (kv.shape[0], 1, 512) and vkv.data_ptr() == kv.data_ptr()  # a view, no copy
    assert vidx.dtype == torch.int32 and vidx.shape == (q.shape[0], 1, 256)  # width rounded up to 128
    assert torch.equal(vidx[:, 0, :130], idx) and bool((vidx[:, 0, 130:] == -1).all())
    assert torch.equal(vkw["topk_length"], lens) and vkw["topk_length"].dtype == torch.int32
    assert torch.equal(vkw["attn_sink"][:5], kw["sink"]) and bool(torch.isneginf(vkw["attn_sink"][5:]).all())
    assert vscale == scale and vdv == 512


def test_flashmla_combined_width_passes_without_copy():
    args, kw = vendor_case(4, K=256, heads=(64,))
    calls = []
    with contract_doubles("cuda:sm90"), spy(FMLA_MOD, "flash_mla_sparse_fwd", calls):
        flashmla.sparse_mla(*args, **kw)
    assert calls[0][0][2].data_ptr() == args[2].data_ptr()


def test_flashmla_lse_convention_converted():
    """FlashMLA marks an empty query with lse = +inf; the pack with -inf (and zeros)."""
    args, kw = vendor_case(5, T=3, heads=(64,), K=128)
    args[3][1] = 0  # token 1 reads nothing
    with contract_doubles("cuda:sm90"):
        raw = sys.modules[FMLA_MOD].flash_mla_sparse_fwd(
            args[0], args[1].unsqueeze(1), args[2].unsqueeze(1), args[4], 512, topk_length=args[3])
        assert bool(torch.isposinf(raw[2][1]).all())
        out, lse = assert_matches_reference(flashmla.sparse_mla, args, kw)
    assert bool(torch.isneginf(lse[1]).all()) and not out[1].any()


@pytest.mark.parametrize("call, message", [
    (dict(arch="sm89"), "only supported on SM90a and SM100f"),
    (dict(width=192), "topk (192) mod B_TOPK (128) must be 0"),
    (dict(width=96, arch="sm90", heads=64), "topk (96) mod B_TOPK (64) must be 0"),
    (dict(heads=32), "Unsupported h_q: 32"),
    (dict(dtype=torch.float16), "must be bfloat16"),
    (dict(D=256), "Invalid d_qk: 256"),
])
def test_flashmla_double_failure_modes(call, message):
    g = torch.Generator().manual_seed(0)
    H, D, width = call.get("heads", 128), call.get("D", 512), call.get("width", 128)
    dtype = call.get("dtype", torch.bfloat16)
    q = torch.randn(2, H, D, generator=g).to(dtype)
    kv = torch.randn(10, 1, D, generator=g).to(dtype)
    idx = torch.zeros(2, 1, width, dtype=torch.int32)
    with contract_doubles(f"cuda:{call.get('arch', 'sm100')}"), pytest.raises(RuntimeError, match=re.escape(message)):
        fmla_double(q, kv, idx, 0.1, 512)


def test_flashmla_input_check_falls_through():
    assert flashmla.input_check(torch.zeros(1, 8, 64), None, torch.zeros(1, 4), None, 0.1, 64)
    assert flashmla.input_check(torch.zeros(1, 256, 512), None, torch.zeros(1, 4), None, 0.1, 512)
    assert not flashmla.input_check(torch.zeros(1, 7, 576), None, torch.zeros(1, 4), None, 0.1, 512)


# --- FlashInfer -------------------------------------------------------------------------

@pytest.mark.parametrize("arch, fn", [("sm100", flashinfer.sparse_mla_sm10x), ("sm103", flashinfer.sparse_mla_sm10x),
                                      ("sm120", flashinfer.sparse_mla_sm12x)])
@pytest.mark.parametrize("seed", range(5))
def test_flashinfer_equals_reference(arch, fn, seed):
    K = 128 + 4 * (seed * 7 % 20)
    args, kw = vendor_case(seed, K=K, heads=(1, 3, 8, 33, 128))
    if seed == 4:  # lens below the 128 window columns keep the reference meaning
        args[3].clamp_(max=50)
    with contract_doubles(f"cuda:{arch}"):
        assert_matches_reference(fn, args, kw)


def test_flashinfer_sm10x_gets_mixed_layout_and_lengths():
    args, kw = vendor_case(7, K=136, heads=(20,), sink=True)
    q, kv, idx, lens, scale, _ = args
    calls = []
    with contract_doubles("cuda:sm100"), spy("flashinfer.mla", "trtllm_batch_decode_sparse_mla_dsv4", calls):
        flashinfer.sparse_mla_sm10x(*args, **kw)
    (vq, swa, ws, vidx), vkw = calls[0]
    T = q.shape[0]
    assert vq.shape == (T, 32, 512) and vidx.shape == (T, 136) and vidx.dtype == torch.int32
    j = torch.arange(136)
    assert torch.equal(vidx, torch.where(j[None] < lens[:, None], idx, -1))
    assert torch.equal(vkw["sparse_topk_lens"], lens.clamp(min=128)) and bool((vkw["sparse_topk_lens"] >= 128).all())
    assert torch.equal(vkw["seq_lens"], torch.full((T,), 128, dtype=torch.int32))
    assert torch.equal(vkw["cum_seq_lens_q"], torch.arange(T + 1, dtype=torch.int32)) and vkw["max_q_len"] == 1
    assert swa.shape == (kv.shape[0], 1, 1, 512) and vkw["compressed_kv_cache"] is swa
    assert swa.data_ptr() == kv.data_ptr() and vkw["bmm1_scale"] == scale and vkw["kv_layout"] == "HND"
    assert ws.dtype == torch.uint8 and ws.numel() == flashinfer.WORKSPACE_BYTES


def test_flashinfer_sm12x_gets_two_segments():
    args, kw = vendor_case(8, K=140, heads=(16,))
    lens = args[3]
    calls = []
    with contract_doubles("cuda:sm120"), spy("flashinfer.mla", "trtllm_batch_decode_sparse_mla_dsv4", calls):
        flashinfer.sparse_mla_sm12x(*args, **kw)
    (vq, swa, ws, win), vkw = calls[0]
    idx = args[2]
    T = vq.shape[0]
    extra = vkw["extra_sparse_indices"]
    assert win.shape == (T, 1, 128) and extra.shape == (T, 1, 12)
    j = torch.arange(140)
    keep = (j[None] < lens[:, None]) & (idx != -1)
    for seg, n, cols in ((win[:, 0], vkw["swa_topk_lens"], slice(0, 128)),
                         (extra[:, 0], vkw["extra_sparse_topk_lens"], slice(128, 140))):
        for t in range(T):  # valid entries first (no PAD inside the active length), then PAD
            kept = idx[t, cols][keep[t, cols]]
            assert int(n[t]) == kept.numel() and torch.equal(seg[t, : n[t]], kept)
            assert bool((seg[t, n[t]:] == -1).all())
    assert "sparse_topk_lens" not in vkw and vkw["kv_layout"] == "NHD"


@pytest.mark.parametrize("kwargs, arch, message", [
    (dict(cap=124), "sm100", "fixed 128 SWA entries"),
    (dict(cap=130), "sm100", "multiple of 4"),
    (dict(lens=100), "sm100", "must include the fixed 128 SWA entries"),
    (dict(sm12x_args=True), "sm100", "only supported on SM120/SM121"),
    (dict(), "sm90", "supports SM100/SM103 via TRTLLM-GEN or SM120/SM121"),
    (dict(heads=12), "sm100", "Expected 8, 16, 32, 64, or 128 query heads"),
])
def test_flashinfer_double_failure_modes(kwargs, arch, message):
    T, cap, H = 2, kwargs.get("cap", 128), kwargs.get("heads", 8)
    q = torch.randn(T, H, 512).to(torch.bfloat16)
    pool = torch.randn(20, 1, 1, 512).to(torch.bfloat16)
    extra = dict(swa_topk_lens=torch.full((T,), 5, dtype=torch.int32)) if kwargs.get("sm12x_args") else {}
    with contract_doubles(f"cuda:{arch}"), pytest.raises(ValueError, match=re.escape(message)):
        fi_double(q, pool, torch.zeros(8, dtype=torch.uint8), torch.zeros(T, cap, dtype=torch.int32),
                  compressed_kv_cache=pool, sparse_topk_lens=torch.full((T,), kwargs.get("lens", 128), dtype=torch.int32),
                  seq_lens=torch.full((T,), 128, dtype=torch.int32), cum_seq_lens_q=torch.arange(T + 1, dtype=torch.int32),
                  max_q_len=1, **extra)


def test_flashinfer_input_check_wants_the_mixed_layout():
    q = torch.zeros(1, 8, 512)
    assert any("mixed layout" in r for r in flashinfer.input_check(q, None, torch.zeros(1, 100), None, 0.1, 512))
    assert any("mixed layout" in r for r in flashinfer.input_check(q, None, torch.zeros(1, 130), None, 0.1, 512))
    assert not flashinfer.input_check(q, None, torch.zeros(1, 132), None, 0.1, 512)
    assert flashinfer.input_check(torch.zeros(1, 8, 576), None, torch.zeros(1, 132), None, 0.1, 512)


# --- selection: arch gating as data, probes as reasons ---------------------------------

# on sm90 the pack's gluon_ws leads (measured faster on the H200), the vendor kernel next
@pytest.mark.parametrize("device, head", [("cuda:sm90", ("gluon_ws", "flashmla")), ("cuda:sm100", ("flashmla",)),
                                          ("cuda:sm120", ("flashinfer_sm12x",))])
def test_vendor_variant_chosen_when_its_package_is_there(device, head):
    with contract_doubles(device):
        b = sb.select(device)
        assert b.variants["sparse_mla"][:len(head)] == head
        assert b.variants["sparse_mla"][-1] == "reference"


def test_sm100_chain_and_per_call_fall_through():
    with contract_doubles("cuda:sm100"):
        b = sb.select("cuda:sm100")
        assert b.variants["sparse_mla"][:2] == ("flashmla", "flashinfer")
        args, _ = vendor_case(0, K=132, heads=(8,))
        assert b.variant_for("sparse_mla", *args) == "flashmla"
        args16, _ = vendor_case(0, K=132, heads=(8,), dtype=torch.float16)
        assert b.variant_for("sparse_mla", *args16) not in ("flashmla", "flashinfer")
        args64, _ = vendor_case(0, D=64, d_v=64, K=132)
        assert b.variant_for("sparse_mla", *args64) not in ("flashmla", "flashinfer")


@pytest.mark.parametrize("device", ["cuda:sm80", "cuda:sm89"])
def test_no_vendor_attention_below_sm90(device):
    with contract_doubles(device):
        e = sb.explain(device)
    assert "flashmla" not in e.chosen["sparse_mla"] and "flashinfer" not in e.chosen["sparse_mla"]
    why = {c.variant: c.reasons for c in e.table if c.op == "sparse_mla"}
    assert any("requires arch in (sm90, sm100, sm103)" in r for r in why["flashmla"])
    assert any("requires capability >= (10, 0)" in r for r in why["flashinfer"])


def test_without_vllm_flashmla_is_a_reason_here():
    why = {c.variant: c.reasons for c in sb.explain("cuda:sm90").table if c.op == "sparse_mla"}
    assert any("vLLM is not installed" in r and "empty placeholder" in r for r in why["flashmla"])


def _interface(**attrs):
    m = types.ModuleType(FMLA_MOD)
    m.__dict__.update(attrs)
    return m


def test_flashmla_probe_reasons(monkeypatch):
    import importlib.machinery

    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", loader=None)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    for path in probes.FLASHMLA_MODULES[1:]:
        monkeypatch.setitem(sys.modules, path, None)  # import raises ModuleNotFoundError

    def old_api(q, kv, indices, sm_scale, d_v=512):
        return None

    monkeypatch.setitem(sys.modules, FMLA_MOD, _interface(flash_mla_sparse_fwd=old_api))
    assert "older than DeepSeek-V4" in probes.find_flashmla()[1]
    monkeypatch.setitem(sys.modules, FMLA_MOD, _interface())
    assert "has no flash_mla_sparse_fwd" in probes.find_flashmla()[1]
    monkeypatch.setitem(sys.modules, FMLA_MOD, _interface(flash_mla_sparse_fwd=fmla_double))
    assert probes.find_flashmla()[1] is None


def test_flashinfer_without_sm12x_path_is_a_reason():
    def sm10x_only(query, swa_kv_cache, workspace_buffer, sparse_indices, compressed_kv_cache, sparse_topk_lens,
                   seq_lens, out=None):
        return None

    assert "no SM120/SM121 path" in probes.flashinfer_sm12x_reason(sm10x_only)
    assert probes.flashinfer_sm12x_reason(fi_double) is None


def test_contract_doubles_restore_everything():
    before = {m: sys.modules.get(m) for m in ("vllm", "flashinfer", "flashinfer.mla", FMLA_MOD)}
    with contract_doubles():
        assert registry.probe("vllm_flashmla") is None and registry.probe("flashinfer_dsv4") is None
    assert {m: sys.modules.get(m) for m in before} == before
    assert "vllm_flashmla" not in registry._PROBE_OVERRIDES


# --- per-call order: FlashMLA before gluon_ws where it measured faster (AHEAD) -------------

def _prefill(H, K, rows, T=4):
    q = torch.zeros(T, H, 512, dtype=torch.bfloat16)
    kv = torch.zeros(rows, 512, dtype=torch.bfloat16)
    return (q, kv, torch.zeros(T, K, dtype=torch.int32), torch.full((T,), K, dtype=torch.int32), 0.04, 512)


def test_ahead_of_gluon_ws_reason_names_the_class(monkeypatch):
    assert flashmla.ahead_of_gluon_ws(*_prefill(128, 1536, 4096)) is None  # a host tensor: no L2 to compare with
    monkeypatch.setattr(flashmla, "l2_bytes_of", lambda kv: 1 << 20)  # 1 MiB
    why = flashmla.ahead_of_gluon_ws(*_prefill(128, 1536, 4096), sink=None)
    assert why and "H 128 >= 128" in why and "K 1536 >= 1536" in why and "4 MiB cache > L2 (1 MiB)" in why
    for H, K, rows in ((64, 2048, 4096), (128, 1152, 4096), (128, 2048, 1024)):  # each condition alone fails it
        assert flashmla.ahead_of_gluon_ws(*_prefill(H, K, rows)) is None, (H, K, rows)
    args = _prefill(128, 1536, 4096)
    assert flashmla.ahead_of_gluon_ws(args[0], args[1].view(4096, 1, 512), *args[2:]) is None  # not the rows layout


def test_flashmla_runs_before_gluon_ws_where_it_measured_faster(monkeypatch):
    monkeypatch.setattr(flashmla, "l2_bytes_of", lambda kv: 1 << 20)
    with contract_doubles("cuda:sm90"):
        b = sb.select("cuda:sm90")
        assert b.variants["sparse_mla"][:2] == ("gluon_ws", "flashmla")
        assert b.variant_for("sparse_mla", *_prefill(128, 1536, 4096)) == "flashmla"
        for H, K, rows in ((64, 1536, 4096), (128, 1152, 4096), (128, 1536, 512)):
            assert b.variant_for("sparse_mla", *_prefill(H, K, rows)) == "gluon_ws", (H, K, rows)
        row = next(c for c in b.explain().table if c.op == "sparse_mla" and c.variant == "flashmla")
        assert row.ahead and "runs before gluon_ws" in row.ahead[0] and "ahead_of_gluon_ws" in row.ahead[0]
        b.failures["sparse_mla"] = {"flashmla": "failed to build in this process: (injected)"}
        assert b.variant_for("sparse_mla", *_prefill(128, 1536, 4096)) == "gluon_ws"
    without = sb.select("cuda:sm90")  # no FlashMLA here: no rule applies
    assert "flashmla" not in without.variants["sparse_mla"] and not without._ahead


def test_a_call_flashmla_cannot_build_runs_gluon_ws_next(monkeypatch):
    """The per-call order and the fall-through compose: FlashMLA first, it cannot build this call,
    then the variant it ran before (not the one after it)."""
    from swa_backends.dispatch import variant

    monkeypatch.setattr(flashmla, "l2_bytes_of", lambda kv: 1 << 20)
    calls = []

    def cannot(*a, **k):
        calls.append("flashmla")
        raise sb.KernelUnavailable("injected by the test", whole_variant=False)

    def ws(q, *a, **k):
        calls.append("gluon_ws")
        return torch.zeros(q.shape[0], q.shape[1], 512, dtype=q.dtype), torch.zeros(q.shape[0], q.shape[1])

    with contract_doubles("cuda:sm90"):
        b = sb.select("cuda:sm90")
        # the declarations' loaded implementations (restored after the test, unlike a module attribute they cache)
        monkeypatch.setitem(variant("sparse_mla", "flashmla")._cache, "impl", cannot)
        monkeypatch.setitem(variant("sparse_mla", "gluon_ws")._cache, "impl", ws)
        with pytest.warns(RuntimeWarning, match="flashmla.*cannot build this call"):
            b.sparse_mla(*_prefill(128, 1536, 4096))
    assert calls == ["flashmla", "gluon_ws"]


# --- per-call order: the tl kernel before FlashMLA for calls of a few tokens (AHEAD) ---------

def test_triton_ahead_of_flashmla_reason_names_the_class():
    why = flashmla.triton_ahead_of_flashmla(*_prefill(128, 640, 64, T=6))
    assert why and "12 (token, 64-head) items <= 12" in why and "K 640 <= 640" in why
    assert flashmla.triton_ahead_of_flashmla(*_prefill(64, 640, 64, T=12))  # 12 items at 64 heads
    assert flashmla.triton_ahead_of_flashmla(*_prefill(96, 512, 64, T=1))  # 2 items: the partial block counts whole
    for H, K, T in ((128, 640, 7), (64, 640, 13), (64, 1152, 1), (16, 640, 1)):  # each condition alone fails it
        assert flashmla.triton_ahead_of_flashmla(*_prefill(H, K, 64, T=T)) is None, (H, K, T)


def test_triton_runs_before_flashmla_for_calls_of_a_few_tokens(monkeypatch):
    from swa_backends.kernels import sparse_mla_gluon

    # host tensors pass the Gluon kernels' decode-size check (it counts SMs of a CUDA tensor's device):
    # declined here as they are on the GPU, so FlashMLA is the variant that would take these calls
    real = sparse_mla_gluon.input_check
    monkeypatch.setattr(sparse_mla_gluon, "input_check",
                        lambda q, *a, **k: real(q, *a, **k) + (["decode-sized"] if q.shape[0] < 64 else []))
    with contract_doubles("cuda:sm90"):
        b = sb.select("cuda:sm90")
        assert b.variants["sparse_mla"] == ("gluon_ws", "flashmla", "gluon", "triton", "reference")
        assert b.variant_for("sparse_mla", *_prefill(64, 640, 64, T=1)) == "triton"
        assert b.variant_for("sparse_mla", *_prefill(128, 640, 64, T=6)) == "triton"
        for H, K, T in ((64, 640, 16), (128, 640, 8), (64, 1152, 1), (16, 640, 1)):
            assert b.variant_for("sparse_mla", *_prefill(H, K, 64, T=T)) == "flashmla", (H, K, T)
        assert b.variant_for("sparse_mla", *_prefill(64, 640, 64, T=256)) == "gluon_ws"  # prefill-sized: unchanged
        row = next(c for c in b.explain().table if c.op == "sparse_mla" and c.variant == "triton")
        assert row.ahead and "runs before flashmla" in row.ahead[0] and "triton_ahead_of_flashmla" in row.ahead[0]
        # the tl kernel cannot run (a whole-variant failure): FlashMLA takes the call again
        b.failures["sparse_mla"] = {"triton": "failed to build in this process: (injected)"}
        assert b.variant_for("sparse_mla", *_prefill(64, 640, 64, T=1)) == "flashmla"


def test_the_ahead_rules_hold_only_on_sm90_where_they_were_measured():
    """The tl kernel measured faster than FlashMLA for decode-sized calls on the H200 (sm90) only: on
    the SM100 family FlashMLA and FlashInfer's decode keep the priority's order, and explain()
    shows no exception there (it shows the rule, limited to sm90, on sm90)."""
    with contract_doubles("cuda:sm100"):
        b = sb.select("cuda:sm100")
        assert b.variants["sparse_mla"][:2] == ("flashmla", "flashinfer") and "triton" in b.variants["sparse_mla"]
        assert not b._ahead
        for H, K, T in ((64, 512, 1), (128, 640, 6), (128, 512, 4)):
            assert b.variant_for("sparse_mla", *_prefill(H, K, 64, T=T)) == "flashmla", (H, K, T)
        assert not any(c.ahead for c in b.explain().table)
    with contract_doubles("cuda:sm90"):
        rows = [c for c in sb.explain("cuda:sm90").table if c.ahead]
        assert {c.variant for c in rows} == {"triton", "flashmla"}
        assert all(", on sm90 only, for a call where" in c.ahead[0] for c in rows)


def test_an_ahead_rule_names_archs_of_its_platform():
    from swa_backends.common.platforms import Ahead, _check

    from swa_backends.backends.cuda import PLATFORM

    bad = dataclasses.replace(PLATFORM, name="cuda2", torch_types=(), ahead={
        "sparse_mla": (Ahead("triton", "flashmla", "m:f", archs=("gfx942",)),)})
    with pytest.raises(ValueError, match=r"register_platform: cuda2.ahead\['sparse_mla'\]=.*archs None or some of"):
        _check(bad, {})
