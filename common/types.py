"""Metadata types of the contract (SPEC §0-§3): PAD, the index dtypes, the clamp, and the
host/device records the scheduler and decoder-side ops exchange (frozen dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


#: Slot id meaning "write nothing / read nothing". Slot 0 is a real (shared null) block.
PAD = -1

INDEX_DTYPE = torch.int32  # query_start_loc, seq_lens, replay_start, block tables, indices, lens
SLOT_DTYPE = torch.int64  # slot mappings, positions, gathered rows

# Limits the kernels' 32-bit arithmetic relies on, checked by validation: a position plus a
# window (or a block) stays below 2**31. Far above any real deployment (DeepSeek-V4.1: W 128,
# blocks of 64, contexts of 1M tokens).
MAX_POSITION = 2**30  # positions, seq_lens, replay starts
MAX_WINDOW = 2**20  # W, Wr, block sizes, index widths


#: Heads one sparse-MLA program (a wgmma M block) serves; the unit of work of every sparse-MLA
#: kernel is a (token, head block) item.
HEAD_BLOCK = 64


def head_block_items(T: int, H: int) -> int:
    """The (token, 64-head block) items of a sparse-MLA call of ``T`` tokens and ``H`` heads."""
    return T * -(-H // HEAD_BLOCK)


def swa_lo(p: torch.Tensor, W: int, R: torch.Tensor) -> torch.Tensor:
    """The clamp contract: ``lo(p) = max(p - W + 1, 0, R)`` (elementwise)."""
    return torch.maximum(torch.clamp(p - (W - 1), min=0), R.to(p.dtype))


@dataclass(frozen=True)
class Admission:
    """Result of :func:`admit_prefix_hit` (SPEC §1).

    ``hit``: adopted prefix-hit length (0 when dropped); ``replay_start``: R (0 = no replay);
    ``num_computed``: tokens the scheduler treats as computed (rewound to R on replay);
    ``start_async_load``: whether an external (connector) load starts;
    ``external_hit``: external tokens adopted after the block cut; ``replay_tokens``: tokens
    recomputed to rebuild the window; ``dropped``: a short hit was discarded.
    """

    hit: int
    replay_start: int
    num_computed: int
    start_async_load: bool
    external_hit: int
    replay_tokens: int
    dropped: bool

    @property
    def replays(self) -> bool:
        return self.replay_start > 0


@dataclass(frozen=True, eq=False)
class ReplayPlan:
    """Host plan of the decoder-side sub-batch (SPEC §3.1).

    ``kept`` int32 [B] rows each request keeps; ``trimmed`` bool [B] (kept < q);
    ``dropped_before`` int32 [B+1] rows dropped before each boundary;
    ``num_rows`` = sum(kept); ``num_rows_padded`` >= num_rows (graph size, PAD slots past
    ``num_rows``); ``window`` = W; ``prefilling`` bool [B] or None (unknown): the requests
    whose length the device cannot change (only decodes are resized on the device, by
    adaptive verification; validation holds prefills to the plan's length). All tensors
    live on the host (CPU), in any layout (the device copy the kernels read is made
    contiguous). A plan's tensors do not change after its first use: a backend keeps their
    device copy and launch values per plan (a plan changed in place meets stale copies; a
    validated call on a self-checked kernel refuses it as an input changed during the call).
    """

    kept: torch.Tensor
    trimmed: torch.Tensor
    dropped_before: torch.Tensor
    num_rows: int
    num_rows_padded: int
    window: int
    prefilling: torch.Tensor | None = None
    # init=False: a plan of its own, dataclasses.replace()'s too, starts with caches of its own (a
    # derived plan sharing its original's would launch with the original's values)
    _device_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    #: per-device launch arguments a backend derives from the plan once (kernels' own use)
    _launch_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_reqs(self) -> int:
        host = self.__dict__.get("_host")
        return host[0].shape[0] if host is not None else self.kept.shape[0]

    def longest_kept(self) -> int:
        """The most rows one request keeps (0 without requests), a host int."""
        host = self.__dict__.get("_host")
        if host is None:  # a plan built field by field
            return max(self.kept.tolist(), default=0)
        kept = host[0]
        # a list's maximum for a few requests, numpy's past that (either a fraction of a torch op's host cost)
        return max(kept.tolist(), default=0) if kept.shape[0] <= 32 else int(kept.max())

    def __getattr__(self, name: str):
        # a plan of from_kept makes its host tensors on first use: a serving step's launch reads
        # its sizes and its device copy of dropped_before, none of them (bench/README.md, "2026-12-03
        # evening"); each is made once, so every read gets the same tensor
        make = _LAZY_FIELDS.get(name)
        host = self.__dict__.get("_host") if make is not None else None
        if host is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = self.__dict__[name] = make(*host)
        return value

    @staticmethod
    def dropped_before_of(kept, query_start_loc_host):
        """int32 ``[B+1]`` (numpy): rows dropped before each boundary, ``query_start_loc -
        [0, cumsum(kept)]`` for ``kept`` rows per request over a host ``query_start_loc``
        ([B+1] or longer)."""
        import numpy as np

        kept = np.asarray(kept)
        cum = np.zeros(kept.shape[0] + 1, dtype=np.int64)
        np.cumsum(kept, out=cum[1:])
        return (np.asarray(query_start_loc_host)[: kept.shape[0] + 1] - cum).astype(np.int32, copy=False)

    @classmethod
    def from_kept(cls, kept, query_start_loc_host, num_rows_padded: int, window: int, *,
                  dropped_before=None, device_dropped_before: torch.Tensor | None = None,
                  is_prefilling=None) -> "ReplayPlan":
        """The plan of a decision already made: ``kept`` rows per request (host ints) over a
        batch's host ``query_start_loc`` ([B+1] or longer), ``dropped_before`` derived
        (:meth:`dropped_before_of`) unless given; no checks of the decision (a planner's result:
        ``plan_replay_batch``, or a serving engine's own planning). ``device_dropped_before``:
        the same values already on a device (an engine's own upload): the plan's device copy
        there, so :meth:`device_dropped_before` copies nothing; the kernels read it as it is, so
        its layout is checked (a contiguous int32 ``[B+1]``, else a ``ValueError``; a validated
        call compares its values with the host's, an unchecked one takes them on the caller's
        word). ``is_prefilling`` (host bools, optional): the plan's ``prefilling``.
        ``kept`` and ``dropped_before``, as contiguous int32 arrays, are taken as they are, not
        copied (the plan's tensors are views of them, made on first use): the caller leaves them
        unchanged; others are copied."""
        import numpy as np

        if type(kept) is not np.ndarray or kept.dtype != np.int32:  # noqa: E721 - the common case, checked cheaply
            kept = np.asarray(kept).astype(np.int32, copy=False)
        if not kept.flags.c_contiguous:  # the plan's tensors and their device copies are views of these
            kept = np.ascontiguousarray(kept)
        if kept.ndim != 1:
            _plan_arg("kept", kept, "1-D host ints: the rows kept per request")
        B = kept.shape[0]
        qsl = np.asarray(query_start_loc_host)
        if qsl.ndim != 1 or qsl.shape[0] < B + 1:
            _plan_arg("query_start_loc_host", qsl, f"1-D host ints of length at least {B + 1} (kept has {B} requests)")
        qsl = qsl[: B + 1]
        for name, value in (("num_rows_padded", num_rows_padded), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                _plan_arg(name, value, "an int")
        if dropped_before is None:
            dropped_before = cls.dropped_before_of(kept, qsl)
        dropped = dropped_before
        if type(dropped) is not np.ndarray or dropped.dtype != np.int32:  # noqa: E721
            dropped = np.asarray(dropped).astype(np.int32, copy=False)
        if not dropped.flags.c_contiguous:
            dropped = np.ascontiguousarray(dropped)
        if dropped.shape != (B + 1,):
            _plan_arg("dropped_before", dropped, f"1-D host ints of length {B + 1} (one per boundary of the {B} requests)")
        ddb = device_dropped_before
        if ddb is not None and (ddb.__class__ is not torch.Tensor or ddb.dtype != torch.int32
                                or ddb.shape != (B + 1,) or not ddb.is_contiguous()):
            shown = (f"tensor(shape={tuple(ddb.shape)}, dtype={ddb.dtype}, contiguous={ddb.is_contiguous()})"
                     if isinstance(ddb, torch.Tensor) else repr(ddb)[:120])
            raise ValueError(f"ReplayPlan.from_kept: device_dropped_before={shown}: expected a contiguous int32 tensor "
                             f"of shape [{B + 1}] (one entry per boundary of the {B} requests)")
        if is_prefilling is not None:
            pre = is_prefilling
            if type(pre) is not np.ndarray or pre.dtype != np.bool_:  # noqa: E721
                pre = np.asarray(pre, dtype=bool)
            is_prefilling = torch.from_numpy(pre[:B].copy())
        # from the rows dropped before each boundary (``qsl - [0, cumsum(kept)]``): a request is
        # trimmed where they grow, and the kept rows are the last boundary less its drops (no
        # np.diff or sum: this runs once per serving step). The fields go straight into the
        # instance's __dict__ (the frozen dataclass's __init__ sets each through
        # object.__setattr__, a fifth of this method's host time): the same object.
        plan = _new(cls)
        fields = plan.__dict__
        fields["_host"] = (kept, dropped)  # kept, trimmed and dropped_before: made on first use (__getattr__)
        fields["num_rows"] = int(qsl[B]) - int(dropped[B])
        fields["num_rows_padded"] = int(num_rows_padded)
        fields["window"] = int(window)
        fields["prefilling"] = is_prefilling
        fields["_device_cache"] = {} if device_dropped_before is None else {
            str(device_dropped_before.device): device_dropped_before}
        fields["_launch_cache"] = {}
        return plan

    def device_dropped_before(self, device: torch.device) -> torch.Tensor:
        """``dropped_before`` on ``device``, copied once per plan and device: all a device op
        reads of the plan besides its sizes (request ``b`` is trimmed where ``dropped_before``
        grows, ``dropped_before[b+1] > dropped_before[b]``, so ``trimmed`` needs no copy)."""
        key = str(device)
        cached = self._device_cache.get(key)
        if cached is None:
            # contiguous: the kernels read it as a flat run (a plan built field by field may hold a
            # strided or expanded view, which .to() of its own device returns as it is)
            cached = self._device_cache[key] = self.dropped_before.to(device).contiguous()
        return cached


def _plan_arg(name: str, value, expected: str) -> None:
    shown = f"array(shape={tuple(value.shape)})" if hasattr(value, "shape") else repr(value)[:120]
    raise ValueError(f"ReplayPlan.from_kept: {name}={shown}: expected {expected}")


#: ReplayPlan's host tensors a plan of ``from_kept`` makes on first use, from its numpy ``(kept,
#: dropped_before)``
_LAZY_FIELDS = {
    "kept": lambda kept, dropped: torch.from_numpy(kept),
    "trimmed": lambda kept, dropped: torch.from_numpy(dropped[1:] > dropped[:-1]),
    "dropped_before": lambda kept, dropped: torch.from_numpy(dropped),
}


@dataclass(frozen=True, eq=False)
class ReplayBatch:
    """The decoder-side sub-batch (SPEC §3.2), all on the device.

    ``rows`` int64 [n_pad] (row of the full batch for each sub-batch row; padded rows 0),
    ``query_start_loc`` int32 [B+1], ``positions`` int64 [n_pad],
    ``slot_mappings`` int64 [G, n_pad] (padded rows PAD), ``kv_start`` int32 [B]
    (``max(R, seq_len - W)`` for trimmed requests, ``R`` otherwise).
    ``num_rows`` real rows, ``num_rows_padded`` = n_pad.
    """

    rows: torch.Tensor
    query_start_loc: torch.Tensor
    positions: torch.Tensor
    slot_mappings: torch.Tensor
    kv_start: torch.Tensor
    num_rows: int
    num_rows_padded: int


_new = object.__new__
