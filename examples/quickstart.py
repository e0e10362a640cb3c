"""Encoder-side replay after a prefix hit, end to end on one small batch (runs on any machine;
the CPU reference when there is no GPU). ``python examples/quickstart.py``

The batch: two requests in one prefill step, block size 64, window W = Wr = 128.
* request 0 had a prefix-cache hit of 1024 tokens on a 1100-token prompt: its window cache
  was not cached, so the last 128 hit tokens [896, 1024) are recomputed (replayed) together
  with the 76 new ones: 204 tokens at positions 896..1099, replay_start R = 896;
* request 1 is a cold 40-token prompt: positions 0..39, R = 0.
"""

from __future__ import annotations

import torch

import swa_backends as sb

W = Wr = 128
BLOCK = 64

backend = sb.select()  # this process's accelerator, else the CPU
dev = torch.device(backend.device.torch_device or "cpu")
print(f"backend: {backend.device}; sparse_mla runs {' -> '.join(backend.variants['sparse_mla'])}")
caps = backend.capabilities  # the decision for this device under serving defaults
print(f"encoder replay {'on' if caps.encoder_replay.enabled else 'off'}, "
      f"decoder replay {'on' if caps.decoder_replay.enabled else 'off'}")

# 1. scheduler (host): admit the hit. hit 1024 > Wr, so the request replays from R = 1024 - 128.
adm = sb.admit_prefix_hit(local_hit=1024, external_hit=0, Wr=Wr, block_size=BLOCK)
assert adm.replays and adm.replay_start == 896 and adm.num_computed == 896
print(f"admission: hit {adm.hit}, replay_start {adm.replay_start}, computed {adm.num_computed} "
      f"({adm.replay_tokens} tokens recomputed to rebuild the window)")

# 2. the step's batch (device tensors; dtypes are the contract's: int32 metadata, int64 slots)
q0, q1 = 1100 - adm.num_computed, 40
query_start_loc = torch.tensor([0, q0, q0 + q1], dtype=torch.int32, device=dev)  # [B+1]
seq_lens = torch.tensor([1100, 40], dtype=torch.int32, device=dev)  # [B]: KV length after this step
replay_start = torch.tensor([adm.replay_start, 0], dtype=torch.int32, device=dev)  # [B]
positions = torch.cat([torch.arange(adm.num_computed, 1100), torch.arange(0, 40)]).to(dev)  # int64 [T]
T = positions.shape[0]
block_table = torch.stack([torch.arange(100, 118), torch.arange(200, 218)]).to(torch.int32).to(dev)  # [B, 18]
req = torch.repeat_interleave(torch.arange(2, device=dev), torch.tensor([q0, q1], device=dev))
slots = block_table[req, positions // BLOCK].long() * BLOCK + positions % BLOCK  # int64 [T]
# two KV groups: 0 = the prefix-cacheable (compressed) cache, 1 = the SWA window cache
slot_mappings = torch.stack([slots, slots + 10_000])  # int64 [G=2, T]
cacheable_groups = torch.tensor([0], dtype=torch.int32, device=dev)

# 3. replayed tokens must not rewrite cached KV: their cacheable slots become PAD (-1) in place
backend.pad_replayed_slots(slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, Wr)
padded = (slot_mappings[0] == sb.PAD).sum().item()
print(f"pad_replayed_slots: {padded} cacheable writes padded (positions [896, 1024)), window group untouched")
assert padded == Wr and bool((slot_mappings[1] >= 0).all())

# 4. their window attention must not read below R: the clamp lives in the indices
indices, lens = backend.swa_indices_and_lens(query_start_loc, seq_lens, block_table, BLOCK, W, replay_start,
                                             num_tokens=T)  # int32 [T, W], int32 [T]
print(f"swa_indices_and_lens: first replayed token reads {int(lens[0])} position(s) (itself, clamped at R), "
      f"the 129th reads {int(lens[128])} (a full window), a cold token at position 5 reads {int(lens[q0 + 5])}")
assert lens[0] == 1 and lens[128] == W and lens[q0 + 5] == 6

# 5. attention through those indices: MQA over one latent cache (64 heads, D 512 here)
H, D = 64, 512
dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
kv = torch.randn(20_000 + BLOCK * 218, D, device=dev).to(dtype)  # slot-addressed latent rows
q = torch.randn(T, H, D, device=dev).to(dtype)
out, lse = backend.sparse_mla(q, kv, indices, lens, D ** -0.5, D)  # [T, H, 512] q.dtype, [T, H] fp32
print(f"sparse_mla: out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)}; "
      f"variant for this call: {backend.variant_for('sparse_mla', q, kv, indices, lens, D ** -0.5, D)}")
assert torch.isfinite(out.float()).all()
