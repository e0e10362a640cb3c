"""Decoder-side replay in one prefill step (runs on any machine). ``python examples/decoder_trim.py``

Layers after the last KV-source layer own only window KV, so in a prefill step they need only
each request's last W = 128 rows. The batch: a decode (1 token at position 999), a 900-token
cold prefill, and a 100-token chunk that continues a prefix-hit replay (R = 50, positions
200..299). The replay layers run on a sub-batch of 1 + 128 + 100 = 229 rows instead of 1001;
their output is scattered back, and the trimmed rows come back as zeros (nothing after the
replay layers reads them in a prefill step: only the last row of a prefill makes a token).

The planner's trim policy (SPEC 3.5) decides first: a step a FULL CUDA graph runs keeps its whole
batch, and so does a step of fewer than ``trim_threshold`` tokens (default 768, vLLM's): such
steps are launch-bound and the trim's extra work would cost more than the rows it saves.
"""

from __future__ import annotations

import numpy as np
import torch

import swa_backends as sb

W = 128
backend = sb.select()
dev = torch.device(backend.device.torch_device or "cpu")

# which layers replay: 8 layers, KV-source layers 0..3 -> the replay layers are 4..7
layers = sb.replay_layer_ids(8, [0, 1, 2, 3])
print(f"replay layers: {list(layers)}")

# the step
q = np.array([1, 900, 100])
qsl_host = np.concatenate([[0], np.cumsum(q)])  # [0, 1, 901, 1001]
T = int(qsl_host[-1])
is_prefilling = np.array([False, True, True])
keeps_rows = np.array([False, False, False])  # e.g. True for a request that asked for prompt logprobs
query_start_loc = torch.tensor(qsl_host, dtype=torch.int32, device=dev)
seq_lens = torch.tensor([1000, 900, 300], dtype=torch.int32, device=dev)
replay_start = torch.tensor([0, 0, 50], dtype=torch.int32, device=dev)
positions = torch.cat([torch.tensor([999]), torch.arange(900), torch.arange(200, 300)]).to(dev)  # int64 [1001]
slot_mappings = torch.stack([positions + 1000, positions + 5000])  # int64 [G=2, 1001]

# 1. host: which rows each request keeps. None means the layers run on the whole batch: nothing
#    trims, or the policy keeps it (a FULL-graph step; a step under trim_threshold tokens).
assert sb.plan_replay_batch(qsl_host, is_prefilling, keeps_rows, W, graph_mode="full") is None
assert sb.plan_replay_batch([0, 1, 301], is_prefilling[:2], keeps_rows[:2], W) is None  # 301 < 768 tokens
plan = sb.plan_replay_batch(qsl_host, is_prefilling, keeps_rows, W, graph_mode="none")  # an eager step
print(f"plan: kept {plan.kept.tolist()} of {q.tolist()} rows -> a sub-batch of {plan.num_rows} rows "
      f"(policy: a step of {T} >= {sb.TRIM_THRESHOLD} tokens, eager)")

# 2. device: the sub-batch's rows, query_start_loc, positions, slots and KV starts (one launch on a GPU)
sub = backend.gather_replay_batch(plan, query_start_loc, seq_lens, replay_start, positions, slot_mappings, W)
print(f"sub-batch: query_start_loc {sub.query_start_loc.tolist()}, kv_start {sub.kv_start.tolist()} "
      f"(a trimmed request's window starts at max(R, seq_len - W))")
assert sub.query_start_loc.tolist() == [0, 1, 129, 229] and sub.kv_start.tolist() == [0, 772, 50]

# 3. the replay layers run on the gathered hidden states ([1001, 7168] bf16 -> [229, 7168])
hidden = torch.randn(T, 7168, device=dev).to(torch.bfloat16)
h = backend.gather_rows(hidden, sub.rows)
h = h * 2  # stand-in for layers 4..7 (attention with sub.positions / sub.slot_mappings / sub.kv_start)

# 4. back into the full batch: rows the replay layers did not run are zero. count: the sub-batch's device row
#    count (rows past it are graph padding, not written: see 5)
out = backend.scatter_rows(h, sub.rows, hidden.shape[0], count=sub.query_start_loc[-1:])
kept = torch.zeros(T, dtype=torch.bool, device=dev)
kept[sub.rows] = True
assert torch.equal(out[kept], hidden[kept] * 2) and not out[~kept].any()
print(f"scatter_rows: {int(kept.sum())} rows back from the replay layers, {int((~kept).sum())} trimmed rows are "
      "zero; the last row of every prefill is among the kept ones")
assert all(bool(kept[int(e) - 1]) for e in qsl_host[1:])

# 5. speculative decoding: adaptive verification may resize the decodes on the device alone, after the host
#    planned (SPEC 3.2). Two decodes and a 10-token prefill, W 4: the host counts [1, 1, 10] rows, the device
#    verifies none for the second decode and the batch shrinks by one row. The sub-batch follows the device;
#    its last row is padding (row 0, slots PAD), which the scatter leaves alone given the device count.
plan = sb.plan_replay_batch([0, 1, 2, 12], np.array([False, False, True]), np.zeros(3, dtype=bool), 4,
                            trim_threshold=0)
dev_qsl = torch.tensor([0, 1, 1, 11], dtype=torch.int32, device=dev)
pos = torch.tensor([40, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9], device=dev)  # decode at 40; the prefill at 0..9
sub = backend.gather_replay_batch(plan, dev_qsl, torch.tensor([41, 30, 10], dtype=torch.int32, device=dev),
                                  torch.zeros(3, dtype=torch.int32, device=dev), pos, pos[None] + 100, 4)
assert sub.rows.tolist() == [0, 7, 8, 9, 10, 0] and sub.query_start_loc.tolist() == [0, 1, 1, 5]
h = backend.gather_rows(torch.arange(11.0, device=dev)[:, None] + 1, sub.rows) * 10  # the replay layers' stand-in
h[5] = -1.0  # what the layers leave in a padding row: anything
out = backend.scatter_rows(h, sub.rows, 11, count=sub.query_start_loc[-1:])
assert out[:, 0].tolist() == [10.0, 0, 0, 0, 0, 0, 0, 80.0, 90.0, 100.0, 110.0]
print(f"resized on the device: {sub.num_rows} sub-batch rows planned, {int(sub.query_start_loc[-1])} kept; "
      "row 0 keeps the decode's own output, not the padding row's")
