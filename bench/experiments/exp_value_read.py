#!/usr/bin/env python
"""The value reader (``kernels/value_read.py``) against torch's way, and where a validated
metadata call's host time goes, on one device::

    . bench/gpu_env.sh && python3 bench/experiments/exp_value_read.py --out $OUT
    python bench/experiments/exp_value_read.py --out /tmp/vr --smoke          # CPU wiring, one round

Host time per call, median of ``--reps`` with the device idle before each call (fresh arguments
made outside the timing), per metadata op at ``bench_validation.py``'s serving-sized step:

* ``off``: the call unvalidated; ``reader``: validated, the backend's value reads by the reader
  (the default on CUDA and ROCm); ``torch``: validated by a backend built without it (torch's
  ``aminmax`` / ``where`` / ``cat`` and one copy); ``host_checks``: the validator under
  ``values_on_device`` (shapes, dtypes, devices, scalars, overlaps; the range checks held
  unread; the per-request checks a validator defers itself still read, once, torch's way);
* ``no_read``: the whole validator (value checks included) with its value reads answered from a copy
  of their first answer: the validators' host work alone (the device torch ops they launch
  included), without the read's transfer and wait;
* ``in_read``: the host time a validated call (the reader's backend) spends inside
  ``validation.to_host``, its value read (plan, launch, copy with its wait, decode; or torch's way);
* ``pieces``: what the op's value checks read (``W`` whole, ``R`` reduced: shape, dtype);
* ``gated_floor``: the host time a validated call could not go below if its host checks were
  skipped on a repeat of the same argument metadata and its value checks ran on the device ahead of
  a gated kernel (the design of ``kernels/sparse_mla_check.py``, which no metadata op has): the
  memo's key of the call (every tensor's dtype, device, shape, strides, address and lazy bits, the
  other arguments as they are) and its lookup, one device pass over the op's pieces (the reader's
  launches into its device buffer, in place of a check kernel that reads the same), a one-word copy
  to a pinned host word and an event, the unvalidated call, the event's wait. The same arguments
  each call (a memo's hit); ``key`` alone beside it;
* ``gated_floor_mapped``: the same, but the host learns that the device pass is done from a word a
  one-program kernel queued behind it writes straight into pinned host memory (mapped into the
  device's address space), which the host polls after the unvalidated call: no copy, no event;
* ``fused_floor``: the floor of any validated call that learns its values' verdict before it returns,
  however its checks are built: the memo's key and lookup (as above), the unvalidated call, an event
  behind it and the event's wait -- as if the op's own kernel checked every value before it wrote and
  left its verdict in host memory, its checks costing nothing (no check launch, no copy). No design
  that raises the ``ValueError`` before the call returns and skips repeated host checks by a memo
  goes below it.
* ``fused_mapped``: the same floor with the wait of ``gated_floor_mapped``: the memo's key and lookup,
  the unvalidated call, then a one-program kernel queued behind it that writes a word into mapped
  pinned host memory, which the host polls (an event's wait replaced by a poll of host memory).
  ``word_launch``: that kernel's launch alone, the part a fused design would not pay (its own kernel
  would write the word last): ``fused_mapped - word_launch`` is that design's floor;
  ``wait_mapped``: ``fused_mapped`` without the key (no memo: the call and the wait alone);
  ``off_same``: the unvalidated call on the same arguments as these floors (``off`` makes fresh
  copies of them before each call, outside the timing).

And the primitives: a read of a few bytes (``.cpu()``); the reader on one whole and one reduced
piece, split into its plan, its launch and its copy; ``torch.aminmax`` of 20K int32; ``torch.cat``
of four small tensors. Writes ``exp_value_read.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lib import smoke  # noqa: E402

smoke.use_interpreter()  # before anything imports Triton

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

import swa_backends as sb  # noqa: E402
from lib import results  # noqa: E402
from lib.steps import validation_cases  # noqa: E402
from swa_backends import dispatch  # noqa: E402
from swa_backends.common import validation as V  # noqa: E402
from swa_backends.common.ops import OPS  # noqa: E402
from swa_backends.kernels._launch import Kernel, jit  # noqa: E402


def med_us(fn, reps: int, gpu: bool, fresh=None, sync: bool = True) -> float:
    times = []
    for _ in range(reps):
        call = fresh() if fresh is not None else fn
        if gpu and sync:
            torch.cuda.synchronize()
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e6)
    if gpu:
        torch.cuda.synchronize()
    return statistics.median(times)


@contextlib.contextmanager
def reader_off():
    """Backends selected inside read their value checks torch's way."""
    real = dispatch._value_reader
    dispatch._value_reader = lambda device: None
    try:
        yield
    finally:
        dispatch._value_reader = real


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


