"""Unified diffs of one file applied strictly, for kernel candidates kept as diffs against the file
they change (``bench/experiments/candidates/``): a candidate made for an older kernel is refused,
naming its hunk, instead of being timed as something else.

Strict: every hunk's context and removed lines must stand exactly at the line its header names
(no fuzz, no offset), hunks in order and apart; one file per diff."""

from __future__ import annotations

import re
from pathlib import Path

_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
ROOT = Path(__file__).resolve().parents[2]


def target(diff: str, *, name: str = "diff") -> str:
    """The repository path the diff changes (its ``+++`` line, a ``b/`` prefix dropped)."""
    paths = [ln[4:].split("\t")[0].strip() for ln in diff.splitlines() if ln.startswith("+++ ")]
    if len(paths) != 1:
        raise ValueError(f"{name}: names {len(paths)} files ({paths}); expected a diff of exactly one file")
    path = paths[0]
    return path[2:] if path.startswith("b/") else path


def _hunks(diff: str, name: str):
    """``(header line number, old start, old lines, new lines)`` per hunk."""
    hunks, cur = [], None
    for no, ln in enumerate(diff.splitlines(keepends=True), 1):
        m = _HUNK.match(ln)
        if m:
            old_n = 1 if m.group(2) is None else int(m.group(2))
            new_n = 1 if m.group(4) is None else int(m.group(4))
            cur = (no, int(m.group(1)), [], [], old_n, new_n)
            hunks.append(cur)
        elif cur is None or ln.startswith("\\"):  # the file header; "\ No newline at end of file"
            continue
        elif ln[:1] in (" ", "\n"):  # context (an empty context line may have lost its space)
            body = ln[1:] if ln[:1] == " " else ln
            cur[2].append(body)
            cur[3].append(body)
        elif ln[:1] == "-":
            cur[2].append(ln[1:])
        elif ln[:1] == "+":
            cur[3].append(ln[1:])
        else:
            raise ValueError(f"{name}: line {no} is {ln.rstrip()!r}; expected a hunk line (' ', '-', '+')")
    for no, _start, old, new, old_n, new_n in hunks:
        if (len(old), len(new)) != (old_n, new_n):
            raise ValueError(f"{name}: the hunk at line {no} has {len(old)} old / {len(new)} new lines; its "
                             f"header says {old_n} / {new_n}")
    if not hunks:
        raise ValueError(f"{name}: no hunk; expected a unified diff")
    return [(no, start, old, new) for no, start, old, new, _o, _n in hunks]


def apply(text: str, diff: str, *, name: str = "diff") -> str:
    """``text`` with ``diff`` applied; a ``ValueError`` naming the hunk where a line differs."""
    lines = text.splitlines(keepends=True)
    out, pos = [], 0
    for no, start, old, new in _hunks(diff, name):
        at = start - 1 if old else start  # a pure insertion's header names the line before it
        if at < pos:
            raise ValueError(f"{name}: the hunk at line {no} starts at line {start}, before the previous hunk's "
                             f"end (line {pos}); expected hunks in order and apart")
        got = lines[at:at + len(old)]
        if got != old:
            bad = next((i for i, (a, b) in enumerate(zip(got, old)) if a != b), min(len(got), len(old)))
            have = got[bad].rstrip("\n") if bad < len(got) else "(end of file)"
            raise ValueError(f"{name}: the hunk at line {no} does not apply: line {at + bad + 1} is {have!r}; "
                             f"expected {old[bad].rstrip(chr(10))!r}")
        out += lines[pos:at] + new
        pos = at + len(old)
    return "".join(out + lines[pos:])


def patched(diff_path: Path) -> str:
    """The text of the repository file ``diff_path`` changes, with it applied."""
    diff = Path(diff_path).read_text()
    path = target(diff, name=str(diff_path))
    return apply((ROOT / path).read_text(), diff, name=str(diff_path))
