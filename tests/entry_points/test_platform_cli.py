"""`swa-backends info` for the platform devices, plain and ``--emulate``: the variant per
op, the verified status, and the encoder/decoder decision with reasons, each checked against
matrix.yaml and the API."""

from __future__ import annotations

import importlib
import json
import re

import pytest

import swa_backends as sb
from swa_backends.cli import main

DEVICES = ["rocm:gfx942", "rocm:gfx950", "ascend:910b", "ascend:910_93", "cuda:sm90", "cuda:sm100", "cuda:sm89"]
# the vendor sparse_mla a deployment with the vendor packages runs (None: no vendor kernel there): first,
# after the pack's variants in PACK_LEADS
VENDOR = {"rocm:gfx942": None, "rocm:gfx950": "aiter_opus", "ascend:910b": "npu_sparse_flash_mla",
          "ascend:910_93": "npu_sparse_flash_mla", "cuda:sm90": "flashmla", "cuda:sm100": "flashmla",
          "cuda:sm89": None}
# the pack's own variants that lead the vendor's (measured faster there: sm90's gluon_ws on an H200)
PACK_LEADS = {"cuda:sm90": ("gluon_ws",)}
# the reason each vendor variant gives on this machine, where the vendor package is absent
ABSENT = {"flashmla": "vLLM is not installed", "flashinfer": "FlashInfer (flashinfer-python): module flashinfer is "
          "not installed", "aiter_opus": "AMD AITER is not installed", "npu_sparse_flash_mla": "torch_npu"}


def _unwrapped(out: str) -> str:
    """The output with every wrapped bullet joined back onto one line (continuation lines are
    indented under the bullet's text)."""
    return re.sub(r"\n {6,}(?![-+] )", " ", out)


def _every_variant(out: str) -> dict[tuple[str, str], tuple[str, list[str]]]:
    """``{(op, variant): (status, [reasons])}`` from ``--all``'s list."""
    found: dict = {}
    key = None
    for line in _unwrapped(out).split("every variant:\n", 1)[1].splitlines():
        if line.startswith("      - "):
            found[key][1].append(line[8:])
        elif line.startswith("  ") and not line.startswith("      "):
            op, name, status = line.split()
            key = (op, name)
            found[key] = (status, [])
    return found


def _table(out: str) -> dict[str, list[tuple[str, str]]]:
    """``{op: [(variant, verified), ...]}`` from the printed variant table."""
    lines = out.split("\n\n", 1)[1].splitlines()
    assert re.split(r"\s{2,}", lines[0].strip()) == ["op", "variant", "verified", "graph-safe", "layout"]
    table: dict[str, list] = {}
    op = None
    for line in lines[1:]:
        if not line.strip() or line.startswith("every variant"):
            break
        cells = re.split(r"\s{2,}", line.strip())
        if not line.startswith(" "):
            op, cells = cells[0], cells[1:]
        name = re.sub(r" \((per-call|else)\)$", "", cells[0])
        table.setdefault(op, []).append((name, cells[1]))
    return table


def _run(device, emulate, capsys, *extra):
    args = ["info", "--device", device, *(["--emulate"] if emulate else []), *extra]
    assert main(args) == 0
    out = capsys.readouterr().out
    dev = sb.parse_device(device)
    if emulate:
        with importlib.import_module(f"swa_backends.testing.emulation.{dev.platform}").contract_doubles(dev):
            e = sb.explain(dev)
    else:
        e = sb.explain(dev)
    return out, e, sb.load_matrix().row_for(dev)


