"""``bench/experiments/exp_plain_indices_parts.py``: its copies of ``kernels/plain_indices.py`` are the
file with exactly the edits they name (every one found once in today's kernel, the stamped copies
too, which only a GPU runs), a kernel whose code moved is refused, and its CPU wiring runs
(``--smoke``: numbers meaningless)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "experiments"))
sys.path.insert(0, str(ROOT / "bench"))

import exp_plain_indices_parts as parts  # noqa: E402
from bench_smoke import smoke  # noqa: E402

TEXT = parts.KERNEL.read_text()


@pytest.mark.parametrize("name", sorted(parts.COPIES))
def test_every_copy_applies_to_the_kernel_as_it_is(name):
    out = parts.copy_source(TEXT, parts.COPIES[name])
    ast.parse(out)
    assert (out == TEXT) == (name == "base")


@pytest.mark.parametrize("name", sorted(parts.STAMPED))
def test_every_stamped_copy_applies_and_notes_the_checkers_and_workers(name):
    out = parts.copy_source(TEXT, parts.STAMPED[name])
    ast.parse(out)
    assert out.count("_stamp(pid)") == 4  # a checker's start, test, settle; a worker's start
    assert "def _plain_indices_checked(dbg_ptr, swa_ptr," in out


def test_a_kernel_whose_code_moved_is_refused():
    with pytest.raises(ValueError, match="found 0 times"):
        parts.copy_source(TEXT.replace("BLOCK_W = 128\n", "BLOCK_W = 64\n"), parts.COPIES["wide"])


def test_smoke_times_every_part_and_copy(tmp_path):
    res = smoke("experiments/exp_plain_indices_parts.py", tmp_path, "exp_plain_indices_parts.json", timeout=600)
    for part in ("off", "on", "quick", "open", "alloc", "plain_launch", "checked_launch"):
        assert res["host_us"][part] > 0, part
    assert sorted(res["copies"]) == sorted(["base", "wait_first", "wide", "wide_wait", "checkers_only"])
    assert res["T"] > 0 and res["width"] > 0 and "stamps" not in res  # (the stamped copies run on a GPU only)


def test_smoke_times_a_copy_of_another_revision_beside_the_kernel(tmp_path):
    """``--before FILE``: a copy of the kernel file of another revision (here today's, as a file
    elsewhere), timed as the copy ``before`` in the same rounds, its results compared with the pack's."""
    before = tmp_path / "plain_indices_before.py"
    before.write_text(TEXT)
    res = smoke("experiments/exp_plain_indices_parts.py", tmp_path, "exp_plain_indices_parts.json", timeout=600,
                extra=("--copies", "base", "--before", str(before)))
    assert sorted(res["copies"]) == ["base", "before"]
    assert res["copies"]["before"]["form_wait"] > 0
