"""README's examples are files, and they run: each ``examples/*.py`` script in its own process
(the CPU reference here; whatever this process's device picks on a GPU), asserting what it
prints it shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


@pytest.mark.parametrize("script", [p for p in EXAMPLES if p.name != "__init__.py"], ids=lambda p: p.name)
def test_example_runs(script):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip(), "an example says what it shows"
