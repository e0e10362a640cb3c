"""The serving-step shapes the metadata benchmarks time, one naming for all of them.

A step is ``<prefills>x<tokens>[K][+<decodes>d]``: ``8x4K+32d`` is 8 prefills of 4096 tokens
and 32 single-token decodes. Every benchmark builds its steps with window ``W`` 128, block size
``BS`` 64 and ``G`` 5 slot groups (0, 2 and 4 prefix-cacheable); every third prefill replays
from 896 after a 1024-token prefix hit.
"""

from __future__ import annotations

import re

W, BS, G = 128, 64, 5

#: the five steps of ``bench_triton_ops.py`` and ``bench_replay_step.py``: (prefills, tokens, decodes)
STEPS = {
    "1x1K": (1, 1024, 0),
    "1x16K": (1, 16384, 0),
    "8x4K+32d": (8, 4096, 32),
    "32x4K+128d": (32, 4096, 128),
    "16x1K+240d": (16, 1024, 240),
}


def step_shape(name: str) -> tuple[int, int, int]:
    """``(prefills, tokens per prefill, decodes)`` of a step named as above."""
    m = re.fullmatch(r"(\d+)x(\d+)(K?)(?:\+(\d+)d)?", name)
    if m is None:
        raise ValueError(f"step {name!r}: expected <prefills>x<tokens>[K][+<decodes>d], e.g. 8x4K+32d")
    return int(m[1]), int(m[2]) * (1024 if m[3] else 1), int(m[4] or 0)
