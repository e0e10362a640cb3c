"""``swa_backends`` for the offline-compile scripts (``tests/aot_compile*.py``), which run as
standalone processes, possibly under another Python than the tests' (``SWA_EXTRA_TRITON_PYTHONS``)
where the pack is not installed: the installed package when there is one (unless
``SWA_AOT_FROM_CHECKOUT=1``), else this checkout loaded as ``swa_backends`` (the repository root
is the package). Scripts run as ``python tests/<name>.py``, which puts this folder on ``sys.path``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_pack():
    if "swa_backends" in sys.modules:
        return sys.modules["swa_backends"]
    try:
        if os.environ.get("SWA_AOT_FROM_CHECKOUT") == "1":  # this checkout even if another one is installed
            raise ImportError
        import swa_backends  # installed

        return swa_backends
    except ImportError:
        spec = importlib.util.spec_from_file_location("swa_backends", ROOT / "__init__.py",
                                                      submodule_search_locations=[str(ROOT)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["swa_backends"] = module
        spec.loader.exec_module(module)
        return module
