"""Cases run in a worker process that reports each one, so a crash, a hang or a memory blow-up
fails that case and the others still run (the pattern of tests/dispatch/test_fuzz.py, for any
test file).

A *case file* (a test module) defines ``cases()``: a list of ``(label, fn)``; ``fn()`` runs one
case and returns a short detail string or raises. The test calls :func:`run_cases` and judges
the reports: one dict per case with ``label``, ``outcome`` (``returned``, ``raised``, ``crash``
or ``hang``), ``types`` (the raised exception's class and its bases, by name), ``detail``,
``seconds`` and ``rss_growth_mb`` (how far the case raised the worker's peak resident memory).
The worker also caps its address space (``LIMIT_BYTES`` above what it holds when it starts), so
a case that tries to take gigabytes fails with ``MemoryError`` instead of taking the machine.

Worker side: ``python case_worker.py CASE_FILE START`` prints one JSON line per finished case.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

#: Address space a case may add to the worker's (a bounded loader needs far less).
LIMIT_BYTES = 2 * 2**30


def _load(path: str):
    spec = importlib.util.spec_from_file_location(f"_cases_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _vm_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _emit(row: dict) -> None:
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def worker(path: str, start: int) -> None:
    cases = _load(path).cases()
    if sys.platform.startswith("linux"):
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = _vm_bytes() + LIMIT_BYTES
        resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    _emit({"ready": len(cases)})
    for i in range(start, len(cases)):
        label, fn = cases[i]
        before = _peak_mb()
        t0 = time.perf_counter()
        try:
            detail, outcome, types = str(fn())[:2000], "returned", []
        except Exception as exc:  # noqa: BLE001 - every exception is a report, judged by the test
            outcome, types = "raised", [c.__name__ for c in type(exc).__mro__]
            detail = f"{type(exc).__name__}: {exc}"[:2000]
            if not isinstance(exc, ValueError):
                detail += "\n" + "".join(traceback.format_exception(exc)[-3:])[:1500]
        _emit({"i": i, "label": label, "outcome": outcome, "types": types, "detail": detail,
               "seconds": round(time.perf_counter() - t0, 3), "rss_growth_mb": round(_peak_mb() - before, 1)})
    _emit({"done": True})


def run_cases(path: str | Path, *, env: dict | None = None, case_timeout: float = 30.0,
              start_timeout: float = 180.0) -> list[dict]:
    """Every case of ``path`` in workers; a worker that dies or stops reporting for
    ``case_timeout`` seconds marks the case it was on (``crash`` / ``hang``) and a new worker
    carries on with the next."""
    rows: list[dict] = []
    start, total = 0, None
    while total is None or start < total:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([sys.executable, __file__, str(path), str(start)], stdout=subprocess.PIPE,
                                    stderr=err, env=env, start_new_session=True)
            buf, current, stalled, finished = b"", start, False, False
            deadline = time.monotonic() + start_timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    stalled = True
                    break
                ready, _, _ = select.select([proc.stdout], [], [], left)
                if not ready:
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    if "ready" in msg:
                        total = msg["ready"]
                    elif "done" in msg:
                        finished = True
                    else:
                        rows.append(msg)
                        current = msg["i"] + 1
                    deadline = time.monotonic() + case_timeout
            if stalled:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
        if finished:
            break
        if total is None:
            raise RuntimeError(f"case worker for {path} did not start (exit {proc.returncode}): {tail}")
        if current < total:
            rows.append({"i": current, "label": _load_label(path, current), "types": [], "seconds": None,
                         "rss_growth_mb": None, "outcome": "hang" if stalled else "crash",
                         "detail": f"worker exit {proc.returncode}: {tail}"})
        start = current + 1
    return rows


def failed(reports: list[dict]) -> str:
    """The cases that did not return (raised, crashed, hung), one line each; '' if none."""
    bad = [r for r in reports if r["outcome"] != "returned"]
    lines = "\n".join(f"{r['label'][:80]}: {r['outcome']}: {r['detail'][:500]}" for r in bad[:20])
    return f"{len(bad)} of {len(reports)} cases failed:\n{lines}" if bad else ""


def over_bounds(reports: list[dict], *, seconds: float, rss_mb: float) -> list[tuple]:
    """``(label, seconds, rss growth in MB)`` of the cases that took longer or grew more."""
    return [(r["label"][:60], r["seconds"], r["rss_growth_mb"]) for r in reports
            if (r["seconds"] or 0) > seconds or (r["rss_growth_mb"] or 0) > rss_mb]


def _load_label(path, i: int) -> str:
    return _load(str(path)).cases()[i][0]


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]))
