"""``swa-backends matrix``: the conformance suite (every op vs the torch reference) for every
row of matrix.yaml, on the real device where this machine has it and *emulated* elsewhere.

For each row, each op and each variant the row lists for that op (dispatch order first),
one *job*:

``hardware``
    the row is this machine's device (the ``cpu`` row always is, an H200 makes
    ``cuda:sm90`` one): the variant runs on it, if it has no reasons not to;
``interpreter``
    a Triton variant (``emulated_on=("cpu",)``) runs in Triton's interpreter on the CPU;
``cpu``
    a variant that runs on any torch device (the reference) runs on CPU tensors for a row
    whose device is not here;
``doubles``
    a vendor wrapper runs on the CPU inside its platform's contract doubles (the module its
    ``Platform.emulation`` names, ``swa_backends.testing.emulation.<platform>``:
    ``contract_doubles()``, vendor modules replaced by torch functions with the vendor's
    documented contract, probes overridden); without that module the variant is *skipped*
    with the reason. The doubles do not stand in for Triton: a variant that requires it
    (the Gluon kernels), like an ``interpreter`` job, is skipped where it is not installed.

Emulated jobs run under a fake :class:`DeviceInfo` of the row (``fake_device``). A job
*passes* (hardware) or is *emulated* (emulation) when every generated case matches the
reference, *fails* when one does not or the variant crashes, and is *skipped* with a
reason when the variant cannot run here at all or rejects every generated case.

Processes: Triton fixes interpreted vs compiled per process (``TRITON_INTERPRET``, read
when a kernel is decorated). Interpreter and contract-double jobs run in a CPU-only worker
subprocess started with ``TRITON_INTERPRET=1`` (accelerators hidden; in a private folder of
the run, never the user's working directory, which ``-m`` would put first on its path), hardware
jobs in this process; a process already in interpreter mode on a CPU machine runs everything
itself. Emulated results of the same variant on the same inputs do not depend on the row, so
each is computed once and reported for every row listing it (``shared_with`` names the row that
ran it).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import inspect
import json
import os
import platform as _platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..common import registry
from ..common.device import DeviceInfo, current_device, detect, fake_device, parse_device
from ..common.matrix import Matrix, Row
from ..common.ops import OPS
from ..common.platforms import get_platform
from ..common.registry import Variant, probe
from ..common.validation import validation_enabled
from ..dispatch import all_variants, load_matrix, platform_input_check, priority
from .conformance import case_for, mismatch, run_op

MODES = ("hardware", "interpreter", "cpu", "doubles")
EMULATED_MODES = ("interpreter", "cpu", "doubles")
STATUSES = ("pass", "emulated", "fail", "skipped")
DEFAULT_CASES = 3



def short(op: str) -> str:
    """An op's column label in the terminal table (its ``OpSpec.short``; full names in JSON and Markdown)."""
    spec = OPS.get(op)
    return spec.short if spec is not None else op


@dataclass
class Job:
    """One variant of one op on one matrix row, and how it will run."""

    row: str
    platform: str
    arch: str
    op: str
    variant: str
    mode: str | None  # one of MODES, None when skipped up front
    reasons: list[str] = field(default_factory=list)
    verified: str = "not-run"  # what matrix.yaml claims for this variant on this row

    def key(self) -> tuple:
        """Jobs with the same key run the same code on the same inputs."""
        if self.mode in ("cpu", "interpreter"):
            return (self.op, self.variant, "cpu-process", self.mode)
        if self.mode == "hardware" and self.platform == "cpu":
            return (self.op, self.variant, "cpu-process", "cpu")
        return (self.op, self.variant, self.row, self.mode)


