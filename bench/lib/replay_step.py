"""One serving step's replay metadata, the first window group's main batch alone: the inputs
and vLLM's buffers of a step, vLLM's kernel sequence for it, and the pack's (one
``prepare_replay_step`` launch answering vLLM's call sites through the patches' shims).

``bench_replay_step.py`` times the whole step (every window group, the sub-batch's builds) on
top of these inputs; the experiments on the replay step (``experiments/exp_launch_cost.py``,
``exp_prepare_config.py``, ``exp_replay_step_ablation.py``, ``profile_replay_step.py``) time
this scope. Steps as :mod:`lib.steps` names them; decodes first, as vLLM orders a batch.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

import swa_backends
from swa_backends.common.ops.prepare_replay_step import allocate_out as prepare_out
from swa_backends.common.types import INDEX_DTYPE, SLOT_DTYPE
from swa_backends.common.validation import set_validation
from swa_backends.integrations.vllm import runtime
from swa_backends.testing import vllm_kernels as vk
from swa_backends.testing.vllm_shims import routed_shims

from .steps import BS, G, W


def integration_backend(dev):
    """The backend the vLLM integration selects on ``dev`` (the Triton variants, unchecked),
    validation off, as the serving path runs."""
    set_validation(False)
    return swa_backends.select(dev, prefer="triton", checked=False)


@contextlib.contextmanager
def on_this_gpu():
    """``(device, backend, shims)`` on the current CUDA device: the integration's backend
    (:func:`integration_backend`) and the patches' shims routed to it."""
    dev = torch.device("cuda", torch.cuda.current_device())
    be = integration_backend(dev)
    with routed_shims(lambda device: be) as shims:
        yield dev, be, shims


