"""How a backend reads its validated calls' value checks (``Platform.value_reader``): CUDA and ROCm
name the one-pass Triton reader and explain() shows it; a reader that cannot load or read leaves
torch's way for the rest of the process with one warning, the call still validated."""

from __future__ import annotations

import warnings

import pytest
import torch

import swa_backends as sb
from swa_backends import dispatch
from swa_backends.common import validation
from swa_backends.common.device import DeviceInfo
from swa_backends.kernels import VALUE_READER


def test_gpu_platforms_name_the_one_pass_reader():
    assert dispatch.platform_value_reader("cuda") == VALUE_READER
    assert dispatch.platform_value_reader("rocm") == VALUE_READER
    assert dispatch.platform_value_reader("cpu") is None
    assert dispatch.platform_value_reader("ascend") is None


def test_explain_says_how_value_checks_are_read():
    from swa_backends.dispatch import format_explanation

    gpu = sb.explain(DeviceInfo(platform="cuda", arch="sm90", torch_device="cuda:0"))  # a stand-in GPU that is here
    assert gpu.value_reader == VALUE_READER and gpu.as_dict()["value_reader"] == VALUE_READER
    assert f"read by: {VALUE_READER}" in format_explanation(gpu, full=True)
    # the host, and a faked GPU (its calls run on host tensors): torch's way, which its backend takes
    for device in ("cpu", "cuda:sm90"):
        e = sb.explain(device)
        assert e.value_reader is None and dispatch._value_reader(e.device) is None
        assert "read by: torch's reductions and one copy" in format_explanation(e, full=True)


def test_no_reader_where_nothing_runs():
    assert dispatch._value_reader(DeviceInfo(platform="cuda", arch="sm90", fake=True)) is None
    assert dispatch._value_reader(DeviceInfo(platform="cpu", arch="cpu", torch_device="cpu")) is None


@pytest.mark.parametrize("failure", ["load", "read"])
def test_a_failing_reader_leaves_torchs_way_with_one_warning(monkeypatch, failure):
    """A reader that cannot be imported, or raises while reading (a compile error, say): one
    RuntimeWarning naming it, then None (torch's way) for every later read without another."""
    gpu = DeviceInfo(platform="cuda", arch="sm90", torch_device="cuda:0")
    if failure == "load":
        monkeypatch.setattr(dispatch, "platform_value_reader", lambda p: "swa_backends.no_such_module:read")
    else:
        monkeypatch.setattr(dispatch, "load_attr", lambda path: lambda items: 1 / 0)
    read = dispatch._value_reader(gpu)
    with pytest.warns(RuntimeWarning, match=r"value reader .* failed .*torch from now on"):
        assert read([torch.zeros(1)]) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read([torch.zeros(1)]) is None


def test_a_backends_explain_drops_a_reader_that_failed(monkeypatch):
    # its validated calls read with torch from the failure on: explain() says so, as it shows a
    # variant that failed to build
    monkeypatch.setattr(dispatch, "platform_value_reader", lambda p: "swa_backends.no_such_module:read")
    be = sb.select(DeviceInfo(platform="cuda", arch="sm90", torch_device="cuda:0"))
    assert be.explain().value_reader == "swa_backends.no_such_module:read"
    with pytest.warns(RuntimeWarning, match="value reader .* failed"):
        assert be._reader([torch.zeros(1)]) is None
    assert be.explain().value_reader is None
    assert "read by: torch's reductions and one copy" in str(be.explain())


def test_a_declined_read_goes_the_torch_way(monkeypatch):
    """to_host with a reader that declines (None): the values torch's way, in order."""
    monkeypatch.setattr(validation, "_for_reader", lambda device: True)
    seen = []
    a, b = torch.tensor([3, 1, 2], dtype=torch.int32), torch.arange(5, dtype=torch.int64)
    with validation.one_read(lambda items: seen.append(len(items))):
        validation.defer("op", (("a", a), ("b", validation.Reduced(b))),
                         lambda x, y: seen.append((x.tolist(), y.tolist())))
    assert seen == [2, ([3, 1, 2], [0, 4])]


def test_a_tensor_several_checks_read_travels_once(monkeypatch):
    """Two checks reading one tensor object: the reader gets it once, each check its values."""
    monkeypatch.setattr(validation, "_for_reader", lambda device: True)
    got, seen = [], []
    a, b = torch.tensor([3, 1, 2], dtype=torch.int32), torch.arange(4, dtype=torch.int64)

    def reader(items):
        seen.append([id(t) for t in items])
        return None  # torch's way reads them

    with validation.one_read(reader):
        validation.defer("op", (("a", a), ("b", b)), lambda x, y: got.append((x.tolist(), y.tolist())))
        validation.defer("op", (("a", a),), lambda x: got.append(x.tolist()))
    assert seen == [[id(a), id(b)]]
    assert got == [([3, 1, 2], [0, 1, 2, 3]), [3, 1, 2]]
