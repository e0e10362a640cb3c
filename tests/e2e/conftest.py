"""The bench scripts' own folder on ``sys.path`` (before any test module of this folder is
imported): their library ``bench/lib`` is imported as ``lib``, as the scripts import it."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
