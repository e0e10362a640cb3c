"""Reading the experiments' copies of a kernel module (bench/experiments/exp_ws_*.py) in tests."""

from __future__ import annotations

import ast


def function_source(text: str, name: str) -> str:
    """The source of top-level function ``name`` in module text ``text`` (to its last statement)."""
    tree = ast.parse(text)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(text, node)
