"""``swa-backends`` / ``python -m swa_backends``: the pack's report on this machine.

    swa-backends info  [--device D] [--prefer V] [--config k=v ...] [--all] [--emulate] [--json]
    swa-backends check [--device D] [--prefer V] [--cases N] [--seed S] [--json]
    swa-backends matrix [--rows ID,..] [--ops OP,..] [--cases N] [--seed S] [--out DIR] [--json]

``--device`` names a real device (``cpu``, ``cuda:0``, ``npu:0``) or a fake one
(``rocm:gfx942``, ``rocm:gfx950``, ``ascend:910b``, ``ascend:910_93``, ``cuda:sm90``...).
``info --emulate`` installs the device platform's contract doubles first
(``swa_backends.testing.emulation``): the report then shows what a deployment *with* the
vendor packages would pick -- labelled as emulated, never as a measurement.

Every user mistake (a bad flag value, a file that cannot be read or written, a malformed
matrix file, a variant that cannot run here) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from .common.config import ServingConfig
from .common.device import resolve_device
from .dispatch import explain, format_explanation, select
from .common.errors import MatrixError, SelectionError


#: Bounds of the counts the CLI takes: far above any useful run, far below one that never ends.
MAX_CASES = 10_000
MAX_SEED = 2**32 - 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, exit 2
        sys.stderr.write(f"swa-backends: error: {message} (see --help)\n")
        raise SystemExit(2)


def _known_devices() -> str:
    from .common.device import device_spec, known_archs

    return ", ".join(device_spec(p, a) for p, archs in known_archs().items() for a in archs)


def _matrix_rows() -> str:
    from .dispatch import load_matrix

    return ", ".join(load_matrix().rows)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="swa-backends", description="Kernels for DeepSeek-V4.1 SWA bounded replay: what runs here.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("--device", default=None,
                        help="a device here (cpu, cuda:0, npu:0; default: this process's accelerator, else cpu) or a "
                             f"fake one by its kind: {_known_devices()}")
    common.add_argument("--prefer", default=None, help="force a variant by name for every op that has it (e.g. triton)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    info = sub.add_parser(
        "info", parents=[common], help="device, replay decision with reasons, variant per op",
        description="What the pack picks for a device and a serving configuration: whether encoder and decoder "
                    "replay are on (with every reason), and which variant runs each op (per-call chains in order).")
    info.add_argument("--config", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                      help="ServingConfig fields (--config pcp=2 graph_mode=none lora=true); the flag may repeat")
    info.add_argument("--all", action="store_true", help="every variant of every op with its reasons")
    info.add_argument("--emulate", action="store_true",
                      help="install the platform's vendor contract doubles: show what a deployment with the vendor "
                           "packages would pick (emulated, not measured)")
    check = sub.add_parser(
        "check", parents=[common], help="run every op here against the reference on random batches",
        description="Run every op of the selected backend on a device present here against the CPU torch reference, "
                    "on random serving-like batches, and report pass/fail per op (exit 1 on a failure).")
    check.add_argument("--cases", type=int, default=20, help=f"random cases per op (default 20, at most {MAX_CASES})")
    check.add_argument("--seed", type=int, default=0, help=f"random seed, 0 to {MAX_SEED}")
    matrix = sub.add_parser(
        "matrix", help="conformance of every variant of every matrix.yaml row: real device or emulated",
        description="The conformance suite for every row of the capability matrix: on this machine's device where it "
                    "is one, emulated elsewhere (Triton's interpreter, contract doubles of the vendor packages).")
    matrix.add_argument("--rows", default=None, help=f"comma-separated rows (default: every row): {_matrix_rows()}")
    matrix.add_argument("--ops", default=None, help="comma-separated op names (default: every op)")
    matrix.add_argument("--cases", type=int, default=3,
                        help=f"random cases per op and variant (default 3, at most {MAX_CASES})")
    matrix.add_argument("--seed", type=int, default=0, help=f"random seed, 0 to {MAX_SEED}")
    matrix.add_argument("--matrix", default=None, metavar="PATH", help="a matrix YAML file instead of the shipped one")
    matrix.add_argument("--out", default=None, metavar="DIR", help="write matrix_report.json and matrix_report.md here")
    matrix.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    matrix.add_argument("--progress", dest="progress", action="store_true", default=None,
                        help="progress bar on stderr (default: when stderr is a terminal)")
    matrix.add_argument("--no-progress", dest="progress", action="store_false")
    matrix.add_argument("--in-process", action="store_true",
                        help="run emulated jobs in this process even when an accelerator is present")
    matrix.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    matrix.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    return p


def _colour_default() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


EMULATED_NOTE = ("vendor packages replaced by contract doubles (swa_backends.testing.emulation.{platform}), their probes "
                 "forced available: what a deployment with them would pick, not a measurement")


def emulated(device):
    """The context that installs ``device``'s platform contract doubles (pinned to it)."""
    from .common.platforms import get_platform, platforms
    from .testing.emulation import contract_doubles

    p = get_platform(device.platform)
    if p is None or p.emulation is None:
        having = [q.name for q in platforms().values() if q.emulation is not None]
        names = ", ".join(having[:-1]) + f" or {having[-1]}" if len(having) > 1 else "".join(having)
        raise ValueError(f"--emulate: device={device.platform}: expected a {names} device "
                         f"(the {p.label if p is not None else device.platform} has no vendor package to emulate)")
    return contract_doubles(device)


