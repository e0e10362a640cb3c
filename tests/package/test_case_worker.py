"""The case worker of the crash-counting families (tests/helpers/case_worker.py): a case that
kills its process, hangs or takes gigabytes fails alone; the cases after it still run."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from case_worker import failed, over_bounds, run_cases


def _crash():
    os.kill(os.getpid(), signal.SIGSEGV)


def _hang():
    time.sleep(600)


def _hog():
    return len(bytearray(8 * 2**30))  # past the worker's address-space cap: MemoryError, not the machine


def cases():
    return [("fine", lambda: "ok"), ("crash", _crash), ("after the crash", lambda: "ok"), ("hang", _hang),
            ("raises", lambda: int("x")), ("hog", _hog), ("last", lambda: "ok")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the worker caps its address space on Linux only")
def test_a_crash_a_hang_and_a_hog_each_fail_alone():
    reports = run_cases(__file__, case_timeout=3.0)
    got = {r["label"]: r for r in reports}
    assert [r["label"] for r in reports] == [label for label, _ in cases()]
    assert got["crash"]["outcome"] == "crash" and got["hang"]["outcome"] == "hang"
    assert got["raises"]["outcome"] == "raised" and "ValueError" in got["raises"]["types"]
    assert got["hog"]["outcome"] == "raised" and "MemoryError" in got["hog"]["types"]
    for label in ("fine", "after the crash", "last"):
        assert got[label]["outcome"] == "returned" and got[label]["detail"] == "ok"
    assert failed(reports).startswith("4 of 7 cases failed")
    assert not over_bounds([got["fine"]], seconds=5, rss_mb=100)
