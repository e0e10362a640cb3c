"""The matrix report of this machine: ``python bench/matrix_report.py --out $OUT``.

Runs ``swa-backends matrix`` (every op of every matrix.yaml row against the torch reference:
this machine's device on hardware, every other row emulated in a CPU-only worker) and writes
``matrix_report.json`` / ``matrix_report.md`` to ``--out``; prints the table. Works from a
checkout with nothing installed (the repository root is the package). Exit status 1 on any
failing variant. Extra arguments go to ``swa-backends matrix`` (e.g. ``--cases 5``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _import_pack():
    """``import swa_backends`` from this checkout whatever its directory is called, unless an
    installed one is already importable."""
    try:
        import swa_backends

        return swa_backends
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location("swa_backends", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["swa_backends"] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    _import_pack()
    from swa_backends.cli import main as cli_main

    if "--out" not in argv:
        argv = [*argv, "--out", os.environ.get("OUT", "matrix_report")]
    return cli_main(["matrix", "--progress", *argv])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
