"""One serving step's replay metadata: the pack against vLLM 0.33's own kernel sequence.

    . bench/gpu_env.sh && SWA_VLLM_KERNELS_DIR=.vllm_kernels python3 bench/bench_replay_step.py --out DIR
    python bench/bench_replay_step.py --out DIR --smoke   # no GPU: tiny sizes, Triton's interpreter

vLLM's kernels come from :mod:`swa_backends.testing.vllm_kernels` (the installed vLLM, or copies
of its ``model_state.py`` and ``sparse_swa.py`` named by ``SWA_VLLM_KERNELS_DIR``: vLLM's wheel
cannot travel to the GPU machine); without them the vLLM column is a reason and the pack's
columns still run.

One step = what DeepSeek-V4.1's model state and its sparse-SWA metadata builder launch for
replay metadata in vLLM 0.33, on the five step shapes of ``bench_triton_ops.py`` (1x1K, 1x16K,
8x4K+32 decodes, 32x4K+128 decodes, 16x1K+240 decodes; decodes first, as vLLM orders a batch;
every third prefill replays from 896 after a 1024-token hit; W 128, block 64, 5 slot groups,
0/2/4 cacheable; decoder replay keeps each prefill's last 128 rows):

* **vllm** -- vLLM's kernels launched as at its call sites (``testing/vllm_kernels.py``):
  ``_pad_replayed_slots_kernel`` when a request of the step replays (vLLM's model state pads only
  then: ``replay_start_np.any()``; the single-prefill steps replay nothing);
  ``_compute_swa_indices_and_lens_kernel`` twice (decode rows into the decode buffer, prefill rows
  with ``token_offset`` into the prefill buffer; each only when its part has tokens, as the
  builder calls it);
  ``ComputePrefillMetadataKernel``; the ``PAD_SLOT_ID`` fill and ``_gather_replay_batch_kernel``.
* **pack** -- the same step through the pack as vLLM runs it with the pack installed
  (``integrations/vllm/runtime.py``: the functions the patches and the model state call, into
  the same kind of buffers).
* **pack_fused** -- ``prepare_replay_step`` (replay start from the request states, padding,
  window indices of every token into one buffer, the decoder gather: one launch) plus
  ``prefill_gather_lens``: what one launch costs; vLLM keeps decode and prefill window indices
  in two buffers, so the integration cannot hand this layout to vLLM's builders as they are.

Left out of every column alike, as the same work either way: the host-side planning
(``replay_start`` from the request states, ``kept_lens``, ``dropped_before``) and its uploads;
vLLM's ``token_to_req_indices`` (a common-metadata op every builder shares; vLLM's SWA kernel
reads it, the pack's does not: leaving it out flatters vLLM); ``is_valid_token`` (built by
vLLM's builder for both); the decode-lens tail fill.

GPU time: events around the whole step, median of 200 steps, L2 flushed and warm
(``bench_triton_ops.gpu_pair``), the GPU asleep ~2 ms before each step so that all of its
launches are queued before it starts (device time, not host time). Host time: back-to-back steps without a sync, validation off,
the three columns timed in interleaved rounds; the ratio to vLLM's column is given as the ratio of the
medians and as the median of each round's ratio (the host's drift between rounds cancels there). Before timing, the outputs of all three are
compared (bit-identical, vLLM's graph-padding rows aside: SPEC §3.2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

# the sibling script (python puts the script's folder first on sys.path): its step shapes and
# timing helpers; importing it sets TRITON_INTERPRET for --smoke before Triton loads
import bench_triton_ops as bto  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

import swa_backends  # noqa: E402
from swa_backends.common.ops.prepare_replay_step import allocate_out as prepare_out  # noqa: E402
from swa_backends.common.types import INDEX_DTYPE, SLOT_DTYPE  # noqa: E402
from swa_backends.common.validation import set_validation  # noqa: E402
from swa_backends.integrations.vllm import runtime  # noqa: E402
from swa_backends.testing import vllm_kernels as vk  # noqa: E402
from swa_backends.testing.vllm_shims import routed_shims  # noqa: E402

W, BS, G = bto.W, bto.BS, bto.G
STEPS = dict(bto.STEPS)
SMOKE_STEPS = {"1x140": (1, 140, 0), "3x140+3d": (3, 140, 3)}
COLUMNS = ("vllm", "pack", "pack_fused")
SHIMS: dict = {}  # the patches' shims, routed to the pack (main: testing.vllm_shims.routed_shims)


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


def host_interleaved(fns: dict, calls: int, rounds: int, per_round: dict | None = None) -> dict:
    """Host us per step of each column (the median over rounds), rounds interleaved (drift hits
    all alike); ``per_round``: filled with each column's list of round times."""
    times = {} if per_round is None else per_round
    times.update({k: [] for k in fns})
    keys = list(fns)
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            f = fns[k]
            if bto.SMOKE:
                times[k].append(bto._host_median(f, 2))
                continue
            f()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            times[k].append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    return {k: statistics.median(v) for k, v in times.items()}


