"""The CLI never prints a traceback: every user mistake -- each flag of ``info``, ``check`` and
``matrix`` with bad values, files that are missing, folders, devices, FIFOs, malformed YAML,
an ``--out`` onto a file -- is one line on stderr and exit status 2, in bounded time and memory.

The families run ``main(argv)`` in a worker that reports each case (tests/helpers/case_worker.py;
an exception escaping ``main`` is what would print a traceback), with accelerators hidden and
without ``TRITON_INTERPRET`` (as a user's shell starts). A few run as real ``python -m
swa_backends`` processes: the examples of the issue and the interpreter hint.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from case_worker import failed, over_bounds, run_cases

from swa_backends.cli import MAX_CASES, MAX_SEED, main

MAX_SECONDS = 5.0
MAX_RSS_GROWTH_MB = 200

_DIR: list[tempfile.TemporaryDirectory] = []  # made in the worker on first use, removed when it exits


def _tmp(name: str, content: str | bytes | None = None, *, fifo: bool = False) -> str:
    if not _DIR:
        _DIR.append(tempfile.TemporaryDirectory(prefix="swa-cli-families-"))
    path = os.path.join(_DIR[0].name, name)
    if fifo:
        if not os.path.exists(path):
            os.mkfifo(path)
    elif content is not None:
        with open(path, "wb") as fh:
            fh.write(content.encode() if isinstance(content, str) else content)
    return path


def _run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own exit (our parser writes one line first)
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _mistake(*argv, mentions: str):
    """``argv`` (strings, or callables giving one when the case runs) is a user mistake."""

    def case():
        args = [a() if callable(a) else a for a in argv]
        code, _, err = _run_main(args)
        lines = err.splitlines()
        assert code == 2, (code, err)
        assert len(lines) == 1 and lines[0].startswith("swa-backends: error: "), err
        assert len(lines[0]) <= 1600, lines[0][:200]
        assert "Traceback" not in err and mentions in lines[0], (mentions, lines[0])
        return lines[0]

    label = " ".join(a.__name__ if callable(a) else a for a in argv)
    return label[:120], case


def _jobs(content: str):
    def path():
        return _tmp(f"jobs-{abs(hash(content))}.json", content)

    path.__name__ = f"jobs:{content[:30]}"
    return path


def _file(name: str, content: str | bytes):
    def path():
        return _tmp(name, content)

    path.__name__ = name
    return path


def _named(name: str, fn):
    fn.__name__ = name
    return fn


MISSING = _named("missing.yaml", lambda: os.path.join(os.path.dirname(_tmp("x", "")), "missing.yaml"))
FOLDER = _named("a-folder", lambda: os.path.dirname(_tmp("x", "")))
FIFO = _named("a-fifo", lambda: _tmp("fifo.yaml", fifo=True))
A_FILE = _named("a-file", lambda: _tmp("existing.txt", "x"))
UNDER_A_FILE = _named("a-file/sub", lambda: os.path.join(_tmp("existing.txt", "x"), "sub"))
NO_DIR = _named("missing-dir/out.json", lambda: os.path.join(os.path.dirname(_tmp("x", "")), "no-such-dir", "out.json"))
BOMB = _file("bomb.yaml", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n")
LATIN1 = _file("latin1.yaml", "version: 1\nname: caf\u00e9\n".encode("latin-1"))
DEEP = _file("deep.yaml", "[" * 50_000 + "]" * 50_000)
KEY = _file("key.yaml", "? [a]\n: 1\n")
EMPTY_JOBS = '{"cases": 1, "seed": 0, "jobs": []}'


def cases():
    return [
        # top level
        _mistake(mentions="the following arguments are required: command"),
        _mistake("launch", mentions="invalid choice: 'launch'"),
        _mistake("--device", "cpu", mentions="invalid choice"),
        # info --device
        _mistake("info", "--device", "tpu:v5", mentions="device='tpu:v5'"),
        _mistake("info", "--device", "", mentions="device=''"),
        _mistake("info", "--device", "cuda:99999999999999999999", mentions="device='cuda:99999999999999999999'"),
        _mistake("info", "--device", "cuda:999", mentions="device='cuda:999'"),
        _mistake("info", "--device", "npu:x", mentions="device='npu:x'"),
        _mistake("info", "--device", "rocm:0", mentions="is a device index, not an arch"),
        _mistake("info", "--device", "cuda:sm9x", mentions="expected a CUDA arch"),
        _mistake("info", "--device", "cpu\x00", mentions="device="),
        _mistake("info", "--device", "x" * 10_000, mentions="device="),
        # info --config
        _mistake("info", "--config", mentions="expected at least one argument"),
        _mistake("info", "--config", "pcp=many", mentions="prefill_context_parallel_size='many'"),
        _mistake("info", "--config", "=", mentions="config: item='='"),
        _mistake("info", "--config", "nokey", mentions="config: item='nokey'"),
        _mistake("info", "--config", "window=-1", mentions="window=-1"),
        _mistake("info", "--config", "lora=maybe", mentions="lora='maybe'"),
        _mistake("info", "--config", "pcp=" + "9" * 5000, mentions="prefill_context_parallel_size="),
        _mistake("info", "--config", "drafter_aux_layers=a,b", mentions="drafter_aux_layers="),
        _mistake("info", "--config", "graph_mode=sideways", mentions="graph_mode"),
        _mistake("info", "--config", "pcp=2", "graph_mode=sideways", mentions="graph_mode"),
        _mistake("info", "--config", "pcp=2", "--config", "lora=maybe", mentions="lora='maybe'"),
        # info --prefer / --emulate / other flags
        _mistake("info", "--prefer", "warp-drive", mentions="prefer='warp-drive'"),
        _mistake("info", "--prefer", "", mentions="prefer=''"),
        _mistake("info", "--prefer", "triton", "--device", "cpu",
                 mentions="run: TRITON_INTERPRET=1 swa-backends info --prefer triton --device cpu"),
        _mistake("info", "--prefer", "gluon", "--device", "rocm:gfx942",
                 mentions="prefer='gluon' cannot run on rocm:gfx942"),
        _mistake("info", "--emulate", "--device", "cpu", mentions="--emulate: device=cpu"),
        _mistake("info", "--frobnicate", mentions="unrecognized arguments: --frobnicate"),
        _mistake("info", "--all=yes", mentions="ignored explicit argument 'yes'"),
        _mistake("info", "extra", mentions="unrecognized arguments: extra"),
        # check
        _mistake("check", "--cases", "0", mentions="--cases=0"),
        _mistake("check", "--cases", "-3", mentions="--cases=-3"),
        _mistake("check", "--cases", str(MAX_CASES + 1), mentions=f"--cases={MAX_CASES + 1}: expected an int in"),
        _mistake("check", "--cases", "9" * 30, mentions="--cases="),
        _mistake("check", "--cases", "x", mentions="argument --cases: invalid int value: 'x'"),
        _mistake("check", "--cases", "1e3", mentions="invalid int value"),
        _mistake("check", "--seed", "-1", mentions="--seed=-1"),
        _mistake("check", "--seed", str(MAX_SEED + 1), mentions=f"--seed={MAX_SEED + 1}"),
        _mistake("check", "--seed", "nan", mentions="invalid int value"),
        _mistake("check", "--device", "rocm:gfx942", mentions="fake devices"),
        _mistake("check", "--device", "cuda:999", mentions="cuda:999"),
        _mistake("check", "--prefer", "triton", mentions="run: TRITON_INTERPRET=1 swa-backends check --prefer triton"),
        _mistake("check", "--prefer", "gluon", mentions="prefer='gluon' cannot run on cpu"),
        _mistake("check", "--prefer", "warp-drive", mentions="prefer='warp-drive'"),
        _mistake("check", "--config", "pcp=2", mentions="unrecognized arguments: --config"),
        # matrix: the file
        _mistake("matrix", "--matrix", MISSING, mentions="cannot read it: No such file or directory"),
        _mistake("matrix", "--matrix", FOLDER, mentions="a directory: expected a matrix YAML file"),
        _mistake("matrix", "--matrix", "/dev/zero", mentions="/dev/zero: not a regular file"),
        _mistake("matrix", "--matrix", FIFO, mentions="not a regular file"),
        _mistake("matrix", "--matrix", "", mentions="matrix='': expected a path"),
        _mistake("matrix", "--matrix", BOMB, mentions="aliases and anchors are not allowed at line 1"),
        _mistake("matrix", "--matrix", LATIN1, mentions="line 2: byte 0xe9"),
        _mistake("matrix", "--matrix", DEEP, mentions="nested deeper than"),
        _mistake("matrix", "--matrix", KEY, mentions="a mapping key must be a plain scalar"),
        # matrix: the other flags
        _mistake("matrix", "--out", A_FILE, mentions="expected a directory (or a new one to create), got an existing file"),
        _mistake("matrix", "--out", UNDER_A_FILE, mentions="got a path under the file"),
        _mistake("matrix", "--out", "", mentions="--out='': expected a directory path"),
        _mistake("matrix", "--rows", "nope", mentions="matrix: rows='nope'"),
        _mistake("matrix", "--rows", ",", mentions="--rows=',': expected comma-separated names"),
        _mistake("matrix", "--ops", "nope", mentions="matrix: ops='nope'"),
        _mistake("matrix", "--ops", " , ", mentions="--ops=' , '"),
        _mistake("matrix", "--cases", "0", mentions="--cases=0"),
        _mistake("matrix", "--cases", str(MAX_CASES + 1), mentions=f"--cases={MAX_CASES + 1}"),
        _mistake("matrix", "--seed", "-5", mentions="--seed=-5"),
        _mistake("matrix", "--progress", "yes", mentions="unrecognized arguments: yes"),
        # matrix: the runner's own worker flags
        _mistake("matrix", "--worker", MISSING, mentions="expected --worker-out too"),
        _mistake("matrix", "--worker", MISSING, "--worker-out", NO_DIR, mentions="expected a jobs file"),
        _mistake("matrix", "--worker", _jobs("not json"), "--worker-out", NO_DIR, mentions="JSONDecodeError"),
        _mistake("matrix", "--worker", _jobs("[]"), "--worker-out", NO_DIR, mentions="expected a jobs file"),
        _mistake("matrix", "--worker", _jobs('{"cases": 1, "seed": 0, "jobs": [{"bogus": 1}]}'), "--worker-out",
                 NO_DIR, mentions="expected a jobs file"),
        _mistake("matrix", "--worker", _jobs(EMPTY_JOBS), "--worker-out", NO_DIR, mentions="No such file or directory"),
    ]


# ---------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------

#: a user's shell: no accelerator, Triton not told to interpret (pytest's conftest sets it)
ENV = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "CUDA_VISIBLE_DEVICES": "",
       "HIP_VISIBLE_DEVICES": "", "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def reports():
    return run_cases(__file__, env=ENV)


def test_every_mistake_is_one_line_and_exit_2(reports):
    assert not failed(reports), failed(reports)
    assert len(reports) == len(cases())


def test_every_mistake_is_bounded_in_time_and_memory(reports):
    assert not over_bounds(reports, seconds=MAX_SECONDS, rss_mb=MAX_RSS_GROWTH_MB)


def _processes(commands: dict[str, tuple[list[str], dict]]) -> dict[str, subprocess.CompletedProcess]:
    """Real ``python -m swa_backends`` processes, started together (each costs an import)."""
    procs = {k: (subprocess.Popen([sys.executable, "-m", "swa_backends", *argv], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env), time.monotonic())
             for k, (argv, env) in commands.items()}
    done = {}
    for k, (p, t0) in procs.items():
        out, err = p.communicate(timeout=300)
        done[k] = (subprocess.CompletedProcess(p.args, p.returncode, out, err), time.monotonic() - t0)
    return done


def test_the_issues_examples_in_real_processes(tmp_path):
    existing = tmp_path / "report.json"
    existing.write_text("{}")
    runs = _processes({
        "missing matrix": (["matrix", "--matrix", str(tmp_path / "missing.yaml")], ENV),
        "out onto a file": (["matrix", "--out", str(existing)], ENV),
        "huge cuda index": (["info", "--device", "cuda:99999999999999999999"], ENV),
        "triton without the interpreter": (["check", "--prefer", "triton"], ENV),
        "the hint's command": (["info", "--prefer", "triton", "--device", "cpu", "--json"],
                               {**ENV, "TRITON_INTERPRET": "1"}),
    })
    for name, (proc, seconds) in runs.items():
        if name == "the hint's command":  # what the hint says to run does run
            assert proc.returncode == 0, proc.stderr
            assert set(json.loads(proc.stdout)["chosen"]["gather_rows"]) == {"triton"}
            continue
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (name, proc.stderr)
        assert lines[0].startswith("swa-backends: error: ") and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert seconds < 60, (name, seconds)  # an import and a refusal (the machine may be busy)
    assert "TRITON_INTERPRET=1 swa-backends check --prefer triton" in runs["triton without the interpreter"][0].stderr
    assert existing.read_text() == "{}"  # nothing was written over it
