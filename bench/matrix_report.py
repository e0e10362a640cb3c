"""The matrix report of this machine: ``python bench/matrix_report.py --out $OUT``.

Runs ``swa-backends matrix`` (every op of every matrix.yaml row against the torch reference:
this machine's device on hardware, every other row emulated in a CPU-only worker) and writes
``matrix_report.json`` / ``matrix_report.md`` to ``--out``; prints the table. Works from a
checkout with nothing installed (the repository root is the package). Exit status 1 on any
failing variant. Extra arguments go to ``swa-backends matrix`` (e.g. ``--cases 5``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


from _pack import load_pack as _import_pack  # noqa: E402  (one loader for every bench script)


def main(argv: list[str]) -> int:
    _import_pack()
    from swa_backends.cli import main as cli_main

    if "--out" not in argv:
        argv = [*argv, "--out", os.environ.get("OUT", "matrix_report")]
    return cli_main(["matrix", "--progress", *argv])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
