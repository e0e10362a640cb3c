"""Ascend: SoC detection, vllm-ascend's npu_sparse_flash_mla against its contract double
(explicit clamped window indices; the op's band mask would not clamp), the op's constraints
as data, and the triton-ascend kernels under Triton's interpreter."""

from __future__ import annotations

import sys
import types

import zlib

import numpy as np
import pytest
from _tritons import NO_TRITON
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swa_backends as sb
from swa_backends.backends.ascend import constraints, npu_attention
from swa_backends.testing.emulation.ascend import contract_doubles, npu_sparse_flash_mla_metadata
from swa_backends.testing.emulation.ascend import npu_sparse_flash_mla as npu_double
from swa_backends.backends.ascend import device as device_mod
from swa_backends.common import registry
from swa_backends.testing.conformance import ODD_BATCHES, case_for, check_backend, mismatch, random_batch, run_op

from platform_helpers import assert_matches_reference, spy, vendor_case

C_MOD = "vllm_ascend.vllm_ascend_C"


# --- SoC detection -----------------------------------------------------------------------

@pytest.mark.parametrize("soc, arch", [("ascend:910b", "910b"), ("ascend:910_93", "910_93"),
                                       ("ascend:950", "950")])
def test_soc_detection_through_torch_npu(soc, arch):
    with contract_doubles(soc):
        info = device_mod.probe_npu(0)
    assert isinstance(info, sb.DeviceInfo) and info.arch == arch and info.torch_device == "npu:0"


