"""``Backend.warmup()`` for the Triton variants: compile everything the serving path launches.

Why real launches: Triton's compile-only warmup (``kernel.warmup(...)``) fills Triton's
compile cache, but neither loads the module onto the device (done on the first launch)
nor fills this pack's launch cache (``_launch.Kernel``), whose entries are made by a real
launch. So the hook runs each op of the backend whose chosen variant is ``triton`` on a
small synthetic serving step -- replaying prefills (``R > 0``, padded slots, clamped
windows), a decode, a cold prefill longer than ``W`` (so the decoder sub-batch trims) with
graph padding -- once for every specialisation the op's launcher can pick: the optional
inputs (``valid``, top-k), the index dtypes, the compression ratios, the hidden sizes and
dtypes of the row copies, and the fused step with and without padding and plan, in each
serving layout and launch tile.

The specialisation keys never depend on sizes (token and request counts, strides, W are
runtime arguments that Triton is told not to specialise on) but for one choice:
``prepare_replay_step``'s token tile follows the step's token count, and each tile is
launched here (forced on the small step). So after this a serving step of any size
compiles nothing new. Row copies are specialised on 16-byte alignment of the
hidden-state buffers: freshly allocated buffers are aligned, and so are serving buffers.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from ..common.types import INDEX_DTYPE, PAD, SLOT_DTYPE

_VIA_TRITON = "triton"


def warmup(backend, *, W: int = 128, block_size: int = 64, num_groups: int = 5, index_width: int | None = None,
           compress_ratios=(4, 128), top_k: int = 512, hidden_sizes=(7168,), hidden_dtypes=(torch.bfloat16,),
           index_dtypes=(torch.int32, torch.int64), **_other) -> list[str]:
    """Launch every Triton kernel specialisation the serving path uses, through
    ``backend``'s own ops (so the variants it chose are the ones warmed up).

    ``W``/``block_size``/``num_groups``/``index_width``: the model's window, KV block size,
    slot groups and window index width; ``compress_ratios``: compressed caches' ratios;
    ``top_k``: top-k width of the combined/mixed layouts; ``hidden_sizes``/``hidden_dtypes``:
    rows moved by gather/scatter; ``index_dtypes``: dtypes of the per-request replay starts
    and the batch->request mapping. Unknown keyword arguments (other hooks') are ignored.
    Returns the ops it ran.
    """
    if not backend.device.runnable:
        return []
    dev = torch.device(backend.device.torch_device)
    ops = {op for op, names in backend.variants.items() if _VIA_TRITON in names}
    step = _Step(dev, W, block_size, num_groups)
    width = W if index_width is None else index_width
    ran: list[str] = []

    def run(op, *args, **kwargs):
        if op in ops:
            getattr(backend, op)(*args, **kwargs)
            if op not in ran:
                ran.append(op)

    s = step
    for rd in index_dtypes:
        for idd in index_dtypes:
            run("batch_replay_start", s.R_all.to(rd), s.idx.to(idd), s.prefilling)
    run("pad_replayed_slots", s.slots.clone(), s.cacheable, s.qsl, s.positions[: s.T], s.R, W)
    for ratio in compress_ratios:
        if block_size % ratio == 0:
            run("compressed_slot_mapping", s.slots[0, : s.T].clone(), s.qsl, s.seq, s.block_table, block_size, ratio)
    for valid in (None, s.valid):
        run("swa_indices_and_lens", s.qsl, s.seq, s.block_table, block_size, W, s.R, index_width=width,
            num_tokens=s.T_pad, valid=valid)
    run("prefill_gather_lens", s.qsl, s.seq, s.R, W)
    swa, lens = backend.swa_indices_and_lens(s.qsl, s.seq, s.block_table, block_size, W, s.R, index_width=width,
                                             num_tokens=s.T)
    topk = torch.randint(-1, 64, (s.T, top_k), dtype=INDEX_DTYPE, device=dev)
    topk_lens = torch.randint(0, top_k + 1, (s.T,), dtype=INDEX_DTYPE, device=dev)
    slab = 64 + int(s.gather_lens.max()) + 1
    for valid in (None, s.valid[: s.T]):
        for ratio in compress_ratios:
            run("combined_indices", topk, s.qsl, s.seq, s.R, W, ratio, top_k, slab, 64, valid=valid)
    run("mixed_indices", swa, topk, topk_lens)
    run("plain_indices", swa, lens)
    run("plain_indices", swa, lens, topk, topk_lens)
    run("indices_to_csr", swa, lens)
    plan = backend.plan_replay_batch(s.qsl_host, s.prefilling_host, np.zeros(s.B, bool), W, pad_to=s.n_kept + 3, trim_threshold=0)
    run("gather_replay_batch", plan, s.qsl, s.seq, s.R, s.positions, s.slots, W)
    for hidden in hidden_sizes:
        for dtype in hidden_dtypes:
            x = torch.ones(s.T, hidden, dtype=dtype, device=dev)
            rows = torch.arange(s.T - plan.num_rows, s.T, dtype=SLOT_DTYPE, device=dev)
            run("gather_rows", x, rows)
            run("scatter_rows", x[: plan.num_rows].contiguous(), rows, s.T)
    if "prepare_replay_step" in ops:
        from .prepare_replay_step import TILES, forced_tile

        # the serving layouts (vLLM's builder): decode and prefill rows apart with gather lengths,
        # and with them tokens left out by a window group's PAD slots (group 1: never cacheable)
        layouts = [{}, {"prefill_from": 1, "gather_lens_from": 1}]
        if num_groups > 1:
            layouts.append({**layouts[1], "valid_group": 1})
        # the launch tile depends on the step's size: each tile forced on this small step
        for tile, rd, idd, any_replay, p, layout in itertools.product(TILES, index_dtypes, index_dtypes,
                                                                       (None, False), (None, plan), layouts):
            # any_replay=False (host knowledge that no request replays) needs replay starts of 0
            R_all = s.R_all.to(rd) if any_replay is None else torch.zeros_like(s.R_all, dtype=rd)
            with forced_tile(tile):
                run("prepare_replay_step", R_all, s.idx.to(idd), s.prefilling, s.qsl, s.seq, s.positions,
                    s.slots.clone(), s.cacheable, s.block_table, block_size, W, W, index_width=width, plan=p,
                    any_replay=any_replay, **layout)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return ran


class _Step:
    """A small serving step: a decode, a replaying prefill (R > 0, not block aligned), a
    cold prefill longer than W (it trims), a chunked prefill; three padded token columns."""

    def __init__(self, dev, W: int, bs: int, G: int):
        q = np.array([1, W // 2 + 3, W + 5, 7])
        R = np.array([0, W + 3, 0, 0])
        prefix = np.array([3 * W + 1, W + 3, 0, 2 * W])
        seq = prefix + q
        self.B, self.T, self.T_pad = len(q), int(q.sum()), int(q.sum()) + 3
        self.qsl_host = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
        self.prefilling_host = np.array([False, True, True, True])
        kept = np.where(self.prefilling_host, np.minimum(q, W), q)
        self.n_kept = int(kept.sum())
        n_blocks = int(-(-seq.max() // bs)) + 1
        table = np.arange(self.B * n_blocks, dtype=np.int32).reshape(self.B, n_blocks)[:, ::-1].copy()
        pos = np.zeros(self.T_pad, np.int64)
        pos[: self.T] = np.concatenate([np.arange(s - a, s) for a, s in zip(q, seq)])
        req = np.repeat(np.arange(self.B), q)
        token_slots = table[req, pos[: self.T] // bs].astype(np.int64) * bs + pos[: self.T] % bs
        slots = np.full((G, self.T_pad), PAD, np.int64)
        slots[:, : self.T] = token_slots[None, :] * (np.arange(G)[:, None] + 1)
        t = lambda a, dt: torch.tensor(a, dtype=dt, device=dev)  # noqa: E731
        self.qsl = t(self.qsl_host, INDEX_DTYPE)
        self.seq = t(seq, INDEX_DTYPE)
        self.R = t(R, INDEX_DTYPE)
        self.positions = t(pos, SLOT_DTYPE)
        self.slots = t(slots, SLOT_DTYPE)
        self.cacheable = t(np.arange(0, G, 2), INDEX_DTYPE)
        self.block_table = t(table, INDEX_DTYPE)
        self.prefilling = t(self.prefilling_host, torch.bool)
        self.valid = t(np.arange(self.T_pad) % 5 != 4, torch.bool)
        self.idx = t(np.array([2, 0, 3, 1]), INDEX_DTYPE)
        R_all = np.zeros(4, np.int64)
        R_all[[2, 0, 3, 1]] = R
        self.R_all = t(R_all, INDEX_DTYPE)
        back = np.minimum(np.maximum(prefix - R, 0), W - 1)
        self.gather_lens = q + back
