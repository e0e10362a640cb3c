"""How every benchmark and experiment times a call: one implementation of each method.

Device time (CUDA events, what the GPU spends; the host's launch work is kept outside the
events by keeping the device busy while the host enqueues):

* :func:`gpu_us` -- ``triton.testing.do_bench``'s method: events right before and after each
  call, median over calls; **L2 flushed** (a 256 MB buffer zeroed before each call) or **warm**
  (a GPU sleep instead of the flush, so the call's data stays in L2, as in serving where the
  step's previous kernels just wrote it). :func:`gpu_pair` gives both,
  :func:`gpu_pair_rounds` both for several callables in interleaved rounds.
* :func:`graph_us` -- per call, ``calls`` calls captured in one CUDA graph and replayed.
* :func:`event_ms` -- events around each call with nothing before it (long calls: prefill).
* :func:`interleaved_ms` -- several callables, one call of each per round (the order rotating)
  after a GPU sleep, median per callable: a slow stretch of the machine hits all alike
  (``calls``: a loop of that many calls per round instead; :func:`host_lead`: each callable's
  host time and a sleep long enough for the slowest).
* :func:`copy_us` -- a device-to-device copy of the same bytes: the bandwidth baseline.

Host time (``time.perf_counter``):

* :func:`host_us` -- back-to-back calls without a sync (the GPU keeps up with a host-bound
  stream of small launches), median of rounds;
* :func:`host_interleaved_us` -- the same for several callables in interleaved rounds whose
  order rotates each round (``before``: a setting made before a callable's timing, e.g. a
  launch path), optionally with the device's work included;
* :func:`host_alternating_us` -- several callables within one round in turns of a few calls
  each, every callable's time summed over its turns: a slow stretch of the host shorter than a
  round falls on all of them alike;
* :func:`one_call_us` -- one call at a time with the device idle before it (host: until the
  call returns; wall: until the device is done), callables alternating;
* :func:`settle_host` -- back-to-back calls for a few seconds before the first host timing.

**Smoke mode** (:func:`set_smoke`, what every script's ``--smoke`` turns on): a callable is
called once, with no warm-up, no settling and no repeats, timed on the host clock, and every
later measurement of the same callable object reuses that time (:func:`call`: the call a script
checks is that one call); a CPU run under Triton's
interpreter then checks a script's wiring (arguments, inputs, one call of each path, the output
file) without timing loops whose numbers mean nothing. Off a GPU the device-time methods time
one call on the host clock whatever the mode.
"""

from __future__ import annotations

import statistics
import time
import weakref
from typing import Callable

import torch

#: ~0.2 ms at 2 GHz: longer than the host needs to enqueue a small call (or four); the warm
#: L2 mode of :func:`gpu_us` sleeps this long instead of flushing.
SLEEP_CYCLES = 400_000
#: ~2 ms: a callable that enqueues many launches (the torch reference, a whole serving step)
#: gets this much GPU sleep before each timed call, so all of its launches are queued before
#: the device starts them.
LONG_LEAD_CYCLES = 4_000_000
#: ~0.5 ms on an H200 at 1.98 GHz: longer than any sparse-MLA path's host work before its first
#: kernel (the torch baseline's is the longest); without it a path's host overhead sat inside
#: its GPU time (up to 4% of a T 4K cell on the H200 machines with torch 2.11).
LEAD_CYCLES = 1_000_000
#: the H200's SM clock under load (1.98 GHz), for turning host µs into sleep cycles; a slower clock
#: makes the sleep longer, never shorter
CYCLES_PER_US = 2_000
FLUSH_BYTES = 256 * 1024 * 1024

_smoke = False
_flush: dict = {}
_smoke_times: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # callable -> µs of its one call


def set_smoke(on: bool) -> bool:
    """Smoke mode on or off (module docstring); returns the previous setting."""
    global _smoke
    previous, _smoke = _smoke, bool(on)
    _smoke_times.clear()
    return previous


def smoke() -> bool:
    return _smoke


def on_gpu() -> bool:
    return torch.cuda.is_available()


def sync() -> None:
    if on_gpu():
        torch.cuda.synchronize()


def _once_us(fn: Callable) -> float:
    """Host µs of one call (with the device's work, on a GPU); in smoke mode a callable already
    timed is not called again."""
    if _smoke:
        try:
            return _smoke_times[fn]
        except (KeyError, TypeError):  # not timed yet; or a callable that takes no weak reference
            pass
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    us = (time.perf_counter() - t0) * 1e6
    if _smoke:
        try:
            _smoke_times[fn] = us
        except TypeError:
            pass
    return us


def call(fn: Callable):
    """``fn()``, the call a script checks before timing ``fn``; in smoke mode its host time is
    ``fn``'s one measurement, so the timing that follows calls it no more."""
    if not _smoke:
        return fn()
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    try:
        _smoke_times[fn] = (time.perf_counter() - t0) * 1e6
    except TypeError:  # a callable that takes no weak reference: timed again when measured
        pass
    return out


def _rotated(keys: list, r: int) -> list:
    k = r % len(keys) if keys else 0
    return keys[k:] + keys[:k]