def run_step(name, shape, K, be, ref, dev, rng) -> dict:
    s = ServingStep(*shape, dev, rng)
    bufs = {c: s.buffers() for c in COLUMNS}
    pack_gather = gather_out_view(s, bufs["pack"])
    target, scratch = window_target(bufs["pack"]), step_scratch(s)
    shims = SHIMS
    fout = fused_out(s, bufs["pack_fused"])
    fns = {"pack": lambda: pack_step(be, s, bufs["pack"], pack_gather, target, scratch, shims),
           "pack_fused": lambda: fused_step(be, s, bufs["pack_fused"], fout)}
    if K is not None:
        kept_want = vllm_step(K, s, bufs["vllm"])
        fns = {"vllm": lambda: vllm_step(K, s, bufs["vllm"]), **fns}
        oracle = "vllm"
    else:  # no vLLM kernels: the torch reference, one op per call site, stands in as the oracle
        ref_step(ref, s, bufs["vllm"], gather_out_view(s, bufs["vllm"]))
        kept_want = bufs["vllm"]["kslots"][:, : s.n]
        oracle = "reference"
    before = dict(runtime.CALLS)
    fns["pack"]()
    called = {k: runtime.CALLS[k] - before.get(k, 0) for k in runtime.CALLS if runtime.CALLS[k] != before.get(k, 0)}
    one_launch = {"prepare_step": 1, "swa_indices_and_lens.answered": 1 + (s.D > 0), "gather_replay_batch.answered": 1}
    one_launch |= ({"pad_replayed_slots.held": 1} if s.replays else {}) | ({"gather_lens.answered": 1} if s.P else {})
    if called != one_launch:
        raise AssertionError(f"the pack's step did not run as one launch: {called}")
    fns["pack_fused"]()
    check(s, bufs["vllm"], kept_want, bufs["pack"], pack_gather)
    check(s, bufs["vllm"], kept_want, bufs["pack_fused"], fout["replay_batch"])
    row = {"step": name, "B": s.B, "T": s.T, "decodes": s.D, "prefills": s.P, "kept_rows": s.n,
           "checked_against": oracle}
    for col, f in fns.items():
        # every column sleeps the GPU ~2 ms before each step (the lead bench_triton_ops gives its
        # host-heavy torch reference): a step's launches take up to ~0.35 ms of host time on the
        # H200 machine, past the default lead, and GPU time is to be device time
        row.update({f"{col}_{k}": v for k, v in bto.gpu_pair(f, lead_cycles=bto.REFERENCE_LEAD_CYCLES).items()})
    if not bto.SMOKE:  # two untimed rounds first: the first shape timed came out 1.3-2x slower in some runs
        host_interleaved(fns, calls=300, rounds=2)
    rounds: dict = {}
    host = host_interleaved(fns, calls=300 if not bto.SMOKE else 2, rounds=7 if not bto.SMOKE else 1, per_round=rounds)
    row.update({f"{col}_host_us": v for col, v in host.items()})
    if K is not None:
        for col in ("pack", "pack_fused"):
            for k in ("gpu_us_flushed", "gpu_us_warm", "host_us"):
                row[f"{col}_vs_vllm_{k}"] = row[f"{col}_{k}"] / row[f"vllm_{k}"]
            # the same rounds paired: each round's ratio (its columns timed within milliseconds of
            # each other), so the host's drift between rounds cancels; their median beside the
            # ratio of the medians above
            paired = [a / b for a, b in zip(rounds[col], rounds["vllm"])]
            row[f"{col}_vs_vllm_host_us_rounds"] = paired
            row[f"{col}_vs_vllm_host_us_paired"] = statistics.median(paired)
    return row


