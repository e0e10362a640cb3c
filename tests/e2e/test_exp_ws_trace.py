"""``bench/experiments/exp_ws_trace.py`` stamps its copy of the ws kernel exactly at the lines its marks
name (refusing a kernel where one is missing), turns the readings into the phases it says, and stops with
the reason on a machine without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import exp_ws_trace as tr  # noqa: E402
from kernel_copies import function_source as _function  # noqa: E402
from lib.smoke import run_script  # noqa: E402

TEXT = tr.KERNEL.read_text()


def test_every_mark_is_stamped_at_its_line_and_nothing_else_changes():
    out = tr.trace_source(TEXT)
    compile(out, "ws_trace.py", "exec")
    for function, part in (("_consume_item", "W"), ("_produce_item", "2")):
        body = _function(out, function).splitlines()
        item, pair, _width = tr._layout()[function]
        for fn, name, line, where, count, per_pair in tr.MARKS:
            if fn != function:
                continue
            at = [i for i, ln in enumerate(body) if ln.strip() == line]
            assert len(at) == count
            for i in at:
                stamp = body[i - 1 if where == "before" else i + 1].strip()
                slot = f"{len(item)} + j * {len(pair)} + {pair.index(name)}" if per_pair else str(item.index(name))
                # (a function's source segment ends at its last statement, before a trailing comment)
                assert stamp.split("  #")[0] == f"_stamp(SINK, {part}, k, {slot})"
                assert f"_stamp(SINK, {part}, k, {slot})  # {name}\n" in out
    # the copy is the kernel with the stamps, the stamp function, SINK passed to the producer's item, the entry
    stripped = "\n".join(ln for ln in out.splitlines() if "_stamp(SINK" not in ln)
    stripped = stripped.replace("IDX, SINK, H,", "IDX, H,")
    assert stripped.startswith(TEXT.split("\n\n@gluon.jit\ndef _pairs(")[0])
    assert TEXT.split("\n\n@gluon.jit\ndef _pairs(")[1].rstrip() in stripped
    assert "def traced(q, kv, indices, lens, sm_scale, d_v, trace):" in out


def test_a_kernel_without_a_marks_line_is_refused():
    changed = TEXT.replace("s = _wgmma_wait(0, deps=(s,))", "s = _wgmma_wait(0, deps=[s])")
    with pytest.raises(ValueError, match=r"found 0 lines 's = _wgmma_wait\(0, deps=\(s,\)\)' in _consume_item; "
                                         r"expected 1"):
        tr.trace_source(changed)


def _synthetic(n_pairs: int, phase: dict, start: int) -> np.ndarray:
    """Readings of a schedule whose every phase takes ``phase[name]`` cycles, as the copy stores them."""
    layout = tr._layout()
    width = max(w for _i, _p, w in layout.values())
    raw = np.full((tr.PROGRAMS, 3, tr.ITEMS, width), -1, dtype=np.int64)
    ci, cp, _ = layout["_consume_item"]
    pi, pp, _ = layout["_produce_item"]
    for prog in range(tr.PROGRAMS):
        for w in (0, 1):
            t = start
            for k in range(tr.ITEMS):
                s = {"start": t}
                t += phase["q_wait"]
                s["q_ready"] = t
                for j in range(n_pairs):
                    p = {}
                    t += phase["tile_wait"]
                    p["tile_in"] = t
                    t += phase["qk"]
                    p["s_done"] = t
                    order = (("pv_issue", "softmax"), ("max_in", "max_wait")) if w == 0 else \
                        (("max_in", "max_wait"), ("pv_issue", "softmax"))
                    for mark, what in order:
                        t += phase[what]
                        p[mark] = t
                    t += phase["p_wait"]
                    p["p_in"] = t
                    t += phase["pv_tail"]
                    p["pair_end"] = t
                    for name, v in p.items():
                        raw[prog, w, k, len(ci) + j * len(cp) + cp.index(name)] = v
                s["pairs_done"] = t
                t += phase["sums_wait"]
                s["sums_in"] = t
                t += phase["store"]
                s["stored"] = t
                for name, v in s.items():
                    raw[prog, w, k, ci.index(name)] = v
        t = start
        for k in range(tr.ITEMS):
            s = {"start": t, "q_free": t + phase["q_free_wait"], "q_issued": t + phase["q_free_wait"] + 5}
            t = s["q_issued"]
            for j in range(n_pairs):
                for h in (0, 3, 1, 2):
                    t += phase["free_wait"]
                    raw[prog, 2, k, len(pi) + j * len(pp) + pp.index(f"free{h}")] = t
                    t += phase["issue"]
                    raw[prog, 2, k, len(pi) + j * len(pp) + pp.index(f"issued{h}")] = t
            for name, v in s.items():
                raw[prog, 2, k, pi.index(name)] = v
    return raw


def test_readings_become_the_schedules_phases_across_a_clock_wrap():
    phase = {"q_wait": 300, "tile_wait": 20, "qk": 900, "softmax": 400, "max_wait": 50, "p_wait": 70,
             "pv_tail": 600, "sums_wait": 40, "store": 500, "q_free_wait": 100, "free_wait": 30, "issue": 200}
    n_pairs = 5
    raw = _synthetic(n_pairs, phase, start=2**32 - 5000)  # the 32-bit clock wraps inside the trace
    buf = torch.from_numpy((raw % 2**32).astype(np.uint32).view(np.int32).copy())
    buf[torch.from_numpy(raw == -1)] = -1
    cycles = tr.readings(buf.view(torch.float32))
    assert cycles.min() == -1 and cycles[cycles >= 0].min() == 0 and cycles.max() < 10**6
    got = tr.summarise(cycles, n_pairs)
    pair = sum(phase[n] for n in ("tile_wait", "qk", "softmax", "max_wait", "p_wait", "pv_tail"))
    for w in (0, 1):
        c = f"consumer{w}"
        assert got[f"{c}/q_wait"]["median"] == 300
        assert got[f"{c}/epilogue"]["median"] == 540 and got[f"{c}/sums_wait"]["median"] == 40
        assert got[f"{c}/item"]["median"] == 300 + n_pairs * pair + 540
        for where in ("first", "middle", "last"):
            for name in ("tile_wait", "qk", "softmax", "max_wait", "p_wait", "pv_tail"):
                assert got[f"{c}/{where}/{name}"]["median"] == phase[name], (c, where, name)
            assert got[f"{c}/{where}/pair"]["median"] == pair
        assert got[f"{c}/middle/qk"]["n"] == tr.PROGRAMS * (tr.ITEMS - 1) * (n_pairs - 2)
    assert got["producer/q_free_wait"]["median"] == 100 and got["producer/q_issue"]["median"] == 5
    for h in (0, 3, 1, 2):
        assert got[f"producer/free_wait{h}"]["median"] == 30 and got[f"producer/issue{h}"]["median"] == 200


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_stops_with_the_reason(tmp_path, capsys):
    assert run_script(ROOT / "bench" / "experiments" / "exp_ws_trace.py", "--out", str(tmp_path / "o")) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_kernel_file_that_is_not_there_or_lacks_the_marks_is_refused_before_the_gpu(tmp_path):
    with pytest.raises(ValueError, match=r"--kernel: '.*nothing\.py' is not a file; expected a copy of "
                                         r"sparse_mla_gluon_ws\.py"):
        tr.main(["--out", str(tmp_path / "o"), "--kernel", str(tmp_path / "nothing.py")])
    copy = tmp_path / "ws_copy.py"
    copy.write_text(TEXT.replace("m_i = m_b", "m_i = m_b + 0.0"))
    with pytest.raises(ValueError, match=r"found 0 lines 'm_i = m_b' in _consume_item; expected 2"):
        tr.main(["--out", str(tmp_path / "o"), "--kernel", str(copy)])
    assert not (tmp_path / "o").exists()
