"""``sparse_mla`` through ``sparse_mla_cluster.cu`` (a 2-CTA cluster that splits D and exchanges
partial scores through distributed shared memory): an experiment of issue 38, item 2, timed and
checked by the ws kernel's tools as a module copy::

    python3 bench/experiments/check_ws_copies.py bench/experiments/cluster/sparse_mla_cluster.py
    python3 bench/bench_flashmla.py --variant cluster=bench/experiments/cluster/sparse_mla_cluster.py

Not product code: the pack ships no compiled extension. The cubin is built at first use with the
machine's ``nvcc`` into a private temporary folder (``build_cluster.py``) and launched through the
CUDA driver API (``ctypes``). Same signature and results as the reference for what it takes:
bf16, ``D_qk = d_v = 512``, the plain index layout, inputs already validated.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_cluster  # noqa: E402

D = 512
HEADS = 64
LOG2E = 1.4426950408889634
#: the P V operand's descriptor strides (bytes) for its MN-major layout: between 64-column blocks (the leading
#: byte offset), between 8-row groups (the stride byte offset); checked on the GPU by every form's runs (README)
PV_STRIDES = (8192, 1024)
SMEM = 2 * 32768 + 4 * 32768 + 16384 + 14 * 8 + 1024  # as SMEM_BYTES in the .cu
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_state: dict = {}


def wide_gathers(kv) -> bool:
    """Kept for the ws kernel's tools, which set it per check: this kernel always gathers a row
    half per warp instruction (512 contiguous bytes)."""
    return True


def _driver():
    if "fn" in _state:
        return _state["cuda"], _state["fn"]
    cuda = ctypes.CDLL("libcuda.so.1")
    folder = tempfile.mkdtemp(prefix="swa_cluster_")  # 0700: nobody else writes the cubin
    atexit.register(shutil.rmtree, folder, True)
    data = build_cluster.build(Path(folder)).read_bytes()
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the primary context is current
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    _ok(cuda, cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data)), "cuModuleLoadData")
    _ok(cuda, cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"swa_sparse_mla_cluster"), "cuModuleGetFunction")
    _ok(cuda, cuda.cuFuncSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM),
        "cuFuncSetAttribute")
    _state.update(cuda=cuda, fn=fn, mod=mod, data=data)
    return cuda, fn


def _ok(cuda, rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what}: CUDA driver error {rc} ({name.value.decode() if name.value else '?'})")


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None, **_unused):
    """``(out [T, H, 512] bf16, lse [T, H] fp32)`` as the reference computes them."""
    return run(q, kv, indices, lens, sm_scale, d_v, sink, FLAGS)


#: the kernel's ``flags`` (ablations whose results are wrong): bit 1 skips the exchange of partial scores, bit 2
#: the KV gathers
FLAGS = 0


def run(q, kv, indices, lens, sm_scale, d_v, sink, flags: int):
    """One launch with ``flags``."""
    T, H, Dq = q.shape
    if q.dtype != torch.bfloat16 or Dq != D or d_v != D or kv.shape[-1] != D:
        raise ValueError(f"sparse_mla_cluster: bf16 with D_qk = d_v = 512 only; got {q.dtype}, {Dq}, {d_v}")
    kv2 = kv.reshape(-1, D) if kv.dim() != 2 else kv
    if q.stride(-1) != 1 or kv2.stride(-1) != 1 or indices.dtype != torch.int32 or indices.stride(-1) != 1:
        raise ValueError("sparse_mla_cluster: q and kv need a contiguous last dimension, indices int32 rows")
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    if T == 0 or indices.shape[1] == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    lens = lens.contiguous()
    sink_t = sink.float().contiguous() if sink is not None else lse
    cuda, fn = _driver()
    num_hb = math.ceil(H / HEADS)
    items = T * num_hb
    from swa_backends.common.device import cuda_index
    from swa_backends.kernels.sparse_mla_gluon import num_sms  # the persistent Gluon kernels' SM count, read once

    clusters = max(1, min(num_sms(cuda_index(q)) // 2, items))  # persistent: a cluster per two SMs, an item at a time
    vals = [ctypes.c_uint64(t.data_ptr()) for t in (q, kv2, indices, lens, sink_t, out, lse)]
    vals += [ctypes.c_int32(v) for v in (H, num_hb, items)]
    vals += [ctypes.c_int64(v) for v in (q.stride(0), q.stride(1), kv2.stride(0), indices.stride(0), out.stride(0),
                                         out.stride(1), lse.stride(0))]
    vals += [ctypes.c_float(float(sm_scale) * LOG2E), ctypes.c_int32(int(sink is not None)),
             ctypes.c_int32(PV_STRIDES[0]), ctypes.c_int32(PV_STRIDES[1]), ctypes.c_int32(flags)]
    args = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
    stream = torch.cuda.current_stream(q.device).cuda_stream
    _ok(cuda, cuda.cuLaunchKernel(fn, 2 * clusters, 1, 1, 256, 1, 1, SMEM, ctypes.c_void_p(stream), args, None),
        "cuLaunchKernel")
    return out, lse
