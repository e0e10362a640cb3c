"""Import this checkout as ``swa_backends`` for the bench scripts, whatever the repository's
folder is called (the repository root is the package), so a benchmark always measures the
code beside it. Scripts run as ``python bench/<name>.py``, which puts this folder on
``sys.path``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_pack():
    """``swa_backends`` from this checkout (the already-imported module if there is one)."""
    if "swa_backends" in sys.modules:
        return sys.modules["swa_backends"]
    spec = importlib.util.spec_from_file_location("swa_backends", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["swa_backends"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["swa_backends"]
        raise
    return module
