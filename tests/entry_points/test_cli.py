"""The CLI: `info` matches capabilities()/matrix.yaml for faked devices; `check` passes here;
bad flags give one clear line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import swa_backends as sb
from swa_backends.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "swa_backends", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("device", ["rocm:gfx942", "rocm:gfx950", "ascend:910b", "ascend:910_93", "cuda:sm90",
                                    "cuda:sm100", "cuda:sm89", "cpu"])
def test_info_json_matches_capabilities_and_matrix(device, capsys):
    assert main(["info", "--device", device, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    caps = sb.capabilities(device)
    assert data["capabilities"]["encoder_replay"]["enabled"] == caps.encoder_replay.enabled
    assert data["capabilities"]["decoder_replay"]["enabled"] == caps.decoder_replay.enabled
    assert data["capabilities"]["decoder_replay"]["reasons"] == list(caps.decoder_replay.reasons)
    row = sb.load_matrix().row_for(sb.parse_device(device) if device != "cpu" else sb.parse_device("cpu"))
    assert data["capabilities"]["row"] == row.id
    for op, names in data["chosen"].items():
        assert set(names) <= set(row.allowed(op))


def test_info_text_prints_decision_reasons_and_variant_table(capsys):
    assert main(["info", "--device", "ascend:910b", "--config", "lora=true", "--config", "graph_mode=none"]) == 0
    out = capsys.readouterr().out
    assert "matrix row:    ascend:910b" in out
    assert "decoder replay: OFF" in out and "[ascend-lora]" in out
    assert "encoder replay: ON" in out
    for op in sb.OPS:
        assert op in out


def test_info_all_lists_every_variant(capsys):
    assert main(["info", "--device", "cuda:sm90", "--all"]) == 0
    out = capsys.readouterr().out
    assert "every variant:" in out and out.count(" reference ") >= len(sb.OPS)


def test_check_passes_on_this_machine():
    out = run_cli("check", "--cases", "5")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(sb.OPS)}/{len(sb.OPS)} ops pass" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["info", "--device", "tpu:v5"], "device='tpu:v5'"),
    (["info", "--config", "pcp=many"], "prefill_context_parallel_size='many'"),
    (["info", "--prefer", "warp-drive"], "prefer='warp-drive'"),
    (["check", "--device", "rocm:gfx942"], "fake devices"),
    (["check", "--cases", "0"], "--cases=0"),
    (["info", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["launch"], "invalid choice: 'launch'"),
])
def test_bad_flags_give_one_clear_line(args, message):
    out = run_cli(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swa-backends: error:") and message in lines[0], out.stderr


def test_config_takes_several_pairs_after_one_flag(capsys):
    """README's own example: ``--config pcp=2 graph_mode=none`` (and the repeated form)."""
    assert main(["info", "--device", "cuda:sm90", "--config", "pcp=2", "graph_mode=none", "--json"]) == 0
    one_flag = json.loads(capsys.readouterr().out)
    assert main(["info", "--device", "cuda:sm90", "--config", "pcp=2", "--config", "graph_mode=none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == one_flag
    caps = sb.capabilities("cuda:sm90", config={"prefill_context_parallel_size": 2, "graph_mode": "none"})
    assert one_flag["capabilities"]["encoder_replay"]["reasons"] == list(caps.encoder_replay.reasons)
    assert not any("[pcp-eager]" in r for r in caps.encoder_replay.reasons)  # graph_mode=none was applied
    assert any("[pcp-sync]" in r for r in caps.encoder_replay.reasons)  # and pcp=2


def test_info_text_is_the_explanations_own_rendering(capsys):
    """``info --all`` prints ``str(explain(device))``: one renderer for the CLI and the API."""
    for device in ("cuda:sm90", "ascend:910b", "cpu"):
        assert main(["info", "--device", device, "--all"]) == 0
        assert capsys.readouterr().out == str(sb.explain(device)) + "\n"
        assert main(["info", "--device", device]) == 0
        out = capsys.readouterr().out
        assert out.startswith(str(sb.capabilities(device)) + "\n\n")
        assert "every variant:" not in out
