"""A small DeepSeek-V4.1-shaped attention stack that runs both replay sides through the pack.

``Stack`` (weights and per-layer math), ``PagedKV`` (two KV groups with block tables and a
prefix cache), ``Engine`` (admission with ``admit_prefix_hit``, chunked prefill, decode,
encoder- and decoder-side replay through ``swa_backends.select(device)``), and ``probe``
(instrumented reads and drift measures). Not part of the wheel; it imports the installed pack
(``pip install -e .``), through which it is also ``swa_backends.examples.dsv41_stack``
(``bench/bench_e2e.py`` imports it so). ``sb`` is ``swa_backends`` itself.
"""

import swa_backends as sb

from .cache import MAIN, SWA, PagedKV
from .engine import TRIM_MODES, AttnContext, Engine, Request, StepInfo
from .model import Stack, StackConfig

__all__ = ["MAIN", "SWA", "TRIM_MODES", "AttnContext", "Engine", "PagedKV", "Request", "Stack", "StackConfig",
           "StepInfo", "sb"]
