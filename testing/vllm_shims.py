"""The vLLM integration's shims with no vLLM behind them, routed to a backend: what vLLM's call
sites cost through the pack, timed on a machine without vLLM (``bench/bench_replay_step.py``).

The shims are the patches' own classes (the release's ``patches`` module,
``integrations/vllm/v0_33/patches.py``: the installed vLLM's release, else the newest
supported), called exactly as vLLM's call sites call the globals they replace; their originals
raise, so a call the pack does not take fails loudly instead of running nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..integrations.vllm import current_release, patches

#: the replay-metadata call sites of the model state and the sparse-SWA builders
NAMES = ("pad_replayed_slots", "swa_indices_and_lens", "prefill_gather_lens")


class _NoOriginal:
    """Stands where vLLM's kernel would be."""

    def _missing(self, *args, **kwargs):
        raise RuntimeError("vLLM's kernel is not here: the pack did not take this call")

    __call__ = __getitem__ = _missing


@contextmanager
def routed_shims(backend_for: Callable) -> Iterator[dict]:
    """``{name: shim}`` of :data:`NAMES`, their routes sent to ``backend_for`` (device ->
    Backend) for the ``with`` block; the routes are put back after."""
    classes = {p.name: p.shim for p in current_release().patches.PATCHES if p.name in NAMES}
    saved = {name: patches._routes.get(name) for name in NAMES}
    try:
        for name in NAMES:
            patches._routes[name] = backend_for
        yield {name: classes[name](_NoOriginal()) for name in NAMES}
    finally:
        patches._routes.update(saved)
