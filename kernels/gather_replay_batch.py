"""``gather_replay_batch`` (SPEC §3.2) in Triton: the decoder-side sub-batch in one launch.

Program ``i`` owns sub-batch rows ``[i*BLOCK, (i+1)*BLOCK)`` and requests
``[i*BLOCK, (i+1)*BLOCK)``. A row finds its request by binary search over the output
``query_start_loc = query_start_loc - dropped_before`` (computed on the fly, never read
back from memory another program writes), gathers its source row's position and every
group's slot; rows past the plan's ``num_rows`` (graph padding) gather row 0 with PAD
slots. A request writes its output ``query_start_loc`` entry and its ``kv_start``.
"""

from __future__ import annotations

import triton.language as tl

from ..common.ops.gather_replay_batch import allocate_out
from ..common.types import ReplayBatch
from ._device import PAD, warm
from ._launch import Kernel, contiguous, jit

BLOCK = 256


@jit
def _gather_replay_batch(qsl_ptr, drop_ptr, trim_ptr, seq_ptr, rs_ptr, pos_ptr, slot_ptr, s_g, s_t,
                         rows_ptr, oqsl_ptr, opos_ptr, oslot_ptr, kv_ptr,
                         B, G, n, n_pad, n_steps, W, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # --- sub-batch rows
    o = i
    m = o < n_pad
    real = o < n
    lo = tl.zeros([BLOCK], tl.int32)
    hi = tl.maximum(lo + B, tl.minimum(warm(qsl_ptr, B + 1), warm(drop_ptr, B + 1)))  # == B
    for _ in range(n_steps):  # searchsorted(out_qsl[1:], o, right=True)
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(qsl_ptr + 1 + mid, mask=active, other=0) - tl.load(drop_ptr + 1 + mid, mask=active, other=0)
        right = v <= o
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (~right), mid, hi)
    req = tl.minimum(lo, tl.maximum(B - 1, 0))
    has_req = real & (req < B)  # False everywhere when B == 0
    d = tl.load(drop_ptr + req + 1, mask=has_req, other=0).to(tl.int64)
    row = tl.where(has_req, o.to(tl.int64) + d, 0)
    tl.store(rows_ptr + o, row, mask=m)
    tl.store(opos_ptr + o, tl.load(pos_ptr + row, mask=m, other=0), mask=m)
    o64 = o.to(tl.int64)
    for g in range(G):
        s = tl.load(slot_ptr + g * s_g + row * s_t, mask=real, other=PAD)
        tl.store(oslot_ptr + g * n_pad + o64, s, mask=m)
    # --- per-request outputs
    b = i
    mq = b <= B
    tl.store(oqsl_ptr + b, tl.load(qsl_ptr + b, mask=mq, other=0) - tl.load(drop_ptr + b, mask=mq, other=0), mask=mq)
    mb = b < B
    R = tl.load(rs_ptr + b, mask=mb, other=0)
    seq = tl.load(seq_ptr + b, mask=mb, other=0)
    trimmed = tl.load(trim_ptr + b, mask=mb, other=0) != 0
    kv = tl.where(trimmed, tl.maximum(R.to(tl.int64), seq.to(tl.int64) - W), R.to(tl.int64))
    tl.store(kv_ptr + b, kv.to(tl.int32), mask=mb)


_K = Kernel(_gather_replay_batch)
_KEY = ()


def gather_replay_batch(plan, query_start_loc, seq_lens, replay_start, positions, slot_mappings, W, *,
                        out=None) -> ReplayBatch:
    """Request ``i`` keeps its last ``kept_i`` rows before its end ``query_start_loc[i+1]``
    (the *device* copy); they land at ``end - dropped_before[i+1]``. Returns ``rows``,
    ``query_start_loc``, ``positions``, ``slot_mappings`` and ``kv_start`` (``max(R,
    seq_len - W)`` for trimmed requests, ``R`` otherwise). Rows past ``num_rows`` (graph
    padding) gather row 0 with every slot PAD. One launch; no host synchronisation once the
    plan's device copy exists (``plan.device_tensors(device)``, made on first use).
    """
    dev = positions.device
    dropped, trimmed = plan.device_tensors(dev)
    n, n_pad = plan.num_rows, plan.num_rows_padded
    B = query_start_loc.shape[0] - 1
    G = slot_mappings.shape[0]
    if out is None:
        out = allocate_out(plan, G, dev)
    rows, oqsl, opos, oslot, kv = out["rows"], out["query_start_loc"], out["positions"], out["slot_mappings"], out["kv_start"]
    span = n_pad if n_pad > B + 1 else B + 1
    _K(_KEY, ((span + BLOCK - 1) // BLOCK, 1, 1),
       contiguous(query_start_loc), dropped, trimmed, contiguous(seq_lens), contiguous(replay_start),
       contiguous(positions), slot_mappings, slot_mappings.stride(0), slot_mappings.stride(1),
       rows, oqsl, opos, oslot, kv, B, G, n, n_pad, B.bit_length(), W, BLOCK)
    return ReplayBatch(rows, oqsl, opos, oslot, kv, n, n_pad)