def print_table(res) -> None:
    print(f"\n{res['meta']['gpu']}: one step's replay metadata, us (ratio to vLLM's sequence)")
    print(f"vLLM kernels: {res['meta']['vllm_kernels']}")
    hdr = f"{'step':>12} {'col':>10} {'GPU flushed':>16} {'GPU warm':>16} {'host':>16}"
    print(hdr)
    for row in res["steps"]:
        for col in COLUMNS:
            if f"{col}_host_us" not in row:
                continue
            cells = []
            for k in ("gpu_us_flushed", "gpu_us_warm", "host_us"):
                v = row[f"{col}_{k}"]
                r = row.get(f"{col}_vs_vllm_{k}")
                cells.append(f"{v:8.2f}" + (f" ({r:4.2f})" if r is not None else "       "))
            print(f"{row['step']:>12} {col:>10} " + " ".join(f"{c:>16}" for c in cells))
    paired = [(row["step"], row["pack_vs_vllm_host_us_paired"]) for row in res["steps"]
              if "pack_vs_vllm_host_us_paired" in row]
    if paired:
        print("host ratio of the pack's column, the median of each round's ratio: "
              + "; ".join(f"{step} {r:.2f}" for step, r in paired))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="What each column measures: the module docstring and bench/README.md.")
    ap.add_argument("--out", required=True, help="directory for the JSON")
    ap.add_argument("--quick", action="store_true", help="the first step shape only")
    ap.add_argument("--smoke", action="store_true",
                    help="no GPU: tiny steps through Triton's interpreter (checks the script; numbers mean nothing)")
    ap.add_argument("--vllm-kernels", default=None,
                    help=f"folder with vLLM's model_state.py and sparse_swa.py (default: ${vk.ENV}, else the installed vLLM)")
    a = ap.parse_args(argv)
    steps = STEPS
    if a.smoke:
        if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
            print("--smoke runs on a CPU-only machine under TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        bto.SMOKE = True
        steps = SMOKE_STEPS
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    if a.quick:
        steps = dict(list(steps.items())[:1])
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cpu") if bto.SMOKE else torch.device("cuda", torch.cuda.current_device())
    be = integration_backend(dev)
    ref = swa_backends.select(dev, prefer="reference")
    K, origin = vk.load(a.vllm_kernels)
    res = {"meta": {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": "cpu (smoke)" if bto.SMOKE else torch.cuda.get_device_name(dev), "smoke": bto.SMOKE,
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "vllm_kernels": origin, "vllm_ran": K is not None, "W": W, "block_size": BS, "groups": G,
        "method": "GPU us: events around the whole step, median of 200 steps, L2 flushed (256 MB zeroed before each) "
                  "and warm (a GPU sleep instead); host us: back-to-back steps without sync, validation off, the "
                  "columns in interleaved rounds (median of 7 rounds of 300 steps, after 2 untimed rounds)",
    }, "steps": []}
    rng = np.random.default_rng(0)
    global SHIMS
    with routed_shims(lambda device: be) as SHIMS:
        for name, shape in steps.items():
            res["steps"].append(run_step(name, shape, K, be, ref, dev, rng))
    path = out_dir / "bench_replay_step.json"
    path.write_text(json.dumps(res, indent=1, default=str))
    print_table(res)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
