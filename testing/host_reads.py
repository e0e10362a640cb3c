"""Count the host reads of tensor values a piece of code makes, on any device (a CPU included,
where nothing would otherwise show them): each is a device->host synchronisation on a GPU.

Seen through torch's dispatcher (:class:`~torch.utils._python_dispatch.TorchDispatchMode`): every
op whose result needs the values on the host (``item`` / ``bool`` / ``int`` / ``float`` of a
tensor, ``nonzero``, ``equal``, boolean-mask indexing, ``unique``, ...). Seen at the Python
level: ``Tensor.tolist`` / ``numpy``, which read without an op of their own, and ``cpu`` /
``to("cpu")`` of a tensor not on the host. The validation's one read of a call (``common.validation.to_host``) counts once,
whatever it reads inside. While counting, ``torch.Tensor``'s methods are patched process-wide:
count in one thread at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..common import validation

#: aten ops whose output depends on tensor values on the host (a sync on a GPU)
SYNCING = {"_local_scalar_dense", "nonzero", "equal", "is_nonzero", "masked_select", "_unique2", "unique_dim",
           "unique_consecutive", "unique_dim_consecutive", "repeat_interleave", "allclose", "histc"}


class HostReads:
    """``reads``: the count; ``what``: one name per read (the op or method)."""

    def __init__(self) -> None:
        self.what: list[str] = []

    @property
    def reads(self) -> int:
        return len(self.what)


class _Mode(TorchDispatchMode):
    def __init__(self, log: HostReads, quiet: list):
        super().__init__()
        self.log, self.quiet = log, quiet

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if not self.quiet and (name in SYNCING and not (name == "repeat_interleave" and kwargs.get("output_size"))
                               or name == "index" and _bool_index(args)):
            self.log.what.append(f"aten.{name}")
        return func(*args, **kwargs)


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


@contextlib.contextmanager
def count_host_reads() -> Iterator[HostReads]:
    """``with count_host_reads() as n: ...``; then ``n.reads``."""
    log = HostReads()
    quiet: list = []  # non-empty inside the validation's own read
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "cpu", "to")}
    read_once = validation.to_host

    def method(name):
        original = originals[name]

        def counted(self, *args, **kwargs):
            moves = name in ("tolist", "numpy") or self.device.type != "cpu" and (
                name == "cpu" or _to_host_device(args, kwargs))
            if not quiet and moves:
                log.what.append(f"Tensor.{name}")
            return original(self, *args, **kwargs)

        return counted

    def to_host(tensors):
        if tensors:
            log.what.append("validation.to_host")
        quiet.append(True)
        try:
            return read_once(tensors)
        finally:
            quiet.pop()

    for name in originals:
        setattr(torch.Tensor, name, method(name))
    validation.to_host = to_host
    try:
        with _Mode(log, quiet):
            yield log
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)
        validation.to_host = read_once


def _to_host_device(args, kwargs) -> bool:
    device = kwargs.get("device", args[0] if args and isinstance(args[0], (str, torch.device)) else None)
    return device is not None and torch.device(device).type == "cpu"
