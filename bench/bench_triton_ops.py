"""Benchmark of the portable Triton kernels on one GPU; baselines measured in the same run.

    . bench/gpu_env.sh && python3 bench/bench_triton_ops.py --out DIR [--quick]   # under a minute on an H200
    python bench/bench_triton_ops.py --out DIR --smoke   # no GPU: tiny sizes, Triton's interpreter

Writes ``DIR/bench_triton_ops.json`` (raw numbers + date, GPU, torch/triton/CUDA versions),
``DIR/rows_bandwidth.png`` when matplotlib is there, and prints a short table.

Measured (validation off, the serving setting). Every GPU time is reported twice, from the
same loop (events recorded right before and after each call, as ``triton.testing.do_bench``
does; median of 200 calls): **L2 flushed** (a 256 MB buffer zeroed before each call, which
is do_bench's method and what the issue's "empty kernel ~3.5 us" was measured with: the
target is judged on it) and **L2 warm** (a GPU sleep instead of the flush keeps the device
ahead of the host without touching memory: the metadata stays in L2, as in serving, where
the step's previous kernels just wrote it). The empty Triton kernel is measured the same
two ways.

* ``gather_replay_batch`` on serving-like steps (1x1K, 1x16K, 8x4K+32 decodes, 32x4K+128
  decodes, 16x1K+240 decodes; W 128, block 64, 5 slot groups, some replaying prefills):
  GPU time flushed and warm, GPU time per call inside a CUDA graph of 64 calls, and host
  time per call through the ``Backend`` (``out=`` given): through the pack's launch path
  (``kernels/_launch.py``: after a key's first launch, the compiled kernel's own launcher),
  through Triton's own ``kernel[grid]`` path (``swa_backends.kernels._launch.check_keys =
  True`` for that timing), and without ``out=``; the two launch paths are timed in
  interleaved rounds over every step, so drift of the host hits them alike. Against the
  torch reference on the same GPU and an empty Triton kernel (through ``kernel[grid]`` and
  through the pack's path: the host floor of any launch).
* calibration kernels (GPU only): one memory round trip, two dependent ones, and
  ``same_io`` (``gather_replay_batch``'s 12 tensors and traffic in two dependent rounds,
  none of its logic): the floor that op's GPU time is judged against.
* ``prepare_replay_step`` (one launch) against its four ops launched one by one.
* ``gather_rows``/``scatter_rows`` of 7168-wide bf16 rows, 128..8K rows picked out of
  131072: bandwidth against a device-to-device copy moving the same bytes, and against
  ``torch.index_select`` / ``Tensor.index_copy_``.
* ``swa_indices_and_lens``, ``pad_replayed_slots`` and the fused ``prepare_replay_step``
  (no plan) on a 64K-token step: bandwidth against a copy moving the same bytes.

``--smoke`` (what the CPU test runs) checks the script's wiring -- every section but the
calibration kernels and the warmup, the correctness checks, the output file and the table -- on
tiny sizes through Triton's interpreter on the CPU (the script sets ``TRITON_INTERPRET=1``
before Triton is imported unless it is set): every measurement is one call on the host clock
(``lib.timing``'s smoke mode), no timing loops; its numbers mean nothing. Timing methods:
``lib/timing.py``. Imports the installed pack (``pip install -e .``; ``bench/gpu_env.sh`` on
the GPU machine).

Bandwidth = (bytes read + bytes written) / time; the copy baseline copies half that many
bytes (a copy reads and writes each byte once).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

import torch

from lib import smoke

smoke.use_interpreter()  # before anything imports Triton

import numpy as np  # noqa: E402
import swa_backends  # noqa: E402

from lib import floors, results, timing as tm  # noqa: E402
from lib.steps import BS, G, STEPS, W  # noqa: E402
from swa_backends.common.ops import OPS, plan_replay_batch  # noqa: E402
from swa_backends.common.ops.gather_replay_batch import allocate_out as gather_out  # noqa: E402
from swa_backends.common.ops.prepare_replay_step import allocate_out as prepare_out  # noqa: E402
from swa_backends.common.types import INDEX_DTYPE, SLOT_DTYPE  # noqa: E402
from swa_backends.common.validation import set_validation  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What one run measures: the steps, the rows benchmark's row width, rows and row counts,
    the 64K-token step (prefills, tokens each), the steps of the fused-launch comparison, and
    whether the GPU-only calibration kernels run."""

    steps: dict
    hidden: int = 7168
    total_rows: int = 131072
    row_counts: tuple = (128, 256, 512, 1024, 2048, 4096, 8192)
    step_64k: tuple = (16, 4096)
    prepare_steps: tuple = ("8x4K+32d", "16x1K+240d")
    calibration: bool = True