@pytest.mark.parametrize("emulate", [False, True], ids=["real", "emulated"])
@pytest.mark.parametrize("device", DEVICES)
def test_info_matches_matrix_and_api(device, emulate, capsys):
    out, e, row = _run(device, emulate, capsys)
    assert max(len(line) for line in out.splitlines()) <= 100  # reasons wrap
    table = _table(out)
    out = _unwrapped(out)
    caps = e.capabilities
    assert f"matrix row:    {row.id}\n" in out
    assert ("emulated:      vendor packages replaced by contract doubles" in out) == emulate
    for side, label in (("encoder_replay", "encoder replay"), ("decoder_replay", "decoder replay")):
        decision = getattr(caps, side)
        assert f"{label}: {'ON' if decision.enabled else 'OFF'}\n" in out
        for line in (decision.notes if decision.enabled else decision.reasons):
            assert f"    - {line}\n" in out
    # the row's own gate text is printed (as a note when on, as a reason when off)
    assert f"[matrix:{row.id}] {row.gates['encoder_replay'].text}" in out
    assert set(table) == set(sb.OPS)
    for op, printed in table.items():
        assert tuple(n for n, _ in printed) == e.chosen[op]
        for name, verified in printed:
            assert name in row.allowed(op)
            # a faked device never reads as hardware: the row's record is marked as the row's
            claim = " (row)" if row.status(name) == "hardware" else ""
            assert verified == row.status(name) + claim
    assert ("this device is faked, so nothing ran on it here" in out) == any(
        row.status(n) == "hardware" for names in e.chosen.values() for n in names)
    names = [n for n, _ in table["sparse_mla"]]
    vendor = VENDOR[device]
    if emulate and vendor:
        lead = PACK_LEADS.get(device, ())
        assert tuple(names[:len(lead) + 1]) == (*lead, vendor)
        assert row.status(vendor) in ("emulated", "hardware")  # sm90's FlashMLA ran on an H200
    else:
        assert names[0] not in ("flashmla", "flashinfer", "flashinfer_sm12x", "aiter_opus", "npu_sparse_flash_mla")


@pytest.mark.parametrize("device", ["rocm:gfx950", "ascend:910b", "cuda:sm90", "cuda:sm100"])
def test_info_all_shows_why_the_vendor_kernel_is_not_used_here(device, capsys):
    out, e, row = _run(device, False, capsys, "--all")
    listed = _every_variant(out)
    assert set(listed) == {(c.op, c.variant) for c in e.table}
    for name in row.allowed("sparse_mla"):
        if name in ABSENT:
            status, reasons = listed[("sparse_mla", name)]
            assert status == "rejected" and any(ABSENT[name] in r for r in reasons), (status, reasons)


def test_info_emulate_json_is_labelled(capsys):
    assert main(["info", "--device", "rocm:gfx950", "--emulate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["emulated"] is True and "not a measurement" in data["emulated_note"]
    assert data["chosen"]["sparse_mla"][0] == "aiter_opus"
    assert main(["info", "--device", "rocm:gfx950", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["emulated"] is False


def test_info_emulate_on_cpu_is_an_error(capsys):
    assert main(["info", "--device", "cpu", "--emulate"]) == 2
    assert "--emulate: device=cpu" in capsys.readouterr().err


def test_emulate_leaves_no_trace(capsys):
    before = sb.explain("cuda:sm100").chosen
    assert main(["info", "--device", "cuda:sm100", "--emulate"]) == 0
    capsys.readouterr()
    assert sb.explain("cuda:sm100").chosen == before


@pytest.mark.parametrize("device", [*DEVICES, "cpu"])
def test_printing_an_explanation_or_capabilities_is_readable(device):
    """``print(sb.explain(d))`` is the table ``info --all`` prints, not the raw object: lines of
    at most 100 characters (reasons wrap under their bullet and unwrap to the same text), a
    short repr, and a faked device never reads as verified on hardware here."""
    e, caps = sb.explain(device), sb.capabilities(device)
    for obj in (e, caps):
        text = str(obj)
        assert max(len(line) for line in text.splitlines()) <= 100, obj
        assert len(repr(obj)) < 200 and "print()" in repr(obj)
        for reason in [*caps.encoder_replay.reasons, *caps.encoder_replay.notes, *caps.decoder_replay.reasons,
                       *caps.decoder_replay.notes]:
            assert f"    - {reason}\n" in _unwrapped(text) + "\n"
    assert str(e).startswith(str(caps) + "\n\n")
    listed = _every_variant(str(e))
    for c in e.table:
        status, reasons = listed[(c.op, c.variant)]
        assert status == c.status and reasons == list(c.reasons)
    verified = [v for vs in _table(str(e)).values() for _, v in vs]
    if e.device.fake:
        assert "hardware" not in verified  # the row's claim is marked as the row's
        assert all(v in ("hardware (row)", "emulated", "not-run") for v in verified), verified
    else:
        assert "hardware" in verified and "hardware (row)" not in verified  # the CPU row: this kind of device
