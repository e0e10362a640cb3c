"""Benchmark of the portable Triton kernels on one GPU; baselines measured in the same run.

    python bench/bench_triton_ops.py --out DIR [--quick]

Writes ``DIR/bench_triton_ops.json`` (raw numbers + date, GPU, torch/triton/CUDA versions),
``DIR/rows_bandwidth.png`` when matplotlib is there, and prints a short table.

Measured (validation off, the serving setting):

* ``gather_replay_batch`` on serving-like steps (1x1K, 1x16K, 8x4K+32 decodes, 32x4K+128
  decodes, 16x1K+240 decodes; W 128, block 64, 5 slot groups, some replaying prefills):
  GPU median (``triton.testing.do_bench``: cold L2, events around each call), GPU time per
  call inside a CUDA graph of 64 calls, and host time per call through the ``Backend``
  (``out=`` given; also without ``out=``); against the torch reference on the same GPU,
  the launch of an empty Triton kernel, and the pack's launcher with its fast path off.
* ``prepare_replay_step`` (one launch) against its four ops launched one by one.
* ``gather_rows``/``scatter_rows`` of 7168-wide bf16 rows, 128..8K rows picked out of
  131072: bandwidth against a device-to-device copy moving the same bytes, and against
  ``torch.index_select`` / ``Tensor.index_copy_``.
* ``swa_indices_and_lens`` and ``pad_replayed_slots`` on a 64K-token step: bandwidth
  against a copy moving the same bytes.

Bandwidth = (bytes read + bytes written) / time; the copy baseline copies half that many
bytes (a copy reads and writes each byte once).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _import_pack():
    """``import swa_backends`` from this checkout whatever its directory is called (the
    repository root is the package), unless an installed one is already importable."""
    if "swa_backends" in sys.modules:
        return sys.modules["swa_backends"]
    spec = importlib.util.spec_from_file_location("swa_backends", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["swa_backends"] = module
    spec.loader.exec_module(module)
    return module


swa_backends = _import_pack()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from swa_backends.common.ops import plan_replay_batch  # noqa: E402
from swa_backends.common.ops.gather_replay_batch import allocate_out as gather_out  # noqa: E402
from swa_backends.common.ops.prepare_replay_step import allocate_out as prepare_out  # noqa: E402
from swa_backends.common.types import INDEX_DTYPE, SLOT_DTYPE  # noqa: E402
from swa_backends.common.validation import set_validation  # noqa: E402

W, BS, G = 128, 64, 5
HIDDEN = 7168
TOTAL_ROWS = 131072


@triton.jit
def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


# ---------------------------------------------------------------------------------------
# timing helpers
# ---------------------------------------------------------------------------------------


def gpu_us(fn) -> float:
    """``do_bench`` median in microseconds (cold L2, events around each call)."""
    return float(do_bench(fn, warmup=25, rep=200, return_mode="median")) * 1e3


def graph_us(fn, calls: int = 64) -> float:
    """Device time per call: ``calls`` calls captured in one CUDA graph, replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def host_us(fn, calls: int = 3000) -> float:
    """Host time per call: ``calls`` back-to-back calls without synchronising (the GPU keeps
    up with a host-bound stream of tiny launches), median of 5 rounds."""
    fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def copy_gbps(nbytes_traffic: int, dev) -> tuple[float, float]:
    """(us, GB/s) of a device-to-device copy moving ``nbytes_traffic`` bytes in total."""
    n = max(1, nbytes_traffic // 2)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    us = gpu_us(lambda: dst.copy_(src))
    return us, 2 * n / us / 1e3


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
        self.plan = plan_replay_batch(self.qsl_host, pre, np.zeros(B, bool), W)


STEPS = {
    "1x1K": (1, 1024, 0),
    "1x16K": (1, 16384, 0),
    "8x4K+32d": (8, 4096, 32),
    "32x4K+128d": (32, 4096, 128),
    "16x1K+240d": (16, 1024, 240),
}


def bench_gather_replay_batch(tb, ref, dev, rng, results, quick):
    from swa_backends.kernels import _launch

    empty_x = torch.empty(1, device=dev)
    results["empty_triton_launch"] = {
        "gpu_us": gpu_us(lambda: _empty_kernel[(1,)](empty_x, 1, BLOCK=16)),
        "graph_us": graph_us(lambda: _empty_kernel[(1,)](empty_x, 1, BLOCK=16)),
        "host_us": host_us(lambda: _empty_kernel[(1,)](empty_x, 1, BLOCK=16)),
    }
    rows = []
    for name, (p, q, d) in STEPS.items():
        s = Step(p, q, d, dev, rng)
        args = (s.plan, s.qsl, s.seq, s.R, s.positions, s.slots, W)
        out = gather_out(s.plan, G, dev)
        got = tb.gather_replay_batch(*args, out=out)
        want = ref.gather_replay_batch(*args)
        assert all(torch.equal(getattr(got, k), getattr(want, k))
                   for k in ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start")), name
        fn = lambda: tb.gather_replay_batch(*args, out=out)  # noqa: E731
        rfn = lambda: ref.gather_replay_batch(*args)  # noqa: E731
        row = {
            "step": name, "B": s.B, "T": s.T, "rows": s.plan.num_rows,
            "triton_gpu_us": gpu_us(fn), "triton_graph_us": graph_us(fn), "triton_host_us": host_us(fn),
            "triton_host_us_no_out": host_us(lambda: tb.gather_replay_batch(*args)),
            "reference_gpu_us": gpu_us(rfn), "reference_host_us": host_us(rfn, calls=300),
        }
        _launch.FAST = False
        row["triton_host_us_triton_launch_path"] = host_us(fn)
        _launch.FAST = True
        rows.append(row)
        if quick:
            break
    results["gather_replay_batch"] = rows


def bench_prepare(tb, dev, rng, results, quick):
    rows = []
    for name in ("8x4K+32d", "16x1K+240d") if not quick else ("8x4K+32d",):
        p, q, d = STEPS[name]
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
            tb.swa_indices_and_lens(s.qsl, s.seq, s.block_table, BS, W, R, index_width=W, num_tokens=s.T, out=swa_out)
            tb.gather_replay_batch(s.plan, s.qsl, s.seq, R, s.positions, s.slots, W, out=g_out)

        rows.append({"step": name, "T": s.T, "fused_gpu_us": gpu_us(fused), "fused_host_us": host_us(fused),
                     "separate_gpu_us": gpu_us(separate), "separate_host_us": host_us(separate)})
    results["prepare_replay_step"] = rows


def bench_rows(tb, dev, rng, results, quick):
    from swa_backends.kernels import rows as rows_mod

    N = TOTAL_ROWS
    x = torch.randn(N, HIDDEN, device=dev).to(torch.bfloat16)
    rb = HIDDEN * 2
    counts = (128, 256, 512, 1024, 2048, 4096, 8192) if not quick else (128, 1024, 8192)
    gather, scatter = [], []
    out = torch.empty(max(counts), HIDDEN, dtype=torch.bfloat16, device=dev)
    big = torch.zeros(N, HIDDEN, dtype=torch.bfloat16, device=dev)
    for n in counts:
        rows = torch.tensor(np.sort(rng.permutation(N)[:n]), dtype=SLOT_DTYPE, device=dev)
        o = out[:n]
        traffic = 2 * n * rb
        copy_us, copy_bw = copy_gbps(traffic, dev)
        t_us = gpu_us(lambda: tb.gather_rows(x, rows, out=o))
        i_us = gpu_us(lambda: torch.index_select(x, 0, rows, out=o))
        assert torch.equal(tb.gather_rows(x, rows, out=o), x[rows])
        gather.append({"rows": n, "bytes": traffic, "triton_us": t_us, "triton_GBps": traffic / t_us / 1e3,
                       "index_select_us": i_us, "index_select_GBps": traffic / i_us / 1e3,
                       "copy_us": copy_us, "copy_GBps": copy_bw, "triton_vs_copy": copy_us / t_us})
        y = x[:n].clone()
        core_us = gpu_us(lambda: rows_mod._launch(y, big, rows, n, True))  # the scatter launch alone
        ic_us = gpu_us(lambda: big.index_copy_(0, rows, y))
        full_us = gpu_us(lambda: tb.scatter_rows(y, rows, N, out=big))
        full_traffic = (N + n) * rb  # write every output row once, read every input row once
        fcopy_us, fcopy_bw = copy_gbps(full_traffic, dev)
        scatter.append({"rows": n, "bytes": traffic, "triton_us": core_us, "triton_GBps": traffic / core_us / 1e3,
                        "index_copy_us": ic_us, "index_copy_GBps": traffic / ic_us / 1e3,
                        "copy_us": copy_us, "copy_GBps": copy_bw, "triton_vs_copy": copy_us / core_us,
                        "with_zero_fill_us": full_us, "with_zero_fill_bytes": full_traffic,
                        "with_zero_fill_GBps": full_traffic / full_us / 1e3, "with_zero_fill_copy_us": fcopy_us,
                        "with_zero_fill_vs_copy": fcopy_us / full_us})
    results["gather_rows"] = gather
    results["scatter_rows"] = scatter
    del x, big, out


def bench_64k(tb, dev, rng, results, steps=(16, 4096)):
    s = Step(steps[0], steps[1], 0, dev, rng)
    T = s.T
    swa_out = (torch.empty(T, W, dtype=INDEX_DTYPE, device=dev), torch.empty(T, dtype=INDEX_DTYPE, device=dev))
    fn = lambda: tb.swa_indices_and_lens(s.qsl, s.seq, s.block_table, BS, W, s.R, index_width=W,  # noqa: E731
                                         num_tokens=T, out=swa_out)
    traffic = T * W * 4 + T * 4 + T * 4  # indices + lens written, ~one block-table word read per token
    us = gpu_us(fn)
    c_us, c_bw = copy_gbps(traffic, dev)
    results["swa_indices_and_lens_64k"] = {"T": T, "bytes": traffic, "triton_us": us, "triton_GBps": traffic / us / 1e3,
                                           "copy_us": c_us, "copy_GBps": c_bw, "triton_vs_copy": c_us / us}
    n_replayed = int(((s.R > 0).sum()).item()) * W
    slots = s.slots.clone()
    fn = lambda: tb.pad_replayed_slots(slots, s.cacheable, s.qsl, s.positions, s.R, W)  # noqa: E731
    traffic = T * 8 + n_replayed * int(s.cacheable.numel()) * 8  # positions read, PAD written
    us = gpu_us(fn)
    c_us, c_bw = copy_gbps(traffic, dev)
    results["pad_replayed_slots_64k"] = {"T": T, "bytes": traffic, "triton_us": us, "triton_GBps": traffic / us / 1e3,
                                         "copy_us": c_us, "copy_GBps": c_bw, "triton_vs_copy": c_us / us}


# ---------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------


def print_table(res) -> None:
    e = res["empty_triton_launch"]
    print(f"\nempty Triton kernel: GPU {e['gpu_us']:.2f} us (graph {e['graph_us']:.2f}), host {e['host_us']:.2f} us")
    print("\ngather_replay_batch (targets: GPU <= 4.5 us, host <= 10 us)")
    print(f"{'step':>12} {'rows':>6} {'GPU us':>8} {'graph us':>9} {'host us':>8} {'host no-out':>11} "
          f"{'host jit-path':>13} {'ref GPU us':>10} {'ref host us':>11}")
    for r in res["gather_replay_batch"]:
        print(f"{r['step']:>12} {r['rows']:>6} {r['triton_gpu_us']:>8.2f} {r['triton_graph_us']:>9.2f} "
              f"{r['triton_host_us']:>8.2f} {r['triton_host_us_no_out']:>11.2f} "
              f"{r['triton_host_us_triton_launch_path']:>13.2f} {r['reference_gpu_us']:>10.1f} "
              f"{r['reference_host_us']:>11.1f}")
    print("\nprepare_replay_step (one launch) vs its four ops")
    for r in res["prepare_replay_step"]:
        print(f"{r['step']:>12}: fused GPU {r['fused_gpu_us']:.2f} us host {r['fused_host_us']:.2f} us | "
              f"separate GPU {r['separate_gpu_us']:.2f} us host {r['separate_host_us']:.2f} us")
    print(f"\ngather_rows / scatter_rows, {HIDDEN}-wide bf16 rows out of {TOTAL_ROWS} (target >= 80% of copy from 1K rows)")
    print(f"{'rows':>6} {'gather GB/s':>11} {'vs copy':>7} {'index_select':>12} {'scatter GB/s':>12} {'vs copy':>7} "
          f"{'index_copy_':>11} {'copy GB/s':>9}")
    for g, s in zip(res["gather_rows"], res["scatter_rows"]):
        print(f"{g['rows']:>6} {g['triton_GBps']:>11.0f} {g['triton_vs_copy']:>7.0%} {g['index_select_GBps']:>12.0f} "
              f"{s['triton_GBps']:>12.0f} {s['triton_vs_copy']:>7.0%} {s['index_copy_GBps']:>11.0f} {g['copy_GBps']:>9.0f}")
    for key in ("swa_indices_and_lens_64k", "pad_replayed_slots_64k"):
        r = res[key]
        print(f"{key}: {r['triton_us']:.2f} us, {r['triton_GBps']:.0f} GB/s = {r['triton_vs_copy']:.0%} of a copy of "
              f"the same bytes ({r['copy_GBps']:.0f} GB/s)")


def plot(res, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
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
    ax.set_xlabel(f"rows moved ({HIDDEN}-wide bf16, out of 131072)")
    ax.set_ylabel("GB/s (read + write)")
    ax.set_title(res["meta"]["gpu"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the JSON (and PNG)")
    ap.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA/ROCm GPU", file=sys.stderr)
        return 2
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda", torch.cuda.current_device())
    set_validation(False)
    tb = swa_backends.select(dev, prefer="triton")
    ref = swa_backends.select(dev, prefer="reference")
    t0 = time.time()
    tb.warmup(W=W, block_size=BS, num_groups=G, hidden_sizes=(HIDDEN,), hidden_dtypes=(torch.bfloat16,))
    warmup_s = time.time() - t0
    from swa_backends.kernels import _launch

    res = {"meta": {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(dev), "capability": list(torch.cuda.get_device_capability(dev)),
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "hip": torch.version.hip, "python": platform.python_version(), "host": platform.node(),
        "fast_launch": _launch.FAST, "warmup_s": warmup_s, "variants": tb.variants,
        "method": "GPU us: triton.testing.do_bench median (cold L2); graph us: per call in a 64-call CUDA graph; "
                  "host us: back-to-back calls without sync, validation off",
    }}
    rng = np.random.default_rng(0)
    bench_gather_replay_batch(tb, ref, dev, rng, res, a.quick)
    bench_prepare(tb, dev, rng, res, a.quick)
    bench_rows(tb, dev, rng, res, a.quick)
    bench_64k(tb, dev, rng, res)
    res["meta"]["compiled_after_run"] = _launch.total_compiled()
    path = out_dir / "bench_triton_ops.json"
    path.write_text(json.dumps(res, indent=1, default=str))
    print_table(res)
    if plot(res, out_dir / "rows_bandwidth.png"):
        print(f"\nwrote {path} and {out_dir / 'rows_bandwidth.png'}")
    else:
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
