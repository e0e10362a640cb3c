#!/usr/bin/env python
"""What a quick host check (``OpSpec.quick_check``) pays per tensor attribute, on the device's own
tensors, and ``pad_replayed_slots``' quick check whole::

    . bench/gpu_env.sh && python3 bench/experiments/exp_quick_parts.py --out $OUT
    python bench/experiments/exp_quick_parts.py --out /tmp/qp --smoke        # CPU wiring, few calls

Host µs per read, the median of ``--rounds`` rounds of 2000 reads each (``timeit``), of one
attribute of a 1-D int32 tensor on the device: ``device``, ``device ==`` another device,
``get_device()``, ``is_cuda``, ``dtype``, ``dim()``, ``is_contiguous()``, ``is_neg()``,
``shape[0]``, ``stride(0)``, ``data_ptr()``, ``nbytes``; then ``_quick.plain`` of it, and
``pad_replayed_slots.quick_check`` on ``bench_validation.py``'s step.

Writes ``exp_quick_parts.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lib import results  # noqa: E402
from lib.steps import validation_cases  # noqa: E402
from swa_backends.common.ops import OPS  # noqa: E402
from swa_backends.common.ops._quick import plain  # noqa: E402


def per_read_us(fn, rounds: int, number: int) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=rounds)) / number * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--smoke", action="store_true", help="few calls on the CPU (checks the script)")
    a = p.parse_args(argv)
    gpu = torch.cuda.is_available() and not a.smoke
    dev = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    rounds, number = (a.rounds, 2000) if gpu else (1, 10)
    t = torch.zeros(64, dtype=torch.int32, device=dev)
    other = torch.device(dev)
    reads = {
        "device": lambda: t.device,
        "device_eq": lambda: t.device == other,
        "get_device": lambda: t.get_device(),
        "is_cuda": lambda: t.is_cuda,
        "dtype": lambda: t.dtype,
        "dim": lambda: t.dim(),
        "is_contiguous": lambda: t.is_contiguous(),
        "is_neg": lambda: t.is_neg(),
        "shape0": lambda: t.shape[0],
        "stride0": lambda: t.stride(0),
        "data_ptr": lambda: t.data_ptr(),
        "nbytes": lambda: t.nbytes,
        "plain": lambda: plain(t, (torch.int32,), 1, other),
    }
    row = {name: per_read_us(fn, rounds, number) for name, fn in reads.items()}
    for op, args, kwargs in validation_cases(dev, smoke=not gpu):
        if op == "pad_replayed_slots":
            quick = OPS[op].quick_check
            assert quick(*args, **kwargs), "the step's call does not pass the quick check"
            row["pad_quick_check"] = per_read_us(lambda: quick(*args, **kwargs), rounds, number // 10 or 1)
    for name, us in row.items():
        print(f"{name:<16} {us:7.3f} us", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    results.write_json(a.out / "exp_quick_parts.json", {"meta": results.machine(dev), "rounds": rounds,
                                                        "reads_per_round": number, "us": row})
    return 0


if __name__ == "__main__":
    sys.exit(main())
