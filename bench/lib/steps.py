"""The serving-step shapes the metadata benchmarks time, one naming for all of them.

A step is ``<prefills>x<tokens>[K][+<decodes>d]``: ``8x4K+32d`` is 8 prefills of 4096 tokens
and 32 single-token decodes. Every benchmark builds its steps with window ``W`` 128, block size
``BS`` 64 and ``G`` 5 slot groups (0, 2 and 4 prefix-cacheable); every third prefill replays
from 896 after a 1024-token prefix hit.
"""

from __future__ import annotations

import re

W, BS, G = 128, 64, 5


def validation_cases(dev, smoke: bool = False):
    """``(op, args, kwargs)`` of every metadata op at the serving-sized step the validation
    benchmarks time (up to 64 requests, a long prefill, one seed per op; ``smoke``: small steps
    of up to 3 requests, a long prefill among them)."""
    import numpy as np

    from swa_backends.common.ops import OPS
    from swa_backends.common.ops._steps import random_batch
    from swa_backends.testing.conformance import case_for

    for k, op in enumerate(OPS):
        if op == "sparse_mla":
            continue
        rng = np.random.default_rng(k)
        # (smoke: a small step with a long prefill, so at least one request: a form declines a step of none)
        batch = (random_batch(rng, max_reqs=3, max_q=16, long_prefill=True) if smoke else
                 random_batch(rng, max_reqs=64, max_q=256, W=W, block_size=BS, num_groups=3, long_prefill=True))
        yield (op, *case_for(op, rng, dev, batch=batch, poison=False))

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
