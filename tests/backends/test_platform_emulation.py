"""``swa_backends.testing.emulation.<platform>.contract_doubles()`` -- the entry point the
emulated matrix runner calls -- end to end: a backend selected for a fake device runs the
vendor wrapper through the doubles and returns the reference's result."""

from __future__ import annotations

import importlib

import pytest

import swa_backends as sb

from platform_helpers import assert_matches_reference, vendor_case

CASES = [  # device, vendor variant, a case it takes
    ("cuda:sm90", "flashmla", dict(K=128, heads=(16,))),  # gluon_ws leads, for H >= 64
    ("cuda:sm100", "flashmla", dict(K=200, heads=(3,))),
    ("cuda:sm120", "flashinfer_sm12x", dict(K=136, heads=(16,))),
    ("rocm:gfx950", "aiter_opus", dict(T=1024, K=9, S=60, heads=(1,))),
    ("ascend:910b", "npu_sparse_flash_mla", dict(K=40, heads=(8,))),
    ("ascend:910_93", "npu_sparse_flash_mla", dict(K=40, heads=(2,))),
]


@pytest.mark.parametrize("device, vendor, shape", CASES, ids=[c[0] for c in CASES])
def test_contract_doubles_entry_point_runs_the_vendor_path(device, vendor, shape):
    dev = sb.parse_device(device)
    emulation = importlib.import_module(f"swa_backends.testing.emulation.{dev.platform}")
    args, kw = vendor_case(5, **shape)
    with emulation.contract_doubles(), sb.fake_device(dev):  # the doubles read the arch from the fake device
        b = sb.select()
        assert b.variant_for("sparse_mla", *args, **kw) == vendor
        assert_matches_reference(b.sparse_mla, args, kw)
    assert vendor not in sb.select(dev).variants["sparse_mla"]  # nothing left behind


def test_doubles_apply_the_fake_device_arch():
    from swa_backends.backends.rocm import aiter_opus
    from swa_backends.testing.emulation.rocm import contract_doubles

    args, kw = vendor_case(1, T=4, K=8, S=20, heads=(1,))
    with contract_doubles(), sb.fake_device("rocm:gfx942"), pytest.raises(RuntimeError, match="requires gfx950"):
        aiter_opus.sparse_mla(*args, **kw)


def test_wrong_platform_device_is_refused():
    from swa_backends.testing.emulation.cuda import contract_doubles

    with pytest.raises(ValueError, match="expected a cuda device"):
        with contract_doubles("rocm:gfx950"):
            pass


@pytest.mark.parametrize("device, foreign", [
    ("cuda:sm100", ("aiter", "torch_npu", "vllm_ascend")),
    ("rocm:gfx950", ("vllm", "flashinfer", "torch_npu", "vllm_ascend")),
    ("ascend:910b", ("vllm", "flashinfer", "aiter")),
])
def test_probes_never_import_another_platforms_vendor(device, foreign):
    """Assessing one platform (every probe of its variants runs) imports nothing of another's."""
    import subprocess
    import sys

    code = (f"import sys, swa_backends as sb; sb.explain({device!r}); sb.capabilities({device!r}); "
            f"bad = [m for m in sys.modules if m.split('.')[0] in {foreign!r}]; assert not bad, bad; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
