#!/usr/bin/env python
"""What a validated call cannot avoid on this GPU: the floor under ``bench_validation.py``'s ratios.

A validated call must refuse bad input before it writes anything, so it reads the device once
(the values) before its kernel launches. Measured here, host time per call (median of
``--reps``), device idle unless named:

* ``read``: one device-to-host read of a few bytes (``.cpu()``), the device idle;
* ``read_after_kernel``: the same read right after a 0.2 ms kernel (the read waits for it);
* ``launch``: an unvalidated ``batch_replay_start`` (one kernel launch through the pack);
* ``validated``: the same call validated; its ratio to ``launch`` is ``bench_validation``'s;
* the top host functions of the validated ``sparse_mla`` call at T 4K / K 640 / H 64 over a
  16K-row cache (``torch.profiler``, CPU side), to name where its time goes;
* ``validators_us``: each metadata op's validator on ``bench_validation.py``'s serving-sized
  batch, split into its host checks alone (shapes, dtypes, devices, scalars, overlaps by address:
  ``values_on_device``, which skips the value checks) and the whole validator (value checks
  included, read at its end): the host work a validated call does besides its one read.

Writes ``exp_validation_floor.json`` under ``--out``. ``--smoke``: one round on the CPU.
``--validators-only``: only ``validators_us``, ``--reps`` rounds, on the GPU when there is one,
else on the CPU (the host checks' cost is the host's, whatever the device).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import swa_backends as sb  # noqa: E402
from lib import results  # noqa: E402
from lib.steps import validation_cases  # noqa: E402
from swa_backends.common.ops import OPS  # noqa: E402
from swa_backends.common.validation import values_on_device  # noqa: E402


def host_us(fn, reps: int, sync: bool) -> float:
    times = []
    for _ in range(reps):
        if sync:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    if sync:
        torch.cuda.synchronize()
    return statistics.median(times)


def validators_us(dev, reps: int, sync: bool) -> dict:
    """Per metadata op: its validator's host checks alone and whole, median us (the batches of
    ``bench_validation.py``: one seed per op)."""
    out = {}
    for op, args, kwargs in validation_cases(dev):
        spec = OPS[op]

        def run():
            spec.validate(*args, **kwargs)
            spec.check_writes(args, kwargs)

        def host_only():
            with values_on_device():
                run()

        run()
        out[op] = {"host_checks": host_us(host_only, reps, sync), "all_checks": host_us(run, reps, sync)}
        print(f"{op:<24} host checks {out[op]['host_checks']:8.1f} us, with the value checks "
              f"{out[op]['all_checks']:8.1f} us", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--smoke", action="store_true", help="one round on the CPU (checks the script)")
    p.add_argument("--validators-only", action="store_true", help="only the validators' host work, --reps rounds")
    a = p.parse_args(argv)
    gpu = torch.cuda.is_available() and not a.smoke
    dev = torch.device("cuda" if gpu else "cpu")
    if a.validators_only:
        res = {"meta": results.machine(dev), "validators_us": validators_us(dev, a.reps, gpu)}
        a.out.mkdir(parents=True, exist_ok=True)
        results.write_json(a.out / "exp_validation_floor.json", res)
        return 0
    reps = a.reps if gpu else 2
    be = sb.select(str(dev) if gpu else "cpu")
    i32 = torch.int32
    R = torch.arange(64, dtype=i32, device=dev)
    idx = torch.arange(32, dtype=i32, device=dev)
    pre = torch.ones(32, dtype=torch.bool, device=dev)
    out = torch.empty(32, dtype=i32, device=dev)
    tiny = torch.zeros(4, dtype=i32, device=dev)
    big = torch.randn(4096, 4096, device=dev)

    def busy():  # about 0.2 ms of device work on an H200
        torch.mm(big, big[:, :256])

    res: dict = {"meta": results.machine(dev), "host_us": {}}
    res["host_us"]["read"] = host_us(lambda: tiny.cpu(), reps, gpu)
    res["host_us"]["read_after_kernel"] = host_us(lambda: (busy(), tiny.cpu()), reps, gpu)
    res["host_us"]["busy_kernel_launch"] = host_us(busy, reps, gpu)
    with sb.validation(False):
        res["host_us"]["launch"] = host_us(lambda: be.batch_replay_start(R, idx, pre, out=out), reps, gpu)
    with sb.validation(True):
        res["host_us"]["validated"] = host_us(lambda: be.batch_replay_start(R, idx, pre, out=out), reps, gpu)
    T, H, K, S = (4096, 64, 640, 16384) if gpu else (8, 16, 64, 256)
    q = torch.randn(T, H, 512, device=dev).to(torch.bfloat16)
    kv = torch.randn(S, 512, device=dev).to(torch.bfloat16)
    ind = torch.randint(0, S, (T, K), dtype=i32, device=dev)
    lens = torch.full((T,), K, dtype=i32, device=dev)
    sink = torch.randn(H, device=dev)
    call = lambda: be.sparse_mla(q, kv, ind, lens, 0.05, 512, sink=sink)  # noqa: E731
    with sb.validation(False):
        res["host_us"]["sparse_mla"] = host_us(call, max(2, reps // 10), gpu)
    with sb.validation(True):
        res["host_us"]["sparse_mla_validated"] = host_us(call, max(2, reps // 10), gpu)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                call()
        res["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    res["validators_us"] = validators_us(dev, reps, gpu)
    print("\n".join(f"{k:>22}: {v:9.1f} us" for k, v in res["host_us"].items()))
    print(res["profile"])
    a.out.mkdir(parents=True, exist_ok=True)
    results.write_json(a.out / "exp_validation_floor.json", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
