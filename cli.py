"""``swa-backends`` / ``python -m swa_backends``: the pack's report on this machine.

    swa-backends info  [--device D] [--prefer V] [--config k=v ...] [--all] [--emulate] [--json]
    swa-backends check [--device D] [--prefer V] [--cases N] [--seed S] [--json]
    swa-backends matrix [--rows ID,..] [--ops OP,..] [--cases N] [--seed S] [--out DIR] [--json]

``--device`` names a real device (``cpu``, ``cuda:0``, ``npu:0``) or a fake one
(``rocm:gfx942``, ``rocm:gfx950``, ``ascend:910b``, ``ascend:910_93``, ``cuda:sm90``...).
``info --emulate`` installs the device platform's contract doubles first
(``swa_backends.testing.emulation``): the report then shows what a deployment *with* the
vendor packages would pick -- labelled as emulated, never as a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys

from .common.config import ServingConfig
from .common.device import resolve_device
from .dispatch import Explanation, explain, select
from .common.errors import MatrixError, SelectionError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, exit 2
        sys.stderr.write(f"swa-backends: error: {message} (see --help)\n")
        raise SystemExit(2)


def _known_devices() -> str:
    from .common.device import KNOWN_ARCHS, device_spec

    return ", ".join(device_spec(p, a) for p, archs in KNOWN_ARCHS.items() for a in archs)


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
    info.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                      help="a ServingConfig field (pcp=4, graph_mode=none, lora=true, ...); repeatable")
    info.add_argument("--all", action="store_true", help="every variant of every op with its reasons")
    info.add_argument("--emulate", action="store_true",
                      help="install the platform's vendor contract doubles: show what a deployment with the vendor "
                           "packages would pick (emulated, not measured)")
    check = sub.add_parser(
        "check", parents=[common], help="run every op here against the reference on random batches",
        description="Run every op of the selected backend on a device present here against the CPU torch reference, "
                    "on random serving-like batches, and report pass/fail per op (exit 1 on a failure).")
    check.add_argument("--cases", type=int, default=20, help="random cases per op (default 20)")
    check.add_argument("--seed", type=int, default=0)
    matrix = sub.add_parser(
        "matrix", help="conformance of every variant of every matrix.yaml row: real device or emulated",
        description="The conformance suite for every row of the capability matrix: on this machine's device where it "
                    "is one, emulated elsewhere (Triton's interpreter, contract doubles of the vendor packages).")
    matrix.add_argument("--rows", default=None, help=f"comma-separated rows (default: every row): {_matrix_rows()}")
    matrix.add_argument("--ops", default=None, help="comma-separated op names (default: every op)")
    matrix.add_argument("--cases", type=int, default=3, help="random cases per op and variant (default 3)")
    matrix.add_argument("--seed", type=int, default=0)
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


class _Style:
    """ANSI colour on a terminal (unless NO_COLOR is set), nothing when piped."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.enabled else text

    def on_off(self, enabled: bool) -> str:
        return self("ON", "1;32") if enabled else self("OFF", "1;31")


def _colour_default() -> bool:
    import os

    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _side(name: str, d, style: _Style) -> list[str]:
    lines = [f"{name}: {style.on_off(d.enabled)}"]
    lines += [f"    - {r}" for r in (d.reasons if not d.enabled else d.notes)]
    return lines


def _table(rows: list[tuple[str, ...]], style: _Style) -> list[str]:
    """Aligned columns (widths from the plain text; colour codes added after padding)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        cells = [x.ljust(w) for x, w in zip(r, widths)]
        if n == 0:
            cells = [style(c, "1") for c in cells]
        else:
            status = {"hardware": "32", "emulated": "33", "not-run": "2"}.get(r[2].strip())
            if status:
                cells[2] = style(cells[2], status)
        out.append("  ".join(cells).rstrip())
    return out


EMULATED_NOTE = ("vendor packages replaced by contract doubles (swa_backends.testing.emulation.{platform}), their probes "
                 "forced available: what a deployment with them would pick, not a measurement")


def format_explanation(e: Explanation, *, full: bool = False, emulated: bool = False, colour: bool = False) -> str:
    style = _Style(colour)
    caps = e.capabilities
    lines = [f"device:        {e.device}", f"matrix row:    {caps.row or '(none)'}"]
    if emulated:
        lines.append("emulated:      " + EMULATED_NOTE.format(platform=e.device.platform))
    if caps.fallback:
        lines.append(f"fallback:      {caps.fallback}")
    for problem in e.device.problems:
        lines.append(f"device note:   {problem}")
    lines += _side("encoder replay", caps.encoder_replay, style) + _side("decoder replay", caps.decoder_replay, style)
    lines.append("")
    rows = [("op", "variant", "verified", "graph-safe", "layout")]
    by = {(c.op, c.variant): c for c in e.table}
    for op, names in e.chosen.items():
        for i, name in enumerate(names):
            c = by[(op, name)]
            label = name if len(names) == 1 else f"{name} ({'per-call' if i < len(names) - 1 else 'else'})"
            rows.append((op if i == 0 else "", label, c.verified or "-", "yes" if c.graph_safe else "no", c.index_layout or "-"))
    lines += _table(rows, style)
    if full:
        lines.append("")
        lines.append("every variant:")
        for c in e.table:
            why = "; ".join(c.reasons) if c.reasons else "ok"
            if c.ahead:
                why += "; " + "; ".join(c.ahead)
            status = style(f"{c.status:<9}", {"chosen": "32", "per-call": "36", "rejected": "2"}.get(c.status, "0"))
            lines.append(f"  {c.op:<24} {c.variant:<18} {status} {why}")
    return "\n".join(lines)


def emulated(device):
    """The context that installs ``device``'s platform contract doubles (pinned to it)."""
    from .testing.emulation import contract_doubles

    if device.platform == "cpu":
        raise ValueError(f"--emulate: device={device.platform}: expected a cuda, rocm or ascend device "
                         "(the CPU has no vendor package to emulate)")
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
        print(format_explanation(e, full=args.all, emulated=args.emulate, colour=_colour_default()))
    return 0


def _check(args) -> int:
    from .testing.conformance import check_backend

    if args.cases < 1:
        raise ValueError(f"--cases={args.cases}: expected an int >= 1")
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


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [x.strip() for x in value.split(",") if x.strip()]


def _matrix(args) -> int:
    from .testing import matrix_runner

    progress = sys.stderr.isatty() if args.progress is None else args.progress
    if args.worker:
        return matrix_runner.run_worker(args.worker, args.worker_out, progress=progress)
    report = matrix_runner.run_matrix(matrix=args.matrix, rows=_split(args.rows), ops=_split(args.ops),
                                      cases=args.cases, seed=args.seed, progress=progress,
                                      in_process=True if args.in_process else None)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.text())
    if args.out:
        paths = report.write(args.out)
        (sys.stderr if args.json else sys.stdout).write("reports: " + ", ".join(paths) + "\n")
    return report.exit_code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"info": _info, "check": _check, "matrix": _matrix}[args.command](args)
    except (ValueError, SelectionError, MatrixError) as exc:
        sys.stderr.write(f"swa-backends: error: {str(exc).splitlines()[0]}\n")
        for extra in str(exc).splitlines()[1:]:
            sys.stderr.write(f"  {extra}\n")
        return 2