def test_missing_or_broken_torch_npu_is_a_reason(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    assert device_mod.probe_npu() == "torch_npu is not installed"
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise OSError('libhccl.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        why = device_mod.probe_npu()
        assert why.startswith("import torch_npu failed: OSError: libhccl.so")
        registry.clear_probes()
        assert "libhccl.so" in registry.probe("vllm_ascend_sparse_flash_mla")
    finally:
        sys.modules.pop("torch_npu", None)
        registry.clear_probes()



def _torch_npu(count: int, current) -> dict:
    """A torch_npu of ``count`` A2 NPUs whose current one is ``current`` (or ``current[0]``, read
    at each call). Plain modules: a contract double (testing/doubles.py's ``fake_module``) is no
    NPU of this host, and current_index() does not read one."""
    import importlib.machinery

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        m.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
        return m

    npu = mod("torch_npu.npu", get_soc_version=lambda: 223, is_available=lambda: True, device_count=lambda: count,
              current_device=lambda: current[0] if isinstance(current, list) else current)
    return {"torch_npu": mod("torch_npu", npu=npu), "torch_npu.npu": npu}


@pytest.mark.parametrize("count, current", [(1, 0), (2, 1), (4, 3)])
def test_npu_index_is_one_torch_npu_sees_and_none_is_the_current_npu(count, current):
    """``npu:N`` names one of the NPUs torch_npu sees (as ``cuda:N`` one of torch's): past them it
    is refused, not a backend placing tensors on no device; ``npu`` and None are torch_npu's
    current NPU, not npu:0."""
    from swa_backends.common.device import clear_cache, resolve_device
    from swa_backends.testing.doubles import installed_modules

    clear_cache()
    try:
        with installed_modules(_torch_npu(count, current)):
            assert device_mod.probe_npu().torch_device == f"npu:{current}"
            assert device_mod.probe_npu(count - 1).torch_device == f"npu:{count - 1}"
            assert device_mod.probe_npu(count).endswith(f"NPU{'s' if count > 1 else ''}: an index below {count}")
            for spec in (f"npu:{count}", "npu:12345"):
                with pytest.raises(ValueError, match=f"device='{spec}': expected a usable Ascend NPU .*below {count}"):
                    sb.select(spec)
            # (resolve_device: select() is this, then a Backend on a torch device this torch cannot name)
            assert resolve_device("npu").torch_device == f"npu:{current}"
            if not torch.cuda.is_available():  # the default device: the first platform with one, CUDA/ROCm first
                assert resolve_device(None).torch_device == f"npu:{current}"
    finally:
        clear_cache()


def test_the_current_npu_is_read_on_every_call():
    """Detection is cached per index, the current index read before it: after torch_npu's
    ``set_device(1)``, ``npu`` and None are npu:1 (a cache of the first current NPU kept npu:0)."""
    from swa_backends.common.device import clear_cache, resolve_device
    from swa_backends.testing.doubles import installed_modules

    current = [0]
    clear_cache()
    try:
        with installed_modules(_torch_npu(2, current)):
            for i in (0, 1, 0):
                current[0] = i
                assert device_mod.current_index() == i
                assert resolve_device("npu").torch_device == f"npu:{i}"
                if not torch.cuda.is_available():
                    assert resolve_device(None).torch_device == f"npu:{i}"
        with contract_doubles("ascend:910b"):  # a double is no NPU of this host: nothing to read
            assert device_mod.current_index() is None
    finally:
        clear_cache()

# --- npu_sparse_flash_mla ----------------------------------------------------------------

@pytest.mark.parametrize("soc", ["ascend:910b", "ascend:910_93", "ascend:950"])
@pytest.mark.parametrize("seed", range(5))
def test_npu_attention_equals_reference(soc, seed):
    args, kw = vendor_case(seed, heads=(1, 2, 4, 16, 64), d_v=512 if seed % 2 else 128)
    with contract_doubles(soc):
        assert_matches_reference(npu_attention.sparse_mla, args, kw)


def test_npu_attention_passes_explicit_clamped_rows():
    args, kw = vendor_case(21, T=5, K=30, heads=(8,))
    q, kv, idx, lens, scale, _ = args
    idx[2, :4] = -1  # PAD holes inside the active length
    calls = []
    with contract_doubles("ascend:910b"):
        ns = sys.modules[C_MOD].__swa_op_namespace__
        orig = ns.npu_sparse_flash_mla
        try:
            ns.npu_sparse_flash_mla = lambda *a, **k: calls.append((a, k)) or orig(*a, **k)
            npu_attention.sparse_mla(*args, **kw)
        finally:
            ns.npu_sparse_flash_mla = orig
    (vq,), k = calls[0]
    assert k["ori_mask_mode"] == 0 and k["layout_q"] == "TND" and k["layout_kv"] == "TND"
    assert "cmp_kv" not in k and k["cmp_ratio"] == 0 and k["topk_value_mode"] == 1 and k["return_softmax_lse"]
    assert k["ori_win_left"] == constraints.SERVED.window - 1 and k["ori_win_right"] == 0
    rows, n = k["ori_sparse_indices"][:, 0], k["ori_topk_length"][:, 0]
    assert rows.dtype == torch.int32 and n.dtype == torch.int32
    j = torch.arange(30)
    keep = (j[None] < lens[:, None]) & (idx != -1)
    for t in range(5):  # valid entries first, in order, then PAD; the length counts them
        assert int(n[t]) == int(keep[t].sum())
        assert torch.equal(rows[t, : n[t]], idx[t][keep[t]]) and bool((rows[t, n[t]:] == -1).all())
    assert k["ori_kv"].shape == (kv.shape[0], 1, 512) and k["ori_kv"].data_ptr() == kv.data_ptr()
    assert bool((k["sinks"] == npu_attention.NO_SINK).all()) and k["sinks"].dtype == torch.float32


def _replay_case():
    """One request replaying from R = 20 (positions 20..39), window W = 128, identity slots."""
    T, H, D, R = 20, 4, 512, 20
    g = torch.Generator().manual_seed(3)
    q = torch.randn(T, H, D, generator=g).to(torch.bfloat16)
    kv = torch.randn(40, D, generator=g).to(torch.bfloat16)
    qsl = torch.tensor([0, T], dtype=torch.int32)
    idx, lens = sb.reference_backend().swa_indices_and_lens(
        qsl, torch.tensor([40], dtype=torch.int32), torch.arange(1, dtype=torch.int32)[None].expand(1, 1).contiguous(),
        64, 128, torch.tensor([R], dtype=torch.int32), num_tokens=T)
    return q, kv, idx, lens, D ** -0.5


def test_band_mask_would_read_below_replay_start():
    """The op's own window (ori_mask_mode=4) has no replay start: on a replaying prefill it
    reads positions below R and differs from the clamped reference; the explicit mode does not."""
    q, kv, idx, lens, scale = _replay_case()
    want = sb.reference_backend().sparse_mla(q, kv, idx, lens, scale, 512)
    with contract_doubles("ascend:910b"):
        cu_q = torch.tensor([0, 20], dtype=torch.int32)
        cu_kv = torch.tensor([0, 40], dtype=torch.int32)
        band = dict(cmp_ratio=0, ori_mask_mode=4, cmp_mask_mode=0, ori_win_left=127, ori_win_right=0,
                    layout_q="TND", layout_kv="TND")
        meta = npu_sparse_flash_mla_metadata(4, 1, 512, cu_seqlens_q=cu_q, cu_seqlens_ori_kv=cu_kv, batch_size=1,
                                             max_seqlen_q=20, max_seqlen_ori_kv=40, ori_topk=0, cmp_topk=0,
                                             has_ori_kv=True, has_cmp_kv=False, **band)
        out_band, _ = npu_double(q, ori_kv=kv.view(40, 1, 512), cu_seqlens_q=cu_q, cu_seqlens_ori_kv=cu_kv,
                                 sinks=torch.full((4,), -1e30), metadata=meta, softmax_scale=scale, **band)
        got = npu_attention.sparse_mla(q, kv, idx, lens, scale, 512)
    assert (out_band.float() - want[0].float()).abs().max() > 0.05
    assert (got[0].float() - want[0].float()).abs().max() < 0.02


@pytest.mark.parametrize("change, message", [
    (dict(heads=6), "power of two in [1, 128]"),
    (dict(D=256), "head dim of q only support 512"),
    (dict(mask=4), "requires oriMaskMode 0"),
    (dict(no_length=True), "Ori_topk_length is required"),
    (dict(cmp_ratio=1), "cmpRatio should be 0 in SWA"),
    (dict(bad_meta=True), "metadata was built from other parameters"),
    (dict(soc="ascend:310p"), "is not support"),
])
def test_npu_double_failure_modes(change, message):
    H, D = change.get("heads", 4), change.get("D", 512)
    q = torch.randn(3, H, D).to(torch.bfloat16)
    kv = torch.randn(10, 1, D).to(torch.bfloat16)
    idx = torch.tensor([[[0, 1]], [[2, -1]], [[3, 4]]], dtype=torch.int32)
    n = torch.tensor([[2], [1], [2]], dtype=torch.int32)
    cu_q, cu_kv = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 10], dtype=torch.int32)
    mode = dict(cmp_ratio=change.get("cmp_ratio", 0), ori_mask_mode=change.get("mask", 0), cmp_mask_mode=0,
                ori_win_left=127, ori_win_right=0, layout_q="TND", layout_kv="TND")
    with contract_doubles(change.get("soc", "ascend:910b")):
        meta = npu_sparse_flash_mla_metadata(max(H, 1), 1, 512, batch_size=1, max_seqlen_q=3, max_seqlen_ori_kv=10,
                                             ori_topk=3 if change.get("bad_meta") else 2, cmp_topk=0,
                                             has_ori_kv=True, has_cmp_kv=False, **mode)
        with pytest.raises(RuntimeError, match=message.replace("[", r"\[").replace("]", r"\]")):
            npu_double(q, ori_kv=kv, ori_sparse_indices=idx, ori_topk_length=None if change.get("no_length") else n,
                       cu_seqlens_q=cu_q, cu_seqlens_ori_kv=cu_kv, sinks=torch.zeros(H), metadata=meta,
                       softmax_scale=0.1, return_softmax_lse=True, **mode)


