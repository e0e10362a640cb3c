"""``pad_replayed_slots`` (SPEC §2.2): replayed tokens write no cacheable KV."""

from __future__ import annotations

import torch

from ..types import INDEX_DTYPE, MAX_POSITION, MAX_WINDOW, PAD, SLOT_DTYPE
from ..validation import INT32_MAX, check_range, check_tensor, defer, fail, value_checks_enabled
from ._batch import token_view
from ._checks import check_batch, check_extents, check_positions, check_slot_mappings, check_window
from ._results import Results
from ._spec import Call, OpSpec
from ._steps import CaseDraw, WarmupStep

NAME = "pad_replayed_slots"


def validate(slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, Wr, *, any_replay=None) -> None:
    check_tensor(NAME, "positions", positions, dtypes=SLOT_DTYPE, ndim=1)
    dev = positions.device
    T = positions.shape[0]
    G = check_slot_mappings(NAME, slot_mappings, dev, T)
    check_tensor(NAME, "cacheable_groups", cacheable_groups, dtypes=INDEX_DTYPE, ndim=1, device=dev)
    check_extents(NAME, "cacheable_groups", cacheable_groups)
    check_tensor(NAME, "query_start_loc", query_start_loc, device=dev)
    check_batch(NAME, query_start_loc, replay_start=replay_start, num_tokens=T)
    check_window(NAME, "Wr", Wr, min_value=0)
    if any_replay is not None and not isinstance(any_replay, bool):
        fail(NAME, "any_replay", any_replay, "None or a bool (host knowledge that some R > 0)")
    check_range(NAME, "cacheable_groups", cacheable_groups, low=0, high=G)
    check_positions(NAME, positions)
    if any_replay is False and value_checks_enabled():
        # the switch only skips the launch; it may never skip a duty (cached KV would be rewritten)
        def test(R):
            if (R > 0).any():
                fail(NAME, "any_replay", any_replay, "True or None when some replay_start > 0")

        defer(NAME, (("replay_start", replay_start),), test)


_TENSOR = torch.Tensor
_META = torch.device("meta")
_STRIDED = torch.strided


def quick_check(slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, Wr,
                any_replay=None) -> tuple | None:
    """``validate``'s host checks for plain tensors (``OpSpec.quick_check``; ``slot_mappings`` may
    be a slice of a wider buffer), written out, each tensor's facts read once; answered as the
    facts the launch takes, ``(device, T, B, n_groups, G, n_cols, stride0, stride1)`` (``G`` and
    ``n_cols``: ``slot_mappings``' rows and columns), or None. ``check_writes``' overlaps are the
    self-checked kernel's to test (``OpSpec.writes_on_device``). ``any_replay`` may come
    positionally: the form passes it so (a keyword call costs a validated call more)."""
    p, q, r, g, s = positions, query_start_loc, replay_start, cacheable_groups, slot_mappings
    if (p.__class__ is not _TENSOR or q.__class__ is not _TENSOR or r.__class__ is not _TENSOR
            or g.__class__ is not _TENSOR or s.__class__ is not _TENSOR):
        return None
    if (p.dtype is not SLOT_DTYPE or q.dtype is not INDEX_DTYPE or r.dtype is not INDEX_DTYPE
            or g.dtype is not INDEX_DTYPE or s.dtype is not SLOT_DTYPE or s.layout is not _STRIDED):
        return None
    try:  # each tensor's rank and sizes in one read: a tensor of another rank does not unpack
        (T,), (n_q,), (n_r,), (n_groups,), (n, m) = p.shape, q.shape, r.shape, g.shape, s.shape
    except ValueError:
        return None
    dev = p.device
    if dev == _META or q.device != dev or r.device != dev or g.device != dev or s.device != dev:
        return None  # (meta: no values for the kernel to test; the validator says so)
    if (not p.is_contiguous() or not q.is_contiguous() or not r.is_contiguous() or not g.is_contiguous()
            or p.is_neg() or q.is_neg() or r.is_neg() or g.is_neg() or s.is_neg()):
        return None
    B = n_q - 1
    if B < 0 or n_r != B or T > MAX_POSITION or B >= MAX_POSITION or n_groups > MAX_POSITION:
        return None
    # a tensor of one element may carry any stride (the kernels never read it): the validator
    # bounds it all the same
    if ((T < 2 and p.stride(0) > INT32_MAX) or (B < 1 and q.stride(0) > INT32_MAX)
            or (B < 2 and r.stride(0) > INT32_MAX) or (n_groups < 2 and g.stride(0) > INT32_MAX)):
        return None
    if Wr.__class__ is not int or not 0 <= Wr <= MAX_WINDOW or not (any_replay is None or any_replay.__class__ is bool):
        return None
    s0, s1 = s.stride()
    if (T <= m and n <= MAX_POSITION and m <= MAX_POSITION and s0 <= INT32_MAX and s1 <= INT32_MAX
            and (n == 0 or m == 0 or ((s1 == 1 or m == 1) and (s0 >= m or n == 1)))):
        return dev, T, B, n_groups, n, m, s0, s1
    return None


def reference(slot_mappings, cacheable_groups, query_start_loc, positions, replay_start, Wr, *, any_replay=None) -> torch.Tensor:
    """In place: ``slot_mappings[g, t] = PAD`` for ``g`` in ``cacheable_groups`` and every
    token ``t`` of a request with ``R > 0`` and ``R <= positions[t] < R + Wr``, unless ``R`` is
    stale: above the request's first position ``positions[query_start_loc[b]]`` (SPEC §0;
    such a request is not replaying).

    Window (non-cacheable) groups and columns past ``query_start_loc[B]`` are untouched.
    ``any_replay=False`` (host knowledge that every R is 0) returns without any launch.
    Returns ``slot_mappings``.
    """
    T = positions.shape[0]
    if any_replay is False or Wr == 0 or T == 0 or cacheable_groups.numel() == 0:
        return slot_mappings
    view = token_view(query_start_loc, None, T)
    R = view.take(replay_start)
    first = positions[(torch.arange(T, device=positions.device) - view.offset).clamp(0, T - 1)]  # p of the request's first token
    replayed = view.valid & (R > 0) & (R <= first) & (positions >= R) & (positions < R + Wr)
    G = slot_mappings.shape[0]
    cacheable = torch.zeros(G, dtype=torch.bool, device=slot_mappings.device)
    cacheable[cacheable_groups.to(torch.int64)] = True
    head = slot_mappings[:, :T]
    head.masked_fill_(cacheable[:, None] & replayed[None, :], PAD)
    return slot_mappings


# in place on slot_mappings (OpSpec.mutates); no result tensor of its own
RESULTS = Results((), lambda a: {}, out=None, pack=lambda tensors, a: a["slot_mappings"])


def case(d: CaseDraw) -> Call:
    b, t = d.batch, d.tensors
    any_replay = None if d.rng.random() < 0.7 else bool((b.R > 0).any())
    return (t["slot_mappings"], t["cacheable_groups"], t["query_start_loc"], t["positions"][: b.T],
            t["replay_start"], b.Wr), {"any_replay": any_replay}


def warmup(s: WarmupStep):
    yield (s.slots.clone(), s.cacheable, s.qsl, s.positions[: s.T], s.R, s.W), {}


OP = OpSpec(NAME, reference, validate, RESULTS, mutates=("slot_mappings",), short="pad_slots",
            scalars={"Wr": "int", "any_replay": "bool"}, case=case, warmup=warmup, quick_check=quick_check,
            writes_on_device=True)
