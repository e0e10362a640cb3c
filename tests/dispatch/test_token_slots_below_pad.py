"""A token slot below PAD (-1) is bad input for ``compressed_slot_mapping`` (SPEC §5: "slots in range or
PAD"; §2.3: a token whose slot is PAD writes no compressed entry). The op once took one as a real slot:
with ``ratio > 1`` such a token, closing a compressed group, got a compressed entry; with ``ratio`` 1 it
was copied out as a write slot.

Here, on the CPU (the kernels in Triton's interpreter): the validator refuses it with a ``ValueError``
naming ``token_slots`` and writes nothing, at every ratio and wherever the value lies; the self-checked
kernel form (``Variant.self_checked``), whose every program tests every token slot, refuses it and
writes nothing wherever it lies (in the first, a middle or the last program's tokens); the validated
Triton backend raises the validator's error through that form; PAD and large slots pass. Unvalidated,
the op keeps vLLM's own rule (``get_compressed_slot_mapping`` skips exactly PAD), as the validation-off
contract says: the value is bad input, not a new meaning.
"""

from __future__ import annotations

import functools

import pytest
import torch

import swa_backends as sb
from swa_backends.common.ops import OPS
from swa_backends.common.registry import load_attr
from swa_backends.common.types import PAD

pytest.importorskip("triton")
from swa_backends.kernels import SELF_CHECKED, _launch  # noqa: E402

OP = "compressed_slot_mapping"
I32, I64 = torch.int32, torch.int64
BELOW_PAD = (-2, -5, -(2**63))
EXPECT = "expected values in >= 0 or PAD (-1)"


def _call(T: int = 40, ratio: int = 4):
    """Two prefills from position 0 (T tokens), block 16, blocks 1.. (0 is the null block), a fifth
    of the token slots PAD."""
    n0 = T // 3
    qsl = torch.tensor([0, n0, T], dtype=I32)
    seq = torch.tensor([n0, T - n0], dtype=I32)
    cols = (T + 15) // 16
    table = torch.arange(1, 2 * cols + 1, dtype=I32).reshape(2, cols)
    slots = torch.arange(T, dtype=I64) + 16
    slots[::5] = PAD
    return (slots, qsl, seq, table, 16, ratio)


def _form():
    return functools.partial(load_attr(f"swa_backends.kernels.{SELF_CHECKED[OP]}"), None)


def _checked_launches() -> int:
    module = SELF_CHECKED[OP].partition(":")[0]
    return sum(k.launches for n, k in _launch.KERNELS.items() if n.startswith(f"{module}.") and n.endswith("_checked"))


@pytest.mark.parametrize("value", BELOW_PAD)
@pytest.mark.parametrize("ratio", [1, 4])
@pytest.mark.parametrize("at", [0, 17, -1], ids=["first", "middle", "last"])
def test_the_validator_refuses_a_token_slot_below_pad_and_writes_nothing(at, ratio, value):
    args = _call(ratio=ratio)
    args[0][at] = value
    with pytest.raises(ValueError) as err:
        OPS[OP].validate(*args)
    assert str(err.value) == f"{OP}: token_slots={value}: {EXPECT}"
    out = torch.full((args[0].shape[0],), 12345, dtype=I64)
    with pytest.raises(ValueError, match=f"^{OP}: token_slots={value}: "):
        sb.select("cpu").compressed_slot_mapping(*args, out=out)  # the reference backend, validated
    assert (out == 12345).all(), "a refused call wrote"


@pytest.mark.parametrize("value", BELOW_PAD)
@pytest.mark.parametrize("at", [0, 700, -1], ids=["first-program", "middle-program", "last-program"])
def test_the_self_checked_form_refuses_a_token_slot_below_pad_wherever_it_lies(at, value):
    """1500 tokens: three programs of 512, each testing every token slot before it stores."""
    args = _call(T=1500)
    good = _form()(*args)
    assert good is not None and not good[1].failed()
    assert torch.equal(good[0], OPS[OP].reference(*args))
    args[0][at] = value
    out = torch.full((1500,), 12345, dtype=I64)
    done = _form()(*args, out=out)
    assert done is not None, "the form declined a call it takes"
    assert done[1].failed(), "the kernel passed a token slot below PAD"
    assert (out == 12345).all(), "a refused call wrote"


@pytest.mark.parametrize("value", BELOW_PAD)
def test_the_validated_triton_backend_raises_the_validators_error(value):
    be = sb.select("cpu", prefer="triton")
    assert be.variants[OP][0] == "triton"
    args = _call()
    args[0][7] = value
    out = torch.full((args[0].shape[0],), 12345, dtype=I64)
    n = _checked_launches()
    with pytest.raises(ValueError) as err:
        be.compressed_slot_mapping(*args, out=out)
    assert str(err.value) == f"{OP}: token_slots={value}: {EXPECT}"
    assert _checked_launches() == n + 1, "the call took the self-checked path"
    assert (out == 12345).all(), "a refused call wrote"


def test_pad_and_large_slots_pass_and_unvalidated_the_op_keeps_vllms_rule():
    args = _call()
    args[0][3] = 2**62  # a slot the pack cannot bound (the engine's cache size is not an argument)
    for be in (sb.select("cpu"), sb.select("cpu", prefer="triton")):
        got = be.compressed_slot_mapping(*args)
        assert torch.equal(got, OPS[OP].reference(*args))
    # token 7 (request 0, position 7) closes a group of 4: with -5 it writes the group's entry, as vLLM's
    # kernel does (it skips exactly PAD); with PAD it writes none
    args[0][7] = -5
    for be in (sb.select("cpu", checked=False), sb.select("cpu", prefer="triton", checked=False)):
        got = be.compressed_slot_mapping(*args)
        assert int(got[7]) == 1 * 4 + 1  # block 1 of request 0, bs_c = 4: compressed position 1
    args[0][7] = PAD
    assert int(OPS[OP].reference(*args)[7]) == PAD
