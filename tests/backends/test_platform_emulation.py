"""``swa_backends.testing.emulation.<platform>.contract_doubles()`` -- the entry point the
emulated matrix runner calls -- end to end: a backend selected for a fake device runs the
vendor wrapper through the doubles and returns the reference's result."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swa_backends as sb
from swa_backends.common.ops.sparse_mla import reference as sparse_mla_reference
from swa_backends.common.registry import load_attr
from swa_backends.testing.conformance import mismatch, poisoned_allocations

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


# Every vendor wrapper, called directly inside its platform's doubles (its per-call check, which sends
# most of these calls elsewhere in dispatch, left out): device, implementation, what its interface needs
WRAPPERS = [
    ("cuda:sm90", "swa_backends.backends.cuda.flashmla:sparse_mla", {}),
    ("cuda:sm100", "swa_backends.backends.cuda.flashinfer:sparse_mla_sm10x", {"K": 128}),  # the mixed layout's 128
    ("cuda:sm120", "swa_backends.backends.cuda.flashinfer:sparse_mla_sm12x", {"K": 132}),  # 128 + 4k
    ("rocm:gfx950", "swa_backends.backends.rocm.aiter_opus:sparse_mla", {}),
    ("ascend:910b", "swa_backends.backends.ascend.npu_attention:sparse_mla", {}),
]
#: odd shapes: no token, one token of one head, one index (where the layout allows), one KV row
SHAPES = {"random": {}, "no token": dict(T=0), "one token, one head": dict(T=1, heads=(1,)), "one index": dict(K=1),
          "one kv row": dict(S=1)}


@pytest.mark.parametrize("device, impl, needs", WRAPPERS, ids=[w[1].split(".")[-1] for w in WRAPPERS])
def test_vendor_wrappers_on_random_odd_and_poisoned_calls(device, impl, needs):
    """Each vendor wrapper against the reference on hypothesis-drawn calls: random ones and odd
    shapes, with and without the lse, with every ``torch.empty`` the wrapper and the double make
    filled with NaN (an output element left unwritten shows)."""
    dev = sb.parse_device(device)
    emulation = importlib.import_module(f"swa_backends.testing.emulation.{dev.platform}")
    fn = load_attr(impl)

    @settings(max_examples=12)
    @given(seed=st.integers(0, 2**31 - 1), shape=st.sampled_from(sorted(SHAPES)), lse=st.booleans(),
           poison=st.booleans())
    def run(seed, shape, lse, poison):
        kw = {**SHAPES[shape], **needs} if shape != "one index" or "K" not in needs else dict(needs)
        args, k = vendor_case(seed, **kw)
        if not lse:
            k["return_lse"] = False
        with emulation.contract_doubles(device):
            if poison:
                with poisoned_allocations():
                    got = fn(*args, **k)
            else:
                got = fn(*args, **k)
        if lse:
            assert_matches_reference(lambda *a, **kk: got, args, k)
        else:
            why = mismatch("sparse_mla", got, sparse_mla_reference(*args, **k))
            assert why is None and got[1] is None, why
            assert not torch.isnan(got[0]).any()

    run()