def test_constraints_are_data_and_drive_the_input_check():
    c = constraints.CONSTRAINTS["910b"]
    assert (c.window, c.head_dim, c.max_heads, c.heads_power_of_two, c.cmp_topk) == (128, 512, 128, True, (512, 1024))
    assert constraints.CONSTRAINTS["910_93"].explicit_window_indices
    assert not constraints.CONSTRAINTS["950"].heads_power_of_two
    q = torch.zeros(1, 12, 512)
    assert any("power of two" in r for r in npu_attention.input_check(q, None, torch.zeros(1, 3), None, 0.1, 512))
    assert any("head dim 512" in r for r in npu_attention.input_check(torch.zeros(1, 8, 64), None, torch.zeros(1, 3),
                                                                       None, 0.1, 64))
    assert not npu_attention.input_check(torch.zeros(1, 16, 512), None, torch.zeros(1, 3), None, 0.1, 512)
    # rows wider than the window the op serves (A2/A3: W = 128, ori_win_left = 127): declined, the
    # reference runs (an audit, 2026-12-06: a 256-wide row went to the op)
    assert not npu_attention.input_check(torch.zeros(1, 16, 512), None, torch.zeros(1, c.window), None, 0.1, 512)
    wide = npu_attention.input_check(torch.zeros(1, 16, 512), None, torch.zeros(1, 256), None, 0.1, 512)
    assert wide == ["npu_sparse_flash_mla's window mode on A2/A3 takes rows of at most W=128 (ori_win_left=127), "
                    "got index width 256"]