def read_items(spec, args, kwargs) -> list:
    """What one validation of the call reads: its tensors read whole and its :class:`Reduced`
    pieces, as ``validation.to_host`` gets them."""
    seen: list = []
    real = V.to_host

    def spy(items):
        seen.extend(items)
        return real(items)

    V.to_host = spy
    try:
        with V.one_read():
            spec.validate(*args, **kwargs)
    finally:
        V.to_host = real
    return seen


def pieces_of(spec, args, kwargs) -> list:
    """What the op's value checks read: ``(W|R, shape, dtype)`` per piece."""
    return [("R" if isinstance(t, V.Reduced) else "W", list((t.t if isinstance(t, V.Reduced) else t).shape),
             str((t.t if isinstance(t, V.Reduced) else t).dtype).replace("torch.", ""))
            for t in read_items(spec, args, kwargs)]


@contextlib.contextmanager
def reads_answered(spec, args, kwargs):
    """Inside, ``validation.to_host`` answers each read of a validation of this call with what the
    same read returned once, in order, without touching the device."""
    answers: list = []
    real = V.to_host
    V.to_host = lambda items: answers.append(real(items)) or answers[-1]
    try:
        with V.one_read():
            spec.validate(*args, **kwargs)
    finally:
        V.to_host = real
    at = [0]

    def replay(items):
        got = answers[at[0] % len(answers)]
        at[0] += 1
        return got

    V.to_host = replay
    try:
        yield
    finally:
        V.to_host = real


def in_read_us(make, reps: int, gpu: bool) -> float:
    """Median host us a validated call spends inside ``validation.to_host`` (its value read:
    the reader's plan, launch, copy and decode, or torch's way), the device idle before each call."""
    spent = [0.0]
    real = V.to_host

    def timed(items):
        t = time.perf_counter()
        try:
            return real(items)
        finally:
            spent[0] += time.perf_counter() - t

    times = []
    V.to_host = timed
    try:
        for _ in range(reps):
            call = make()
            if gpu:
                torch.cuda.synchronize()
            spent[0] = 0.0
            call()
            times.append(spent[0] * 1e6)
    finally:
        V.to_host = real
    return statistics.median(times)


