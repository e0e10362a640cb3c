"""The Gluon sparse-MLA kernel compiles for sm_90a offline (no GPU) with every Triton the host
has (this interpreter's, and e.g. the H200's Triton 3.6 named in SWA_EXTRA_TRITON_PYTHONS):
every config the H200 benchmark measures, with and without sink, within 227 KB of shared
memory and without a register spill (tests/aot_compile_sparse_mla_gluon.py --report, in its
own process: compiled mode). Skipped, with the reason, where the Triton has no Gluon Hopper
API. Also: the dispatch's reasons on a CPU, and that importing the pack imports no Gluon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swa_backends.common.registry import probe

from _tritons import ids, pythons, triton_version


@pytest.mark.skipif(probe("triton") is not None, reason=f"{probe('triton')}")
@pytest.mark.parametrize("python", pythons(), ids=ids)
def test_gluon_kernel_compiles_offline_for_sm90(python):
    version = triton_version(python)
    if version is None:
        pytest.skip(f"{python}: no such interpreter, or no Triton there")
    script = Path(__file__).with_name("aot_compile_sparse_mla_gluon.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([python, str(script), "--report"], env=env, capture_output=True, text=True, timeout=600)
    if out.stdout.startswith("SKIP:"):
        pytest.skip(f"Triton {version}: {out.stdout.strip()}")
    fails = [line for line in out.stderr.splitlines() if line.startswith("FAIL")]
    assert out.returncode == 0, f"Triton {version}: " + "\n".join(fails) + out.stdout[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("compiled ") and int(lines[-1].split()[1]) >= 6, lines[-1]
    every = [ln for ln in lines if ln.startswith("cuda:90 _sparse_mla_gluon_fwd")]
    kernels = [ln for ln in every if "[gluon-ws" not in ln]
    ws = [ln for ln in every if "[gluon-ws" in ln]
    assert len(ws) == 2, every  # without and with a sink
    for ln in ws:
        # each consumer warpgroup: S at wgmma N 64 (64x64x16) and P V at N 256; fits; no
        # ptxas serialisation; spills within the budget the script enforces
        assert "HGMMA.64x64x16" in ln and "HGMMA.64x256x16" in ln and "fits" in ln and "PTXAS" not in ln, ln
    for ln in kernels:
        assert ("spill=0/0" in ln or not version.startswith("3.6")) and "HGMMA.64x256x16" in ln and "fits" in ln, ln
        # two wgmma waits (S, then P V) and no ptxas serialisation of the wgmma chains
        assert "wgmma_waits=2" in ln and "PTXAS" not in ln, ln
    n32 = next(ln for ln in kernels if ln.split("[")[1].startswith("gluon-n32b4l0]"))
    # 4 KV buffers, the loop waits with 2 cp.async groups (tiles) still in flight
    assert "kv_buffers=4" in n32 and "loop_wait_num=2" in n32, n32
    # proxy fences (MEMBAR.ALL.CTA): with P as a register operand only the one before Q K^T
    # when nothing else is in flight (2 buffers); Triton 3.9 adds its own before Q K^T
    if version.startswith("3.6"):
        for ln in kernels:
            label = ln.split("[")[1].split("]")[0].split()[0]
            want = ("b2" in label) + ("l0s" in label or label.endswith("s"))
            assert f"MEMBAR={want}" in ln, ln
        for ln in kernels:  # the pipelined configs: Q K^T(i+1) + P V(i) retired by one wait
            if ln.split("[")[1].split("]")[0].split()[0].endswith("dp"):
                assert "wgmma_waits=2" in ln, ln


def test_import_pulls_in_no_gluon():
    code = ("import sys, swa_backends; from swa_backends.kernels import sparse_mla; "
            "print(any(m.startswith('triton.experimental.gluon') or m.endswith('sparse_mla_gluon') for m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.skipif(probe("triton") is not None, reason=f"{probe('triton')}")
def test_dispatch_on_cpu_keeps_tl_and_says_why():
    # own process: importing kernels.sparse_mla here would fix its compiled/interpreted
    # mode for the rest of this pytest process
    code = r'''
import os, torch
from swa_backends.kernels import sparse_mla as K
q = torch.randn(300, 64, 512).to(torch.bfloat16)
kv = torch.randn(50, 512).to(torch.bfloat16)
idx = torch.randint(0, 50, (300, 640), dtype=torch.int32)
info = K.dispatch_info(q, kv, idx, 512)
print(info["kernel"], "|", info["why"])
os.environ["SWA_SPARSE_MLA_GLUON"] = "0"
print(K.dispatch_info(q, kv, idx, 512)["why"])
'''
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SWA_SPARSE_MLA_GLUON")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    assert first.startswith("tl |") and "not CUDA" in first
    assert "SWA_SPARSE_MLA_GLUON=0" in second


def test_gluon_scope_rules_without_a_gpu():
    """unsupported()'s shape rules, with the device checks stubbed (a CPU host): every
    reason the tl kernel keeps a call is a sentence naming it."""
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = r'''
import torch
from swa_backends.kernels import sparse_mla_gluon as G
if G.api_reason():
    print("SKIP", G.api_reason()); raise SystemExit
G._device_facts = lambda index: ((9, 0), 132)  # an sm90 with 132 SMs
class FakeQ:
    def __init__(self, T, H, D, dtype=torch.bfloat16):
        self.shape, self.dtype, self.device = (T, H, D), dtype, torch.device("cuda", 0)
    def stride(self, i): return (self.shape[1] * self.shape[2], self.shape[2], 1)[i]
kv = torch.empty(4, 512, dtype=torch.bfloat16)
idx = torch.empty(4, 640, dtype=torch.int32)
def why(q, d_v=512, cfg=G.DEFAULT): return G.unsupported(q, kv, idx, d_v, cfg=cfg, num_sms=132)
print(why(FakeQ(300, 64, 512)))
print(why(FakeQ(300, 128, 512)))
print(why(FakeQ(100, 64, 512)))
print(why(FakeQ(66, 128, 512)))
print(why(FakeQ(300, 32, 512)))
print(why(FakeQ(300, 64, 576)))
print(why(FakeQ(300, 64, 512), d_v=256))
print(why(FakeQ(300, 64, 512, torch.float32)))
print(why(FakeQ(300, 64, 512), cfg=G.GluonConfig(block_n=64, nbuf=3)))
print(why(FakeQ(300, 128, 512), cfg=G.WS), G.default_for(64).short(), G.default_for(96).short(),
      G.default_for(128).short())
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
    assert "float32" in lines[7]
    assert "does not fit" in lines[8]  # Q 64 KB + 3 x 64 KB
    # the ws kernel takes prefill and is shipped for every head count (n64b2l0 where it cannot build)
    assert lines[9] == "None gluon-ws gluon-ws gluon-ws", lines[9]


def test_parse_env():
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("from swa_backends.kernels import sparse_mla_gluon as G\n"
            "print(G.parse_env(None), G.parse_env('0'), G.parse_env('n64b2l0'), G.parse_env('gluon-n32b3'))\n"
            "print(G.parse_env('n64b2l0d').short(), G.parse_env('n32b4l0dp').pipe, G.parse_env('ws').short(),\n"
            "      G.parse_env('gluon-ws') == G.WS)\n"
            "try:\n    G.parse_env('fast')\nexcept ValueError as e:\n    print('ValueError', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, third, second = out.stdout.strip().splitlines()[-3:]
    assert third == "gluon-n64b2l0d True gluon-ws True"
    assert first == ("True False GluonConfig(block_n=64, nbuf=2, lazy=0, p_smem=False, split_s=True, pipe=False, "
                     "ws=False) GluonConfig(block_n=32, nbuf=3, lazy=8, p_smem=False, split_s=True, pipe=False, "
                     "ws=False)")
    assert second.startswith("ValueError SWA_SPARSE_MLA_GLUON='fast'")
