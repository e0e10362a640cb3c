"""``bench/experiments/cluster/``, the 2-CTA cluster experiment of issue 38 (not product code): its
generated wgmma wrappers name every operand they bind, its launcher refuses what the kernel does not
take before any CUDA work, and, where ``nvcc`` is on PATH, the kernel builds for sm_90a with the
shared memory the launcher asks for."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

CLUSTER = Path(__file__).resolve().parents[2] / "bench" / "experiments" / "cluster"
sys.path.insert(0, str(CLUSTER))

import build_cluster  # noqa: E402
import sparse_mla_cluster as cluster  # noqa: E402


def _asm_blocks(header: str) -> list[tuple[str, int]]:
    """(instruction text, bound operand count) per asm statement of the header."""
    found = []
    for m in re.finditer(r'asm volatile\((.*?)\);', header, re.S):
        body = m.group(1)
        text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"\s*(?=[:"\n])', body.split(":")[0]))
        operands = len(re.findall(r'"[+=]?[flr]"\(', body))
        found.append((text, operands))
    return found


def test_wgmma_wrappers_number_every_operand_once():
    blocks = _asm_blocks(build_cluster.wgmma_header())
    assert [n for _, n in blocks] == [32 + 3, 128 + 6]
    for text, n in blocks:
        used = sorted({int(k) for k in re.findall(r"%(\d+)", text)})
        assert used == list(range(n)), (used[:5], n)
    assert "m64n64k16" in blocks[0][0] and ", p, 1, 1, 0, 0;" in blocks[0][0]  # A, B K-major
    assert "m64n256k16" in blocks[1][0] and ", p, 1, 1, 1;" in blocks[1][0]  # V transposed (MN-major)


@pytest.mark.parametrize("bad", ["fp16", "d", "dv", "idx64"])
def test_launcher_refuses_what_the_kernel_does_not_take(bad):
    T, H, D = 2, 64, 512
    q = torch.zeros(T, H, D, dtype=torch.float16 if bad == "fp16" else torch.bfloat16)
    if bad == "d":
        q = q[..., :256]
    kv = torch.zeros(8, q.shape[-1], dtype=q.dtype)
    idx = torch.zeros(T, 4, dtype=torch.int64 if bad == "idx64" else torch.int32)
    lens = torch.full((T,), 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="sparse_mla_cluster"):
        cluster.sparse_mla(q, kv, idx, lens, 0.1, 128 if bad == "dv" else D)
    assert "fn" not in cluster._state  # refused before the driver was touched


def test_launcher_asks_for_the_kernels_shared_memory():
    src = (CLUSTER / "sparse_mla_cluster.cu").read_text()
    consts = dict(re.findall(r"constexpr int (\w+) = ([^;]+);", src))
    env: dict = {}
    for name, expr in consts.items():  # in order of definition: each names only those before it
        env[name] = eval(expr.split("//")[0], {}, dict(env))
    assert env["SMEM_BYTES"] == cluster.SMEM <= 232448  # an sm90 block's limit


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_kernel_builds_for_sm90a_without_spills_or_serialised_wgmma(tmp_path, capsys):
    cubin = build_cluster.build(tmp_path)
    assert cubin.stat().st_size > 0
    report = capsys.readouterr().out
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills and max(spills) == 0, report
    # C7514 / C7518: ptxas waits for every wgmma where it cannot prove the overlap safe (a group pending across
    # the loop's back edge, a wgmma in a branch), which undoes the pipelining the kernel is written for
    assert "serialized" not in report, report
