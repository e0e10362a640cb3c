"""``sparse_mla_cluster.py`` with each stream's next Q half prefetched into L2 (the kernel's flag
bit 0), as a module copy of its own for the ws kernel's tools."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sparse_mla_cluster as _base  # noqa: E402

wide_gathers = _base.wide_gathers


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None, **_unused):
    return _base.run(q, kv, indices, lens, sm_scale, d_v, sink, 1)
