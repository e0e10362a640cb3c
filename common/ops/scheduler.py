"""Scheduler-side helpers (SPEC §1): host-only, pure Python, identical on every platform."""

from __future__ import annotations

import itertools

from ..types import MAX_POSITION, MAX_WINDOW, Admission
from ..validation import check_int, fail

_OP = "admit_prefix_hit"
#: More KV-source layer ids than any model has (DeepSeek-V4.1: one per layer at most).
MAX_LAYER_IDS = 2**16


def _check_hit(op: str, name: str, value) -> int:
    return check_int(op, name, value, min_value=0, max_value=MAX_POSITION, why="MAX_POSITION")


def _check_window(op: str, name: str, value, *, min_value: int) -> int:
    return check_int(op, name, value, min_value=min_value, max_value=MAX_WINDOW, why="MAX_WINDOW")


def _check_flag(op: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        fail(op, name, value, "a bool")
    return value


def mark_prefix_replay(hit: int, Wr: int) -> tuple[int, int]:
    """``replay_tokens = min(Wr, hit)``, ``R = hit - replay_tokens``; ``Wr == 0``: ``(0, 0)``."""
    _check_hit("mark_prefix_replay", "hit", hit)
    _check_window("mark_prefix_replay", "Wr", Wr, min_value=0)
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
    _check_hit(_OP, "local_hit", local_hit)
    _check_hit(_OP, "external_hit", external_hit)
    if local_hit + external_hit > MAX_POSITION:
        fail(_OP, "local_hit + external_hit", local_hit + external_hit, f"<= MAX_POSITION={MAX_POSITION}")
    _check_window(_OP, "Wr", Wr, min_value=0)
    _check_window(_OP, "block_size", block_size, min_value=1)
    _check_flag(_OP, "boundary_retained", boundary_retained)
    _check_flag(_OP, "loads_window", loads_window)
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
    op = "replay_block_is_live"
    _check_hit(op, "hit", hit)
    _check_window(op, "W", W, min_value=1)
    _check_window(op, "block_size", block_size, min_value=1)
    _check_flag(op, "retained", retained)
    if Wr is None:
        Wr = W
    _check_window(op, "Wr", Wr, min_value=0)
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
    _check_flag("replay_layer_ids", "trim_cut_layer", trim_cut_layer)
    if isinstance(kv_source_layer_ids, (str, bytes)):
        fail("replay_layer_ids", "kv_source_layer_ids", kv_source_layer_ids, "an iterable of layer ids (ints)")
    try:  # a bounded read: an endless iterator is refused, not followed
        ids = list(itertools.islice(iter(kv_source_layer_ids), MAX_LAYER_IDS + 1))
    except TypeError:
        fail("replay_layer_ids", "kv_source_layer_ids", kv_source_layer_ids, "an iterable of layer ids (ints)")
    if len(ids) > MAX_LAYER_IDS:
        fail("replay_layer_ids", "kv_source_layer_ids", f"more than {MAX_LAYER_IDS} ids", f"at most {MAX_LAYER_IDS}")
    if not ids:
        fail("replay_layer_ids", "kv_source_layer_ids", ids, "at least one KV-source layer id")
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers for i in ids):
        fail("replay_layer_ids", "kv_source_layer_ids", ids, f"ints in [0, {num_layers})")
    cut = max(ids)
    return range(cut if trim_cut_layer else cut + 1, num_layers)
