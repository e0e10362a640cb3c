"""bench/lib, the benchmarks' one timing library, without a GPU: what each timing method calls
(smoke mode: one call per callable, no loops; off smoke: its warm-up, calls and rounds, rounds
interleaved with a rotating order and their settings made first), the interpreter switch of
``--smoke``, the result file and machine info, the step names; and the layout rule: no
benchmark or experiment imports another one, each imports the library."""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

from lib import results, smoke, steps, timing as tm  # noqa: E402

SCRIPTS = sorted(BENCH.glob("*.py")) + sorted((BENCH / "experiments").glob("*.py"))
TOOLS = {"fetch_flashmla.py", "matrix_report.py"}  # no timing: a download and the CLI's matrix report


class Counter:
    """A callable that counts its calls (and takes weak references, as functions do)."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


@pytest.fixture()
def smoke_mode():
    previous = tm.set_smoke(True)
    yield
    tm.set_smoke(previous)


@pytest.fixture()
def timing_mode():
    previous = tm.set_smoke(False)
    yield
    tm.set_smoke(previous)


def test_smoke_mode_calls_each_callable_once(smoke_mode):
    f, g = Counter(), Counter()
    measures = [tm.gpu_us(f), tm.gpu_us(f, flush=False, calls=500), tm.gpu_pair(f)["gpu_us_warm"],
                tm.event_ms(f, reps=9) * 1e3, tm.host_us(f, calls=3000), tm.interleaved_ms({"f": f}, 9)["f"] * 1e3,
                tm.host_interleaved_us({"f": f, "g": g}, calls=300, rounds=7)["f"],
                tm.host_alternating_us({"f": f, "g": g}, calls=300, turn=25)["f"],
                tm.gpu_pair_rounds({"f": f}, rounds=5)["f"]["warm"]]
    if not torch.cuda.is_available():  # on a GPU smoke mode still captures (and replays) a one-call graph
        measures.append(tm.graph_us(f))
    assert f.calls == 1 and g.calls == 1  # every later measurement of f reuses its one call
    assert all(m > 0 for m in measures) and len(set(measures)) == 1
    tm.settle_host(f, seconds=60)  # no settling in smoke mode
    assert f.calls == 1
    tm.set_smoke(True)  # a new run forgets the times
    tm.host_us(f)
    assert f.calls == 2


def test_host_alternating_takes_turns(timing_mode):
    """Each callable gets one untimed call, then its calls in turns (the last one short), the
    order starting at ``rotate``; every callable's time is its turns' sum per call."""
    order: list[str] = []
    fns = {k: (lambda k=k: order.append(k)) for k in "abc"}
    rounds: dict = {}
    got = tm.host_alternating_us(fns, calls=5, turn=2, per_round=rounds, rotate=1)
    assert order == ["b", "c", "a"] + ["b"] * 2 + ["c"] * 2 + ["a"] * 2 + ["b"] * 2 + ["c"] * 2 + ["a"] * 2 \
        + ["b", "c", "a"]
    assert list(got) == ["a", "b", "c"] and all(v > 0 for v in got.values())
    assert rounds == {k: [v] for k, v in got.items()}


def test_host_timing_calls_warmup_calls_and_rounds(timing_mode):
    f = Counter()
    assert tm.host_us(f, calls=7, rounds=3) >= 0
    assert f.calls == 1 + 7 * 3  # one warm call, then the rounds
    if torch.cuda.is_available():
        pytest.skip("the device methods below time on the host only off a GPU")
    g = Counter()
    for measure in (tm.gpu_us, tm.graph_us, tm.event_ms):
        measure(g, **({"calls": 50} if measure is tm.gpu_us else {}))
    assert g.calls == 3  # off a GPU: one call on the host clock each


def test_host_interleaved_rotates_and_sets_first(timing_mode):
    order, settings = [], []

    def make(name):
        def fn():
            order.append((name, settings[-1] if settings else None))
        return fn

    fns = {k: make(k) for k in ("a", "b", "c")}
    per_round: dict = {}
    got = tm.host_interleaved_us(fns, calls=2, rounds=3, warm=1, per_round=per_round,
                                 before={k: (lambda k=k: settings.append(k)) for k in fns})
    assert set(got) == {"a", "b", "c"} and all(len(v) == 3 for v in per_round.values())
    timed_order = [name for name, _ in order[::3]]  # each timing: 1 warm call + 2 timed
    assert timed_order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(name == setting for name, setting in order)  # each callable runs under its own setting


def test_one_call_prepares_outside_the_timing(timing_mode):
    made = collections.Counter()

    def prepare(name):
        def make():
            made[name] += 1
            return lambda: None
        return make

    got = tm.one_call_us({"on": prepare("on"), "off": prepare("off")}, rounds=4)
    assert made == {"on": 4, "off": 4} and set(got["on"]) == {"host", "wall"}


def test_use_interpreter_only_for_smoke_on_a_cpu(monkeypatch):
    monkeypatch.setattr(smoke, "_has_gpu", lambda: False)
    env: dict = {}
    assert smoke.use_interpreter(["--out", "x"], env) is False and env == {}
    assert smoke.use_interpreter(["--out", "x", "--smoke"], env) is True and env == {"TRITON_INTERPRET": "1"}
    env = {"TRITON_INTERPRET": "0"}
    assert smoke.use_interpreter(["--smoke"], env) is False and env == {"TRITON_INTERPRET": "0"}  # never overridden
    assert "TRITON_INTERPRET is set to something other than 1" in smoke.refusal(True, environ=env)
    assert smoke.refusal(True, environ={"TRITON_INTERPRET": "1"}) is None
    assert "needs a CUDA GPU" in smoke.refusal(False)
    monkeypatch.setattr(smoke, "_has_gpu", lambda: True)
    assert smoke.use_interpreter(["--smoke"], {}) is False
    assert "CPU-only" in smoke.refusal(True) and smoke.refusal(True, cpu_only=False) is None
    assert smoke.refusal(False) is None


def test_run_script_puts_the_process_back(tmp_path, monkeypatch):
    from swa_backends.common.validation import validation_enabled

    script = tmp_path / "s.py"
    script.write_text("import os, sys, torch\n"
                      "from swa_backends.common.validation import set_validation\n"
                      "set_validation(False); torch.set_num_threads(1); os.environ['SWA_BENCH_T'] = sys.argv[1]\n"
                      "assert sys.path[0] == os.path.dirname(os.path.abspath(__file__))\n"
                      "raise SystemExit(int(sys.argv[1]))\n")
    monkeypatch.delenv("SWA_BENCH_T", raising=False)
    argv, path, threads, validated = list(sys.argv), list(sys.path), torch.get_num_threads(), validation_enabled()
    assert smoke.run_script(script, "3") == 3
    assert (sys.argv, sys.path, torch.get_num_threads(), validation_enabled()) == (argv, path, threads, validated)
    assert "SWA_BENCH_T" not in __import__("os").environ
    script.write_text("raise SystemExit('no GPU here')\n")
    assert smoke.run_script(script) == 1


def test_result_file_and_machine(tmp_path, monkeypatch):
    assert results.out_file(tmp_path / "d", "x.json") == tmp_path / "d" / "x.json" and (tmp_path / "d").is_dir()
    assert results.out_file(tmp_path / "e" / "y.json", "x.json") == tmp_path / "e" / "y.json"
    monkeypatch.setenv("SWA_COMMIT", "abc1234")
    m = results.machine(torch.device("cpu"))
    assert m["commit"] == "abc1234" and m["device"] == "cpu" and m["torch"] == torch.__version__
    assert {"date", "triton", "python", "capability", "sms"} <= set(m)
    assert results.file_sha(tmp_path / "missing") == "unknown"


def test_step_names():
    assert {name: steps.step_shape(name) for name in steps.STEPS} == steps.STEPS
    assert steps.step_shape("3x140+3d") == (3, 140, 3)
    with pytest.raises(ValueError, match=r"step '1x1Q': expected <prefills>x<tokens>\[K\]\[\+<decodes>d\]"):
        steps.step_shape("1x1Q")


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_benchmark_imports_another_and_each_uses_the_library():
    scripts = {p.stem for p in SCRIPTS}
    assert {"bench_sparse_mla", "bench_triton_ops", "bench_replay_step", "bench_flashmla", "bench_e2e",
            "bench_validation"} <= scripts
    for path in SCRIPTS:
        imported = _imported_modules(path)
        assert not imported & scripts, f"{path.relative_to(ROOT)} imports {sorted(imported & scripts)}"
        if path.name not in TOOLS:
            assert "lib" in imported, f"{path.relative_to(ROOT)} does not use bench/lib"
    for path in (BENCH / "lib").glob("*.py"):
        assert not _imported_modules(path) & scripts, path.name


def test_gmean_is_the_geometric_mean_and_refuses_nothing_to_average():
    assert results.gmean([2.0, 8.0]) == pytest.approx(4.0)
    assert results.gmean(iter([0.97])) == pytest.approx(0.97)
    with pytest.raises(ValueError, match="values: empty"):
        results.gmean([])


def test_host_lead_times_each_callable_and_sleeps_for_the_slowest(monkeypatch):
    monkeypatch.setattr(tm, "one_call_us", lambda prepares, rounds: {
        n: {"host": {"fast": 50.0, "slow": 1000.0}[n], "wall": 0.0} for n in prepares})
    host, lead = tm.host_lead({"fast": lambda: None, "slow": lambda: None})
    assert host == {"fast": 50.0, "slow": 1000.0}
    assert lead == tm.lead_cycles_for(1000.0) == 4 * 1000 * tm.CYCLES_PER_US
    assert tm.host_lead({}) == ({}, tm.LEAD_CYCLES)


def test_host_lead_calls_each_callable(monkeypatch):
    counters = {"a": Counter(), "b": Counter()}
    previous = tm.set_smoke(True)
    try:
        host, lead = tm.host_lead(counters, rounds=3)
    finally:
        tm.set_smoke(previous)
    assert set(host) == {"a", "b"} and all(c.calls == 1 for c in counters.values()) and lead >= tm.LEAD_CYCLES