def test_selection_with_and_without_the_vendor_stack():
    e = sb.explain("ascend:910b")
    assert e.chosen["sparse_mla"] == ("reference",)
    why = next(c.reasons for c in e.table if c.op == "sparse_mla" and c.variant == "npu_sparse_flash_mla")
    assert any("torch_npu" in r for r in why)
    with contract_doubles("ascend:910_93"):
        b = sb.select("ascend:910_93")
        assert b.variants["sparse_mla"] == ("npu_sparse_flash_mla", "reference")
        assert b.variants["gather_rows"] == ("triton_ascend",)
        args, _ = vendor_case(1, heads=(12,))
        assert b.variant_for("sparse_mla", *args) == "reference"  # 12 heads: not a power of two
        q, kv = torch.zeros(2, 16, 512, dtype=torch.bfloat16), torch.zeros(300, 512, dtype=torch.bfloat16)
        wide = torch.arange(256, dtype=torch.int32).repeat(2, 1)
        assert b.variant_for("sparse_mla", q, kv, wide, torch.full((2,), 256, dtype=torch.int32), 0.1,
                             512) == "reference"  # a window of 256: wider than the op's


def test_build_rejecting_explicit_indices_fails_the_self_test(monkeypatch):
    """An older vllm-ascend (ori_sparse_indices only on A5) is caught by the probe's
    self-test: a reason, and the clamped reference runs instead."""
    old = constraints.NpuSparseMlaConstraints(**{**constraints.CONSTRAINTS["910b"].__dict__,
                                                 "explicit_window_indices": False})
    monkeypatch.setitem(constraints.CONSTRAINTS, "910b", old)
    with contract_doubles("ascend:910b"):
        registry._PROBE_OVERRIDES.pop("vllm_ascend_sparse_flash_mla")  # run the real probe on the doubles
        registry.clear_probes()
        why = registry.probe("vllm_ascend_sparse_flash_mla")
        b = sb.select("ascend:910b")
    registry.clear_probes()
    assert "rejects explicit window indices" in why and "only supported on A5" in why
    assert b.variants["sparse_mla"] == ("reference",)


# --- triton-ascend kernels ---------------------------------------------------------------

def test_triton_ascend_kernels_match_the_reference_under_the_interpreter():
    b = sb.select("cpu", prefer="triton_ascend")
    ops = [op for op, names in b.variants.items() if names == ("triton_ascend",)]
    assert sorted(ops) == ["gather_rows", "pad_replayed_slots", "scatter_rows", "swa_indices_and_lens"]
    results = check_backend(b, device="cpu", seed=7, cases=6, ops=ops)
    assert all(r.ok for r in results), [(r.op, r.detail) for r in results if not r.ok]


ASCEND_KERNEL_OPS = ("gather_rows", "pad_replayed_slots", "scatter_rows", "swa_indices_and_lens")


def _check_ascend(b, op, args, kwargs):
    got, want = run_op(op, getattr(b, op), args, kwargs, "cpu")
    why = mismatch(op, got, want)
    assert why is None, f"{op}: {why}"


