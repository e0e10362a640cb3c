"""The verdict word of a validated call whose value checks run on the device.

A validated call must refuse bad input before it writes anything, and it must know its verdict
before it returns (the ``ValueError`` names the argument). Reading the values on the host means a
device-to-host copy of them and host code to test them; here instead a kernel tests them and
leaves its verdict in one word, and the host waits for that word alone. Two forms:

* :class:`Gate` (``sparse_mla``'s check kernel, ahead of a gated attention kernel): the word is a
  flag (0: every value passed, 1: one did not) that the gated kernel reads too; the host waits
  for an event behind the check. One word per thread, device and stream, zeroed by the host before
  each check: the call before on the same thread and stream has had its verdict read and, when the
  flag was set, every kernel queued behind its check run (the stream waited for), so no kernel
  still to read the word sees the next call's flag.
* :class:`Verdict` (a kernel that tests its own values, ``Variant.self_checked``): its program 0
  writes :data:`PASS` or :data:`FAIL` into a zeroed word; the host polls the word until it is set
  (no event: the first program's store is the earliest the host can know). One word per thread
  and device: a call has read its verdict before it returns (one that stopped between its launch and
  its wait, on an exception or an interrupt, leaves the word unread: the next call on it waits for
  the device before it zeroes the word). An op of several kernels gates the
  later ones on the word (each computes nothing when it reads ``FAIL``; a word zeroed by the next
  call reads as not failed): its word is per stream too (``per_stream``: a call on another stream
  could write ``FAIL`` into it before they run), and a ``FAIL`` makes the host wait for the stream
  (the next call on it zeroes the word only after every kernel that reads it has run).

On an NVIDIA GPU the word is pinned host memory the kernel writes through the device's mapping of
it, write-through (``_device.publish``). Elsewhere (a CPU tensor under Triton's interpreter; a ROCm
device, where the pack has not measured a mapped host word) it is a one-element device tensor, read
by a copy.
"""

from __future__ import annotations

import threading

import torch


#: the values a self-checking kernel's program 0 leaves in its :class:`Verdict` word (0: not yet)
PASS, FAIL = 1, 2
#: polls of a verdict word between two looks at whether its stream is still running
_SPINS = 4096


def _mapped(device: torch.device) -> bool:
    return device.type == "cuda" and torch.version.hip is None


class Gate:
    """One validated call's device verdict: ``flag`` (int32 [1], the word its check writes) and
    :meth:`failed`, which waits for the check (not for what was queued after it) and says
    whether a value failed."""

    __slots__ = ("flag", "_slot", "_done")

    def __init__(self, flag: torch.Tensor, slot: "_Slot | None"):
        self.flag, self._slot, self._done = flag, slot, None

    def failed(self) -> bool:
        if self._done is None:
            if self._slot is None:  # a device tensor: the copy waits for the check
                self._done = bool(self.flag.item())
            else:
                self._done = self._slot.verdict()
        return self._done


class _Slot:
    """A thread's pinned host word for one device and stream, the event behind its last check,
    and that check's gate while its verdict is unread."""

    __slots__ = ("word", "view", "event", "stream", "pending")

    def __init__(self, stream):
        self.word = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self.view = _host_view(self.word)
        self.event, self.stream, self.pending = torch.cuda.Event(), stream, None

    def verdict(self) -> bool:
        self.pending = None
        self.event.synchronize()
        if self.view[0] == 0:
            return False
        # a gated kernel queued after the check reads the word too: it must have run before a
        # later check on this slot zeroes the word
        self.stream.synchronize()
        return True


class _Words(threading.local):
    """A thread's words: its gates' slots and its verdicts, by device (and stream), made on the
    thread's first use (read as plain attributes: a validated call pays no lookup with a default)."""

    def __init__(self):
        self.slots: dict = {}
        self.verdicts: dict = {}


_local = _Words()


def _host_view(word: torch.Tensor) -> memoryview:
    """The host's reads and writes of a pinned word, without a torch op: a memoryview of its int32
    (each read a Python int; a numpy view's reads build numpy scalars, whose compares cost a
    validated call a few hundred ns more)."""
    return memoryview(word.numpy())