class ServingStep:
    """Inputs of one step and, per column, its own output buffers (vLLM's persistent buffers
    in vLLM's layouts)."""

    def __init__(self, prefills: int, q: int, decodes: int, dev, rng):
        qs = [1] * decodes + [q] * prefills
        pre = np.array([False] * decodes + [True] * prefills)
        B = len(qs)
        prefix = np.zeros(B, np.int64)
        R = np.zeros(B, np.int64)
        prefix[:decodes] = rng.integers(200, 4000, decodes)
        for i in range(prefills):
            if i % 3 == 2:
                R[decodes + i] = prefix[decodes + i] = 896
        q_a = np.array(qs, np.int64)
        seq = prefix + q_a
        self.B, self.T, self.D, self.P = B, int(q_a.sum()), decodes, prefills
        self.replays = bool(R.any())  # vLLM's model state pads slots only then
        self.qsl_np = np.concatenate([[0], np.cumsum(q_a)]).astype(np.int32)
        blocks = int(np.ceil(seq.max() / BS)) + 1
        table = rng.permutation(B * blocks).reshape(B, blocks).astype(np.int32)
        positions = np.concatenate([np.arange(s - a, s) for a, s in zip(q_a, seq)])
        req = np.repeat(np.arange(B), q_a)
        tok = table[req, positions // BS].astype(np.int64) * BS + positions % BS
        t = lambda a, dt: torch.tensor(a, dtype=dt, device=dev)  # noqa: E731
        self.qsl, self.seq, self.R = t(self.qsl_np, INDEX_DTYPE), t(seq, INDEX_DTYPE), t(R, INDEX_DTYPE)
        self.positions = t(positions, SLOT_DTYPE)
        self.slots0 = t(np.stack([tok * (g + 1) + g for g in range(G)]), SLOT_DTYPE)
        self.cacheable = t(np.arange(0, G, 2), INDEX_DTYPE)
        self.table = t(table, INDEX_DTYPE)
        self.prefilling, self.prefilling_np = t(pre, torch.bool), pre
        self.keeps, self.max_q = np.zeros(B, bool), int(q_a.max())
        self.idx_np = np.arange(B)
        self.idx = t(self.idx_np, INDEX_DTYPE)
        self.valid = torch.ones(self.T, dtype=torch.bool, device=dev)
        # decoder replay: each prefill keeps its last W rows (the pack's planner decides as vLLM's does)
        plan = swa_backends.plan_replay_batch(self.qsl_np, pre, np.zeros(B, bool), W, trim_threshold=0)
        self.kept = plan.kept.numpy().astype(np.int32) if plan is not None else np.diff(self.qsl_np).astype(np.int32)
        self.n = int(self.kept.sum())
        dropped_np = runtime.dropped_before(self.kept, self.qsl_np)
        self.dropped = t(dropped_np, INDEX_DTYPE)
        self.plan = runtime.replay_plan(self.kept, self.qsl_np, self.n, W, dropped=dropped_np,
                                        device_dropped=self.dropped)
        self.t2r = vk.token_to_req_indices(self.qsl, self.T)
        self.dev = dev

    def buffers(self) -> dict:
        """vLLM's per-builder and model-state buffers, poisoned."""
        T, B, dev = self.T, self.B, self.dev
        e = lambda shape, dt: torch.full(shape, -77, dtype=dt, device=dev)  # noqa: E731
        return {"slots": self.slots0.clone(), "dec_idx": e((T, 1, W), INDEX_DTYPE), "dec_lens": e((T,), INDEX_DTYPE),
                "pre_idx": e((T, 1, W), INDEX_DTYPE), "pre_lens": e((T,), INDEX_DTYPE),
                "gather_lens": e((B,), INDEX_DTYPE), "rows": e((T,), torch.int64), "kqsl": e((B + 1,), INDEX_DTYPE),
                "kpos": e((T,), torch.int64), "kslots": e((G, T), torch.int64), "kkv": e((B,), INDEX_DTYPE)}


def vllm_step(K, s: ServingStep, b: dict):
    """vLLM 0.33's launches for the step (model state, then the SWA builder, then the gather)."""
    D, T = s.D, s.T
    if s.replays:
        vk.pad_replayed_slots(K, b["slots"], s.cacheable, s.qsl, s.positions, s.R, W, s.B)
    if D:  # the builder calls each window-rows kernel only for a non-empty part (sparse_swa.py)
        vk.swa_indices_and_lens(K, b["dec_idx"], b["dec_lens"], W, W, s.qsl, s.seq, s.t2r, s.valid, s.table, BS,
                                s.R, num_tokens=D, token_offset=0)
    if T > D:
        vk.swa_indices_and_lens(K, b["pre_idx"], b["pre_lens"], W, W, s.qsl, s.seq, s.t2r, s.valid, s.table, BS,
                                s.R, num_tokens=T - D, token_offset=D)
    if s.P:
        b["gl"] = torch.empty(s.P, dtype=INDEX_DTYPE, device=s.dev)  # vLLM allocates it per build
        vk.prefill_gather_lens(K, b["gl"], s.seq, s.qsl, s.R, s.P, s.D, W)
    return vk.gather_replay_batch(K, s.qsl, s.dropped, s.seq, s.R, s.positions, b["slots"], b["rows"], b["kqsl"],
                                  b["kpos"], b["kslots"], b["kkv"], W, s.B, T, s.n)


def predict(s: ServingStep, target: runtime.WindowTarget) -> runtime.WindowTarget:
    """The host work the pack's model state adds to a step to launch it at once, through the
    same functions (``model.py``: ``_swa_window_target``, ``_swa_predicted_gather``): the
    batch's query lengths, vLLM's decode/prefill split and its trim rule predicted
    (``runtime.predicted_split``, ``runtime.predicted_kept``), the window builder's target
    (group 1: a window group, never padded; kept across steps). The sub-batch's plan is planning vLLM's path
    makes too (its ``_kept_input_batch``; the pack makes it earlier and once): left out of
    every column alike (``s.plan``)."""
    q = runtime.query_lens(s.qsl_np, s.B)
    target.num_decodes, target.num_decode_tokens = runtime.predicted_split(q, s.qsl_np, s.T, s.max_q, 1)
    target.block_table = s.table
    keeps = s.keeps[s.idx_np] if np.count_nonzero(s.keeps) else None  # vLLM's per-request flags, mostly all False
    runtime.predicted_kept(q, keeps, s.prefilling_np, W)
    return target


def window_target(b: dict) -> runtime.WindowTarget:
    """The step's window builder (group 1: a window group, never padded), kept across steps
    as the model state keeps it; ``predict`` sets its block table and split."""
    return runtime.WindowTarget(1, None, BS, W, 0, 0, b["dec_idx"][:, 0], b["dec_lens"], b["pre_idx"][:, 0],
                                b["pre_lens"])


def step_scratch(s: ServingStep) -> dict:
    n, dev = s.B + 1, s.dev
    return {"arange": torch.arange(n, dtype=INDEX_DTYPE, device=dev), "ones": torch.ones(n, dtype=torch.bool, device=dev),
            "replay_start": torch.zeros(n, dtype=INDEX_DTYPE, device=dev),
            "stale_replay": torch.zeros(n, dtype=INDEX_DTYPE, device=dev),
            "gather_lens": torch.zeros(n, dtype=INDEX_DTYPE, device=dev),
            "no_groups": torch.zeros(0, dtype=INDEX_DTYPE, device=dev), "views": {}}


def pack_step(be, s: ServingStep, b: dict, gather_out: dict, target: runtime.WindowTarget, scratch: dict,
              shims: dict):
    """The same step as vLLM runs it with the pack installed, vLLM's call sites calling the
    patches' shims as they call the globals those replace (``testing/vllm_shims.py``): the
    model state opens a step, vLLM's pad call is held, one ``prepare_replay_step`` launch
    answers it, the builder's decode rows, prefill rows and gather lengths and the sub-batch
    gather; each of vLLM's calls then finds its answer and launches nothing
    (``integrations/vllm/runtime.py``)."""
    D, T = s.D, s.T
    runtime.begin_step()
    try:
        if s.replays:
            shims["pad_replayed_slots"][(s.B,)](b["slots"], b["slots"].stride(0), s.cacheable, s.qsl, s.positions,
                                                s.R, W, vk.PAD_SLOT_ID, NUM_GROUPS=s.cacheable.numel(), BLOCK=1024)
        runtime.prepare_step(be, predict(s, target), s.qsl, s.seq, s.positions, b["slots"], s.R, s.B, T, scratch,
                             gather=(s.plan, W, gather_out))
        swa = shims["swa_indices_and_lens"]
        if D:
            swa(b["dec_idx"], b["dec_lens"], W, W, b["dec_lens"], b["dec_lens"], s.qsl, s.seq, s.t2r, s.valid,
                s.table, BS, s.R, num_tokens=D, token_offset=0)
        if T > D:
            swa(b["pre_idx"], b["pre_lens"], W, W, b["pre_lens"], b["pre_lens"], s.qsl, s.seq, s.t2r, s.valid,
                s.table, BS, s.R, num_tokens=T - D, token_offset=D)
        if s.P:
            b["gl"] = torch.empty(s.P, dtype=INDEX_DTYPE, device=s.dev)  # vLLM allocates it per build
            shims["prefill_gather_lens"](b["gl"], s.seq, s.qsl, s.R, s.P, s.D, W)
        runtime.gather_replay_batch(be, s.plan, s.qsl, s.seq, s.R, s.positions, b["slots"], W, gather_out)
    finally:
        runtime.end_step()


def ref_step(be, s: ServingStep, b: dict, gather_out: dict):
    """The oracle without vLLM's kernels: one op per vLLM call site (no step open)."""
    D, T = s.D, s.T
    if s.replays:
        runtime.pad_replayed_slots(be, b["slots"], s.cacheable, s.qsl, s.positions, s.R, W, s.B)
    runtime.swa_indices_and_lens(be, b["dec_idx"], b["dec_lens"], W, W, s.qsl, s.seq, s.valid, s.table, BS, s.R,
                                 num_tokens=D, token_offset=0)
    runtime.swa_indices_and_lens(be, b["pre_idx"], b["pre_lens"], W, W, s.qsl, s.seq, s.valid, s.table, BS, s.R,
                                 num_tokens=T - D, token_offset=D)
    if s.P:
        b["gl"] = torch.empty(s.P, dtype=INDEX_DTYPE, device=s.dev)
        runtime.prefill_gather_lens(be, b["gl"], s.seq, s.qsl, s.R, s.P, s.D, W)
    runtime.gather_replay_batch(be, s.plan, s.qsl, s.seq, s.R, s.positions, b["slots"], W, gather_out)


def fused_out(s: ServingStep, b: dict) -> dict:
    D, T = s.D, s.T
    out = prepare_out(s.B, T, W, s.dev, s.plan, G, prefill_from=D, gather_lens_from=D)
    out.update({"swa_indices": b["dec_idx"][:D, 0], "swa_lens": b["dec_lens"][:D],
                "prefill_swa_indices": b["pre_idx"][: T - D, 0], "prefill_swa_lens": b["pre_lens"][: T - D],
                "gather_lens": b["gather_lens"][: s.P]})
    b["gl"] = out["gather_lens"]
    return out


def fused_step(be, s: ServingStep, b: dict, out: dict):
    """``prepare_replay_step`` alone, in vLLM's layouts: one launch, nothing around it (padding
    only when a request replays, as the integration launches it)."""
    be.prepare_replay_step(s.R, s.idx, s.prefilling, s.qsl, s.seq, s.positions, b["slots"], s.cacheable, s.table, BS,
                           W, W if s.replays else 0, index_width=W, plan=s.plan, prefill_from=s.D,
                           gather_lens_from=s.D, valid_group=1, out=out)


def gather_out_view(s: ServingStep, b: dict) -> dict:
    n = s.n
    return {"rows": b["rows"][:n], "query_start_loc": b["kqsl"], "positions": b["kpos"][:n],
            "slot_mappings": b["kslots"][:, :n], "kv_start": b["kkv"]}


def check(s: ServingStep, want: dict, kept_want, got: dict, gather: dict) -> None:
    """``got`` (a pack column's buffers) against vLLM's (or, without vLLM, the reference's)."""
    D, T, n = s.D, s.T, s.n
    same = lambda a, b, what: torch.equal(a, b) or _fail(what)  # noqa: E731
    same(got["slots"], want["slots"], "padded slot mappings")
    same(got["dec_idx"][:D], want["dec_idx"][:D], "decode window indices")
    same(got["dec_lens"][:D], want["dec_lens"][:D], "decode window lengths")
    same(got["pre_idx"][: T - D], want["pre_idx"][: T - D], "prefill window indices")
    same(got["pre_lens"][: T - D], want["pre_lens"][: T - D], "prefill window lengths")
    if s.P:
        same(got["gl"], want["gl"], "prefill gather lengths")
    same(gather["rows"][:n], want["rows"][:n], "kept rows")
    same(gather["query_start_loc"], want["kqsl"], "kept query_start_loc")
    same(gather["positions"][:n], want["kpos"][:n], "kept positions")
    same(gather["slot_mappings"], kept_want, "kept slot mappings")
    same(gather["kv_start"], want["kkv"], "kept kv_start")


def _fail(what: str):
    raise AssertionError(f"{what} differ from vLLM's")
