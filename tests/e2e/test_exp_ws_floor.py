"""``bench/experiments/exp_ws_floor.py`` takes out of its copies of the ws kernel exactly what it says
(the producer's four KV gathers; the consumers' math, their waits and frees kept; the consumers' hand-overs
and, for one copy, their softmax), refuses a kernel whose code it no longer recognises or a loop it does not
have, and stops with the reason on a machine without a GPU."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import exp_ws_floor as floor  # noqa: E402
from kernel_copies import function_source as _function  # noqa: E402
from lib.smoke import run_script  # noqa: E402

TEXT = floor.KERNEL.read_text()


def test_no_gather_drops_the_four_kv_gathers_and_keeps_q():
    out = floor.variant_source(TEXT, True)
    producer = _function(out, "_produce_item")
    assert "_gather_half(KV" not in producer
    assert producer.count("_gather_half(Q, q_smem.index(") == 2
    assert producer.count("_cp_arrive(bars.index(_READY") == 4  # the ready barriers still complete
    assert _function(out, "_consume_item") == _function(TEXT, "_consume_item")


def test_no_math_keeps_every_wait_and_free_of_the_kernel():
    out = floor.variant_source(TEXT, False, "no_math")
    consumer = _function(out, "_consume_item")
    assert "_wgmma" not in consumer and "exp2(s -" not in consumer
    # consumer 0 frees A lo and B lo (halves 0, 2), consumer 1 B hi and A hi (3, 1), as in the kernel;
    # each after waiting for that half
    zero, one = consumer.split("if W == 0:")[1].split("else:")[:2]
    for body, halves in ((zero, "02"), (one, "31")):
        assert re.findall(r"_READY \+ (\d)", body) == re.findall(r"_FREE \+ (\d)", body) == list(halves)
    assert "_QFREE" in consumer and "# row sums" in consumer  # Q released; the epilogue stays
    assert _function(out, "_produce_item") == _function(TEXT, "_produce_item")
    compile(out, "ws_no_math.py", "exec")


def test_neither_is_both():
    both = floor.variant_source(TEXT, True, "no_math")
    assert both == floor.variant_source(floor.variant_source(TEXT, True), False, "no_math")
    compile(both, "ws_neither.py", "exec")


def _waits_and_frees(body: str) -> tuple[list[str], list[str]]:
    return re.findall(r"_READY \+ ([\w +-]+?)\)", body), re.findall(r"_FREE \+ (\d)", body)


@pytest.mark.parametrize("loop", ["mma", "mma_softmax"])
def test_the_mma_copies_keep_the_tensor_work_and_the_producers_barriers_only(loop):
    out = floor.variant_source(TEXT, True, loop)
    consumer = _function(out, "_consume_item")
    kernel = _function(TEXT, "_consume_item")
    # the four wgmma calls of a consumer's pair as in the kernel: two Q K^T halves, two P V
    assert consumer.count("_wgmma(q_") == kernel.count("_wgmma(q_") == 2
    assert consumer.count("_wgmma(p_op, kv") == kernel.count("_wgmma(p_op, kv") == 2
    assert consumer.count("_wgmma(p1, kv2") == consumer.count("_wgmma(p0, kv1") == 1
    # no hand-over between the consumers: no row max, no P published or waited for
    for gone in ("_MBAR", "_SBAR", "_publish_"):
        assert gone not in consumer.split("# row sums")[0]
    # each consumer frees the halves it frees in the kernel (0: A lo, B lo; 1: B hi, A hi), after waiting
    # for every half it reads
    zero, one = consumer.split("if W == 0:")[1].split("else:")[:2]
    assert _waits_and_frees(zero) == (["2"], ["0", "2"])
    assert _waits_and_frees(one) == (["1"], ["3", "1"])
    assert _waits_and_frees(consumer)[0][:2] == ["OWN + FIRST", "OWN + 1 - FIRST"]  # its own tile, both halves
    assert ("exp2(s -" in consumer) == (loop == "mma_softmax") == ("_valid_cols(" in consumer)
    assert _function(out, "_produce_item") == _function(floor.variant_source(TEXT, True), "_produce_item")
    compile(out, f"ws_{loop}.py", "exec")


@pytest.mark.parametrize("loop", ["mma", "mma_softmax"])
def test_the_mma_loops_start_as_the_kernels_pair_loop(loop):
    # the copies' Q K^T part (the views, the waits for the own tile's halves, the two wgmma, the release of Q) is
    # the kernel's own text, up to its softmax; mma_only leaves out the valid mask
    kernel_loop = floor._PAIR_LOOP.search(TEXT).group(0)
    head = kernel_loop[:kernel_loop.index("s = gl.where(")].rstrip(" ")
    valid = next(ln + "\n" for ln in head.splitlines() if "valid = _valid_cols(" in ln)
    copy = _function(floor.variant_source(TEXT, True, loop), "_consume_item")
    assert (head if loop == "mma_softmax" else head.replace(valid, "")) in copy
    assert (valid in copy) == (loop == "mma_softmax")


@pytest.mark.parametrize("loop", ["mma", "mma_softmax"])
def test_the_mma_copies_with_gathers_differ_from_theirs_in_the_producer_alone(loop):
    # the ceiling as it runs: the same consumers, the kernel's producer with its four KV gathers
    out = floor.variant_source(TEXT, False, loop)
    assert floor.COPIES[f"{loop}_gather"] == (False, loop)
    assert _function(out, "_produce_item") == _function(TEXT, "_produce_item")
    assert _function(out, "_consume_item") == _function(floor.variant_source(TEXT, True, loop), "_consume_item")


def test_a_kernel_loop_without_its_softmax_start_is_refused():
    changed = TEXT.replace("s = gl.where(gl.expand_dims(valid, 0)", "s = (gl.where(gl.expand_dims(valid, 0)")
    with pytest.raises(ValueError, match=r"found 0 softmax starts and 1 valid masks .*; expected 1 and 1"):
        floor.variant_source(changed, True, "mma")


def test_an_unknown_loop_is_refused():
    with pytest.raises(ValueError, match=r"loop is 'math'; expected one of \['mma', 'mma_softmax', 'no_math'\]"):
        floor.variant_source(TEXT, False, "math")


def test_every_copy_is_made():
    assert set(floor.COPIES) == {"no_gather", "no_math", "neither", "mma_only", "mma_softmax", "mma_gather",
                                 "mma_softmax_gather"}
    for gathers, loop in floor.COPIES.values():
        compile(floor.variant_source(TEXT, gathers, loop), "copy.py", "exec")


@pytest.mark.parametrize("drop", [(True, None), (False, "no_math"), (False, "mma")])
def test_code_it_does_not_recognise_is_refused(drop):
    changed = TEXT.replace("_gather_half(KV, kv_smem", "_gather(KV, kv_smem").replace("# row sums", "# sums")
    with pytest.raises(ValueError, match=r"variant_source: found 0 .*; expected"):
        floor.variant_source(changed, *drop)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_stops_with_the_reason(tmp_path, capsys):
    assert run_script(ROOT / "bench" / "experiments" / "exp_ws_floor.py", "--out", str(tmp_path / "o")) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("spec", ["nolabel", "=x.py", "x=", "x=no/such/file.py",
                                  f"no_gather={ROOT / 'README.md'}"])
def test_a_bad_or_taken_extra_copy_stops_before_the_gpu_is_asked_for(tmp_path, capsys, spec):
    assert run_script(ROOT / "bench" / "experiments" / "exp_ws_floor.py", "--out", str(tmp_path / "o"),
                      "--extra", spec) == 1
    assert f"--extra: {spec!r}; expected LABEL=FILE, LABEL an identifier not given before" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_flashmla_and_the_kernel_are_checked_before_a_cell_is_timed():
    """The two paths whose ratio the experiment reports are compared with the fp32 reference first (they
    were timed unchecked); FlashMLA's ``(out, max_logits, lse)`` with +inf for an empty token is read in the
    pack's convention, the copies are left alone (their outputs mean nothing), a raise is a reason."""
    from lib.sparse_mla import DV, D, make_inputs, torch_baseline

    scale = D ** -0.5
    kv = torch.randn(256, D).to(torch.bfloat16)
    q, idx, lens, sink = make_inputs(20, 16, 64, D, kv=kv, pads=True, seed=3, dev="cpu")
    assert (lens == 0).any()  # an empty token: its lse is FlashMLA's +inf

    def ws(q, kv, idx, lens, sink):
        return torch_baseline(q, kv, idx, lens, scale, DV, sink)

    def fmla(q, kv, idx, lens, sink):
        out, lse = ws(q, kv, idx, lens, sink)
        return out, None, lse.masked_fill(lse == float("-inf"), float("inf"))

    def garbage(q, kv, idx, lens, sink):
        out, lse = ws(q, kv, idx, lens, sink)
        return out + 1, lse

    def raises(*a):
        raise RuntimeError("no kernel image")

    fns = {"flashmla_direct": fmla, "gluon_ws": ws, "no_gather": garbage}
    assert floor.wrong_paths(fns, q, kv, idx, lens, scale, sink) == {}
    got = floor.wrong_paths({**fns, "gluon_ws": garbage, "flashmla_direct": raises}, q, kv, idx, lens, scale, sink)
    assert set(got) == {"gluon_ws", "flashmla_direct"} and got["flashmla_direct"].startswith("RuntimeError")