@dataclass
class Result:
    row: str
    op: str
    variant: str
    status: str  # STATUSES
    mode: str | None
    passed: int = 0
    failed: int = 0
    rejected: int = 0  # generated cases the variant declined (dtype / input check)
    detail: str = ""  # first failure, or why it was skipped
    reasons: list[str] = field(default_factory=list)
    verified: str = "not-run"
    elapsed_s: float = 0.0
    shared_with: str | None = None
    note: str = ""  # how the cases were chosen, when not the random ones


@dataclass
class Report:
    results: list[Result]
    rows: list[dict]
    ops: list[str]
    settings: dict
    host: dict

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    @property
    def exit_code(self) -> int:
        return 1 if self.counts["fail"] else 0

    def cell(self, row: str, op: str) -> str:
        """The table cell: ``FAIL`` if any variant failed; else ``pass`` when every variant
        that ran did so on hardware, ``emulated`` when every one ran emulated, ``pass+emu``
        for both; ``skipped`` when none could run."""
        rs = [r for r in self.results if r.row == row and r.op == op]
        if not rs:
            return "-"
        if any(r.status == "fail" for r in rs):
            return "FAIL"
        kinds = {r.status for r in rs if r.status in ("pass", "emulated")}
        if not kinds:
            return "skipped"
        return "pass+emu" if len(kinds) == 2 else kinds.pop()

    # -- renderings ---------------------------------------------------------------------

    def as_dict(self) -> dict:
        return {
            "version": 1,
            "host": self.host,
            "settings": self.settings,
            "summary": self.counts | {"exit_code": self.exit_code},
            "rows": [dict(r, cells={op: self.cell(r["id"], op) for op in self.ops}) for r in self.rows],
            "results": [asdict(r) for r in self.results],
        }

    def table(self) -> str:
        heads = ["row", "mode"] + [short(op) for op in self.ops]
        body = [[r["id"], r["mode"]] + [self.cell(r["id"], op) for op in self.ops] for r in self.rows]
        widths = [max(len(x[i]) for x in [heads, *body]) for i in range(len(heads))]
        lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip()]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in body]
        return "\n".join(lines)

    def notes(self, *, limit: int | None = None) -> list[str]:
        """One line per failed or skipped variant (failures first)."""
        out = []
        for status in ("fail", "skipped"):
            for r in self.results:
                if r.status == status:
                    out.append(f"{status.upper() if status == 'fail' else status}: {r.row} / {r.op} / {r.variant}: "
                               f"{r.detail}")
        return out if limit is None else out[:limit]

    def text(self) -> str:
        c = self.counts
        head = (f"matrix conformance on {self.host['device']} ({self.settings['cases']} case(s) per op and variant, "
                f"seed {self.settings['seed']})")
        lines = [head, "", self.table(), "",
                 "cells: pass = the row's variants matched the reference on this machine's hardware; emulated = they "
                 "matched under emulation (Triton interpreter / CPU / contract doubles); pass+emu = some of each; "
                 "FAIL = a variant differed or crashed; skipped = none could run here (reasons below)",
                 f"variants: {c['pass']} pass, {c['emulated']} emulated, {c['fail']} fail, {c['skipped']} skipped"]
        notes = self.notes()
        if notes:
            lines.append("")
            lines += notes
        return "\n".join(lines)

    def markdown(self) -> str:
        c = self.counts
        lines = [
            "# swa_backends matrix report", "",
            f"- device: {self.host['device']}",
            f"- host: {self.host['python']} / torch {self.host['torch']} / triton {self.host['triton']}"
            f" / {self.host['machine']}",
            f"- settings: {self.settings['cases']} case(s) per op and variant, seed {self.settings['seed']}, "
            f"{self.host['created']}",
            f"- variants: **{c['pass']} pass, {c['emulated']} emulated, {c['fail']} fail, {c['skipped']} skipped**",
            "",
            "| row | mode | " + " | ".join(self.ops) + " |",
            "|---|---|" + "---|" * len(self.ops),
        ]
        for r in self.rows:
            lines.append(f"| {r['id']} | {r['mode']} | " + " | ".join(self.cell(r["id"], op) for op in self.ops) + " |")
        lines += ["", "## Every variant", "",
                  "| row | op | variant | status | how | cases | matrix.yaml says | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in self.results:
            cases = f"{r.passed}/{r.passed + r.failed}" + (f" (+{r.rejected} declined)" if r.rejected else "")
            note = r.detail + (f" (run once, shared with {r.shared_with})" if r.shared_with else "")
            lines.append(f"| {r.row} | {r.op} | {r.variant} | {r.status} | {r.mode or '-'} | {cases} | "
                         f"{r.verified} | {note.replace('|', '/')} |")
        return "\n".join(lines) + "\n"

    def write(self, out_dir: str) -> tuple[str, str]:
        os.makedirs(out_dir, exist_ok=True)
        jpath = os.path.join(out_dir, "matrix_report.json")
        mpath = os.path.join(out_dir, "matrix_report.md")
        with open(jpath, "w", encoding="utf-8") as fh:
            json.dump(self.as_dict(), fh, indent=2)
        with open(mpath, "w", encoding="utf-8") as fh:
            fh.write(self.markdown())
        return jpath, mpath


# ---------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------


class Progress:
    """A one-line bar on stderr (``\\r``-redrawn on a terminal, one line per job otherwise)."""

    def __init__(self, total: int, enabled: bool, *, label: str = "", stream=None, tty: bool | None = None):
        self.total, self.done, self.enabled, self.label = total, 0, enabled and total > 0, label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.start = time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 24
        fill = int(width * self.done / self.total)
        bar = "#" * fill + "." * (width - fill)
        secs = time.monotonic() - self.start
        line = f"{self.label}[{bar}] {self.done}/{self.total} {secs:5.1f}s {what}"
        if self.tty:
            self.stream.write("\r" + line[:110].ljust(110))
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


# ---------------------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------------------


def real_device() -> DeviceInfo:
    """This process's accelerator (or the CPU), never a fake one."""
    from ..common.device import _detect_default

    return _detect_default()


def row_device(row: Row, real: DeviceInfo) -> DeviceInfo:
    if row.platform == "cpu":
        return detect("cpu")
    if (row.platform, row.arch) == (real.platform, real.arch):
        return real
    return parse_device(f"{row.platform}:{row.arch}")


def _variants_for(row: Row, op: str) -> list[str]:
    declared = all_variants().get(op, {})
    listed = [n for n in row.allowed(op) if n in declared]
    order = [n for n in priority(row.platform, op) if n in listed]
    return order + [n for n in listed if n not in order]


def emulation_module(platform: str):
    """The module of ``platform``'s contract doubles (``Platform.emulation``) or the reason it is not usable."""
    p = get_platform(platform)
    name = p.emulation if p is not None else None
    if name is None:
        return f"no contract doubles for {platform} (its platform declares none)"
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return f"no contract doubles for {platform} ({name} does not exist in this build)"
        return f"{name}: import failed: {type(exc).__name__}: {exc}"
    except Exception as exc:
        return f"{name}: import failed: {type(exc).__name__}: {exc}"
    if not callable(getattr(mod, "contract_doubles", None)):
        return f"{name} has no contract_doubles()"
    return mod


def plan(matrix: Matrix, *, rows: Sequence[str] | None = None, ops: Sequence[str] | None = None,
         real: DeviceInfo | None = None) -> tuple[list[Job], list[dict]]:
    """Every job of the run and the rows' summaries (id, platform, arch, name, mode)."""
    real = real or real_device()
    wanted_rows = list(matrix.rows) if rows is None else list(rows)
    for r in wanted_rows:
        if r not in matrix.rows:
            raise ValueError(f"matrix: rows={r!r}: expected row ids from {sorted(matrix.rows)}")
    wanted_ops = list(OPS) if ops is None else list(ops)
    for op in wanted_ops:
        if op not in OPS:
            raise ValueError(f"matrix: ops={op!r}: expected op names from {list(OPS)}")
    jobs: list[Job] = []
    summaries: list[dict] = []
    emu_cache: dict[str, object] = {}
    for rid in wanted_rows:
        row = matrix.rows[rid]
        dev = row_device(row, real)
        summaries.append({"id": rid, "platform": row.platform, "arch": row.arch, "name": row.name,
                          "mode": "hardware" if dev.runnable else "emulated", "device": str(dev)})
        for op in wanted_ops:
            for name in _variants_for(row, op):
                v = all_variants()[op][name]
                job = Job(rid, row.platform, row.arch, op, name, None, verified=row.status(name))
                job.mode, job.reasons = _mode(v, dev, emu_cache)
                jobs.append(job)
    return jobs, summaries


def _interpreter_reason() -> str | None:
    """Interpreter jobs run in a worker started with TRITON_INTERPRET=1: they need Triton only."""
    return registry.import_reason("triton", attr="jit", what="Triton (interpreter)")


def _triton_reason() -> str | None:
    """Contract-double jobs of a variant that requires Triton (the Gluon kernels) import the real
    one: the doubles answer the ``triton`` probe as a deployment would, so that the emulated
    chain does not depend on this machine, but they stand in for vendor packages, not Triton."""
    return registry.import_reason("triton", attr="jit", what="Triton")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _mode(v: Variant, dev: DeviceInfo, emu_cache: dict) -> tuple[str | None, list[str]]:
    if dev.runnable and dev.platform not in v.emulated_on:
        reasons = v.not_supported_reasons(dev)
        return (None, reasons) if reasons else ("hardware", [])
    if dev.runnable:  # a Triton variant on the CPU row
        why = _interpreter_reason()
        return (None, [why]) if why else ("interpreter", [])
    declared = v.declared_reasons(dev)
    if declared:
        return None, declared
    if v.runs_on("cpu"):
        return "cpu", []
    if "cpu" in v.emulated_on:
        why = _interpreter_reason()
        return (None, [why]) if why else ("interpreter", [])
    mod = emu_cache.setdefault(dev.platform, emulation_module(dev.platform))
    if isinstance(mod, str):
        return None, [mod]
    if "triton" in v.requires:
        why = _triton_reason()
        if why:
            return None, [why]
    return "doubles", []


# ---------------------------------------------------------------------------------------
# execution
# ---------------------------------------------------------------------------------------


def _cases(op: str, seed: int, cases: int) -> Iterable[tuple[tuple, dict]]:
    """The same inputs for every row and variant of ``op`` (half with poisoned out=)."""
    rng = np.random.default_rng([seed, list(OPS).index(op)])
    for i in range(cases):
        yield case_for(op, rng, "cpu", poison=bool(i % 2))


# Serving shapes for vendor kernels whose per-call checks decline the small random cases
# (the vendors' interfaces: FlashMLA/FlashInfer/NPU take D_qk = d_v = 512 in bf16, power-of-two heads,
# index widths multiples of 128 / 128 + 4k; AITER's OPUS prefill serves >= 1024 queries).
# Tried in order, only for a variant that declined every random case.
SERVING_SHAPES: dict[str, tuple[dict, ...]] = {
    "sparse_mla": (
        dict(T=8, H=16, D=512, d_v=512, K=128, S=512, dtype=torch.bfloat16),
        dict(T=1024, H=4, D=512, d_v=512, K=128, S=256, dtype=torch.bfloat16),
    ),
}


def _serving_cases(op: str, seed: int, cases: int) -> Iterable[tuple[str, list[tuple[tuple, dict]]]]:
    from .conformance import sparse_mla_case

    for k, shape in enumerate(SERVING_SHAPES.get(op, ())):
        rng = np.random.default_rng([seed, list(OPS).index(op), 1000 + k])
        label = ", ".join(f"{a}={v}" for a, v in shape.items() if a != "dtype") + f", {str(shape['dtype'])[6:]}"
        yield label, [sparse_mla_case(rng, "cpu", **shape) for _ in range(cases)]


def _run_job(job: Job, *, cases: int, seed: int, real: DeviceInfo) -> Result:
    v = all_variants()[job.op][job.variant]
    spec = OPS[job.op]
    res = Result(job.row, job.op, job.variant, "skipped", job.mode, verified=job.verified)
    t0 = time.perf_counter()
    row_dev = real if job.mode == "hardware" and job.platform != "cpu" else (
        detect("cpu") if job.platform == "cpu" else parse_device(f"{job.platform}:{job.arch}"))
    if job.mode == "hardware":
        load_dev, tensors_on = row_dev, row_dev.torch_device
    elif job.mode == "doubles":
        load_dev, tensors_on = row_dev, "cpu"
    else:  # interpreter, cpu: the variant is loaded for the CPU
        load_dev, tensors_on = detect("cpu"), "cpu"
    scope = contextlib.nullcontext() if job.mode == "hardware" else fake_device(row_dev)
    with scope:
        if job.mode in ("doubles", "interpreter"):
            # probes (vendor packages, the interpreter) are answered inside the doubles
            why = v.not_supported_reasons(load_dev)
            if why:
                res.detail, res.reasons = "; ".join(why), why
                res.elapsed_s = time.perf_counter() - t0
                return res
        try:
            fn = v.load()
        except Exception as exc:
            res.status, res.failed = "fail", 1
            res.detail = f"could not load {v.impl}: {type(exc).__name__}: {exc}"
            res.elapsed_s = time.perf_counter() - t0
            return res

        # the op's validation, plus the platform's own input check where it has one
        # (what Backend runs on that device)
        path = platform_input_check(row_dev.platform, job.op)
        platform_check = registry.load_attr(path) if path else None

        def call(*args, **kwargs):
            if validation_enabled():
                spec.validate(*args, **kwargs)
                if platform_check is not None:
                    platform_check(row_dev, *args, **kwargs)
            return fn(*args, **kwargs)

        def run(batch) -> str:
            """Run the accepted cases of ``batch``; the first decline reason, if any."""
            declined = ""
            for args, kwargs in batch:
                if v.per_call:
                    why = v.input_reasons(args, kwargs)
                    if why:
                        res.rejected += 1
                        declined = declined or "; ".join(why)
                        continue
                try:
                    got, want = run_op(job.op, call, args, kwargs, tensors_on)
                    bad = mismatch(job.op, got, want)
                except Exception as exc:  # a crash is a failure with its message
                    bad = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                if bad:
                    res.failed += 1
                    res.detail = res.detail or bad
                else:
                    res.passed += 1
            return declined

        declined = run(_cases(job.op, seed, cases))
        if v.per_call and not res.passed and not res.failed:
            # the variant serves only production shapes: try those (recorded in the note)
            for label, batch in _serving_cases(job.op, seed, cases):
                run(batch)
                if res.passed or res.failed:
                    res.note = f"random cases declined ({declined}); ran serving-shaped cases ({label})"
                    break
        if tensors_on != "cpu" and torch.cuda.is_available():
            torch.cuda.synchronize()
    if res.failed:
        res.status = "fail"
    elif res.passed:
        res.status = "pass" if job.mode == "hardware" else "emulated"
    else:
        res.detail = f"declined every generated case ({declined})"
    if res.note and res.status != "skipped":
        res.detail = f"{res.detail}; {res.note}" if res.detail else res.note
    res.elapsed_s = time.perf_counter() - t0
    return res


def _doubles(device: DeviceInfo):
    """The platform's ``contract_doubles()``, pinned to the row's device when it takes one
    (arch-specific failure modes, e.g. OPUS only on gfx950)."""
    mod = emulation_module(device.platform)
    if isinstance(mod, str):  # planning already skipped these jobs
        return contextlib.nullcontext()
    try:
        takes_device = bool(inspect.signature(mod.contract_doubles).parameters)
    except (TypeError, ValueError):
        takes_device = False
    return mod.contract_doubles(device) if takes_device else mod.contract_doubles()


def execute(jobs: Sequence[Job], *, cases: int, seed: int, progress: Progress,
            real: DeviceInfo | None = None) -> list[Result]:
    """Run ``jobs`` in this process (results in job order)."""
    real = real or real_device()
    done: dict[tuple, Result] = {}
    results: list[Result | None] = [None] * len(jobs)
    # a row's contract doubles are installed once, around that row's vendor jobs
    groups: dict[str | None, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(job.row if job.mode == "doubles" else None, []).append(i)
    for rid, idxs in groups.items():
        scope = contextlib.nullcontext() if rid is None else _doubles(parse_device(f"{jobs[idxs[0]].platform}:"
                                                                                   f"{jobs[idxs[0]].arch}"))
        with scope:
            for i in idxs:
                job = jobs[i]
                if job.mode is None:
                    results[i] = Result(job.row, job.op, job.variant, "skipped", None, detail="; ".join(job.reasons),
                                        reasons=list(job.reasons), verified=job.verified)
                else:
                    first = done.get(job.key())
                    if first is None:
                        results[i] = done[job.key()] = _run_job(job, cases=cases, seed=seed, real=real)
                    else:
                        status = first.status
                        if status == "pass" and job.mode != "hardware":
                            status = "emulated"
                        elif status == "emulated" and job.mode == "hardware":
                            status = "pass"
                        results[i] = Result(job.row, job.op, job.variant, status, job.mode, first.passed,
                                            first.failed, first.rejected, first.detail, list(first.reasons),
                                            job.verified, 0.0, shared_with=first.row, note=first.note)
                progress.step(f"{job.row} {job.op}/{job.variant}: {results[i].status}")
    return [r for r in results if r is not None]


_HIDE_ACCELERATORS = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": "",
                      "ASCEND_RT_VISIBLE_DEVICES": ""}


def _worker_env() -> dict[str, str]:
    """The worker's environment: this one, accelerators hidden, Triton interpreting, and each
    ``PYTHONPATH`` entry made absolute. Python reads a relative entry (an empty one too)
    against the working directory, and the worker's is not this process's (below): absolute,
    each names in the worker what it names here, so the pack and anything the user put on
    ``PYTHONPATH`` still resolve. When this process took the pack from its working directory
    (``python -m swa_backends`` beside a checkout folder of that name), that folder leads the
    worker's path: the user ran the code there already, and the worker must run the same pack."""
    env = dict(os.environ, **_HIDE_ACCELERATORS, TRITON_INTERPRET="1")
    entries = [os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep)] if env.get("PYTHONPATH") else []
    pack = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder of this pack
    here = os.getcwd()
    found_here = os.path.basename(pack) == "swa_backends" and os.path.dirname(pack) == here and any(
        os.path.abspath(p or ".") == here for p in sys.path)
    if found_here and here not in entries:
        entries.insert(0, here)
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def _execute_in_worker(jobs: Sequence[Job], *, cases: int, seed: int, progress: bool) -> list[Result]:
    """Run ``jobs`` in a CPU-only subprocess (its own Triton mode, its own doubles)."""
    with tempfile.TemporaryDirectory(prefix="swa-matrix-") as tmp:
        tmp = os.path.abspath(tmp)
        jobs_path = os.path.join(tmp, "jobs.json")
        out_path = os.path.join(tmp, "results.json")
        with open(jobs_path, "w", encoding="utf-8") as fh:
            json.dump({"cases": cases, "seed": seed, "jobs": [asdict(j) for j in jobs]}, fh)
        cmd = [sys.executable, "-m", "swa_backends", "matrix", "--worker", jobs_path, "--worker-out", out_path,
               "--progress" if progress else "--no-progress"]
        # `-m` puts the working directory first on the worker's sys.path, and the user's may be
        # anyone's (/tmp, a shared folder): a triton/ or swa_backends/ planted there would run in
        # the worker. It runs in this run's own folder instead (mkdtemp: mode 0700, this user's),
        # which holds nothing but the jobs file. (-P / PYTHONSAFEPATH would do it from Python
        # 3.11 on; the pack supports 3.10.)
        proc = subprocess.run(cmd, env=_worker_env(), cwd=tmp, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0 or not os.path.exists(out_path):
            detail = f"emulation worker exited {proc.returncode}: {proc.stdout.strip()[-500:]}"
            return [Result(j.row, j.op, j.variant, "fail", j.mode, failed=1, detail=detail, verified=j.verified)
                    for j in jobs]
        with open(out_path, encoding="utf-8") as fh:
            return [Result(**r) for r in json.load(fh)]


def run_worker(jobs_path: str, out_path: str, *, progress: bool) -> int:
    """The worker side of :func:`_execute_in_worker`."""
    # Triton is optional (a plain `pip install .` has none): planning skipped the jobs that need
    # it, and the contract doubles' jobs run without it
    if registry.import_reason("triton", attr="jit") is None:
        from .interpreter import scalar_index_compat

        scalar_index_compat()
    with open(jobs_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    jobs = [Job(**j) for j in spec["jobs"]]
    bar = Progress(len(jobs), progress, label="emulated ")
    results = execute(jobs, cases=spec["cases"], seed=spec["seed"], progress=bar)
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump([asdict(r) for r in results], fh)
    return 0


def _host(real: DeviceInfo) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - reported, not needed
        triton_version = "not installed"
    return {"device": str(real), "torch": torch.__version__, "triton": triton_version,
            "python": f"Python {_platform.python_version()}", "machine": f"{_platform.system()} {_platform.machine()}",
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def run_matrix(*, matrix: Matrix | str | None = None, rows: Sequence[str] | None = None,
               ops: Sequence[str] | None = None, cases: int = DEFAULT_CASES, seed: int = 0,
               progress: bool = False, in_process: bool | None = None) -> Report:
    """Plan and run the whole matrix; see the module docstring. ``in_process``: force one
    process (default: a worker for emulated jobs unless this process already interprets
    Triton kernels on a CPU machine)."""
    if not isinstance(cases, int) or cases < 1:
        raise ValueError(f"matrix: cases={cases!r}: expected an int >= 1")
    if matrix is None or isinstance(matrix, str):
        matrix = load_matrix(matrix)
    real = real_device()
    if current_device().fake:
        raise ValueError("matrix: a fake device is installed (fake_device); the runner emulates rows itself")
    jobs, summaries = plan(matrix, rows=rows, ops=ops, real=real)
    if in_process is None:  # emulated jobs need the interpreter mode, fixed per process
        in_process = real.platform == "cpu" and _interpreting()
    local = [i for i, j in enumerate(jobs) if in_process or j.mode not in ("interpreter", "doubles")]
    remote = [i for i in range(len(jobs)) if i not in set(local)]
    bar = Progress(len(local), progress, label="" if in_process else "hardware ")
    results: list[Result | None] = [None] * len(jobs)
    for i, r in zip(local, execute([jobs[i] for i in local], cases=cases, seed=seed, progress=bar, real=real)):
        results[i] = r
    if remote:
        for i, r in zip(remote, _execute_in_worker([jobs[i] for i in remote], cases=cases, seed=seed,
                                                   progress=progress)):
            results[i] = r
    settings = {"cases": cases, "seed": seed, "matrix": matrix.source, "in_process": in_process,
                "rows": [s["id"] for s in summaries], "ops": list(ops) if ops else list(OPS)}
    return Report([r for r in results if r is not None], summaries, settings["ops"], settings, _host(real))