def _slot(device: torch.device) -> _Slot:
    """This thread's slot for ``device`` and its current stream; a verdict left unread there (a
    call that stopped between its check and its wait) is read first."""
    stream = torch.cuda.current_stream(device)
    cache = _local.slots
    key = (device.index, stream.cuda_stream)
    slot = cache.get(key)
    if slot is None:
        slot = cache[key] = _Slot(stream)
    elif slot.pending is not None:
        slot.pending.failed()
    return slot


def open_word(device: torch.device) -> tuple[torch.Tensor, _Slot | None]:
    """The zeroed word a check on ``device`` is to write, and its slot (None: a device tensor)."""
    if _mapped(device):
        slot = _slot(device)
        slot.view[0] = 0
        return slot.word, slot
    return torch.zeros(1, dtype=torch.int32, device=device), None


def close_word(flag: torch.Tensor, slot: _Slot | None) -> Gate:
    """The gate of a check just queued into ``flag``: an event behind it on the slot's stream."""
    if slot is None:
        return Gate(flag, None)
    slot.event.record(slot.stream)
    slot.pending = Gate(flag, slot)
    return slot.pending


class Verdict:
    """The verdict of one call to a kernel that tests its own values: ``word`` (int32 [1]) for the
    kernel, :meth:`failed` for the host."""

    __slots__ = ("word", "_view", "_device", "scratch", "epoch", "napping", "unread")

    def __init__(self, word: torch.Tensor, view, device: torch.device):
        self.word, self._view, self._device = word, view, device
        # set from a call's open_verdict until its failed(): a call that stopped in between (an
        # exception or an interrupt after its launch) may have a kernel still to write the word
        self.unread = False
        # a checked kernel with checker programs (range_check.py): its scratch words and the count
        # of calls that used them, kept with the word (same thread, device and stream)
        self.scratch, self.epoch, self.napping = None, 0, False

    def failed(self) -> bool:
        """Waits for the kernel's program 0 to leave its verdict (not for the rest of the kernel;
        for all of the stream's work when it is ``FAIL``)."""
        view = self._view
        if view is None:  # a device tensor: the copy waits for the kernel
            v = int(self.word.item())
        else:
            v = view[0]
            spins = 0
            while v == 0:
                spins += 1
                if spins % _SPINS == 0 and torch.cuda.current_stream(self._device).query():
                    v = view[0]  # the stream has run everything queued: the word is final
                    break
                v = view[0]
            if v == FAIL:  # kernels queued behind the check read the word: they run before it is reused
                torch.cuda.current_stream(self._device).synchronize()
            self.unread = False
        if v not in (PASS, FAIL):
            raise RuntimeError(f"a self-checking kernel on {self._device} left no verdict (word {int(v)})")
        return v == FAIL


# the current stream's id without building a Stream object (torch.cuda.current_stream's own call)
_current_stream = getattr(torch._C, "_cuda_getCurrentStream", None)


def _stream_id(device: torch.device) -> int:
    if _current_stream is not None:
        return _current_stream(device.index)[0]
    return torch.cuda.current_stream(device).stream_id


_CUDA: dict[torch.device, bool] = {}


def _is_cuda(device: torch.device) -> bool:
    """``device.type == "cuda"``, remembered per device: reading ``torch.device.type`` builds a
    string each time, a few hundred ns of a validated call's host time."""
    known = _CUDA.get(device)
    if known is None:
        known = _CUDA[device] = device.type == "cuda"
    return known


def open_verdict(device: torch.device, per_stream: bool = False) -> Verdict:
    """This thread's verdict for ``device`` (and its current stream, ``per_stream``), its word
    zeroed (a fresh device tensor where the word is not mapped host memory)."""
    verdicts = _local.verdicts
    key = (device, _stream_id(device)) if per_stream and _is_cuda(device) else device
    v = verdicts.get(key)
    if v is None:
        if not _mapped(device):
            return Verdict(torch.zeros(1, dtype=torch.int32, device=device), None, device)
        word = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        v = verdicts[key] = Verdict(word, _host_view(word), device)
    elif v.unread:
        # the call before never read its verdict: its kernel may still be queued, and would write
        # the word after this call zeroes it (and this call could read that old verdict)
        torch.cuda.synchronize(device)
    v._view[0] = 0
    v.unread = True
    return v
