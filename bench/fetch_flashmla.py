"""Carry vLLM's bundled FlashMLA to a machine without vLLM (the GPU machine has no registry
and a torch that vLLM's wheel does not pin): extract the compiled extension and its Python
interface from the pinned vLLM wheel into an ignored folder, as a minimal ``vllm`` package::

    python bench/fetch_flashmla.py                      # downloads vllm==0.33.0 (336 MB) once
    python bench/fetch_flashmla.py --wheel path/to/vllm-0.33.0-*.whl
    # then, wherever it runs: PYTHONPATH=.flashmla:$PYTHONPATH (the device tool: carry .flashmla)

What lands in ``.flashmla/vllm/``: ``_flashmla_C.abi3.so`` (3.8 MB, built on torch's stable C
ABI, so it loads on the GPU machine's torch 2.11), ``third_party/flashmla/__init__.py`` and
``flash_mla_interface.py``, and empty ``__init__.py`` files that make them importable as
``vllm.third_party.flashmla.flash_mla_interface`` (where the pack's probe looks). Nothing is
committed: ``.flashmla/`` is in ``.gitignore``. Do not install this folder beside a real vLLM.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VLLM = "vllm==0.33.0"
MEMBERS = ("vllm/_flashmla_C.abi3.so", "vllm/third_party/flashmla/__init__.py",
           "vllm/third_party/flashmla/flash_mla_interface.py")
MARKER = '"""A minimal vllm package: FlashMLA extracted by swa_backends bench/fetch_flashmla.py (not vLLM)."""\n'


def _download(dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", VLLM, "-d",
                    str(dest)], check=True)
    return next(dest.glob("vllm-*.whl"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", type=Path, default=None, help=f"a {VLLM} wheel (default: pip download it)")
    p.add_argument("--dest", type=Path, default=Path(__file__).resolve().parents[1] / ".flashmla")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or _download(Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            missing = [m for m in MEMBERS if m not in names]
            if missing:
                raise SystemExit(f"fetch_flashmla: {wheel.name} lacks {missing}")
            for member in MEMBERS:
                target = args.dest / member
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(member))
                print(f"{member}  sha256 {hashlib.sha256(target.read_bytes()).hexdigest()[:16]}  "
                      f"{target.stat().st_size} B")
    for pkg in ("vllm", "vllm/third_party"):
        (args.dest / pkg / "__init__.py").write_text(MARKER)
    print(f"FlashMLA from {wheel.name} in {args.dest}: put it on PYTHONPATH (PYTHONPATH={args.dest}:$PYTHONPATH)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
