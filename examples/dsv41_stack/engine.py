"""A tiny serving loop around :class:`Stack`: admission with prefix hits, chunked prefill,
decode, and both replay sides through the pack.

Per step:

1. **Admission** (host): a new request looks up its full prompt blocks in the prefix cache
   and goes through ``admit_prefix_hit`` (``Wr = W``): a hit ``H`` rewinds the computed
   count to ``R = H - W`` (hits ``<= W`` are dropped); ``R`` goes to the request's persistent
   state row (as in a model runner's request state).
2. **Schedule**: decodes first, then prefills chunked to ``max_batched_tokens``.
3. **Encoder side** (device, the pack): ``batch_replay_start`` -> per-row ``R``; slot mappings
   of both groups from the block tables, then ``pad_replayed_slots`` pads the cacheable
   group for positions ``[R, R + W)``; ``compressed_slot_mapping`` turns the (padded) main
   slots into compressed-entry slots; ``swa_indices_and_lens`` builds the clamped windows;
   ``plain_indices`` joins top-k compressed entries and the window for the KV-source layers.
4. **Layers 0..cut** run on every row (they write the prefix-cacheable cache).
5. **Decoder side** (``decoder_trim="trim"``): ``plan_replay_batch`` (host) ->
   ``gather_replay_batch`` -> clamped windows of the sub-batch (``kv_start``) ->
   ``gather_rows`` -> replay layers on each prefill's last ``W`` rows -> ``scatter_rows``.
   ``"off"`` runs the replay layers on every row; ``"clamp"`` runs them on every row but gives
   the kept rows the sub-batch's clamped windows (what the trim must equal).
6. The last row of each request that finished its prompt (or decodes) gives the final
   hidden state; the next token is forced or greedy.

Every op comes from ``backend`` (default ``swa_backends.select(device)``); nothing imports a
kernel directly.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import swa_backends as sb
import torch

from .cache import MAIN, SWA, PagedKV, block_keys
from .model import Stack

TRIM_MODES = ("off", "trim", "clamp")
#: Steps of fewer tokens keep every row (``plan_replay_batch``'s ``trim_threshold``). This engine
#: runs every step eagerly, without the replay CUDA graphs that make vLLM's trim cheap from its
#: 768-token threshold (the planner's default), so it trims only past the steps vLLM runs in CUDA
#: graphs (up to 1024 tokens by default): below that a step is launch-bound and the trim's extra
#: launches cost more than the rows it saves (the decoder-side seed: a 1K prompt's TTFT 56 -> 110 ms).
EAGER_TRIM_THRESHOLD = 1025


@dataclass
class Request:
    rid: str
    prompt: list[int]
    max_new_tokens: int = 1  # generated tokens, the first one from the prefill
    forced_tokens: list[int] | None = None  # decode inputs instead of greedy argmax
    keep_all_rows: bool = False  # e.g. prompt logprobs: the decoder side keeps every row
    # state
    outputs: list[int] = field(default_factory=list)
    num_computed: int = 0
    replay_start: int = 0
    admission: object = None
    state_idx: int = -1
    main_blocks: list[int] = field(default_factory=list)
    swa_blocks: list[int] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)
    registered: int = 0
    prefill_hidden: torch.Tensor | None = None
    decode_hidden: list[torch.Tensor] = field(default_factory=list)
    scheduled_tokens: int = 0
    steps: int = 0
    t_first_step: float | None = None
    t_first_token: float | None = None
    finished: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.outputs

    @property
    def prefilling(self) -> bool:
        return self.num_computed < len(self.prompt)

    @property
    def ttft_s(self) -> float | None:
        if self.t_first_token is None or self.t_first_step is None:
            return None
        return self.t_first_token - self.t_first_step


@dataclass
class AttnContext:
    """What a ``sparse_mla`` call is about (for instrumentation): ``layer``; ``kind``
    (``"source"`` or ``"replay"``); per query row its batch index ``row_req`` (-1 for padded
    sub-batch rows), absolute ``positions`` and ``row_window_start``, the clamp its window
    was built with (``R`` of its request; ``kv_start`` for rows of the decoder sub-batch);
    ``batch`` (the scheduled requests); per request ``window_start`` (``R``, or ``kv_start``
    in the sub-batch), ``seq_lens`` and ``query_start_loc`` of the (sub-)batch."""

    layer: int
    kind: str
    row_req: torch.Tensor
    positions: torch.Tensor
    batch: list[Request]
    row_window_start: torch.Tensor
    window_start: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    sub_batch: bool


@dataclass
class StepInfo:
    num_tokens: int
    num_reqs: int
    num_prefill_tokens: int
    trimmed: bool
    replay_rows: int  # rows the replay layers ran on
    times_ms: dict[str, float]
    rids: list[str]


class _Marks:
    """Named time marks: CUDA events on a GPU (read after the step's sync), else a clock."""

    def __init__(self, device: torch.device, enabled: bool):
        self.cuda = device.type == "cuda"
        self.enabled = enabled
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if not self.enabled:
            return
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((name, ev))
        else:
            self.marks.append((name, time.perf_counter()))

    def spans(self) -> dict[str, float]:
        """Milliseconds from each mark to the next, named by the earlier one."""
        out: dict[str, float] = {}
        for (name, a), (_, b) in zip(self.marks, self.marks[1:]):
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            out[name] = out.get(name, 0.0) + ms
        if len(self.marks) >= 2:
            a, b = self.marks[0][1], self.marks[-1][1]
            out["step"] = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        return out


class Engine:
    def __init__(self, stack: Stack, *, backend=None, max_batched_tokens: int = 2048, decoder_trim: str = "trim",
                 prefix_caching: bool = True, max_tokens: int = 8192, max_reqs: int = 64, poison: bool = True,
                 trim_threshold: int = EAGER_TRIM_THRESHOLD, timing: bool = False):
        if decoder_trim not in TRIM_MODES:
            raise ValueError(f"decoder_trim={decoder_trim!r}: expected one of {TRIM_MODES}")
        if max_batched_tokens < 1:
            raise ValueError(f"max_batched_tokens={max_batched_tokens}: expected >= 1")
        self.stack = stack
        self.cfg = cfg = stack.cfg
        self.device = stack.device
        self.be = backend if backend is not None else sb.select(self.device)
        self.max_batched_tokens = max_batched_tokens
        self.decoder_trim = decoder_trim
        self.trim_threshold = trim_threshold
        self.timing = timing
        bs = cfg.block_size
        blocks = math.ceil(max_tokens / bs) + max_reqs + 2
        self.cache = PagedKV(cfg, num_main_blocks=blocks, num_swa_blocks=blocks, device=self.device, poison=poison,
                             prefix_caching=prefix_caching)
        self.replay_layers = list(sb.replay_layer_ids(cfg.n_layers, range(cfg.n_source)))
        self.cacheable_groups = torch.tensor([MAIN], dtype=torch.int32, device=self.device)
        self.R_state = torch.zeros(max_reqs, dtype=torch.int32, device=self.device)
        self.free_states = list(range(max_reqs - 1, -1, -1))
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.done: dict[str, Request] = {}
        self.attn_context: AttnContext | None = None
        self.step_count = 0

    # -- public ------------------------------------------------------------------------

    def add(self, req: Request) -> Request:
        if len(req.prompt) < 1:
            raise ValueError(f"prompt of {req.rid!r}: expected at least one token")
        if req.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={req.max_new_tokens}: expected >= 1")
        self.waiting.append(req)
        return req

    def submit(self, rid: str, prompt, **kw) -> Request:
        return self.add(Request(rid, [int(t) for t in prompt], **kw))

    def run(self, max_steps: int = 100000) -> list[StepInfo]:
        infos = []
        for _ in range(max_steps):
            info = self.step()
            if info is None:
                break
            infos.append(info)
        return infos

    def reset_prefix_cache(self) -> None:
        self.cache.main.reset_prefix_cache()

    # -- admission and scheduling ------------------------------------------------------

    def _admit(self) -> None:
        cfg, cache = self.cfg, self.cache
        bs, W = cfg.block_size, cfg.window
        while self.waiting and self.free_states:
            r = self.waiting[0]
            n_full = len(r.prompt) // bs
            r.keys = block_keys(r.prompt, bs, n_full)
            hits = cache.main.lookup(r.keys)[: (len(r.prompt) - 1) // bs]  # leave a token to compute
            adm = sb.admit_prefix_hit(len(hits) * bs, 0, W, bs)
            hits = hits[: adm.hit // bs]
            assert sb.replay_block_is_live(adm.hit, W, bs), "replay start landed in a freed window block"
            n_swa = math.ceil((len(r.prompt) + r.max_new_tokens) / bs)
            if cache.swa.num_free() < n_swa or cache.main.num_free() < math.ceil(len(r.prompt) / bs) - len(hits) + 1:
                break
            self.waiting.pop(0)
            for b in hits:
                cache.main.touch(b)
            r.main_blocks = list(hits)
            r.registered = len(hits)
            r.swa_blocks = [cache.swa.allocate() for _ in range(n_swa)]
            r.admission = adm
            r.num_computed = adm.num_computed
            r.replay_start = adm.replay_start
            r.state_idx = self.free_states.pop()
            self.R_state[r.state_idx] = adm.replay_start
            self.running.append(r)

    def _schedule(self) -> list[tuple[Request, int]]:
        budget = self.max_batched_tokens
        sched = []
        for r in self.running:  # decodes first
            if not r.prefilling and budget > 0:
                sched.append((r, 1))
                budget -= 1
        for r in self.running:
            if r.prefilling and budget > 0:
                q = min(len(r.prompt) - r.num_computed, budget)
                sched.append((r, q))
                budget -= q
        bs = self.cfg.block_size
        for r, q in sched:
            while len(r.main_blocks) * bs < r.num_computed + q:
                r.main_blocks.append(self.cache.main.allocate())
        return sched

    # -- the step ----------------------------------------------------------------------

    def step(self) -> StepInfo | None:
        self._admit()
        sched = self._schedule()
        if not sched:
            if self.waiting:
                raise RuntimeError("requests are waiting but none fits the cache: raise max_tokens")
            return None
        cfg, be, dev, cache = self.cfg, self.be, self.device, self.cache
        bs, W, st = cfg.block_size, cfg.window, self.stack
        marks = _Marks(dev, self.timing)
        t_start = time.perf_counter()
        for r, _ in sched:
            if r.t_first_step is None:
                r.t_first_step = t_start

        # host arrays
        batch = [r for r, _ in sched]
        q = np.array([n for _, n in sched], dtype=np.int64)
        start = np.array([r.num_computed for r in batch], dtype=np.int64)
        seq = start + q
        B, T = len(batch), int(q.sum())
        qsl_h = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
        prefilling_h = np.array([r.prefilling for r in batch], dtype=bool)
        keeps_h = np.array([r.keep_all_rows for r in batch], dtype=bool)
        pos_h = np.concatenate([np.arange(s, e) for s, e in zip(start, seq)])
        req_h = np.repeat(np.arange(B), q)
        ids_h = np.concatenate([np.asarray(r.tokens[s:e], dtype=np.int64) for r, s, e in zip(batch, start, seq)])
        nb_main = max(len(r.main_blocks) for r in batch)
        nb_swa = max(len(r.swa_blocks) for r in batch)
        bt_main_h = np.zeros((B, nb_main), dtype=np.int32)
        bt_swa_h = np.zeros((B, nb_swa), dtype=np.int32)
        for i, r in enumerate(batch):
            bt_main_h[i, : len(r.main_blocks)] = r.main_blocks
            bt_swa_h[i, : len(r.swa_blocks)] = r.swa_blocks
        any_replay = bool(any(r.replay_start > 0 and r.prefilling for r in batch))

        marks.mark("metadata")
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev, non_blocking=True)  # noqa: E731
        qsl, seq_lens = to(qsl_h), to(seq.astype(np.int32))
        positions, row_req, token_ids = to(pos_h.astype(np.int64)), to(req_h.astype(np.int64)), to(ids_h)
        bt_main, bt_swa = to(bt_main_h), to(bt_swa_h)
        idx_mapping = to(np.array([r.state_idx for r in batch], dtype=np.int32))
        is_prefilling = to(prefilling_h)

        # encoder side: replay start, padded slot mappings, clamped windows
        replay_start = be.batch_replay_start(self.R_state, idx_mapping, is_prefilling)
        blk, off = torch.div(positions, bs, rounding_mode="floor"), positions % bs
        slot_mappings = torch.stack([bt_main.long()[row_req, blk] * bs + off, bt_swa.long()[row_req, blk] * bs + off])
        be.pad_replayed_slots(slot_mappings, self.cacheable_groups, qsl, positions, replay_start, W,
                              any_replay=any_replay)
        comp_slots = be.compressed_slot_mapping(slot_mappings[MAIN], qsl, seq_lens, bt_main, bs, cfg.ratio)
        comp_rows = torch.where(comp_slots < 0, -1, comp_slots + cache.S_swa)
        swa_idx, swa_lens = be.swa_indices_and_lens(qsl, seq_lens, bt_swa, bs, W, replay_start, num_tokens=T)
        topk_slots, topk_lens = self._topk(positions, row_req, bt_main)
        src_idx, src_lens = be.plain_indices(swa_idx, swa_lens, topk_slots, topk_lens, topk_offset=cache.S_swa)
        # the window rows each closing token averages into its compressed entry
        r_ = cfg.ratio
        j = (swa_lens.long()[:, None] - r_ + torch.arange(r_, device=dev)[None, :]).clamp(min=0)
        comp_src = swa_idx.long().gather(1, j).clamp(min=0)

        marks.mark("source_layers")
        x = st.embed_tokens(token_ids)
        full_ctx = dict(row_req=row_req, positions=positions, batch=batch, row_window_start=replay_start[row_req],
                        window_start=replay_start, seq_lens=seq_lens, query_start_loc=qsl, sub_batch=False)
        for layer in range(cfg.n_source):
            qh, kv = st.qkv(layer, x, positions)
            cache.write(layer, slot_mappings[SWA], kv)
            comp = cache.layers[layer].index_select(0, comp_src.reshape(-1)).view(T, r_, -1).float().mean(1)
            cache.write(layer, comp_rows, comp)
            o = self._attend(layer, "source", qh, src_idx, src_lens, full_ctx)
            x = st.out_and_mlp(layer, x, o)

        # decoder side
        marks.mark("replay_layers")
        plan = None
        if self.decoder_trim != "off":  # eager steps: the planner's trim policy (SPEC §3.5) decides
            plan = sb.plan_replay_batch(qsl_h, prefilling_h, keeps_h, W, graph_mode="none",
                                        trim_threshold=self.trim_threshold)
        if plan is None:
            for layer in self.replay_layers:
                x = self._replay_layer(layer, x, positions, slot_mappings[SWA], swa_idx, swa_lens, full_ctx)
            replay_rows = T
        else:
            sub = be.gather_replay_batch(plan, qsl, seq_lens, replay_start, positions, slot_mappings, W)
            n = sub.num_rows_padded
            sidx, slens = be.swa_indices_and_lens(sub.query_start_loc, seq_lens, bt_swa, bs, W, sub.kv_start,
                                                  num_tokens=n)
            if self.decoder_trim == "trim":
                sub_req = torch.where(torch.arange(n, device=dev) < sub.num_rows, row_req.index_select(0, sub.rows), -1)
                ctx = dict(row_req=sub_req, positions=sub.positions, batch=batch,
                           row_window_start=sub.kv_start[sub_req.clamp(min=0)], window_start=sub.kv_start,
                           seq_lens=seq_lens, query_start_loc=sub.query_start_loc, sub_batch=True)
                h = be.gather_rows(x, sub.rows)
                for layer in self.replay_layers:
                    h = self._replay_layer(layer, h, sub.positions, sub.slot_mappings[SWA], sidx, slens, ctx)
                x = be.scatter_rows(h, sub.rows, T, count=sub.query_start_loc[-1:])
                replay_rows = sub.num_rows
            else:  # "clamp": every row, the kept rows with the sub-batch's windows
                idx = swa_idx.index_copy(0, sub.rows, sidx)
                lens = swa_lens.index_copy(0, sub.rows, slens)
                row_start = full_ctx["row_window_start"].index_copy(0, sub.rows, sub.kv_start[row_req.index_select(0, sub.rows)])
                ctx = dict(full_ctx, row_window_start=row_start)
                for layer in self.replay_layers:
                    x = self._replay_layer(layer, x, positions, slot_mappings[SWA], idx, lens, ctx)
                replay_rows = T

        marks.mark("output")
        last = torch.from_numpy(qsl_h[1:].astype(np.int64) - 1).to(dev)
        hidden = st.final(x.index_select(0, last))
        emits = [(r.prefilling and s + n == len(r.prompt)) or not r.prefilling for r, s, n in zip(batch, start, q)]
        greedy = st.logits(hidden).argmax(-1).cpu().tolist() if any(emits) else None
        marks.mark("end")
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t_end = time.perf_counter()

        # state update (host)
        self.step_count += 1
        for i, (r, n) in enumerate(sched):
            was_prefill = r.prefilling
            r.num_computed += n
            r.scheduled_tokens += n
            r.steps += 1
            if emits[i]:
                h = hidden[i].float().cpu()
                if was_prefill:
                    r.prefill_hidden = h
                    r.t_first_token = t_end
                else:
                    r.decode_hidden.append(h)
                k = len(r.outputs)
                forced = r.forced_tokens
                r.outputs.append(int(forced[k]) if forced is not None and k < len(forced) else int(greedy[i]))
            self._register(r)
            if len(r.outputs) >= r.max_new_tokens:
                self._finish(r)
        times = marks.spans()
        times["host_wall"] = (t_end - t_start) * 1e3
        return StepInfo(T, B, int(q[prefilling_h].sum()), plan is not None and self.decoder_trim == "trim", replay_rows,
                        times, [r.rid for r in batch])

    # -- pieces ------------------------------------------------------------------------

    def _topk(self, positions, row_req, bt_main):
        """Indexer stand-in: ``min(n, top_k)`` closed entries (``n = (p+1) // ratio``) spread
        over the whole prefix, the newest included: ``k_j = ((j+1) n) // len - 1``; their
        compressed slots through the main block table."""
        cfg = self.cfg
        K, bs_c = cfg.top_k, self.cache.bs_c
        n = torch.div(positions + 1, cfg.ratio, rounding_mode="floor")
        lens = torch.clamp(n, max=K)
        j = torch.arange(K, device=positions.device)[None, :]
        k = torch.div((j + 1) * n[:, None], lens.clamp(min=1)[:, None], rounding_mode="floor") - 1
        k = k.clamp(min=0)
        col = torch.div(k, bs_c, rounding_mode="floor").clamp(max=bt_main.shape[1] - 1)
        blocks = bt_main.long()[row_req[:, None], col]
        slots = torch.where(j < lens[:, None], blocks * bs_c + k % bs_c, -1)
        return slots.to(torch.int32), lens.to(torch.int32)

    def _replay_layer(self, layer, x, positions, swa_slots, idx, lens, ctx):
        qh, kv = self.stack.qkv(layer, x, positions)
        self.cache.write(layer, swa_slots, kv)
        o = self._attend(layer, "replay", qh, idx, lens, ctx)
        return self.stack.out_and_mlp(layer, x, o)

    def _attend(self, layer, kind, qh, idx, lens, ctx):
        self.attn_context = AttnContext(layer=layer, kind=kind, **ctx)
        sink = self.stack.layers[layer]["sink"]
        out, _ = self.be.sparse_mla(qh, self.cache.kv(layer), idx, lens, self.cfg.sm_scale, self.cfg.d_latent, sink=sink)
        return out

    def _register(self, r: Request) -> None:
        bs = self.cfg.block_size
        n_full = min(r.num_computed, len(r.tokens)) // bs
        if n_full <= r.registered:
            return
        if len(r.keys) < n_full:
            r.keys = block_keys(r.tokens, bs, n_full)
        for i in range(r.registered, n_full):
            self.cache.main.register(r.main_blocks[i], r.keys[i])
        r.registered = n_full

    def _finish(self, r: Request) -> None:
        r.finished = True
        self.running.remove(r)
        for b in r.main_blocks:
            self.cache.main.release(b)
        for b in r.swa_blocks:
            self.cache.free_swa_block(b)
        self.R_state[r.state_idx] = 0
        self.free_states.append(r.state_idx)
        self.done[r.rid] = r
