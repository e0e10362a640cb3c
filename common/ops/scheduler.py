"""Scheduler-side helpers (SPEC §1): host-only, pure Python, identical on every platform."""

from __future__ import annotations

from ..types import Admission
from ..validation import check_int, fail

_OP = "admit_prefix_hit"


def mark_prefix_replay(hit: int, Wr: int) -> tuple[int, int]:
    """``replay_tokens = min(Wr, hit)``, ``R = hit - replay_tokens``; ``Wr == 0``: ``(0, 0)``."""
    check_int("mark_prefix_replay", "hit", hit, min_value=0)
    check_int("mark_prefix_replay", "Wr", Wr, min_value=0)
    if Wr == 0:
        return 0, 0
    replay_tokens = min(Wr, hit)
    return replay_tokens, hit - replay_tokens


def admit_prefix_hit(
    local_hit: int,
    external_hit: int,
    Wr: int,
    block_size: int,
    *,
    boundary_retained: bool = False,
    loads_window: bool = False,
) -> Admission:
    """Admit a prefix hit of ``local_hit`` cached + ``external_hit`` connector tokens.

    1. ``Wr > 0`` and the external load neither carries the window nor keeps the boundary
       block: the external part is cut to whole blocks; a load starts only if it is > 0.
    2. ``hit = local + ext``; ``0 < hit <= Wr`` is dropped (recomputed in full anyway, and
       keeping it would break the ``R > 0`` iff replay invariant).
    3. Otherwise ``R = hit - min(Wr, hit)``; the computed count rewinds to ``R``.
    4. ``loads_window=True`` (the load brings the window KV itself): never replays, no cut,
       short hits kept.
    """
    check_int(_OP, "local_hit", local_hit, min_value=0)
    check_int(_OP, "external_hit", external_hit, min_value=0)
    check_int(_OP, "Wr", Wr, min_value=0)
    check_int(_OP, "block_size", block_size, min_value=1)
    ext = external_hit
    if loads_window or Wr == 0:
        hit = local_hit + ext
        return Admission(hit, 0, hit, ext > 0, ext, 0, False)
    if not boundary_retained:
        ext -= ext % block_size
    hit = local_hit + ext
    if 0 < hit <= Wr:
        return Admission(0, 0, 0, False, 0, 0, True)
    replay_tokens, R = mark_prefix_replay(hit, Wr)
    return Admission(hit, R, R, ext > 0, ext, replay_tokens, False)


def replay_block_is_live(hit: int, W: int, block_size: int, retained: bool = False, *, Wr: int | None = None) -> bool:
    """Whether the block holding ``R = hit - min(Wr, hit)`` is still allocated.

    The sliding-window allocator frees logical blocks ``[0, (hit - W + 1) // block_size)``
    once ``hit`` tokens are computed; ``R`` must not sit in one of them (its KV would be
    read from a freed block). ``retained=True``: the allocator keeps the boundary block.
    """
    check_int("replay_block_is_live", "hit", hit, min_value=0)
    check_int("replay_block_is_live", "W", W, min_value=1)
    check_int("replay_block_is_live", "block_size", block_size, min_value=1)
    if Wr is None:
        Wr = W
    check_int("replay_block_is_live", "Wr", Wr, min_value=0)
    _, R = mark_prefix_replay(hit, Wr)
    if retained or R == 0:
        return True
    first_live_block = max(0, hit - W + 1) // block_size
    return R // block_size >= first_live_block


def replay_layer_ids(num_layers: int, kv_source_layer_ids, *, trim_cut_layer: bool = False) -> range:
    """Layers that run on the decoder-side sub-batch (SPEC §3).

    ``cut = max(kv_source_layer_ids)``; replay layers are ``cut+1 .. L-1``, or ``cut .. L-1``
    with ``trim_cut_layer=True`` (the cut layer first writes KV for all rows, then its
    remaining work runs trimmed).
    """
    check_int("replay_layer_ids", "num_layers", num_layers, min_value=1)
    ids = list(kv_source_layer_ids)
    if not ids:
        fail("replay_layer_ids", "kv_source_layer_ids", ids, "at least one KV-source layer id")
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers for i in ids):
        fail("replay_layer_ids", "kv_source_layer_ids", ids, f"ints in [0, {num_layers})")
    cut = max(ids)
    return range(cut if trim_cut_layer else cut + 1, num_layers)
