"""``compressed_slot_mapping`` (SPEC §2.3) against vLLM's own ``get_compressed_slot_mapping``
(the compressed caches' write slots, replayed tokens' PAD inherited) on the differential's mixed
batches, for the reference and the Triton kernel (interpreter on the CPU).

One rule is the pack's own: nothing is written into the engine's null block (SPEC §2.3). vLLM 0.33
has no such rule in this mapping (its null-block guard sits in the compressor ring's mapping, the
decoder-side seed's "ring slots of block 0 are now padded"), so with ``null_block=None`` the two
agree on every table, and with the default ``null_block=0`` on every table without block 0; on an
all-zero (graph-capture dummy) table vLLM writes into block 0 and the pack writes nothing.

Needs vLLM (the CI stage's venv); skipped without it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

import torch  # noqa: E402

import _cases  # noqa: E402
from swa_backends import select  # noqa: E402

compressor_utils = pytest.importorskip("vllm.v1.attention.backends.mla.compressor_utils")
PAD = -1


def _vllm(slots, b, table, ratio):
    return compressor_utils.get_compressed_slot_mapping(b.T, slots, b.qsl, b.seq, table, b.block_size // ratio, ratio)


def _slots(b, seed):
    """The first cacheable group's token slots for the step's real tokens, some of them PAD (replayed)."""
    slots = b.slots[b.cacheable[0], : b.T].clone()
    g = torch.Generator().manual_seed(seed)
    slots[torch.rand(b.T, generator=g) < 0.2] = PAD
    return slots


CASES = [(seed, name) for seed in (0, 1) for name, _ in _cases.mixed_batches(seed)]


@pytest.mark.parametrize("variant", ["reference", "triton"])
@pytest.mark.parametrize("ratio", [2, 4])
@pytest.mark.parametrize("seed,name", CASES, ids=[f"{n}-{s}" for s, n in CASES])
def test_the_compressed_slots_are_vllms(seed, name, ratio, variant):
    b = dict(_cases.mixed_batches(seed))[name]
    if b.block_size % ratio:
        pytest.skip(f"block size {b.block_size} is not a multiple of ratio {ratio}")
    be = select("cpu", prefer={"compressed_slot_mapping": variant}, checked=False)
    slots = _slots(b, seed)
    table = b.block_tables[b.cacheable[0]][: b.B_all]
    want = _vllm(slots, b, table, ratio)
    got = be.compressed_slot_mapping(slots, b.qsl, b.seq, table, b.block_size, ratio, null_block=None)
    assert torch.equal(got, want)
    if not bool((table == 0).any()):
        assert torch.equal(be.compressed_slot_mapping(slots, b.qsl, b.seq, table, b.block_size, ratio), want)
    # a graph-capture dummy's all-zero table: vLLM's mapping lands in block 0, the pack's writes nothing there
    zero = torch.zeros_like(table)
    dummy = _vllm(slots, b, zero, ratio)
    assert bool((dummy >= 0).any()) and bool((dummy < b.block_size // ratio).all())
    assert bool((be.compressed_slot_mapping(slots, b.qsl, b.seq, zero, b.block_size, ratio) == PAD).all())
    assert torch.equal(be.compressed_slot_mapping(slots, b.qsl, b.seq, zero, b.block_size, ratio, null_block=None),
                       dummy)