@pytest.mark.parametrize("op", ASCEND_KERNEL_OPS)
def test_triton_ascend_random_cases(op):
    """Each triton-ascend kernel against the reference on hypothesis-drawn serving-like cases
    (``out=`` poisoned or not, validated or not: these kernels have no self-checked form, so both
    run the same kernel, behind the validator or without it)."""
    b = sb.select("cpu", prefer="triton_ascend")
    assert b.variants[op] == ("triton_ascend",)

    @settings(max_examples=15)
    @given(seed=st.integers(0, 2**32 - 1), poison=st.booleans(), validated=st.booleans())
    def run(seed, poison, validated):
        args, kwargs = case_for(op, np.random.default_rng(seed), "cpu", poison=poison)
        with sb.validation(validated):
            _check_ascend(b, op, args, kwargs)

    run()




@pytest.mark.parametrize("name", list(ODD_BATCHES))
@pytest.mark.parametrize("op", ["pad_replayed_slots", "swa_indices_and_lens"])
def test_triton_ascend_odd_batches(op, name):
    """The batch kernels on odd steps (``conformance.ODD_BATCHES``), ``out=`` poisoned every other
    call."""
    b = sb.select("cpu", prefer="triton_ascend")
    rng = np.random.default_rng(zlib.crc32(f"ascend/{op}/{name}".encode()))
    for i in range(2):
        batch = random_batch(rng, **ODD_BATCHES[name])
        args, kwargs = case_for(op, rng, "cpu", batch=batch, poison=bool(i))
        _check_ascend(b, op, args, kwargs)


@pytest.mark.parametrize("trailing", [(), (1,), (3,), (2, 3, 5), (0,), (1031,)])
@pytest.mark.parametrize("N, n", [(1, 1), (9, 4), (6, 0), (0, 0)])
def test_triton_ascend_rows_odd_shapes(trailing, N, n):
    """gather_rows / scatter_rows on one row, no rows, an empty table, rows of no, one and odd
    element counts (a width past one BLOCK, not a multiple of it), into poisoned ``out=`` buffers,
    against the reference; and rows sliced from a wider buffer, read in place."""
    b = sb.select("cpu", prefer="triton_ascend")
    rng = np.random.default_rng(zlib.crc32(f"ascend/rows/{trailing}/{N}/{n}".encode()))
    x = (torch.randn(N, *trailing) * 50).to(torch.bfloat16)
    rows = torch.tensor(rng.permutation(N)[:n], dtype=torch.int64)
    _check_ascend(b, "gather_rows", (x, rows), {})
    _check_ascend(b, "gather_rows", (x, rows), {"out": torch.full((n, *trailing), float("nan")).to(torch.bfloat16)})
    _check_ascend(b, "scatter_rows", (x[:n].clone(), rows, N), {})
    _check_ascend(b, "scatter_rows", (x[:n].clone(), rows, N),
                  {"out": torch.full((N, *trailing), float("nan")).to(torch.bfloat16)})
    if trailing and trailing[-1] > 1 and n:  # in place (run_op hands a kernel dense copies)
        wide = torch.randn(N, *trailing[:-1], trailing[-1] + 5).to(torch.bfloat16)
        view = wide[..., 2:2 + trailing[-1]]
        assert torch.equal(b.gather_rows(view, rows), view[rows])
        want = torch.zeros(N, *trailing).to(torch.bfloat16)
        want[rows] = view[:n]
        assert torch.equal(b.scatter_rows(view[:n], rows, N), want)


def test_triton_ascend_long_grid_stride_loops():
    """More work than programs x BLOCK: every program loops several times."""
    from swa_backends.backends.ascend.kernels import _launch, rows

    b = sb.select("cpu", prefer="triton_ascend")
    x = (torch.randn(700, 33) * 10).to(torch.bfloat16)
    r = torch.tensor(np.random.default_rng(0).permutation(700)[:400], dtype=torch.int64)
    assert _launch.grid(400 * 33, rows.BLOCK, x.device) == (_launch.INTERPRETER_CORES,)
    assert torch.equal(b.gather_rows(x, r), x[r])
    out = torch.full((700, 33), 7.0).to(torch.bfloat16)
    got = b.scatter_rows(x[:400], r, 700, out=out)
    want = torch.zeros(700, 33).to(torch.bfloat16)
    want[r] = x[:400]
    assert got is out and torch.equal(got, want)


_ODD_DTYPES = [torch.complex64, torch.complex128, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2, torch.float8_e4m3fn,
               torch.bool, torch.uint16, torch.uint32, torch.uint64]


