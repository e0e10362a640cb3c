"""Block tables shorter than a window's positions, and tables with no column at all, with
validation off (the serving path): every kernel that reads a window's slots through the table
gives the reference's result (the table's last column stands for the missing ones; an empty
table reads as block 0) and reads nothing outside it. The short table is a view inside a buffer
of sentinels, so an entry read past its row or its end shows in the result."""

from __future__ import annotations

import pytest
import torch

import swa_backends as sb
from swa_backends.common.ops import OPS

I32 = torch.int32
SENTINEL = 777
#: the variants that read a window through the block table, on this machine (Triton interpreter)
SWA_VARIANTS = ["triton", "triton_ascend"]


def _short_table():
    """Two requests of 8 positions at block size 2 need 4 columns; the table has 2, sentinels around."""
    big = torch.full((16,), SENTINEL, dtype=I32)
    table = big[4:8].view(2, 2)
    table.copy_(torch.tensor([[10, 11], [20, 21]], dtype=I32))
    return big, table


def _empty_table():
    return None, torch.zeros(2, 0, dtype=I32)


TABLES = {"short": _short_table, "empty": _empty_table}


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("variant", SWA_VARIANTS)
def test_swa_indices_and_lens_reads_inside_a_short_or_empty_table(variant, table):
    big, bt = TABLES[table]()
    before = None if big is None else big.clone()
    qsl, seq, R = torch.tensor([0, 1, 2], dtype=I32), torch.tensor([8, 8], dtype=I32), torch.zeros(2, dtype=I32)
    want = OPS["swa_indices_and_lens"].reference(qsl, seq, bt, 2, 8, R, num_tokens=2)
    be = sb.select("cpu", prefer={"swa_indices_and_lens": variant}, checked=False)
    assert be.variants["swa_indices_and_lens"] == (variant,)
    got = be.swa_indices_and_lens(qsl, seq, bt, 2, 8, R, num_tokens=2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (got, want)
    assert not bool((got[0] >= SENTINEL * 2).any())  # no entry read from the sentinels
    if before is not None:
        assert torch.equal(big, before)


@pytest.mark.parametrize("table", TABLES)
def test_prepare_replay_step_reads_inside_a_short_or_empty_table(table):
    _, bt = TABLES[table]()
    qsl, seq = torch.tensor([0, 1, 2], dtype=I32), torch.tensor([8, 8], dtype=I32)
    pos = torch.tensor([7, 7])
    slots = torch.stack([pos + 100, pos + 200])
    args = (torch.zeros(2, dtype=I32), torch.arange(2, dtype=I32), torch.ones(2, dtype=torch.bool), qsl, seq, pos,
            slots, torch.zeros(0, dtype=I32), bt, 2, 8, 4)
    want = OPS["prepare_replay_step"].reference(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    be = sb.select("cpu", prefer={"prepare_replay_step": "triton"}, checked=False)
    got = be.prepare_replay_step(*args)
    assert torch.equal(got.swa_indices, want.swa_indices) and torch.equal(got.swa_lens, want.swa_lens)
    assert not bool((got.swa_indices >= SENTINEL * 2).any())
