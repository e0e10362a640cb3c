"""The matrix report of this machine: ``python bench/matrix_report.py --out $OUT``.

Runs ``swa-backends matrix`` (every op of every matrix.yaml row against the torch reference:
this machine's device on hardware, every other row emulated in a CPU-only worker; the runner
is ``swa_backends.testing.matrix_runner``) and writes ``matrix_report.json`` /
``matrix_report.md`` to ``--out``; prints the table. Imports the installed pack
(``pip install -e .``; ``bench/gpu_env.sh`` on the GPU machine). Exit status 1 on any failing
variant. Extra arguments go to ``swa-backends matrix`` (e.g. ``--cases 5``).
"""

from __future__ import annotations

import os
import sys

from swa_backends.cli import main as cli_main


def main(argv: list[str]) -> int:
    if "--out" not in argv:
        argv = [*argv, "--out", os.environ.get("OUT", "matrix_report")]
    return cli_main(["matrix", "--progress", *argv])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