# ---------------------------------------------------------------------------------------
# device time
# ---------------------------------------------------------------------------------------


def gpu_us(fn: Callable, *, flush: bool = True, calls: int = 200, warmup: int = 25,
           lead_cycles: int | None = None) -> float:
    """Median device µs of one call: events right before and after each call. ``flush``: a
    256 MB buffer zeroed before each call (cold L2); else a GPU sleep of :data:`SLEEP_CYCLES`
    (warm L2). Either way the device is busy while the host enqueues the events and the call,
    so the host's launch work is not counted as long as enqueueing takes less than the flush
    (~0.1 ms) or the sleep; ``lead_cycles``: sleep that long before each call in both modes
    (callables that enqueue many launches)."""
    if _smoke or not on_gpu():
        return _once_us(fn)
    dev = torch.cuda.current_device()
    if dev not in _flush:
        _flush[dev] = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=dev)
    cache = _flush[dev]
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for i in range(calls):
        if flush:
            cache.zero_()
        if lead_cycles is not None or not flush:
            torch.cuda._sleep(lead_cycles or SLEEP_CYCLES)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends)) * 1e3


def gpu_pair(fn: Callable, **kw) -> dict:
    """``{"gpu_us_flushed": ..., "gpu_us_warm": ...}`` of ``fn`` (keywords: :func:`gpu_us`'s);
    one call in smoke mode."""
    if _smoke:
        us = _once_us(fn)
        return {"gpu_us_flushed": us, "gpu_us_warm": us}
    return {"gpu_us_flushed": gpu_us(fn, flush=True, **kw), "gpu_us_warm": gpu_us(fn, flush=False, **kw)}


def gpu_pair_rounds(fns: dict, rounds: int, *, calls: int = 100, lead_cycles: int | None = LONG_LEAD_CYCLES) -> dict:
    """``{name: {"flushed": µs, "warm": µs, "warm_all": [µs per round]}}``: medians over
    ``rounds`` interleaved rounds (order rotating) of :func:`gpu_pair` of ``calls`` calls."""
    got = {k: {"flushed": [], "warm": []} for k in fns}
    keys = list(fns)
    for r in range(1 if _smoke else rounds):
        for k in _rotated(keys, r):
            p = gpu_pair(fns[k], calls=calls, lead_cycles=lead_cycles)
            got[k]["flushed"].append(p["gpu_us_flushed"])
            got[k]["warm"].append(p["gpu_us_warm"])
    return {k: {"flushed": statistics.median(d["flushed"]), "warm": statistics.median(d["warm"]),
                "warm_all": d["warm"]} for k, d in got.items()}


def graph_us(fn: Callable, *, calls: int = 64, reps: int = 15) -> float:
    """Device µs per call: ``calls`` calls captured in one CUDA graph (after one warm call on a
    side stream), the graph replayed ``reps`` times, median."""
    if not on_gpu():
        return _once_us(fn)
    if _smoke:
        calls, reps = 1, 1
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
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    del g
    return statistics.median(times)


def event_ms(fn: Callable, *, reps: int = 3, warmup: int = 1) -> float:
    """Median device ms of ``fn()``: events around each call, each waited for; nothing before
    the call (for calls long against their launch: prefill-sized)."""
    if _smoke or not on_gpu():
        return _once_us(fn) / 1e3
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def interleaved_ms(fns: dict, rounds: int, *, lead_cycles: int = LEAD_CYCLES, calls: int = 1) -> dict:
    """Median device ms per call of each callable, every callable in turn once per round, after a
    GPU sleep of ``lead_cycles`` (its launch work queued before the device starts); the order
    rotates each round, so no callable always runs right after the same ones (a device warmed or
    throttled by the calls before it would otherwise bias the same callable every round). ``calls``:
    that many calls back to back between the round's two events (ms per call: the span over
    ``calls``), so that from the second call on the host works while the device does: what a
    caller timing a loop sees, host work longer than a call included."""
    if calls < 1:
        raise ValueError(f"calls={calls}; expected at least 1")
    if _smoke or not on_gpu():
        return {n: _once_us(f) / 1e3 for n, f in fns.items()}
    times: dict = {n: [] for n in fns}
    torch.cuda.synchronize()
    for r in range(rounds):
        for name in _rotated(list(fns), r):
            fn = fns[name]
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(lead_cycles)
            s.record()
            for _ in range(calls):
                fn()
            e.record()
            e.synchronize()
            times[name].append(s.elapsed_time(e) / calls)
    return {n: statistics.median(t) for n, t in times.items()}


def host_lead(fns: dict, rounds: int = 5) -> tuple[dict, int]:
    """``({name: host µs}, lead cycles)``: each callable's host time (one call on an idle device
    until it returns, median of ``rounds``: :func:`one_call_us`) and :func:`lead_cycles_for` the
    slowest, the sleep to put ahead of each of them in :func:`interleaved_ms`."""
    host = {n: v["host"] for n, v in one_call_us({n: (lambda f=f: f) for n, f in fns.items()}, rounds).items()}
    return host, lead_cycles_for(max(host.values(), default=0.0))