FULL = Sizes(STEPS)
# (every third prefill replays: the smoke's last step and its "64K" step have one, so that what pads
# replayed slots is checked on slots it pads)
SMOKE = Sizes({"1x140": (1, 140, 0), "3x140+3d": (3, 140, 3)}, hidden=40, total_rows=64, row_counts=(8, 16),
              step_64k=(3, 140), prepare_steps=(), calibration=False)


# ---------------------------------------------------------------------------------------
# serving-like steps
# ---------------------------------------------------------------------------------------


class Step:
    """``prefills`` of ``q`` tokens each (every third one replays: R = 896 after a 1024-token
    hit, its chunk starting at R) and ``decodes`` single-token rows; W 128, block 64,
    5 slot groups (0, 2, 4 cacheable)."""

    def __init__(self, prefills: int, q: int, decodes: int, dev, rng):
        qs = [q] * prefills + [1] * decodes
        B = len(qs)
        pre = np.array([True] * prefills + [False] * decodes)
        R = np.zeros(B, np.int64)
        prefix = np.zeros(B, np.int64)
        for i in range(prefills):
            if i % 3 == 2:
                R[i], prefix[i] = 896, 896
        prefix[prefills:] = rng.integers(200, 4000, decodes)
        q_a = np.array(qs, np.int64)
        seq = prefix + q_a
        self.B, self.T = B, int(q_a.sum())
        self.qsl_host = np.concatenate([[0], np.cumsum(q_a)]).astype(np.int32)
        self.prefilling_host = pre
        blocks = int(math.ceil(seq.max() / BS)) + 1
        table = rng.permutation(B * blocks).reshape(B, blocks).astype(np.int32)
        positions = np.concatenate([np.arange(s - a, s) for a, s in zip(q_a, seq)])
        req = np.repeat(np.arange(B), q_a)
        tok = table[req, positions // BS].astype(np.int64) * BS + positions % BS
        slots = np.stack([tok * (g + 1) + g for g in range(G)])
        t = lambda a, dt: torch.tensor(a, dtype=dt, device=dev)  # noqa: E731
        self.qsl = t(self.qsl_host, INDEX_DTYPE)
        self.seq = t(seq, INDEX_DTYPE)
        self.R = t(R, INDEX_DTYPE)
        self.positions = t(positions, SLOT_DTYPE)
        self.slots = t(slots, SLOT_DTYPE)
        self.cacheable = t(np.arange(0, G, 2), INDEX_DTYPE)
        self.block_table = t(table, INDEX_DTYPE)
        self.prefilling = t(pre, torch.bool)
        self.idx = t(np.arange(B), INDEX_DTYPE)
        self.plan = plan_replay_batch(self.qsl_host, pre, np.zeros(B, bool), W, trim_threshold=0)




def bench_gather_replay_batch(tb, ref, dev, rng, sz: Sizes, results, quick):
    from swa_backends.kernels import _launch

    empty_x = torch.empty(1, device=dev)
    kernel = floors.empty_kernel()
    empty = lambda: kernel[(1,)](empty_x, 1, BLOCK=16)  # noqa: E731
    tm.settle_host(empty)
    results["empty_triton_launch"] = {**tm.gpu_pair(empty), "graph_us": tm.graph_us(empty),
                                      "host_us": tm.host_us(empty)}
    # the same empty kernel through the pack's launch path (a _launch.Kernel): the host floor of every op
    pack_empty = _launch.Kernel(_launch.jit(floors.empty_body), name="bench.empty")
    pack_fn = lambda: pack_empty((), (1, 1, 1), empty_x, 1, 16)  # noqa: E731
    pack_fn()
    results["empty_launch_paths"] = {f"host_us_{mode}": us for mode, us in host_modes(pack_fn).items()}
    if sz.calibration:
        cal = floors.calibration_kernels()
        src = torch.arange(160 * 128, dtype=torch.int64, device=dev)
        dst = torch.empty_like(src)
        idx = torch.arange(160, dtype=torch.int32, device=dev) * 128
        results["calibration"] = {
            f"{kind}_{progs}": tm.gpu_pair(
                (lambda g=progs: cal["one"][(g,)](src, dst, BLOCK=128)) if kind == "one_trip" else
                (lambda g=progs: cal["two"][(g,)](idx, src, dst, BLOCK=128)))
            for kind in ("one_trip", "two_trips") for progs in (1, 160)}
        # the gather's 12 tensors and its traffic, with none of its logic: what the tensor
        # count and the stores cost beyond two dependent round trips
        z32 = torch.zeros(161, dtype=torch.int32, device=dev)
        ztrim = torch.zeros(161, dtype=torch.bool, device=dev)
        io_in = [z32.clone() for _ in range(4)]
        pos = torch.arange(160 * 128, dtype=torch.int64, device=dev)
        slots = torch.arange(8 * 160 * 128, dtype=torch.int64, device=dev)
        outs = [torch.empty(160 * 128, dtype=torch.int64, device=dev), z32.clone(), torch.empty_like(pos),
                torch.empty_like(slots), z32.clone()]
        for progs in (1, 160):
            results["calibration"][f"same_io_{progs}"] = tm.gpu_pair(
                lambda g=progs: cal["same_io"][(g,)](io_in[0], io_in[1], ztrim, io_in[2], io_in[3], pos, slots,
                                                     outs[0], outs[1], outs[2], outs[3], outs[4], 160 * 128,
                                                     BLOCK=128, GB=8))
    rows, fns = [], {}
    for name, (p, q, d) in sz.steps.items():
        s = Step(p, q, d, dev, rng)
        args = (s.plan, s.qsl, s.seq, s.R, s.positions, s.slots, W)
        out = gather_out(s.plan, G, dev)
        fn = lambda: tb.gather_replay_batch(*args, out=out)  # noqa: E731
        rfn = lambda: ref.gather_replay_batch(*args)  # noqa: E731
        got, want = tm.call(fn), tm.call(rfn)
        assert all(torch.equal(getattr(got, k), getattr(want, k))
                   for k in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start")), name
        row = {"step": name, "B": s.B, "T": s.T, "rows": s.plan.num_rows}
        row.update({f"triton_{k}": v for k, v in tm.gpu_pair(fn).items()})
        row.update({"triton_graph_us": tm.graph_us(fn),
                    "triton_host_us_no_out": tm.host_us(lambda: tb.gather_replay_batch(*args))})
        fns[name] = fn
        row.update({f"reference_{k}": v for k, v in tm.gpu_pair(rfn, calls=30, warmup=3,
                                                                lead_cycles=tm.LONG_LEAD_CYCLES).items()})
        row["reference_host_us"] = tm.host_us(rfn, calls=300)
        rows.append(row)
        if quick:
            break
    # host times of every step under both launch paths, all interleaved: a slow stretch of the
    # host (seen on the H200 machines hitting every launch path of one step at once) hits all alike
    host = host_modes(fns)
    for row in rows:
        for mode in LAUNCH_PATHS:
            row["triton_host_us" if mode == "pack" else f"triton_host_us_{mode}"] = host[(row["step"], mode)]
    results["gather_replay_batch"] = rows


#: The launch paths whose host time is measured side by side, each a value of
#: ``swa_backends.kernels._launch.check_keys``: the pack's path (after a key's first launch, the
#: compiled kernel's own launcher) and Triton's own ``kernel[grid]`` (bind, specialise, look up
#: the compiled kernel, launch) on every call.
LAUNCH_PATHS = {"pack": False, "triton_path": True}


def host_modes(fns, calls: int = 2000, rounds: int = 7) -> dict:
    """Host time per call through each of :data:`LAUNCH_PATHS`. ``fns``: one function (result
    keyed by path) or ``{step: fn}`` (keyed by ``(step, path)``); interleaved rounds over every
    path and step (``lib.timing.host_interleaved_us``). Restores ``check_keys``."""
    from swa_backends.kernels import _launch

    single = callable(fns)
    steps = {None: fns} if single else fns
    timed = {(step, mode): f for mode in LAUNCH_PATHS for step, f in steps.items()}

    def path(mode):
        def set_path():
            _launch.check_keys = LAUNCH_PATHS[mode]
        return set_path

    before = _launch.check_keys
    try:
        got = tm.host_interleaved_us(timed, calls=calls, rounds=rounds, warm=2,
                                     before={k: path(k[1]) for k in timed})
    finally:
        _launch.check_keys = before
    return {(k[1] if single else k): v for k, v in got.items()}


def bench_prepare(tb, dev, rng, sz: Sizes, results, quick):
    rows = []
    names = [n for n in sz.prepare_steps if n in sz.steps] or list(sz.steps)[-1:]
    for name in names if not quick else names[:1]:
        p, q, d = sz.steps[name]
        s = Step(p, q, d, dev, rng)
        out = prepare_out(s.B, s.T, W, dev, s.plan, G)
        swa_out = (torch.empty(s.T, W, dtype=INDEX_DTYPE, device=dev), torch.empty(s.T, dtype=INDEX_DTYPE, device=dev))
        rs_out = torch.empty(s.B, dtype=INDEX_DTYPE, device=dev)
        g_out = gather_out(s.plan, G, dev)
        R_all = s.R.clone()

        def fused():
            tb.prepare_replay_step(R_all, s.idx, s.prefilling, s.qsl, s.seq, s.positions, s.slots, s.cacheable,
                                   s.block_table, BS, W, W, index_width=W, plan=s.plan, out=out)

        def separate():
            R = tb.batch_replay_start(R_all, s.idx, s.prefilling, out=rs_out)
            tb.pad_replayed_slots(s.slots, s.cacheable, s.qsl, s.positions, R, W)
            swa = tb.swa_indices_and_lens(s.qsl, s.seq, s.block_table, BS, W, R, index_width=W, num_tokens=s.T,
                                          out=swa_out)
            return R, s.slots, swa, tb.gather_replay_batch(s.plan, s.qsl, s.seq, R, s.positions, s.slots, W, out=g_out)

        want = _check_prepare(tb, s, out)
        # the four ops checked against the same reference before they are timed (the slots they pad in place
        # come out as the reference pads a copy; padding them again changes nothing)
        R, slots, swa, gathered = tm.call(separate)
        for k, got in (("replay_start", R), ("slot_mappings", slots), ("swa_indices", swa[0]), ("swa_lens", swa[1])):
            assert torch.equal(got, getattr(want, k)), f"{name}: the four ops' {k}"
        for k in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start"):
            assert torch.equal(getattr(gathered, k), getattr(want.replay_batch, k)), f"{name}: the four ops' {k}"
        row = {"step": name, "T": s.T}
        row.update({f"fused_{k}": v for k, v in tm.gpu_pair(fused).items()})
        row["fused_host_us"] = tm.host_us(fused)
        row.update({f"separate_{k}": v for k, v in tm.gpu_pair(separate).items()})
        row["separate_host_us"] = tm.host_us(separate)
        rows.append(row)
    results["prepare_replay_step"] = rows


def _check_prepare(tb, s, out, plan=True):
    """The fused launch on ``s`` equals the reference (on copies of the slots it pads); returns the
    reference's result."""
    args = lambda slots: (s.R.clone(), s.idx, s.prefilling, s.qsl, s.seq, s.positions, slots, s.cacheable,  # noqa: E731
                          s.block_table, BS, W, W)
    kw = {"index_width": W, "plan": s.plan if plan else None}
    got = tb.prepare_replay_step(*args(s.slots.clone()), out=out, **kw)
    want = OPS["prepare_replay_step"].reference(*args(s.slots.clone()), **kw)
    for k in ("replay_start", "slot_mappings", "swa_indices", "swa_lens"):
        assert torch.equal(getattr(got, k), getattr(want, k)), k
    if plan:
        for k in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start"):
            assert torch.equal(getattr(got.replay_batch, k), getattr(want.replay_batch, k)), k
    return want


def bench_rows(tb, dev, rng, sz: Sizes, results, quick):
    from swa_backends.kernels import rows as rows_mod

    N, hidden = sz.total_rows, sz.hidden
    x = torch.randn(N, hidden, device=dev).to(torch.bfloat16)
    rb = hidden * 2
    counts = sz.row_counts if not quick else sz.row_counts[::3]
    gather, scatter = [], []
    out = torch.empty(max(counts), hidden, dtype=torch.bfloat16, device=dev)
    big = torch.zeros(N, hidden, dtype=torch.bfloat16, device=dev)
    for n in counts:
        rows = torch.tensor(np.sort(rng.permutation(N)[:n]), dtype=SLOT_DTYPE, device=dev)
        o = out[:n]
        traffic = 2 * n * rb
        copy_us, copy_bw = tm.copy_us(traffic, dev)
        pick = lambda: tb.gather_rows(x, rows, out=o)  # noqa: E731
        assert torch.equal(tm.call(pick), x[rows])
        t_us = tm.gpu_us(pick)
        i_us = tm.gpu_us(lambda: torch.index_select(x, 0, rows, out=o))
        gather.append({"rows": n, "bytes": traffic, "triton_us": t_us, "triton_GBps": traffic / t_us / 1e3,
                       "index_select_us": i_us, "index_select_GBps": traffic / i_us / 1e3,
                       "copy_us": copy_us, "copy_GBps": copy_bw, "triton_vs_copy": copy_us / t_us})
        y = x[:n].clone()
        put = lambda: tb.scatter_rows(y, rows, N, out=big)  # noqa: E731
        assert torch.equal(tm.call(put), OPS["scatter_rows"].reference(y, rows, N)), f"scatter_rows, {n} rows"
        core_us = tm.gpu_us(lambda: rows_mod._launch(y, big, rows, n, True))  # the scatter launch alone
        ic_us = tm.gpu_us(lambda: big.index_copy_(0, rows, y))
        full_us = tm.gpu_us(put)
        full_traffic = (N + n) * rb  # write every output row once, read every input row once
        fcopy_us, fcopy_bw = tm.copy_us(full_traffic, dev)
        scatter.append({"rows": n, "bytes": traffic, "triton_us": core_us, "triton_GBps": traffic / core_us / 1e3,
                        "index_copy_us": ic_us, "index_copy_GBps": traffic / ic_us / 1e3,
                        "copy_us": copy_us, "copy_GBps": copy_bw, "triton_vs_copy": copy_us / core_us,
                        "with_zero_fill_us": full_us, "with_zero_fill_bytes": full_traffic,
                        "with_zero_fill_GBps": full_traffic / full_us / 1e3, "with_zero_fill_copy_us": fcopy_us,
                        "with_zero_fill_vs_copy": fcopy_us / full_us})
    results["gather_rows"] = gather
    results["scatter_rows"] = scatter
    del x, big, out


def _vs_copy(fn, traffic: int, dev, T: int) -> dict:
    """Time ``fn`` and a copy of ``traffic`` bytes, L2 flushed and warm."""
    r = {"T": T, "bytes": traffic}
    pair = tm.gpu_pair(fn)
    for mode, flush in (("flushed", True), ("warm", False)):
        us = pair[f"gpu_us_{mode}"]
        c_us, c_bw = tm.copy_us(traffic, dev, flush=flush)
        r.update({f"triton_us_{mode}": us, f"triton_GBps_{mode}": traffic / us / 1e3, f"copy_us_{mode}": c_us,
                  f"copy_GBps_{mode}": c_bw, f"triton_vs_copy_{mode}": c_us / us})
    return r


def bench_64k(tb, dev, rng, sz: Sizes, results):
    s = Step(sz.step_64k[0], sz.step_64k[1], 0, dev, rng)
    T = s.T
    swa_out = (torch.empty(T, W, dtype=INDEX_DTYPE, device=dev), torch.empty(T, dtype=INDEX_DTYPE, device=dev))
    fn = lambda: tb.swa_indices_and_lens(s.qsl, s.seq, s.block_table, BS, W, s.R, index_width=W,  # noqa: E731
                                         num_tokens=T, out=swa_out)
    got = tm.call(fn)
    want = OPS["swa_indices_and_lens"].reference(s.qsl, s.seq, s.block_table, BS, W, s.R, index_width=W, num_tokens=T)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    swa_traffic = T * W * 4 + T * 4 + T * 4  # indices + lens written, ~one block-table word read per token
    results["swa_indices_and_lens_64k"] = _vs_copy(fn, swa_traffic, dev, T)
    n_replayed = int(((s.R > 0).sum()).item()) * W
    slots = s.slots.clone()
    fn = lambda: tb.pad_replayed_slots(slots, s.cacheable, s.qsl, s.positions, s.R, W)  # noqa: E731
    want = OPS["pad_replayed_slots"].reference(s.slots.clone(), s.cacheable, s.qsl, s.positions, s.R, W)
    # (in place: padding the padded slots again changes nothing)
    assert torch.equal(tm.call(fn), want), "pad_replayed_slots at the 64K step"
    traffic = T * 8 + n_replayed * int(s.cacheable.numel()) * 8  # positions read, PAD written
    results["pad_replayed_slots_64k"] = _vs_copy(fn, traffic, dev, T)
    out = prepare_out(s.B, T, W, dev, None, G)
    _check_prepare(tb, s, out, plan=False)
    R_all = s.R.clone()
    fn = lambda: tb.prepare_replay_step(R_all, s.idx, s.prefilling, s.qsl, s.seq, s.positions, slots,  # noqa: E731
                                        s.cacheable, s.block_table, BS, W, W, index_width=W, out=out)
    results["prepare_replay_step_64k"] = _vs_copy(fn, swa_traffic + traffic, dev, T)


# ---------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------


def print_table(res) -> None:
    e = res["empty_triton_launch"]
    print(f"\nempty Triton kernel: GPU {e['gpu_us_flushed']:.2f} us L2-flushed / {e['gpu_us_warm']:.2f} us L2-warm "
          f"(graph {e['graph_us']:.2f}), host {e['host_us']:.2f} us")
    pe = res["empty_launch_paths"]
    print(f"the same through the pack's launch path: host {pe['host_us_pack']:.2f} us "
          f"(Triton's kernel[grid] path in the same rounds: {pe['host_us_triton_path']:.2f} us)")
    for key, v in res.get("calibration", {}).items():
        print(f"  calibration {key:>14}: GPU {v['gpu_us_flushed']:.2f} us flushed / {v['gpu_us_warm']:.2f} us warm")
    if "calibration" in res:
        print("  (one_trip: load, store; two_trips: load an offset, load from it, store; same_io: the gather's 12 "
              "tensors and traffic, two dependent rounds, none of its logic)")
    print("\ngather_replay_batch (targets: GPU <= 4.5 us, judged on the L2-flushed median as the issue's empty-kernel "
          "figure; host <= 10 us)")
    print(f"{'step':>12} {'rows':>5} {'GPU fl':>7} {'GPU warm':>8} {'graph':>6} {'host':>6} {'h triton':>8} "
          f"{'h no-out':>8} {'ref GPU fl':>10} {'ref host':>8}")
    for r in res["gather_replay_batch"]:
        print(f"{r['step']:>12} {r['rows']:>5} {r['triton_gpu_us_flushed']:>7.2f} "
              f"{r['triton_gpu_us_warm']:>8.2f} {r['triton_graph_us']:>6.2f} "
              f"{r['triton_host_us']:>6.2f} {r['triton_host_us_triton_path']:>8.2f} "
              f"{r['triton_host_us_no_out']:>8.2f} {r['reference_gpu_us_flushed']:>10.1f} "
              f"{r['reference_host_us']:>8.1f}")
    print("  (us; GPU fl/warm: L2 flushed/warm medians; graph: per call in a CUDA graph; host: per call through the "
          "pack's launch path, out= given, validation off; h triton: the same through Triton's kernel[grid] path; "
          "h no-out: the pack's path without out=; ref: the torch reference)")
    print("\nprepare_replay_step (one launch) vs its four ops (us, GPU L2-flushed / warm, host)")
    for r in res["prepare_replay_step"]:
        print(f"{r['step']:>12}: fused {r['fused_gpu_us_flushed']:.2f} / {r['fused_gpu_us_warm']:.2f}, host "
              f"{r['fused_host_us']:.2f} | separate {r['separate_gpu_us_flushed']:.2f} / {r['separate_gpu_us_warm']:.2f}, "
              f"host {r['separate_host_us']:.2f}")
    sz = res["meta"]["sizes"]
    print(f"\ngather_rows / scatter_rows, {sz['hidden']}-wide bf16 rows out of {sz['total_rows']} (target >= 80% of "
          "copy from 1K rows)")
    print(f"{'rows':>6} {'gather GB/s':>11} {'vs copy':>7} {'index_select':>12} {'scatter GB/s':>12} {'vs copy':>7} "
          f"{'index_copy_':>11} {'copy GB/s':>9}")
    for g, s in zip(res["gather_rows"], res["scatter_rows"]):
        print(f"{g['rows']:>6} {g['triton_GBps']:>11.0f} {g['triton_vs_copy']:>7.0%} {g['index_select_GBps']:>12.0f} "
              f"{s['triton_GBps']:>12.0f} {s['triton_vs_copy']:>7.0%} {s['index_copy_GBps']:>11.0f} {g['copy_GBps']:>9.0f}")
    print("\n64K-token step, vs a copy of the same bytes (L2 flushed | warm)")
    for key in ("swa_indices_and_lens_64k", "pad_replayed_slots_64k", "prepare_replay_step_64k"):
        r = res[key]
        print(f"{key:>26}: {r['triton_us_flushed']:.2f} us, {r['triton_GBps_flushed']:.0f} GB/s = "
              f"{r['triton_vs_copy_flushed']:.0%} of copy ({r['copy_GBps_flushed']:.0f} GB/s) | "
              f"{r['triton_us_warm']:.2f} us = {r['triton_vs_copy_warm']:.0%} of copy")


def plot(res, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - the table is the result; the plot is a picture of it
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    g, s = res["gather_rows"], res["scatter_rows"]
    n = [r["rows"] for r in g]
    ax.plot(n, [r["triton_GBps"] for r in g], "o-", label="gather_rows (Triton)")
    ax.plot(n, [r["index_select_GBps"] for r in g], "o--", label="torch.index_select")
    ax.plot(n, [r["triton_GBps"] for r in s], "s-", label="scatter_rows (Triton, w/o zero fill)")
    ax.plot(n, [r["index_copy_GBps"] for r in s], "s--", label="Tensor.index_copy_")
    ax.plot(n, [r["copy_GBps"] for r in g], "k:", label="D2D copy, same bytes")
    ax.set_xscale("log", base=2)
    sz = res["meta"]["sizes"]
    ax.set_xlabel(f"rows moved ({sz['hidden']}-wide bf16, out of {sz['total_rows']})")
    ax.set_ylabel("GB/s (read + write)")
    ax.set_title(res["meta"]["device"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="What each section measures: the module docstring and bench/README.md.")
    ap.add_argument("--out", required=True, help="directory for the JSON (and PNG)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer sizes: the first step of each section, every third row count")
    ap.add_argument("--smoke", action="store_true",
                    help="no GPU: tiny sizes through Triton's interpreter, one call per measurement (checks the "
                         "script; numbers mean nothing)")
    a = ap.parse_args(argv)
    why = smoke.refusal(a.smoke)
    if why:
        print(why, file=sys.stderr)
        return 2
    tm.set_smoke(a.smoke)
    sz = SMOKE if a.smoke else FULL
    if a.smoke:
        print("TRITON_INTERPRET=1 (CPU smoke run): tiny sizes through Triton's interpreter, one call per "
              "measurement on the host clock; the numbers check the script, they are not performance")
    path = results.out_file(a.out, "bench_triton_ops.json")
    dev = torch.device("cpu") if a.smoke else torch.device("cuda", torch.cuda.current_device())
    set_validation(False)
    tb = swa_backends.select(dev, prefer="triton")
    ref = swa_backends.select(dev, prefer="reference")
    warmup_s = None
    if not a.smoke:  # every kernel variant compiled before timing (tests/kernels test the warmup itself)
        t0 = time.time()
        # (validation off, what it times: the plain kernels alone; a validating backend's self-checked
        # forms would double prepare_replay_step's 128 compiles)
        tb.warmup(W=W, block_size=BS, num_groups=G, hidden_sizes=(sz.hidden,), hidden_dtypes=(torch.bfloat16,),
                  validated=False)
        warmup_s = time.time() - t0
    from swa_backends.kernels import _launch

    res = {"meta": {
        **results.machine(dev), "smoke": a.smoke, "warmup_s": warmup_s, "variants": tb.variants,
        "sizes": {**dataclasses.asdict(sz), "steps": {k: list(v) for k, v in sz.steps.items()}},
        "method": "GPU us: median of 200 calls, events around each call (do_bench's method), L2 flushed (256 MB "
                  "zeroed before each call) and warm (a GPU sleep instead); graph us: per call in a 64-call CUDA "
                  "graph; host us: back-to-back calls without sync, validation off; host_us: the pack's launch "
                  "path (kernels/_launch.py), host_us_triton_path: Triton's kernel[grid] (_launch.check_keys = True), "
                  "timed in interleaved rounds (lib/timing.py)",
    }}
    rng = np.random.default_rng(0)
    bench_gather_replay_batch(tb, ref, dev, rng, sz, res, a.quick)
    bench_prepare(tb, dev, rng, sz, res, a.quick)
    bench_rows(tb, dev, rng, sz, res, a.quick)
    bench_64k(tb, dev, rng, sz, res)
    res["meta"]["compiled_after_run"] = _launch.total_compiled()
    results.write_json(path, res)
    print_table(res)
    png = path.parent / "rows_bandwidth.png"
    print(f"\nwrote {path}" + (f" and {png}" if plot(res, png) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
