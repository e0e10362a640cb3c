"""``fake_device`` is per thread: a fake installed by one thread (a test trying the ROCm path)
never changes what another thread's ``current_device()`` / ``select()`` sees."""

from __future__ import annotations

import threading

import pytest

import swa_backends as sb
from swa_backends.common.device import _detect_default

FAKES = ["rocm:gfx942", "rocm:gfx950", "ascend:910b", "ascend:910_93", "cuda:sm90", "cuda:sm100", "cuda:sm89",
         "cuda:sm120"]


def _in_thread(fn):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(timeout=60)
    assert out, "thread did not finish"
    return out[0]


def test_other_threads_keep_the_real_device():
    real = _detect_default()
    entered, leave = threading.Event(), threading.Event()
    seen_inside: list = []

    def faker():
        with sb.fake_device("rocm:gfx942") as d:
            seen_inside.append(sb.current_device())
            entered.set()
            leave.wait(timeout=60)
            seen_inside.append(sb.select().device)
            assert d.spec == "rocm:gfx942"

    t = threading.Thread(target=faker)
    t.start()
    try:
        assert entered.wait(timeout=60)
        assert sb.current_device() == real  # this thread, while the other holds its fake
        assert sb.select().device == real
        assert sb.capabilities().device == real
    finally:
        leave.set()
        t.join(timeout=60)
    assert [d.spec for d in seen_inside] == ["rocm:gfx942", "rocm:gfx942"]
    assert sb.current_device() == real


def test_a_thread_started_inside_the_block_sees_the_real_device():
    real = _detect_default()
    with sb.fake_device("ascend:910b"):
        assert sb.current_device().spec == "ascend:910b"
        assert _in_thread(sb.current_device) == real


def test_many_threads_each_see_their_own_fake():
    barrier = threading.Barrier(len(FAKES) * 4)
    errors: list[str] = []

    def worker(spec):
        with sb.fake_device(spec):
            barrier.wait(timeout=60)  # every thread holds a different fake at once
            for _ in range(20):
                got = sb.current_device().spec
                if got != spec:
                    errors.append(f"{spec} saw {got}")
            with sb.fake_device("cuda:sm90"):  # nesting stays per thread
                if sb.current_device().spec != "cuda:sm90":
                    errors.append(f"{spec}: nested fake lost")
            if sb.explain().device.spec != spec:
                errors.append(f"{spec}: explain() saw another device")
        if sb.current_device().fake:
            errors.append(f"{spec}: fake left behind")

    threads = [threading.Thread(target=worker, args=(s,)) for s in FAKES * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:10]


def test_nested_fakes_unwind_in_order_and_after_an_exception():
    real = _detect_default()
    with sb.fake_device("rocm:gfx950"):
        with pytest.raises(RuntimeError):
            with sb.fake_device("cuda:sm100"):
                assert sb.current_device().spec == "cuda:sm100"
                raise RuntimeError("inside")
        assert sb.current_device().spec == "rocm:gfx950"
    assert sb.current_device() == real


@pytest.mark.parametrize("bad", [None, 42, ["rocm:gfx942"], "tpu:v5"])
def test_fake_device_refuses_what_is_not_a_device(bad):
    with pytest.raises(ValueError, match="device="):
        with sb.fake_device(bad):
            pass
    assert not sb.current_device().fake
