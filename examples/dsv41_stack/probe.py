"""Instrumentation and drift measures for the example stack.

:class:`ReadRecorder` stands in for the engine's backend: every op passes through, and each
``sparse_mla`` call has its ``indices``/``lens`` decoded back to (request, position) through
the engine's block tables, then checked against the clamp contract:

* a window read of a query at position ``p`` lands in its own request's window blocks, at a
  position in ``[lo, p]`` with ``lo = max(p - W + 1, 0, start)`` (``start``: ``R``, or the
  decoder sub-batch's ``kv_start``), and covers that range exactly (``swa_len`` reads);
* prefill reads stay inside ``[seq_len - prefill_gather_lens, seq_len)``;
* a compressed read lands in its own request's main blocks, on an entry closed at or before
  ``p``;
* the output is finite (window blocks are NaN-poisoned until written).

Drift: :func:`rel_diff` and :func:`drift_trial` (one random prompt: cold vs prefix hit, with
and without the decoder trim).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .engine import Engine

PAD = -1


@dataclass
class CallRecord:
    layer: int
    kind: str
    sub_batch: bool
    rows: int
    swa_reads: int
    comp_reads: int
    min_window_pos_minus_start: int | None  # over rows whose request replays; >= 0 means no read below R
    lens_of_decodes: list[int]
    violations: list[str] = field(default_factory=list)


class ReadRecorder:
    """Wraps ``engine.be``; ``records`` holds one :class:`CallRecord` per ``sparse_mla`` call."""

    def __init__(self, engine: Engine, *, max_violations: int = 20):
        self.engine = engine
        self.inner = engine.be
        engine.be = self
        self.records: list[CallRecord] = []
        self.max_violations = max_violations

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def detach(self) -> None:
        self.engine.be = self.inner

    @property
    def violations(self) -> list[str]:
        return [v for r in self.records for v in r.violations]

    def sparse_mla(self, q, kv, indices, lens, sm_scale, d_v, *, sink=None):
        out, lse = self.inner.sparse_mla(q, kv, indices, lens, sm_scale, d_v, sink=sink)
        rec = self._check(indices, lens)
        if not bool(torch.isfinite(out).all()):
            rec.violations.append(f"layer {rec.layer} ({rec.kind}): non-finite attention output (poisoned read)")
        self.records.append(rec)
        return out, lse

    # -- decoding ----------------------------------------------------------------------

    def _check(self, indices, lens) -> CallRecord:
        eng, ctx = self.engine, self.engine.attn_context
        cfg, cache = eng.cfg, eng.cache
        bs, W, r, bs_c = cfg.block_size, cfg.window, cfg.ratio, cache.bs_c
        idx = indices.cpu().numpy().astype(np.int64)
        ln = lens.cpu().numpy().astype(np.int64)
        req = ctx.row_req.cpu().numpy().astype(np.int64)
        pos = ctx.positions.cpu().numpy().astype(np.int64)
        start = ctx.row_window_start.cpu().numpy().astype(np.int64)
        seq = ctx.seq_lens.cpu().numpy().astype(np.int64)
        B = len(ctx.batch)
        prefilling = np.array([rq.num_computed < len(rq.prompt) for rq in ctx.batch])
        gather = eng.be.prefill_gather_lens(ctx.query_start_loc, ctx.seq_lens, ctx.window_start, W).cpu().numpy()

        # block -> logical index, per batch request
        swa_logical = np.full((B, cache.swa.num_blocks), -1, dtype=np.int64)
        main_logical = np.full((B, cache.main.num_blocks), -1, dtype=np.int64)
        for b, rq in enumerate(ctx.batch):
            swa_logical[b, rq.swa_blocks] = np.arange(len(rq.swa_blocks))
            main_logical[b, rq.main_blocks] = np.arange(len(rq.main_blocks))

        rec = CallRecord(ctx.layer, ctx.kind, ctx.sub_batch, int((req >= 0).sum()), 0, 0, None, [])
        bad = rec.violations
        T, K = idx.shape
        j = np.arange(K)[None, :]
        live = (j < ln[:, None]) & (idx != PAD)
        rows_ok = req >= 0
        live &= rows_ok[:, None]
        is_swa = live & (idx < cache.S_swa)
        is_comp = live & (idx >= cache.S_swa)
        rq = np.where(rows_ok, req, 0)

        # window reads
        t_idx, k_idx = np.nonzero(is_swa)
        s = idx[t_idx, k_idx]
        logical = swa_logical[rq[t_idx], s // bs]
        wpos = logical * bs + s % bs
        p = pos[t_idx]
        lo = np.maximum(np.maximum(p - W + 1, 0), start[t_idx])
        rec.swa_reads = int(len(s))
        for msg, mask in (("a window block of another request", logical < 0),
                          ("below its window start (the clamp)", (logical >= 0) & (wpos < lo)),
                          ("above its own position", wpos > p)):
            for t in np.nonzero(mask)[0][: self.max_violations]:
                bad.append(f"layer {ctx.layer} ({ctx.kind}): query at p={p[t]} of {ctx.batch[rq[t_idx[t]]].rid} "
                           f"read {msg}: position {wpos[t]}, lo {lo[t]}")
        count = np.bincount(t_idx, minlength=T)
        want = np.where(rows_ok, pos - np.maximum(np.maximum(pos - W + 1, 0), start) + 1, 0)
        for t in np.nonzero(count != want)[0][: self.max_violations]:
            bad.append(f"layer {ctx.layer} ({ctx.kind}): query at p={pos[t]} read {count[t]} window positions, "
                       f"expected {want[t]} (lo = max(p - W + 1, 0, {start[t]}))")
        replaying = np.array([rq_.replay_start > 0 for rq_ in ctx.batch])
        sel = replaying[rq[t_idx]] & (logical >= 0)
        if sel.any():
            rec.min_window_pos_minus_start = int((wpos[sel] - np.array([b.replay_start for b in ctx.batch])[rq[t_idx[sel]]]).min())
        # the window a prefill gathers: [seq_len - gather_len, seq_len)
        pre = prefilling[rq[t_idx]]
        low = seq[rq[t_idx]] - gather[rq[t_idx]]
        for t in np.nonzero(pre & (logical >= 0) & (wpos < low))[0][: self.max_violations]:
            bad.append(f"layer {ctx.layer}: prefill query at p={p[t]} read position {wpos[t]} outside the gathered "
                       f"range [{low[t]}, {seq[rq[t_idx[t]]]})")
        dec = rows_ok & ~prefilling[rq]
        rec.lens_of_decodes = [int(c) for c in count[dec]]

        # compressed reads
        t_idx, k_idx = np.nonzero(is_comp)
        c = idx[t_idx, k_idx] - cache.S_swa
        logical = main_logical[rq[t_idx], c // bs_c]
        entry = logical * bs_c + c % bs_c
        p = pos[t_idx]
        rec.comp_reads = int(len(c))
        for msg, mask in (("a main block outside its block table", logical < 0),
                          ("an entry not yet closed", (logical >= 0) & ((entry + 1) * r - 1 > p))):
            for t in np.nonzero(mask)[0][: self.max_violations]:
                bad.append(f"layer {ctx.layer}: query at p={p[t]} read {msg} (entry {entry[t]})")
        return rec


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def run_prompt(stack, prompt, *, warm=None, decoder_trim="trim", max_batched_tokens=2048, forced=None,
               max_new_tokens=1, backend=None, max_tokens=None, recorder=False, trim_threshold=0):
    """Run ``prompt`` on a fresh engine, after ``warm`` (a prompt that fills the prefix cache)
    when given; ``trim_threshold`` 0 (the probe's default) trims every step that has rows to
    trim, whatever its size. Returns ``(request, engine, recorder or None)``."""
    need = (len(prompt) + max_new_tokens) + (len(warm) + 1 if warm is not None else 0)
    eng = Engine(stack, backend=backend, max_batched_tokens=max_batched_tokens, decoder_trim=decoder_trim,
                 max_tokens=max_tokens or 2 * need + 256, trim_threshold=trim_threshold)
    if warm is not None:
        eng.submit("warm", warm, max_new_tokens=1)
        eng.run()
    rec = ReadRecorder(eng) if recorder else None
    req = eng.submit("main", prompt, max_new_tokens=max_new_tokens, forced_tokens=forced)
    eng.run()
    return req, eng, rec


def drift_trial(stack, rng: np.random.Generator, *, min_len: int, max_len: int, max_batched_tokens: int,
                n_decode: int = 4, full_hit: bool | None = None, backend=None) -> dict:
    """One random prompt; the final hidden state of its last prompt row (and of ``n_decode``
    decode steps on forced tokens) in five runs: cold and after a prefix hit, each with
    ``decoder_trim`` off and on, plus the trim's reference (``"clamp"``). Returns relative
    differences against the cold run without trim (the unmodified model), and
    ``noise_floor``: the same unmodified run with another chunk size."""
    cfg = stack.cfg
    n = int(rng.integers(min_len, max_len + 1))
    prompt = rng.integers(0, cfg.vocab, n).tolist()
    if full_hit is None:
        full_hit = bool(rng.integers(0, 2))
    if full_hit:  # pass 2 of an eval: the same prompt again
        warm = list(prompt)
    else:  # a shared prefix, then a different continuation
        cut = int(rng.integers(cfg.window + cfg.block_size, n))
        warm = prompt[:cut] + rng.integers(0, cfg.vocab, int(rng.integers(1, 64))).tolist()
    forced = rng.integers(0, cfg.vocab, n_decode + 1).tolist()
    kw = dict(max_batched_tokens=max_batched_tokens, forced=forced, max_new_tokens=n_decode + 1, backend=backend)
    runs = {}
    for name, w, mode in (("cold_off", None, "off"), ("cold_trim", None, "trim"), ("cold_clamp", None, "clamp"),
                          ("hit_off", warm, "off"), ("hit_trim", warm, "trim")):
        req, _, _ = run_prompt(stack, prompt, warm=w, decoder_trim=mode, **kw)
        runs[name] = req
    base = runs["cold_off"]
    out = {"prompt_len": n, "full_hit": full_hit, "hit": runs["hit_off"].admission.hit,
           "replay_start": runs["hit_off"].replay_start}
    for name, req in runs.items():
        if name == "cold_off":
            continue
        out[name] = rel_diff(req.prefill_hidden, base.prefill_hidden)
        out[name + "_decode"] = max(rel_diff(a, b) for a, b in zip(req.decode_hidden, base.decode_hidden))
    out["trim_vs_clamp"] = rel_diff(runs["cold_trim"].prefill_hidden, runs["cold_clamp"].prefill_hidden)
    # noise floor: the unmodified model chunked differently (0 in fp32 on CPU; GEMM shapes in bf16)
    kw["max_batched_tokens"] = max(1, max_batched_tokens // 2 + 37)
    rechunked, _, _ = run_prompt(stack, prompt, decoder_trim="off", **kw)
    out["noise_floor"] = rel_diff(rechunked.prefill_hidden, base.prefill_hidden)
    out["hit_trim_vs_hit_off"] = rel_diff(runs["hit_trim"].prefill_hidden, runs["hit_off"].prefill_hidden)
    return out


def summarize(trials: list[dict], keys=("hit_off", "cold_trim", "hit_trim", "hit_off_decode", "cold_trim_decode",
                                        "hit_trim_decode", "trim_vs_clamp", "noise_floor")) -> dict:
    out = {}
    for k in keys:
        v = np.array([t[k] for t in trials], dtype=np.float64)
        out[k] = {"mean": float(v.mean()), "max": float(v.max()), "median": float(np.median(v)), "n": int(v.size)}
    return out