def lead_cycles_for(host_us: float) -> int:
    """The GPU sleep (cycles) to put ahead of a call whose host work takes ``host_us`` µs (a
    median), so that none of it shows in the device time: four times that work at
    :data:`CYCLES_PER_US`, at least :data:`LEAD_CYCLES`. Four: on the H200 machines one call's host
    time varied by 2x from run to run, and a round whose host work outlasts the sleep counts the
    rest as device time (with twice the median, single cells of single runs came out 3-9% slow
    for every path of the cell)."""
    return max(LEAD_CYCLES, int(4 * host_us * CYCLES_PER_US))


def copy_us(nbytes_traffic: int, dev, *, flush: bool = True) -> tuple[float, float]:
    """``(µs, GB/s)`` of a device-to-device copy moving ``nbytes_traffic`` bytes in total (it
    reads and writes half that each): the bandwidth baseline of a kernel moving as many bytes."""
    n = max(1, nbytes_traffic // 2)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    us = gpu_us(lambda: dst.copy_(src), flush=flush)
    return us, 2 * n / us / 1e3


# ---------------------------------------------------------------------------------------
# host time
# ---------------------------------------------------------------------------------------


def settle_host(fn: Callable, seconds: float = 3.0) -> None:
    """Call ``fn`` back to back for ``seconds`` before the first host timing: on the H200
    machines (torch 2.11, Triton 3.6) the first rows timed after start-up ran 20-50% slower in
    every launch path alike, a host that had not settled yet."""
    if _smoke:
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            fn()
        sync()


def host_us(fn: Callable, *, calls: int = 3000, rounds: int = 5) -> float:
    """Host µs per call: ``calls`` back-to-back calls without a sync, median of ``rounds``."""
    if _smoke:
        return _once_us(fn)
    fn()
    sync()
    per_round = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_round.append((time.perf_counter() - t0) / calls * 1e6)
        sync()
    return statistics.median(per_round)


def host_interleaved_us(fns: dict, *, calls: int, rounds: int, per_round: dict | None = None, warm: int = 1,
                        before: dict | None = None, until_done: bool = False, rotate: int = 0) -> dict:
    """Host µs per call of each callable, the median over ``rounds`` interleaved rounds (the
    order rotating each round, so drift of the host hits every callable alike): ``warm`` untimed
    calls and a sync, then ``calls`` back-to-back calls timed. ``before``: ``{name: setting()}``
    called before that callable's timing in each round; ``until_done``: the timing waits for
    the device (its work included); ``per_round``: filled with each callable's list of round
    times; ``rotate``: where the rotation starts (a caller running one round at a time)."""
    times = {} if per_round is None else per_round
    times.update({k: [] for k in fns})
    keys = list(fns)
    for r in range(1 if _smoke else rounds):
        for k in _rotated(keys, r + rotate):
            if before and k in before:
                before[k]()
            f = fns[k]
            if _smoke:
                times[k].append(_once_us(f))
                continue
            for _ in range(warm):
                f()
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            if until_done:
                sync()
            times[k].append((time.perf_counter() - t0) / calls * 1e6)
            sync()
    return {k: statistics.median(v) for k, v in times.items()}


def host_alternating_us(fns: dict, *, calls: int, turn: int, per_round: dict | None = None,
                        rotate: int = 0) -> dict:
    """Host µs per call of each callable in one round: one untimed call of each and a sync, then
    ``calls`` back-to-back calls of each, made in turns of ``turn`` calls (``fns`` in order, from
    the ``rotate``-th), each callable's turns summed; no sync between turns. ``per_round``: each
    callable's time appended to its list. Timed one after another (:func:`host_interleaved_us`), a
    stretch of the host slower than usual for a tenth of a second lands on one callable and moves
    the round's ratio; here it lands on all of them."""
    keys = _rotated(list(fns), rotate)
    if _smoke:
        out = {k: _once_us(fns[k]) for k in fns}
    else:
        spent = dict.fromkeys(keys, 0.0)
        for k in keys:
            fns[k]()
        sync()
        for at in range(0, calls, turn):
            n = min(turn, calls - at)
            for k in keys:
                f = fns[k]
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                spent[k] += time.perf_counter() - t0
        sync()
        out = {k: spent[k] / calls * 1e6 for k in fns}
    if per_round is not None:
        for k, v in out.items():
            per_round.setdefault(k, []).append(v)
    return out


def one_call_us(prepares: dict, rounds: int) -> dict:
    """``{name: {"host": µs, "wall": µs}}``: per round, each ``prepares[name]()`` returns the
    call to time (arguments made outside the timing), run with the device idle before it;
    ``host`` until the call returns, ``wall`` until the device is done; medians over rounds."""
    times = {n: {"host": [], "wall": []} for n in prepares}
    for _ in range(1 if _smoke else rounds):
        for name, prepare in prepares.items():
            call = prepare()
            sync()
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            times[name]["host"].append((t1 - t0) * 1e6)
            times[name]["wall"].append((t2 - t0) * 1e6)
    return {n: {k: statistics.median(v) for k, v in d.items()} for n, d in times.items()}