def _info(args) -> int:
    config = ServingConfig.from_strings(args.config)
    info = resolve_device(args.device)
    if args.emulate:
        with emulated(info):
            e = explain(info, config=config, prefer=args.prefer)
    else:
        e = explain(info, config=config, prefer=args.prefer)
    if args.json:
        data = e.as_dict()
        data["emulated"] = bool(args.emulate)
        if args.emulate:
            data["emulated_note"] = EMULATED_NOTE.format(platform=info.platform)
        print(json.dumps(data, indent=2, default=str))
    else:
        note = EMULATED_NOTE.format(platform=info.platform) if args.emulate else None
        print(format_explanation(e, full=args.all, emulated=note, colour=_colour_default()))
    return 0


def _bounded(flag: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise ValueError(f"{flag}={value}: expected an int in [{low}, {high}]")
    return value


def _check(args) -> int:
    from .testing.conformance import check_backend

    _bounded("--cases", args.cases, 1, MAX_CASES)
    _bounded("--seed", args.seed, 0, MAX_SEED)
    info = resolve_device(args.device)
    if not info.runnable:
        raise ValueError(f"--device={args.device}: expected a device present here (fake devices: use 'info')")
    backend = select(info, prefer=args.prefer)
    results = check_backend(backend, device=info.torch_device, seed=args.seed, cases=args.cases)
    if args.json:
        print(json.dumps({"device": str(info), "results": [r.__dict__ for r in results]}, indent=2))
    else:
        print(f"check on {info}: every op vs the CPU reference, {args.cases} random cases each (seed {args.seed})")
        for r in results:
            status = "pass" if r.ok else "FAIL"
            print(f"  {status}  {r.op:<24} {r.variant:<20} {r.passed}/{r.passed + r.failed}"
                  + (f"  first failure: {r.detail}" if r.detail else ""))
        bad = sum(not r.ok for r in results)
        print(f"{len(results) - bad}/{len(results)} ops pass")
    return 0 if all(r.ok for r in results) else 1


def _split(flag: str, value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [x.strip() for x in value.split(",") if x.strip()]
    if not items:  # an empty list would run nothing and report success
        raise ValueError(f"{flag}={value!r}: expected comma-separated names")
    return items


def _check_out_dir(path: str) -> None:
    """``--out``: a directory, or a path one can be made at (checked before the run, which
    may take minutes)."""
    if not path.strip():
        raise ValueError(f"--out={path!r}: expected a directory path")
    target = os.path.abspath(path)
    probe = target
    while not os.path.exists(probe):  # the nearest existing ancestor must be a writable directory
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        what = "an existing file" if probe == target else f"a path under the file {probe}"
        raise ValueError(f"--out={path}: expected a directory (or a new one to create), got {what}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"--out={path}: expected a directory this user can write ({probe} is not writable)")


def _worker(args, progress: bool) -> int:
    """The runner's own emulation worker (``--worker JOBS --worker-out RESULTS``, not for users)."""
    from .testing import matrix_runner

    if not args.worker_out:
        raise ValueError(f"--worker={args.worker}: expected --worker-out too (the runner starts workers itself)")
    try:
        return matrix_runner.run_worker(args.worker, args.worker_out, progress=progress)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"--worker={args.worker}: expected a jobs file written by the matrix runner "
                         f"({type(exc).__name__}: {exc})") from None
    except ImportError as exc:  # a module a job needs is missing here (planning skips those the runner knows)
        raise ValueError(f"--worker={args.worker}: {type(exc).__name__}: {exc}") from None


def _matrix(args) -> int:
    from .testing import matrix_runner

    progress = sys.stderr.isatty() if args.progress is None else args.progress
    if args.worker:
        return _worker(args, progress)
    _bounded("--cases", args.cases, 1, MAX_CASES)
    _bounded("--seed", args.seed, 0, MAX_SEED)
    if args.out is not None:
        _check_out_dir(args.out)
    report = matrix_runner.run_matrix(matrix=args.matrix, rows=_split("--rows", args.rows),
                                      ops=_split("--ops", args.ops), cases=args.cases, seed=args.seed, progress=progress,
                                      in_process=True if args.in_process else None)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.text())
    if args.out:
        paths = report.write(args.out)
        (sys.stderr if args.json else sys.stdout).write("reports: " + ", ".join(paths) + "\n")
    return report.exit_code


def _interpreter_hint(exc: SelectionError, argv: list[str]) -> str | None:
    """The exact command, when a forced Triton variant failed only for want of the
    interpreter: Triton fixes compiled or interpreted per process, when it decorates a kernel,
    so the CLI cannot switch it on for itself."""
    from .common.registry import probe

    why = probe("triton_interpreter")
    if why is None or "TRITON_INTERPRET" not in why or not any(why in r for rs in exc.reasons.values() for r in rs):
        return None
    return ("Triton kernels run on a CPU only in Triton's interpreter, chosen when the process starts; run: "
            "TRITON_INTERPRET=1 swa-backends " + shlex.join(argv))


def _one_line(text: str, limit: int = 1500) -> str:
    """A message on one line, cut where a value the user typed made it absurdly long."""
    line = "; ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return line if len(line) <= limit else line[:limit - 4] + " ..."


def main(argv: list[str] | None = None) -> int:
    """The CLI; every user mistake is one line on stderr and exit status 2 (1: a check failed)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    try:
        return {"info": _info, "check": _check, "matrix": _matrix}[args.command](args)
    except SelectionError as exc:
        message = _interpreter_hint(exc, argv) or _one_line(exc)
    except (ValueError, MatrixError) as exc:
        message = _one_line(exc)
    except OSError as exc:  # a file the user named (--out, --matrix) that cannot be written or read
        if isinstance(exc, BrokenPipeError):  # the reader went away (| head): nothing left to say
            # what is still buffered goes nowhere, not into a second error when Python flushes at exit
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):  # a stdout with no file descriptor (an embedding caller's)
                pass
            return 1
        message = _one_line(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
    except KeyboardInterrupt:
        sys.stderr.write("swa-backends: interrupted\n")
        return 130
    sys.stderr.write(f"swa-backends: error: {message}\n")
    return 2
