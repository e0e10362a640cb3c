"""The fuzz suite: adversarial calls (tests/dispatch/fuzz_cases.py) on every public op and every
custom op, on the reference backend, the Triton kernels (the interpreter on a CPU, compiled
on a GPU) and the ``torch.ops.swa_backends`` custom ops.

Every case runs in a worker process that reports each finished case; a worker that dies
(a segfault, an abort) marks the case it was running as a crash and a new worker carries on
with the next one. So a crash is a failure of that case, never of the suite. The counts
(tried, clear errors, crashes, silent results, ...) are printed at the end of the pytest run
and quoted in README's reliability section.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _tritons import NO_TRITON

HERE = Path(__file__).resolve().parent
SEED = int(os.environ.get("SWA_FUZZ_SEED", "0"))
PER_OP = int(os.environ.get("SWA_FUZZ_CALLS_PER_OP", "2"))
FAILURES = ("crash", "unclear", "silent", "wrong", "disagree", "touched")
#: backend -> Counter of outcomes, for the terminal summary (conftest.py prints it)
RESULTS: dict[str, collections.Counter] = {}


def run_all(backend: str) -> list[dict]:
    """Every case of ``backend``, each line one case; crashed cases are synthesised."""
    rows: list[dict] = []
    start = 0
    while True:  # a worker reports "done" once it has run every case from ``start`` on
        proc = subprocess.run([sys.executable, str(HERE / "fuzz_cases.py"), backend, str(SEED), str(start), "1000000",
                               str(PER_OP)], capture_output=True, text=True, cwd=HERE, timeout=1800)
        lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        rows += [ln for ln in lines if "i" in ln]
        if any("done" in ln for ln in lines):
            return rows
        # the worker died inside the case after the last one it reported
        crashed = rows[-1]["i"] + 1 if rows and rows[-1]["i"] >= start else start
        rows.append({"i": crashed, "op": "?", "label": "?", "outcome": "crash",
                     "detail": f"worker exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"})
        start = crashed + 1


@pytest.mark.parametrize("backend", ["reference", "triton", "torch_ops"])
def test_fuzz(backend):
    if backend == "triton" and NO_TRITON is not None:
        pytest.skip(NO_TRITON)
    rows = run_all(backend)
    counts = collections.Counter(r["outcome"] for r in rows)
    RESULTS[backend] = counts
    assert rows, "no case ran"
    bad = [r for r in rows if r["outcome"] in FAILURES]
    report = "\n".join(f"{r['op']} {r['label']} (expect {r.get('expect')}): {r['outcome']}: {r['detail'][:200]}"
                       for r in bad[:30])
    assert not bad, f"{len(bad)} of {len(rows)} cases failed:\n{report}"


#: README's Reliability line, with the counts of the last run (pytest runs this after the runs above)
README_FUZZ = re.compile(
    r"reference (\d+) calls \((\d+) clear errors, (\d+) correct\), Triton \(interpreter\) (\d+) \((\d+) / (\d+)\), "
    r"custom ops (\d+) \((\d+) clear errors, (\d+) rejected by the op schema, (\d+) correct\)")


def test_readme_quotes_this_runs_counts():
    """README states the fuzz counts; they are this suite's (deterministic per seed and call
    count), so a change to the cases shows up here until README says it."""
    if set(RESULTS) != {"reference", "triton", "torch_ops"} or SEED != 0 or PER_OP != 2:
        pytest.skip("the three backends' default runs did not all run in this session")
    text = " ".join((HERE.parents[1] / "README.md").read_text().split())
    m = README_FUZZ.search(text)
    assert m, "README's Reliability section no longer states the fuzz counts in the expected form"
    r, t, c = RESULTS["reference"], RESULTS["triton"], RESULTS["torch_ops"]
    got = (sum(r.values()), r["clear"], r["ok"], sum(t.values()), t["clear"], t["ok"],
           sum(c.values()), c["clear"], c["schema"], c["ok"])
    assert tuple(int(x) for x in m.groups()) == got, f"README says {m.groups()}, this run {got}"