def per_op(dev, reps: int, gpu: bool) -> dict:
    be = sb.select(str(dev))
    with reader_off():
        be_torch = sb.select(str(dev))
    out = {}
    for op, args, kwargs in validation_cases(dev):
        spec = OPS[op]

        def fresh(b, on):
            def make():
                a, kw = tuple(_clone(x) for x in args), {n: _clone(x) for n, x in kwargs.items()}

                def call():
                    with sb.validation(on):
                        getattr(b, op)(*a, **kw)
                return call
            return make

        def host_checks():
            with V.values_on_device():
                spec.validate(*args, **kwargs)
                spec.check_writes(args, kwargs)

        def no_read():
            with V.one_read():
                spec.validate(*args, **kwargs)
                spec.check_writes(args, kwargs)

        for b in (be, be_torch):  # warm: every specialisation compiled, both paths
            for on in (True, False):
                fresh(b, on)()()
        row = {"off": med_us(None, reps, gpu, fresh(be, False)), "reader": med_us(None, reps, gpu, fresh(be, True)),
               "torch": med_us(None, reps, gpu, fresh(be_torch, True)),
               "host_checks": med_us(host_checks, reps, gpu, sync=False), "pieces": pieces_of(spec, args, kwargs)}
        with reads_answered(spec, args, kwargs):
            row["no_read"] = med_us(no_read, reps, gpu, sync=False)
        row["in_read"] = in_read_us(fresh(be, True), reps, gpu)
        row.update(gated_floor_us(be, op, spec, args, kwargs, reps, gpu))
        row["reader_ratio"], row["torch_ratio"] = row["reader"] / row["off"], row["torch"] / row["off"]
        row["gated_floor_ratio"] = row["gated_floor"] / row["off"]
        row["gated_floor_mapped_ratio"] = row["gated_floor_mapped"] / row["off"]
        row["fused_floor_ratio"] = row["fused_floor"] / row["off"]
        # the fused design with the polled word, less the word's own launch (its kernel would write it)
        row["fused_mapped_floor"] = row["fused_mapped"] - row["word_launch"]
        for name in ("fused_mapped", "wait_mapped", "fused_mapped_floor"):
            row[f"{name}_ratio"] = row[name] / row["off"]
            row[f"{name}_ratio_same"] = row[name] / row["off_same"]
        out[op] = row
        print(f"{op:<24} off {row['off']:7.1f}  reader {row['reader']:7.1f} ({row['reader_ratio']:5.2f}x)  torch "
              f"{row['torch']:7.1f} ({row['torch_ratio']:5.2f}x)  host checks {row['host_checks']:7.1f}  no read "
              f"{row['no_read']:7.1f}  in the read {row['in_read']:7.1f}  key {row['key']:5.1f}  gated floor "
              f"{row['gated_floor']:7.1f} ({row['gated_floor_ratio']:4.2f}x)  mapped {row['gated_floor_mapped']:7.1f} "
              f"({row['gated_floor_mapped_ratio']:4.2f}x)  fused {row['fused_floor']:7.1f} "
              f"({row['fused_floor_ratio']:4.2f}x)  off same {row['off_same']:6.1f}  fused mapped "
              f"{row['fused_mapped']:6.1f} ({row['fused_mapped_ratio']:4.2f}x)  less its launch "
              f"{row['fused_mapped_floor']:6.1f} ({row['fused_mapped_floor_ratio']:4.2f}x, same args "
              f"{row['fused_mapped_floor_ratio_same']:4.2f}x)  wait alone {row['wait_mapped']:6.1f} "
              f"({row['wait_mapped_ratio']:4.2f}x) us", flush=True)
    return out


def metadata_key(args: tuple, kwargs: dict) -> tuple:
    """What a memo of a call's host checks would be keyed by: per argument, its tensors' (a plan's
    and a dict's included) dtype, device, shape, strides, address and lazy bits, any other value
    as it is (by repr when it cannot be hashed)."""
    key = []
    for name, v in itertools.chain(enumerate(args), kwargs.items()):
        tensors = V._tensors(str(name), v)
        if tensors:
            key.append(tuple((n, t.dtype, t.device, t.shape, t.stride(), t.data_ptr(), t.is_conj(), t.is_neg())
                             for n, t in tensors))
        else:
            try:
                hash(v)
                key.append((name, v))
            except TypeError:
                key.append((name, repr(v)))
    return tuple(key)


@jit
def _store_word(word_ptr, value):
    tl.store(word_ptr, value)


_WORD = Kernel(_store_word, name="exp_value_read.store_word")