@pytest.mark.parametrize("dtype", _ODD_DTYPES, ids=str)
def test_triton_ascend_rows_move_any_dtype_bit_for_bit(dtype):
    # the row ops move any dtype (as the reference and the portable kernels do): a type Triton has no
    # pointer for moves as its bytes
    ref, b = sb.select("cpu"), sb.select("cpu", prefer="triton_ascend")
    x = torch.randint(0, 256, (6, 3 * dtype.itemsize), dtype=torch.uint8).view(dtype)
    rows = torch.tensor([5, 0, 3], dtype=torch.int64)
    raw = lambda t: t.view(torch.uint8)  # noqa: E731 - compare bytes (NaN payloads, FP4 pairs)
    assert torch.equal(raw(b.gather_rows(x, rows)), raw(ref.gather_rows(x, rows)))
    assert torch.equal(raw(b.scatter_rows(x[:3], rows, 6)), raw(ref.scatter_rows(x[:3], rows, 6)))
    count = torch.tensor([2], dtype=torch.int32)
    assert torch.equal(raw(b.scatter_rows(x[:3], rows, 6, count=count)),
                       raw(ref.scatter_rows(x[:3], rows, 6, count=count)))


@pytest.mark.parametrize("lazy", ["neg", "conj"])
def test_triton_ascend_rows_apply_a_sources_lazy_bit(lazy):
    ref, b = sb.select("cpu"), sb.select("cpu", prefer="triton_ascend")
    if lazy == "neg":
        x = torch._neg_view(torch.arange(24, dtype=torch.float32).view(6, 4))  # contiguous, with its negative bit
    else:
        x = torch.complex(torch.arange(12.0), torch.arange(12.0) + 1).view(6, 2).conj()
    rows = torch.tensor([5, 0, 3], dtype=torch.int64)
    assert torch.equal(b.gather_rows(x, rows), ref.gather_rows(x, rows))
    assert torch.equal(b.scatter_rows(x[:3], rows, 6), ref.scatter_rows(x[:3], rows, 6))


def test_grid_is_sized_to_cores_and_never_zero():
    from swa_backends.backends.ascend.kernels import _launch

    cpu = torch.device("cpu")
    assert _launch.grid(0, 1024, cpu) == (1,)
    assert _launch.grid(1, 1024, cpu) == (1,)
    assert _launch.grid(10**9, 1024, cpu) == (_launch.INTERPRETER_CORES,)
    assert _launch.search_steps(0) >= 1 and 2 ** (_launch.search_steps(1000) - 1) > 1000


def test_triton_ascend_probe_here_is_a_reason():
    registry.clear_probes()
    why = registry.probe("triton_ascend")
    assert why is not None and "triton-ascend" in why


def test_contract_doubles_restore_everything():
    names = ("torch_npu", "torch_npu.npu", "vllm_ascend", C_MOD)
    before = {m: sys.modules.get(m) for m in names}
    with contract_doubles():
        assert registry.probe("vllm_ascend_sparse_flash_mla") is None and registry.probe("triton_ascend") is None
        assert isinstance(sys.modules["torch_npu"], types.ModuleType)
    assert {m: sys.modules.get(m) for m in names} == before
    assert "triton_ascend" not in registry._PROBE_OVERRIDES


@pytest.mark.compile
@pytest.mark.skipif(NO_TRITON is not None, reason=str(NO_TRITON))
def test_triton_ascend_kernels_compile_offline():
    """Triton's real compiler on every specialisation the random cases launch (the
    interpreter runs only the Python): tests/backends/ascend/aot_compile_ascend.py, in its own process
    (CI's compile stage)."""
    from pathlib import Path

    from _tritons import run_compile_script

    _, out = run_compile_script(sys.executable, Path(__file__).with_name("aot_compile_ascend.py"), "cuda:90",
                                "hip:gfx942", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("compiled ")
    for target in ("cuda:90", "hip:gfx942"):
        for kernel in ("_move_kernel[gather]", "_zero_kernel", "_move_kernel[scatter]", "_swa_kernel", "_pad_kernel"):
            assert any(line.startswith(f"{target} {kernel} ") for line in lines), (target, kernel)
