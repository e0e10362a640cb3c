"""Install vllm==VERSION into the running interpreter's environment (CI's vLLM stage).

``pip install vllm==VERSION``, except for the exact pins of RELAXED: a release may pin a
dependency the package index CI uses does not hold (vLLM 0.34.0 pins flashinfer-python==0.7.3;
the index has 0.7.2.post1 and 0.7.4). So: the wheel alone (``--no-deps``), its requirements
(the ones without an extra) with those pins turned into lower bounds, then the wheel. On the CPU
the tests never run FlashInfer; every other requirement is the release's own.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: package -> why its exact pin is relaxed to a lower bound
RELAXED = {"flashinfer-python": "vLLM 0.34.0 pins 0.7.3, which the package index does not hold"}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], check=True)


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist: ") or "extra ==" in line:
            continue
        req = line[len("Requires-Dist: "):]
        name = re.split(r"[\s;=<>!~\[]", req, maxsplit=1)[0].lower()
        if name in RELAXED:
            req = re.sub(r"==", ">=", req, count=1)
        out.append(req)
    return out


def main(version: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}", "-d", tmp],
                       check=True)
        wheel = next(Path(tmp).glob("vllm-*.whl"))
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(requirements(wheel)) + "\n")
        pip("-r", str(reqs))
        pip("--no-deps", str(wheel))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
