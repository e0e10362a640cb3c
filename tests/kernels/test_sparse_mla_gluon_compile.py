"""The two Gluon sparse-MLA kernels (variants ``gluon_ws`` and ``gluon``) compile for sm_90a
offline (no GPU) with every Triton the host has (this interpreter's, and e.g. the H200's
Triton 3.6 named in SWA_EXTRA_TRITON_PYTHONS): with and without sink (the ws kernel with both
gather widths), within 227 KB of
shared memory, without a register spill or a serialised wgmma (tests/kernels/aot_compile_sparse_mla_gluon.py
--report, in its own process: compiled mode). Skipped, with the reason, where the Triton has
no Gluon Hopper API; marked ``compile`` (CI's compile stage, ``python -m pytest -q -m compile``). Also
(in the main stage): their per-call scope on a faked sm90, their reasons in explain(),
and that importing the pack imports no Gluon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _tritons import NO_TRITON, ids, pythons, run_compile_script


@pytest.mark.compile
@pytest.mark.skipif(NO_TRITON is not None, reason=str(NO_TRITON))
@pytest.mark.parametrize("python", pythons(), ids=ids)
def test_gluon_kernel_compiles_offline_for_sm90(python):
    version, out = run_compile_script(python, Path(__file__).with_name("aot_compile_sparse_mla_gluon.py"), "--report",
                                      timeout=600)
    if out.stdout.startswith("SKIP:"):
        pytest.skip(f"Triton {version}: {out.stdout.strip()}")
    fails = [line for line in out.stderr.splitlines() if line.startswith("FAIL")]
    assert out.returncode == 0, f"Triton {version}: " + "\n".join(fails) + out.stdout[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "compiled 8", lines[-1]
    every = [ln for ln in lines if ln.startswith("cuda:90 _sparse_mla_gluon")]
    ws = [ln for ln in every if "[gluon_ws" in ln]
    one = [ln for ln in every if "[gluon_ws" not in ln]
    # each without and with a sink; ws with both gather widths, and gated (a validated call) once per width
    assert len(ws) == 6 and len(one) == 2, every
    assert sum(" wide" in ln for ln in ws) == 3 and sum(" gated]" in ln for ln in ws) == 2, ws
    for ln in ws:
        # each consumer warpgroup: S at wgmma N 64 (64x64x16) and P V at N 256; fits; no
        # ptxas serialisation; no spills
        assert "HGMMA.64x64x16" in ln and "HGMMA.64x256x16" in ln and "fits" in ln and "PTXAS" not in ln, ln
        assert "spill=0/0" in ln, ln
    for ln in one:
        assert "spill=0/0" in ln and "HGMMA.64x256x16" in ln and "fits" in ln, ln
        # two wgmma waits (S, then P V) and no ptxas serialisation of the wgmma chains
        assert "wgmma_waits=2" in ln and "PTXAS" not in ln, ln
        if version.startswith("3.6"):  # one proxy fence, before Q K^T with nothing else in flight
            assert "MEMBAR=1" in ln, ln


def test_import_pulls_in_no_gluon():
    code = ("import sys, swa_backends; from swa_backends.kernels import sparse_mla; "
            "print(any(m.startswith('triton.experimental.gluon') or m.endswith('sparse_mla_gluon') for m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_gluon_variants_are_declared_for_sm90_only_and_lead_its_chain():
    import swa_backends as sb

    sm80 = {c.variant: c for c in sb.explain("cuda:sm80").table if c.op == "sparse_mla"}
    for name in ("gluon_ws", "gluon"):
        assert any("requires arch in (sm90)" in r for r in sm80[name].reasons), sm80[name]
    sm90 = sb.explain("cuda:sm90")
    names = [c.variant for c in sm90.table if c.op == "sparse_mla"]
    # the pack's own chain on sm90: FlashMLA (when vLLM is there), then ws, one-item, tl, reference
    assert names.index("gluon_ws") < names.index("gluon") < names.index("triton") < names.index("reference")


def test_gluon_scope_rules_without_a_gpu():
    """input_check()'s shape rules, with the SM count stubbed (a CPU host): every reason the
    triton variant keeps a call is a sentence naming it."""
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = r'''
import torch
from swa_backends.kernels import sparse_mla_gluon as G
if G.api_reason():
    print("SKIP", G.api_reason()); raise SystemExit
G.num_sms = lambda index: 132  # an sm90 with 132 SMs
G.cuda_index = lambda t: 0
class FakeQ:
    is_cuda = True
    def __init__(self, T, H, D, dtype=torch.bfloat16):
        self.shape, self.dtype, self.device = (T, H, D), dtype, torch.device("cuda", 0)
    def stride(self, i): return (self.shape[1] * self.shape[2], self.shape[2], 1)[i]
kv = torch.empty(4, 512, dtype=torch.bfloat16)
idx = torch.empty(4, 640, dtype=torch.int32)
lens = torch.empty(4, dtype=torch.int32)
def why(q, d_v=512, kv=kv): return "; ".join(G.input_check(q, kv, idx, lens, 0.04, d_v)) or "None"
print(why(FakeQ(300, 64, 512)))
print(why(FakeQ(300, 128, 512)))
print(why(FakeQ(100, 64, 512)))
print(why(FakeQ(66, 128, 512)))
print(why(FakeQ(300, 32, 512)))
print(why(FakeQ(300, 64, 576)))
print(why(FakeQ(300, 64, 512), d_v=256))
print(why(FakeQ(300, 64, 512, torch.float16)))
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    if lines and lines[0].startswith("SKIP"):
        pytest.skip(lines[0])
    assert lines[0] == "None" and lines[1] == "None"  # prefill, H 64 and 128
    assert "decode-sized" in lines[2]  # 100 programs < 132 SMs
    assert lines[3] == "None"  # 66 tokens x 2 head blocks = 132 programs
    assert "H=32" in lines[4]
    assert "D_qk=576" in lines[5]
    assert "d_v=256" in lines[6]
    assert "kv dtype torch.bfloat16 differs" in lines[7]


def test_ws_warmup_compiles_both_widths_of_what_dispatch_sends_it():
    """The ws kernel's warmup hook, on a CPU stand-in for an sm90 backend with the compile step
    recorded instead of run: both gather widths for every head count (>= 64), dtype it takes and
    sink setting whose prefill-sized call dispatch sends to it; nothing where another variant
    (FlashMLA) takes the call, where the chain has no ws kernel, or on a device that cannot run."""
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = r'''
import types
import torch
from swa_backends.kernels import sparse_mla_gluon as G, sparse_mla_gluon_ws as WS
if WS.api_reason():
    print("SKIP", WS.api_reason()); raise SystemExit
built = []
G.build = lambda name, kernel, meta, persistent, q, kv, idx, lens, scale, d_v, sink, out, lse, done: built.append(
    (q.shape[1], str(q.dtype), meta["HAS_SINK"], meta["WIDE"], sink is not None, name, persistent))
class Backend:  # dispatch sends a prefill-sized call to first(q)
    def __init__(self, first, chain=("flashmla", "gluon_ws", "gluon", "triton", "reference"), runnable=True):
        self.device = types.SimpleNamespace(runnable=runnable, torch_device="cpu")
        self.checked = False  # serving's backend (a validating one also builds the gated kernels: test_gated_validation)
        self.variants = {"sparse_mla": chain}
        self.first = first
    def variant_for(self, op, q, kv, idx, lens, scale, d_v, sink=None):
        assert op == "sparse_mla" and kv.dtype == q.dtype and idx.shape[0] == q.shape[0] == lens.shape[0]
        return self.first(q)
def run(backend, **kw):
    built.clear()
    print(WS.warmup(backend, **kw), sorted(built))
run(Backend(lambda q: "gluon_ws"), num_heads=(16, 64, 128), attn_dtypes=(torch.bfloat16, torch.float32),
    attn_sink=(False, True))
run(Backend(lambda q: "flashmla"), num_heads=(64, 128))
run(Backend(lambda q: "flashmla" if q.shape[1] == 64 else "gluon_ws"), num_heads=(64, 128), attn_sink=(True,))
run(Backend(lambda q: "gluon_ws", chain=("triton", "reference")))
run(Backend(lambda q: "gluon_ws", runnable=False))
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    if lines and lines[0].startswith("SKIP"):
        pytest.skip(lines[0])
    every = [(H, "torch.bfloat16", s, w, s, "gluon_ws", True) for H in (64, 128) for s in (False, True)
             for w in (False, True)]
    assert lines[0] == f"['sparse_mla'] {sorted(every)}"  # H 16 and fp32 are not its calls
    assert lines[1] == "[] []"  # FlashMLA serves: nothing of the ws kernel would run
    assert lines[2] == "['sparse_mla'] " + str([(128, "torch.bfloat16", True, w, True, "gluon_ws", True)
                                                  for w in (False, True)])
    assert lines[3] == "[] []" and lines[4] == "[] []"