def gated_floor_us(be, op: str, spec, args, kwargs, reps: int, gpu: bool) -> dict:
    """``{"gated_floor": us, "gated_floor_mapped": us, "fused_floor": us, "fused_mapped": us, "wait_mapped": us,
    "off_same": us, "word_launch": us, "key": us}``: see the module docstring. On
    the CPU (``--smoke``) the wiring alone: the host's tensors are read in place, so nothing
    launches, and the word is copied without an event."""
    from swa_backends.kernels import value_read

    on_device = [it for it in read_items(spec, args, kwargs)
                 if (it.t if isinstance(it, V.Reduced) else it).device.type != "cpu"]
    plan = value_read.plan_of(on_device)  # (a host tensor's values are read in place: a plan's)
    assert plan is not None, f"{op}: a piece the reader declines"
    pieces, slots = plan.pieces, value_read.SLOTS
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    dev_buf, _ = value_read._buffers(device, max(plan.size, 1))
    word, host = dev_buf[:1], torch.empty(1, dtype=torch.int64, pin_memory=gpu)
    event = torch.cuda.Event() if gpu else None
    memo = {metadata_key(args, kwargs): True}
    fn = getattr(be, op)

    def checks_ahead() -> None:  # the memo's lookup and the device pass, ahead of the unvalidated call
        memo.get(metadata_key(args, kwargs))
        for at in range(0, len(pieces), slots):
            value_read._launch(dev_buf, pieces[at:at + slots])

    def call():
        with sb.validation(False):
            checks_ahead()
            host.copy_(word, non_blocking=gpu)
            if event is not None:
                event.record()
            fn(*args, **kwargs)
            if event is not None:
                event.synchronize()
            return int(host[0])

    seen = host.numpy()
    seq = [0]

    def mapped():
        with sb.validation(False):
            checks_ahead()
            seq[0] += 1
            _WORD((), (1, 1, 1), host, seq[0])  # the host word, written by the device behind the pass
            fn(*args, **kwargs)
            for _ in range(10_000_000):
                if seen[0] == seq[0]:
                    return
            raise RuntimeError("the device never wrote the host word")

    spare = torch.zeros(1, dtype=torch.int64, pin_memory=gpu)

    def done_word():  # the call's completion, seen as a word the device writes into host memory
        seq[0] += 1
        _WORD((), (1, 1, 1), host, seq[0])
        for _ in range(10_000_000):
            if seen[0] == seq[0]:
                return
        raise RuntimeError("the device never wrote the host word")

    def fused_mapped():
        with sb.validation(False):
            memo.get(metadata_key(args, kwargs))
            fn(*args, **kwargs)
            done_word()

    def wait_mapped():
        with sb.validation(False):
            fn(*args, **kwargs)
            done_word()

    def off_same():
        with sb.validation(False):
            fn(*args, **kwargs)

    def fused():  # the op's own kernel as the check: nothing ahead of it, its completion waited for
        with sb.validation(False):
            memo.get(metadata_key(args, kwargs))
            fn(*args, **kwargs)
            if event is not None:
                event.record()
                event.synchronize()

    for f in (call, mapped, fused, fused_mapped, wait_mapped):
        f()
    return {"gated_floor": med_us(call, reps, gpu), "gated_floor_mapped": med_us(mapped, reps, gpu),
            "fused_floor": med_us(fused, reps, gpu), "fused_mapped": med_us(fused_mapped, reps, gpu),
            "wait_mapped": med_us(wait_mapped, reps, gpu), "off_same": med_us(off_same, reps, gpu),
            "word_launch": med_us(lambda: _WORD((), (1, 1, 1), spare, 0), reps, gpu),
            "key": med_us(lambda: metadata_key(args, kwargs), reps, gpu, sync=False)}


def primitives(dev, reps: int, gpu: bool) -> dict:
    from swa_backends.kernels import value_read

    small = torch.randint(0, 100, (64,), dtype=torch.int32, device=dev)
    big = torch.randint(0, 100, (20000,), dtype=torch.int32, device=dev)
    items = [small, V.Reduced(big)]

    def plan():
        p = value_read._Plan()
        p.add(small, value_read.COPY)
        p.add(big, value_read.MINMAX)
        return p

    p = plan()
    dev_buf, host_buf = value_read._buffers(dev, p.size)
    value_read.read(items)
    res = {"read_few_bytes": med_us(lambda: small[:4].cpu(), reps, gpu),
           "reader": med_us(lambda: value_read.read(items), reps, gpu),
           "reader_plan": med_us(plan, reps, gpu, sync=False),
           "reader_launch": med_us(lambda: value_read._launch(dev_buf, p.pieces), reps, gpu, sync=False),
           "reader_copy": med_us(lambda: host_buf[:p.size].copy_(dev_buf[:p.size]), reps, gpu),
           "torch_way": med_us(lambda: V.to_host(items), reps, gpu),
           "aminmax_20k": med_us(lambda: torch.aminmax(big), reps, gpu, sync=False),
           "cat_4_small": med_us(lambda: torch.cat([small, small, small, small]), reps, gpu, sync=False)}
    print("\n".join(f"{k:>16}: {v:8.1f} us" for k, v in res.items()), flush=True)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--smoke", action="store_true", help="one round on the CPU (checks the script)")
    a = p.parse_args(argv)
    gpu = torch.cuda.is_available() and not a.smoke
    dev = torch.device("cuda" if gpu else "cpu")
    reps = a.reps if gpu else 1
    res = {"meta": results.machine(dev), "reps": reps, "primitives": primitives(dev, reps, gpu),
           "ops": per_op(dev, reps, gpu)}
    a.out.mkdir(parents=True, exist_ok=True)
    results.write_json(a.out / "exp_value_read.json", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
