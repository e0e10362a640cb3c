"""tests/dispatch/fuzz_cases.py as a module, for test files outside tests/dispatch (pytest's
"prepend" import mode puts only a test file's own folder on sys.path)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def load(name: str):
    """The fuzz-case module, loaded under ``name`` (one name per importing test file)."""
    path = Path(__file__).resolve().parents[1] / "dispatch" / "fuzz_cases.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
