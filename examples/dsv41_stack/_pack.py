"""``swa_backends`` for the example stack: the installed package, else this checkout.

The H200 runs scripts from a bare copy of the repository whose folder need not be named
``swa_backends``, so a failed import loads the repository root as that package by path
(``__init__.py`` with the root as its search location; relative imports then resolve).
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys


def load_pack():
    try:
        import swa_backends
        return swa_backends
    except ImportError:
        pass
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("swa_backends", root / "__init__.py",
                                                  submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["swa_backends"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["swa_backends"]
        raise
    return module


sb = load_pack()
