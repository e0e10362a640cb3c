"""``plan_replay_batch`` (SPEC §3.1): which rows the replay layers keep (host)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..types import MAX_POSITION, MAX_WINDOW, ReplayPlan
from ..validation import check_int, fail, validation_enabled

NAME = "plan_replay_batch"

#: vLLM 0.33's ``CompilationConfig.decoder_replay_trim_threshold``: steps of fewer tokens are
#: launch-bound, so the replay layers run on the whole batch (a trim would cost more host time
#: than it saves: the decoder-side seed's measurement, docs/SPEC.md §3.5)
TRIM_THRESHOLD = 768
#: the step's CUDA-graph mode, as vLLM's runtime mode names it
STEP_GRAPH_MODES = ("none", "piecewise", "full")


def _host_1d(name: str, value, dtype) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            fail(NAME, name, value, "a host (CPU) tensor, list or numpy array: the plan is built on the host")
        value = value.detach().resolve_conj().resolve_neg().numpy()
    try:
        arr = np.asarray(value)
    except Exception:  # ragged nesting, objects numpy cannot hold
        fail(NAME, name, value, "a 1-D sequence")
    if arr.ndim != 1:
        fail(NAME, name, value, "a 1-D sequence")
    if dtype is bool:
        if arr.dtype != np.bool_:
            if arr.size:
                fail(NAME, name, value, "booleans")
            arr = arr.astype(np.bool_)  # an empty batch's [] (numpy makes it float64)
        return arr
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        fail(NAME, name, value, "integers")
    return arr.astype(np.int64)


def validate(query_start_loc_host, is_prefilling, keeps_rows, W, *, pad_to=None, graph_mode="none",
             trim_threshold=TRIM_THRESHOLD, num_tokens=None) -> None:
    qsl = _host_1d("query_start_loc_host", query_start_loc_host, int)
    if qsl.size < 1 or qsl[0] != 0 or bool((np.diff(qsl) < 0).any()) or int(qsl[-1]) > MAX_POSITION:
        fail(NAME, "query_start_loc_host", qsl.tolist()[:16],
             f"[B+1] non-decreasing values starting at 0, at most MAX_POSITION={MAX_POSITION}")
    B = qsl.size - 1
    for name, value in (("is_prefilling", is_prefilling), ("keeps_rows", keeps_rows)):
        arr = _host_1d(name, value, bool)
        if arr.size != B:
            fail(NAME, name, value, f"{B} entries (one per request)")
    check_int(NAME, "W", W, min_value=1, max_value=MAX_WINDOW, why="MAX_WINDOW")
    if pad_to is not None and not isinstance(pad_to, (int, Sequence)) or isinstance(pad_to, bool):
        fail(NAME, "pad_to", pad_to, "None, an int graph size, or a sequence of graph sizes")
    sizes = [pad_to] if isinstance(pad_to, int) else (pad_to or [])
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 or s > MAX_POSITION for s in sizes):
        fail(NAME, "pad_to", pad_to, f"graph sizes as ints in [1, MAX_POSITION={MAX_POSITION}]")
    if not isinstance(graph_mode, str) or graph_mode not in STEP_GRAPH_MODES:
        fail(NAME, "graph_mode", graph_mode, f"the step's CUDA-graph mode, one of {STEP_GRAPH_MODES}")
    check_int(NAME, "trim_threshold", trim_threshold, min_value=0, max_value=MAX_POSITION, why="MAX_POSITION")
    if num_tokens is not None:
        check_int(NAME, "num_tokens", num_tokens, min_value=int(qsl[-1]), max_value=MAX_POSITION,
                  why="MAX_POSITION; at least query_start_loc_host[-1]")


def reference(query_start_loc_host, is_prefilling, keeps_rows, W, *, pad_to=None, graph_mode="none",
              trim_threshold=TRIM_THRESHOLD, num_tokens=None) -> ReplayPlan | None:
    """``kept = q`` for requests that keep all rows (``keeps_rows``, e.g. prompt logprobs) and
    non-prefills, else ``min(q, W)``; ``trims = any(kept < q)``; ``dropped_before =
    query_start_loc - [0, cumsum(kept)]``. Returns None when nothing trims, and by the trim
    policy (SPEC §3.5) for a FULL-graph step (``graph_mode="full"``: the graph keeps the whole
    batch) and a step of fewer than ``trim_threshold`` tokens (``num_tokens``, the step's
    padded size, default ``query_start_loc_host[-1]``: such steps are launch-bound).
    ``trim_threshold=0`` trims every eager or PIECEWISE step that has something to trim.

    ``pad_to``: an int graph size (must be >= the kept rows) or a sequence of sizes (the
    smallest that fits; none fits: no padding).
    """
    qsl = _host_1d("query_start_loc_host", query_start_loc_host, int)
    prefilling = _host_1d("is_prefilling", is_prefilling, bool)
    keeps = _host_1d("keeps_rows", keeps_rows, bool)
    step_tokens = int(qsl[-1]) if num_tokens is None else num_tokens
    if graph_mode == "full" or step_tokens < trim_threshold:
        return None
    q = np.diff(qsl)
    kept = np.where(prefilling & ~keeps, np.minimum(q, W), q)
    trimmed = kept < q
    if not trimmed.any():
        return None
    n = int(kept.sum())
    if pad_to is None:
        n_pad = n
    elif isinstance(pad_to, int):
        if pad_to < n:
            fail(NAME, "pad_to", pad_to, f">= the {n} kept rows")
        n_pad = pad_to
    else:
        fits = [s for s in pad_to if s >= n]
        n_pad = min(fits) if fits else n
    return ReplayPlan.from_kept(kept, qsl, n_pad, W, is_prefilling=prefilling)


def plan_replay_batch(query_start_loc_host, is_prefilling, keeps_rows, W, *, pad_to=None, graph_mode="none",
                      trim_threshold=TRIM_THRESHOLD, num_tokens=None):
    """Host plan of the decoder-side sub-batch; None when nothing trims, for a FULL-graph
    step and for a step of fewer than ``trim_threshold`` tokens (SPEC §3.1, §3.5). The public
    op (``swa_backends.plan_replay_batch``): :func:`validate` while validation is on, then
    :func:`reference`."""
    kw = dict(pad_to=pad_to, graph_mode=graph_mode, trim_threshold=trim_threshold, num_tokens=num_tokens)
    if validation_enabled():
        validate(query_start_loc_host, is_prefilling, keeps_rows, W, **kw)
    return reference(query_start_loc_host, is_prefilling, keeps_rows, W, **kw)
