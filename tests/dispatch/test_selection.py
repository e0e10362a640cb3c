"""Selection, capabilities and the matrix loader, with fake devices (SPEC §4, STYLE 2-4)."""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

import swa_backends as sb
from swa_backends import dispatch
from swa_backends.common import registry
from swa_backends.common.matrix import parse_matrix
from swa_backends.dispatch import load_matrix
from swa_backends.common.registry import Variant

MATRIX = load_matrix()
ROW_DEVICES = {row.id: (f"{row.platform}:{row.arch}" if row.platform != "cpu" else "cpu") for row in MATRIX.rows.values()}
REQUIRED_ROWS = {"cpu", "cuda:sm80", "cuda:sm89", "cuda:sm90", "cuda:sm100", "cuda:sm120", "rocm:gfx942",
                 "rocm:gfx950", "ascend:910b", "ascend:910_93"}


def test_matrix_has_every_required_row():
    assert REQUIRED_ROWS <= set(MATRIX.rows)


@pytest.mark.parametrize("row_id", sorted(ROW_DEVICES))
def test_every_row_selects_variants_it_allows(row_id):
    row = MATRIX.rows[row_id]
    dev = sb.parse_device(ROW_DEVICES[row_id]) if row.platform != "cpu" else sb.parse_device("cpu")
    backend = sb.select(dev)
    assert backend.capabilities.row == row_id and backend.capabilities.fallback is None
    for op, names in backend.variants.items():
        assert names, op
        for name in names:
            assert name in row.allowed(op), (op, name)
            v = dispatch.variant(op, name)
            assert not v.declared_reasons(dev)
    # with the serving defaults both sides follow the row's gates
    caps = backend.capabilities
    assert caps.encoder_replay.enabled == row.gates["encoder_replay"].enabled
    if caps.encoder_replay.enabled:
        assert caps.decoder_replay.enabled == (row.gates["decoder_replay"].enabled and row.platform != "ascend")


def test_explain_lists_every_declared_variant_with_reasons():
    e = sb.explain("rocm:gfx942")
    listed = {(c.op, c.variant) for c in e.table}
    for op in sb.OPS:
        assert (op, "reference") in listed
    for c in e.table:
        assert c.status in ("chosen", "per-call", "eligible", "rejected")
        assert (c.status == "rejected") == bool(c.reasons)


@pytest.mark.parametrize("device, self_checked", [("cuda:sm90", True), ("rocm:gfx942", False)])
def test_explain_lists_the_self_checked_form_where_a_validated_call_takes_it(monkeypatch, device, self_checked):
    # ROCm's FP8 input check for gather_rows is not among the quick host checks: its validated
    # calls are validated on the host, and explain() must not list the self-checked form there
    pytest.importorskip("triton")
    from swa_backends.kernels import rows

    calls = []
    form = rows.gather_rows_checked
    monkeypatch.setattr(rows, "gather_rows_checked", lambda *a, **k: calls.append(1) or form(*a, **k))
    registry.override_probe("triton", None)  # the faked GPU's kernels, in this process's interpreter
    try:
        be = sb.select(device)
        assert be.variants["gather_rows"] == ("triton",)
        x = torch.randn(8, 16, dtype=torch.bfloat16)
        assert torch.equal(be.gather_rows(x, torch.tensor([1, 3, 5])), x[[1, 3, 5]])
    finally:
        registry.clear_probes()
    assert bool(calls) == self_checked
    row = next(c for c in be.explain().table if c.op == "gather_rows" and c.variant == "triton")
    assert any("own kernel tests the values" in line for line in row.checks) == self_checked


def test_unknown_device_falls_back_to_reference_with_reason():
    for dev in ("cuda:sm75", "rocm:gfx1100", "ascend:310p"):
        b = sb.select(dev)
        assert set(n for names in b.variants.values() for n in names) == {"reference"}
        assert "no row for" in b.capabilities.fallback
        assert b.capabilities.row is None


@pytest.mark.parametrize("prefer", ["triton", {"gather_rows": "triton"}])
def test_a_device_without_a_row_runs_the_reference_whatever_is_preferred(prefer):
    # the fallback says the reference runs there: prefer= cannot put a variant no row lists in front
    for dev in ("cuda:sm75", "rocm:gfx90a"):
        with pytest.raises(sb.SelectionError, match="no matrix.yaml row for .*: only the reference runs there"):
            sb.select(dev, prefer=prefer)
        e = sb.explain(dev)
        assert all(c.variant == "reference" for c in e.table)
    assert set(sb.select("cuda:sm75", prefer="reference").variants.values()) == {("reference",)}


def test_fake_device_parsing():
    assert sb.parse_device("rocm:gfx942").arch == "gfx942"
    assert sb.parse_device("ascend:910b").arch == "910b"
    assert sb.parse_device("ascend:910_93").arch == "910_93"
    assert sb.parse_device("cuda:9.0").capability == (9, 0)
    assert sb.parse_device("cuda:sm100").capability == (10, 0)
    assert sb.parse_device("cuda:sm_120").arch == "sm120"
    for bad in ("tpu:v5", "cuda", "cuda:smX", ""):
        with pytest.raises(ValueError, match="device="):
            sb.parse_device(bad)


def test_a_rocm_arch_as_torch_reports_it_names_the_same_device():
    """``gcnArchName`` carries feature flags (``gfx942:sramecc+:xnack-``): the arch is the part before
    them, as detection reads it; on another platform they are refused, saying so (every such spec
    was "expected platform[:arch] with platform in ...", though its platform was one)."""
    for spec in ("rocm:gfx942:sramecc+:xnack-", "rocm:gfx942:xnack+", "ROCm:GFX942:sramecc-"):
        assert sb.parse_device(spec) == sb.parse_device("rocm:gfx942")
    assert sb.select("rocm:gfx950:sramecc+:xnack-").capabilities.row == "rocm:gfx950"
    with pytest.raises(ValueError, match=r"device='ascend:910b:xnack-': expected ascend:<arch> \(e.g. ascend:910b\) "
                                         r"without ':xnack-'"):
        sb.parse_device("ascend:910b:xnack-")
    for bad, says in (("cuda:sm90:xnack-", "expected a CUDA arch like sm90"), ("cpu:xnack-", "expected 'cpu'")):
        with pytest.raises(ValueError, match=f"device='{bad}': {says}"):
            sb.parse_device(bad)


def test_fake_device_context_changes_current_device():
    with sb.fake_device("rocm:gfx950") as d:
        assert sb.current_device() is d
        assert sb.select().device.arch == "gfx950"
    assert sb.current_device().platform in ("cpu", "cuda", "rocm", "ascend")


def test_rocm_and_ascend_arch_parsing():
    from swa_backends.backends.ascend.device import ascend_arch
    from swa_backends.backends.rocm.device import rocm_arch

    assert rocm_arch("gfx942:sramecc+:xnack-") == "gfx942"
    assert rocm_arch("gfx950") == "gfx950"
    assert ascend_arch(223)[0] == "910b"
    assert ascend_arch(251)[0] == "910_93"
    assert ascend_arch(202)[0] == "310p"
    assert ascend_arch(260)[0] == "950"
    assert ascend_arch(999)[0] == "soc999"


# --- capability rules (SPEC §4) ------------------------------------------------------------

# (device, a config where the side is on, the change that turns the rule on, side, rule id,
# what its reason must say). Every rule of matrix.yaml appears at least once.
PCP_ON = dict(prefill_context_parallel_size=2, graph_mode="none", async_scheduling=False)
ASCEND_ON = dict(graph_mode="none")
DSPARK = dict(drafter="dspark", drafter_window=128)
RULE_CASES = [
    ("cuda:sm90", {}, dict(model_runner="v1"), "encoder", "runner", "model_runner=v1"),
    ("cuda:sm90", {}, dict(decode_context_parallel_size=2), "encoder", "dcp", "decode_context_parallel_size=2"),
    ("rocm:gfx942", dict(graph_mode="none", async_scheduling=False), dict(prefill_context_parallel_size=2), "encoder",
     "pcp-platform", "platform=rocm"),
    ("cuda:sm90", PCP_ON, dict(graph_mode="piecewise"), "encoder", "pcp-eager", "graph_mode=piecewise"),
    ("cuda:sm90", PCP_ON, dict(async_scheduling=True), "encoder", "pcp-sync", "async_scheduling=True"),
    ("cuda:sm90", PCP_ON, dict(pipeline_parallel_size=2), "encoder", "pcp-pp", "got 2"),
    ("cuda:sm90", PCP_ON, dict(data_parallel_size=2), "encoder", "pcp-dp", "got 2"),
    ("cuda:sm90", PCP_ON, dict(kv_connector=True), "encoder", "pcp-connector", "kv_connector=True"),
    ("cuda:sm90", PCP_ON, DSPARK, "encoder", "pcp-drafter", "drafter=dspark"),
    ("cuda:sm90", PCP_ON, dict(drafter="ngram"), "encoder", "pcp-drafter", "drafter=ngram"),
    ("cuda:sm90", PCP_ON, dict(microbatching=True), "encoder", "pcp-microbatching", "microbatching=True"),
    ("cuda:sm90", PCP_ON, dict(mega_moe=True), "encoder", "pcp-megamoe", "mega_moe=True"),
    ("ascend:910b", dict(kv_connector=True), dict(kv_connector_owns_scheduling=True), "encoder", "ascend-connector",
     "kv_connector_owns_scheduling=True"),
    ("cuda:sm90", {}, dict(stage_holds_all_layers_after_cut=False), "decoder", "stage-layers",
     "stage_holds_all_layers_after_cut=False"),
    ("cuda:sm90", {}, dict(sequence_parallel_moe=True), "decoder", "sp-moe", "sequence_parallel_moe=True"),
    ("ascend:910b", dict(ASCEND_ON, dsa_context_parallel=False), dict(sequence_parallel_moe=True), "decoder",
     "sp-moe-ascend", "dsa_context_parallel=False"),
    ("cuda:sm90", dict(graph_mode="none", async_scheduling=False), dict(prefill_context_parallel_size=2), "decoder",
     "pcp", "prefill_context_parallel_size=2"),
    ("cuda:sm90", {}, dict(microbatching=True), "decoder", "microbatching", "microbatching=True"),
    ("ascend:910b", ASCEND_ON, dict(microbatching=True), "decoder", "microbatching", "microbatching=True"),
    ("cuda:sm90", {}, dict(engram_after_cut=True), "decoder", "engram", "engram_after_cut=True"),
    ("ascend:910b", ASCEND_ON, dict(engram_after_cut=True), "decoder", "engram", "engram_after_cut=True"),
    ("cuda:sm90", DSPARK, dict(drafter_window=256), "decoder", "drafter-window",
     "drafter window 256 is wider than W=128"),
    ("ascend:910b", dict(ASCEND_ON, **DSPARK), dict(drafter_window=129), "decoder", "drafter-window",
     "drafter window 129 is wider than W=128"),
    ("cuda:sm90", dict(drafter="ngram"), dict(drafter="mtp"), "decoder", "drafter-window-unknown",
     "the mtp drafter's window is unknown"),
    ("ascend:910b", dict(ASCEND_ON, **DSPARK), dict(drafter_window=None), "decoder", "drafter-window-unknown",
     "the dspark drafter's window is unknown"),
    ("cuda:sm90", dict(DSPARK, drafter_aux_layers=(25,), cut_layer=20), dict(drafter_aux_layers=(2, 30)), "decoder",
     "drafter-aux", "(2, 30) include a layer at or before the cut 20"),
    ("ascend:910_93", ASCEND_ON, dict(lora=True), "decoder", "ascend-lora", "lora=True"),
    ("ascend:910b", dict(graph_mode="decode_only"), dict(graph_mode="piecewise"), "decoder", "ascend-graph",
     "graph_mode=piecewise"),
    ("ascend:910b", ASCEND_ON, dict(model_runner="v1"), "decoder", "ascend-runner", "model_runner=v1"),
    ("ascend:910b", ASCEND_ON, dict(pipeline_parallel_size=2), "decoder", "ascend-pp", "pipeline_parallel_size=2"),
    ("ascend:910_93", ASCEND_ON, dict(decode_context_parallel_size=2), "decoder", "ascend-dcp",
     "decode_context_parallel_size=2"),
    ("ascend:910b", ASCEND_ON, dict(prefill_context_parallel_size=2), "decoder", "pcp",
     "prefill_context_parallel_size=2"),
    ("ascend:910b", dict(ASCEND_ON, **DSPARK), dict(drafter="eagle"), "decoder", "ascend-drafter", "drafter=eagle"),
    ("ascend:910b", dict(ASCEND_ON, **DSPARK), dict(drafter="mtp"), "decoder", "ascend-drafter", "drafter=mtp"),
]


def _rule_reasons(decision):
    """The decision's rule reasons (the row gates, the clamp check and needs-encoder aside)."""
    return [r for r in decision.reasons if not r.startswith(("[matrix:", "[clamp]", "[needs-encoder]"))]


@pytest.mark.parametrize("device, on, change, side, rule, says", RULE_CASES,
                         ids=[f"{c[4]}@{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[2].items())}" for c in RULE_CASES])
def test_each_rule_both_ways(device, on, change, side, rule, says):
    """Without the change the side is on; with it, off with exactly this rule's reason, which
    names the value (and decoder replay follows encoder replay)."""
    before = sb.capabilities(device, config=sb.ServingConfig(**on))
    assert before.encoder_replay.enabled, before.encoder_replay.reasons
    if side == "decoder":
        assert before.decoder_replay.enabled, before.decoder_replay.reasons
    after = sb.capabilities(device, config=sb.ServingConfig(**{**on, **change}))
    decision = after.encoder_replay if side == "encoder" else after.decoder_replay
    assert not decision.enabled
    (reason,) = _rule_reasons(decision)
    assert reason.startswith(f"[{rule}] ") and says in reason, reason
    if side == "encoder":
        assert not after.decoder_replay.enabled
        assert any(r.startswith("[needs-encoder]") for r in after.decoder_replay.reasons)
    elif not after.encoder_replay.enabled:  # the change also turned encoder replay off (DCP, PCP off CUDA)
        assert any(r.startswith("[needs-encoder]") for r in after.decoder_replay.reasons)


def test_every_rule_has_a_case():
    assert {rule.id for side in MATRIX.rules.values() for rule in side} == {c[4] for c in RULE_CASES}


def test_capabilities_ascend_decoder_off_with_v1_and_with_pp2():
    """vllm-ascend's gate: model runner v2 only, no pipeline parallel (issue: both used to say on)."""
    for config in (dict(model_runner="v1"), dict(pipeline_parallel_size=2)):
        caps = sb.capabilities("ascend:910b", config=sb.ServingConfig(graph_mode="decode_only", **config))
        assert caps.encoder_replay.enabled and not caps.decoder_replay.enabled, caps.decoder_replay.reasons


@pytest.mark.parametrize("change", [dict(kv_connector=True), DSPARK, dict(drafter="ngram"), dict(mega_moe=True),
                                    dict(kv_connector=True, kv_connector_owns_scheduling=True)])
def test_pcp_only_restrictions_leave_encoder_on_without_pcp(change):
    caps = sb.capabilities("cuda:sm90", config=sb.ServingConfig(**change))
    assert caps.encoder_replay.enabled, caps.encoder_replay.reasons
    assert caps.decoder_replay.enabled, caps.decoder_replay.reasons


@pytest.mark.parametrize("change", [c[2] for c in RULE_CASES if c[4].startswith("ascend-")],
                         ids=[c[4] for c in RULE_CASES if c[4].startswith("ascend-")])
def test_ascend_rules_apply_only_on_ascend(change):
    config = sb.ServingConfig(**{**DSPARK, "kv_connector": True, **change})
    for device in ("cuda:sm90", "rocm:gfx950", "cpu"):
        caps = sb.capabilities(device, config=config)
        reasons = caps.encoder_replay.reasons + caps.decoder_replay.reasons
        assert not any(r.startswith("[ascend-") for r in reasons), (device, reasons)


def test_pcp_allowed_on_cuda_eager_sync_with_decoder_off():
    caps = sb.capabilities("cuda:sm90", config=sb.ServingConfig(prefill_context_parallel_size=4, graph_mode="none",
                                                                async_scheduling=False))
    assert caps.encoder_replay.enabled
    assert not caps.decoder_replay.enabled and caps.decoder_replay.reasons[0].startswith("[pcp]")


def test_rules_that_do_not_apply_leave_both_sides_on():
    ok = sb.ServingConfig(drafter="dspark", drafter_window=128, drafter_aux_layers=(25,), cut_layer=20,
                          sequence_parallel_moe=False)
    caps = sb.capabilities("cuda:sm90", config=ok)
    assert caps.encoder_replay.enabled and caps.decoder_replay.enabled
    assert caps.encoder_replay.notes and not caps.encoder_replay.reasons
    asc = sb.capabilities("ascend:910b", config=sb.ServingConfig(graph_mode="decode_only", sequence_parallel_moe=True,
                                                                 dsa_context_parallel=True))
    assert asc.decoder_replay.enabled, asc.decoder_replay.reasons
    # vllm-ascend's supported set: model runner v2, graph mode none or decode-only, DSpark drafting
    # with a window at most W, a KV connector that does not own scheduling
    for graph in ("none", "decode_only"):
        asc = sb.capabilities("ascend:910_93", config=sb.ServingConfig(
            model_runner="v2", graph_mode=graph, drafter="dspark", drafter_window=128, kv_connector=True))
        assert asc.encoder_replay.enabled and asc.decoder_replay.enabled, asc.decoder_replay.reasons


def test_config_validation_and_strings():
    with pytest.raises(ValueError, match="ServingConfig: graph_mode"):
        sb.ServingConfig(graph_mode="sometimes")
    with pytest.raises(ValueError, match="ServingConfig: cut_layer"):
        sb.ServingConfig(drafter="dspark", drafter_aux_layers=(3,))
    with pytest.raises(ValueError, match=r"ServingConfig: drafter='medusa': expected one of \('none', 'dspark'"):
        sb.ServingConfig(drafter="medusa")
    with pytest.raises(ValueError, match=r"ServingConfig: drafter=None: expected one of"):
        sb.ServingConfig(drafter=None)
    for orphan in (dict(drafter_window=128), dict(drafter_aux_layers=(3,), cut_layer=20)):
        with pytest.raises(ValueError, match="ServingConfig: drafter='none': expected the drafter's kind"):
            sb.ServingConfig(**orphan)
    with pytest.raises(ValueError, match="ServingConfig: kv_connector=False: expected True when "
                                         "kv_connector_owns_scheduling=True"):
        sb.ServingConfig(kv_connector_owns_scheduling=True)
    with pytest.raises(ValueError, match="ServingConfig: mega_moe=1: expected a bool"):
        sb.ServingConfig(mega_moe=1)
    c = sb.ServingConfig.from_strings(["drafter=dspark", "drafter_window=128", "mega_moe=true", "kv_connector=yes"])
    assert (c.drafter, c.drafter_window, c.mega_moe, c.kv_connector) == ("dspark", 128, True, True)
    with pytest.raises(ValueError, match="ServingConfig: drafter='Dspark'"):
        sb.ServingConfig.from_strings(["drafter=Dspark"])
    c = sb.ServingConfig.from_strings(["pcp=4", "graph_mode=none", "lora=true", "drafter=eagle3",
                                       "drafter_aux_layers=1,2", "cut_layer=9"])
    assert (c.prefill_context_parallel_size, c.graph_mode, c.lora, c.drafter_aux_layers) == (4, "none", True, (1, 2))
    with pytest.raises(ValueError, match="config"):
        sb.ServingConfig.from_strings(["nonsense=1"])
    assert sb.capabilities("cpu", config={"decode_context_parallel_size": 2}).encoder_replay.enabled is False


@pytest.mark.parametrize("fn", [sb.capabilities, sb.explain, sb.select])
@pytest.mark.parametrize("config, says", [({"bogus": 1}, "not 'bogus'"), ({1: 1}, "not 1"),
                                          ({"pcp": 2}, "'pcp' is --config's short name of prefill_context_parallel_size")])
def test_config_mapping_with_a_key_that_is_no_field_is_a_value_error(fn, config, says):
    """A config mapping's keys are ServingConfig's field names: another key is the ValueError
    naming ``config``, the key and every field (``ServingConfig(**config)`` raised TypeError)."""
    with pytest.raises(ValueError, match=r": config=\{.*: expected ServingConfig field names as keys, ") as err:
        fn("cpu", config=config)
    assert says in str(err.value) and "'prefill_context_parallel_size'" in str(err.value)


# --- variants, probes, prefer --------------------------------------------------------------

def _fake_variant(**kw):
    base = dict(op="gather_rows", name="fakevendor", impl="swa_backends.common.ops.rows:gather_rows",
                platforms=("cuda",), requires=("fakevendor_pkg",))
    base.update(kw)
    return Variant(**base)


def test_reasons_name_value_and_limit():
    v = _fake_variant(archs=("sm90", "sm100"), min_capability=(9, 0))
    why = v.declared_reasons(sb.parse_device("cuda:sm89"))
    assert "requires arch in (sm90, sm100), device has sm89" in why
    assert "requires capability >= (9, 0), device has (8, 9) (too old)" in why
    assert v.declared_reasons(sb.parse_device("rocm:gfx942")) == ["requires platform in (cuda), device is rocm"]


def test_broken_vendor_import_becomes_a_reason(monkeypatch, tmp_path):
    pkg = tmp_path / "fakevendor_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise OSError('libhccl.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    @registry.register_probe("fakevendor_pkg")
    def _probe():
        return registry.import_reason("fakevendor_pkg", what="FakeVendor")

    try:
        why = _fake_variant().not_supported_reasons(sb.parse_device("cuda:sm90"))
        assert why == ["FakeVendor: import fakevendor_pkg failed: OSError: libhccl.so: cannot open shared object file"]
        # the wrong package with the right name: missing attribute is a reason too
        (pkg / "__init__.py").write_text("x = 1\n")
        sys.modules.pop("fakevendor_pkg", None)
        assert "has no attribute" in registry.import_reason("fakevendor_pkg", attr="ops")
        registry.override_probe("fakevendor_pkg", None)
        assert _fake_variant().not_supported_reasons(sb.parse_device("cuda:sm90")) == []
    finally:
        registry.clear_probes()
        registry._PROBES.pop("fakevendor_pkg", None)
        sys.modules.pop("fakevendor_pkg", None)


def test_probes_and_vendor_imports_run_one_at_a_time():
    # two threads' first select() imported Triton at once through two probes; one import saw a
    # partially initialised module, and that reason was kept for the process (an audit, 2026-12-06)
    import threading
    import time

    active, most = [0], [0]
    guard = threading.Lock()

    def slow():
        with guard:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.02)
        with guard:
            active[0] -= 1
        return None

    names = ("slow_probe_a", "slow_probe_b")
    for name in names:
        registry.register_probe(name)(slow)
    try:
        threads = [threading.Thread(target=registry.probe, args=(names[i % 2],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert most[0] == 1
        # a vendor import outside a probe waits for the probe in flight as well
        with registry._PROBE_LOCK:
            t = threading.Thread(target=registry.import_reason, args=("json",))
            t.start()
            t.join(0.2)
            assert t.is_alive()
        t.join(5)
        assert not t.is_alive()
    finally:
        for name in names:
            registry._PROBES.pop(name, None)


def test_probe_never_raises_and_unknown_probe_is_a_reason():
    @registry.register_probe("explodes")
    def _boom():
        raise RuntimeError("bad install")

    try:
        assert registry.probe("explodes") == "probe explodes failed: RuntimeError: bad install"
        assert "no probe registered" in registry.probe("never-registered")
    finally:
        registry._PROBES.pop("explodes", None)


def test_foreign_platform_probes_are_not_run():
    calls = []

    @registry.register_probe("counting")
    def _count():
        calls.append(1)
        return None

    try:
        _fake_variant(requires=("counting",)).not_supported_reasons(sb.parse_device("rocm:gfx942"))
        assert calls == []
    finally:
        registry._PROBES.pop("counting", None)


def test_prefer_errors():
    with pytest.raises(ValueError, match="select: prefer"):
        sb.select("cpu", prefer="no-such-variant")
    with pytest.raises(ValueError, match="select: prefer"):
        sb.select("cpu", prefer={"not_an_op": "reference"})
    with pytest.raises(ValueError, match=r"select: prefer\['gather_rows'\]"):
        sb.select("cpu", prefer={"gather_rows": "nope"})
    assert sb.select("cpu", prefer="reference").variants["sparse_mla"] == ("reference",)


def test_import_has_no_side_effects_and_no_vendor_import():
    code = (
        "import os, sys; before = dict(os.environ); import swa_backends, swa_backends.backends.cuda, "
        "swa_backends.backends.rocm, swa_backends.backends.ascend, swa_backends.kernels;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('triton','flashinfer','aiter','torch_npu','vllm','vllm_ascend','flash_mla','_swa_claunch')];"
        "assert not bad, bad; assert dict(os.environ) == before; "
        "swa_backends.capabilities('rocm:gfx950'); swa_backends.explain('ascend:910b');"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('flashinfer','torch_npu','vllm_ascend')];"
        "assert not bad, bad; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# --- the matrix loader ---------------------------------------------------------------------

def _raw():
    import importlib.resources

    return yaml.safe_load(importlib.resources.files("swa_backends").joinpath("matrix.yaml").read_text())


def _broken(mutate):
    data = copy.deepcopy(_raw())
    mutate(data)
    return data


def _row(data, rid):
    return next(r for r in data["rows"] if (r["platform"] if r["platform"] == "cpu" else f"{r['platform']}:{r['arch']}") == rid)


LOADER_CASES = [
    (lambda d: _row(d, "cuda:sm90")["variants"].update({"*": ["nonexistent"]}), "unknown variant 'nonexistent'"),
    (lambda d: _row(d, "cuda:sm90").update(arch="sm91"), "unknown arch 'sm91'"),
    (lambda d: _row(d, "cuda:sm90").update(platform="tpu"), "unknown platform 'tpu'"),
    (lambda d: _row(d, "cuda:sm90")["variants"].update({"not_an_op": ["reference"]}), "unknown op 'not_an_op'"),
    (lambda d: _row(d, "cuda:sm90")["verified"].update(reference="works-on-my-machine"), "status 'works-on-my-machine'"),
    (lambda d: _row(d, "cuda:sm90").update(colour="red"), "unknown key(s) ['colour']"),
    (lambda d: d["encoder_replay"].append({"id": "x", "when": {"pcp": 2}, "reason": "r"}), "unknown field 'pcp'"),
    (lambda d: d["encoder_replay"].append({"id": "runner", "when": {"lora": True}, "reason": "r"}), "id 'runner'"),
    (lambda d: d["rows"].append(copy.deepcopy(_row(d, "cpu"))), "duplicate platform/arch"),
    (lambda d: d["decoder_replay"].append({"id": "y", "when": {"lora": {"around": 1}}, "reason": "r"}), "predicate"),
    # fail closed: every rule is type-checked at load time, not when it first applies
    (lambda d: d["encoder_replay"].append({"id": "z", "when": {"lora": "yes"}, "reason": "r"}), "expected true or false"),
    (lambda d: d["encoder_replay"].append({"id": "z", "when": {"graph_mode": "fast"}, "reason": "r"}),
     "expected one of ['none'"),
    (lambda d: d["encoder_replay"].append({"id": "z", "when": {"lora": {"gt": 1}}, "reason": "r"}), "compares numbers"),
    (lambda d: d["encoder_replay"].append({"id": "z", "when": {"prefill_context_parallel_size": {"gt": "1"}},
                                           "reason": "r"}), "expected an integer"),
    (lambda d: d["encoder_replay"].append({"id": "z", "when": {"lora": True}, "reason": "{lora.__class__}"}),
     "is not a rule field"),
    (lambda d: d["encoder_replay"].append({"id": "z", "when": {"lora": True}, "reason": "{0}"}), "is not a rule field"),
    (lambda d: d["encoder_replay"].append({"id": "z", "when": {"lora": True}, "reason": "{lora!r}"}),
     "conversions are not allowed"),
    (lambda d: d.update(version=True), "version"),
    # a row allows every op its reference (the variant that runs everywhere), else select() fails there
    (lambda d: _row(d, "cpu").update(variants={"sparse_mla": ["reference"]}, verified={"reference": "hardware"}),
     "row 'cpu': variants: no list for batch_replay_start and no '*': every op needs its 'reference' variant"),
    (lambda d: _row(d, "cuda:sm90")["variants"].update({"sparse_mla": ["gluon_ws", "triton"]}),
     "row 'cuda:sm90': variants['sparse_mla']: sparse_mla without its 'reference' variant (['gluon_ws', 'triton'])"),
    (lambda d: _row(d, "rocm:gfx942").update(variants={"*": ["triton"]}, verified={"triton": "emulated"}),
     "row 'rocm:gfx942': variants['*']: batch_replay_start without its 'reference' variant"),
    # an arch predicate names a registered platform's arch: a misspelt one would never match (fail open)
    (lambda d: d["decoder_replay"].append({"id": "z", "when": {"arch": "gfx-942"}, "reason": "r"}),
     "(z): arch: eq 'gfx-942': expected one of ['cpu', 'sm70'"),
    (lambda d: d["decoder_replay"].append({"id": "z", "when": {"arch": {"ne": "sm_90"}}, "reason": "r"}),
     "(z): arch: ne 'sm_90': expected one of"),
    (lambda d: d["decoder_replay"].append({"id": "z", "when": {"arch": {"in": ["gfx942", "gfx951"]}}, "reason": "r"}),
     "(z): arch: in ['gfx942', 'gfx951']: expected one of"),
    (lambda d: d["decoder_replay"].append({"id": "z", "when": {"arch": {"not_in": ["910B"]}}, "reason": "r"}),
     "(z): arch: not_in ['910B']: expected one of"),
    (lambda d: _row(d, "ascend:910b").update(arch=910), "expected strings"),
]


def test_loader_rejects_duplicate_keys():
    """One appended line must not override a rule or a gate (plain YAML keeps the last key)."""
    import importlib.resources

    from swa_backends.common.matrix import read_yaml

    text = importlib.resources.files("swa_backends").joinpath("matrix.yaml").read_text()
    dup = text.replace("    when: {decode_context_parallel_size: {gt: 1}}",
                       "    when: {decode_context_parallel_size: {gt: 1}}\n    when: {decode_context_parallel_size: {gt: 8}}")
    assert dup != text
    with pytest.raises(sb.MatrixError, match="duplicate key 'when' at line"):
        read_yaml(dup, "dup.yaml")
    read_yaml(text, "matrix.yaml")


def test_matrix_is_immutable_and_its_lookups_thread_safe():
    import threading

    m = load_matrix()
    found = []
    threads = [threading.Thread(target=lambda: found.append(m.row_for(sb.parse_device("rocm:gfx942")))) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(found) == 32 and all(r is not None and r.id == "rocm:gfx942" for r in found)
    with pytest.raises(TypeError):
        m._by_arch[("cuda", "sm99")] = None


@pytest.mark.parametrize("mutate, message", LOADER_CASES, ids=[c[1][:30] for c in LOADER_CASES])
def test_loader_rejects_with_precise_error(mutate, message):
    with pytest.raises(sb.MatrixError) as err:
        parse_matrix(_broken(mutate), "test.yaml", dispatch.all_variants())
    assert message in str(err.value)
    assert str(err.value).startswith("test.yaml: ")


def test_loader_refuses_to_widen_a_declaration(monkeypatch):
    narrow = _fake_variant(name="sm90only", platforms=("cuda",), archs=("sm90",), requires=())
    table = {op: dict(vs) for op, vs in dispatch.all_variants().items()}
    table["gather_rows"]["sm90only"] = narrow
    data = _broken(lambda d: _row(d, "cuda:sm80")["variants"].update({"gather_rows": ["sm90only", "reference"]}))
    with pytest.raises(sb.MatrixError, match="would widen its declaration"):
        parse_matrix(data, "test.yaml", table)
    ok = _broken(lambda d: _row(d, "cuda:sm90")["variants"].update({"gather_rows": ["sm90only", "reference"]}))
    parse_matrix(ok, "test.yaml", table)


def test_row_gate_off_is_a_reason(tmp_path):
    data = _broken(lambda d: _row(d, "rocm:gfx942").update(
        encoder_replay={"enabled": False, "because": "no clamping prefill path here"}))
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    caps = sb.capabilities("rocm:gfx942", matrix=str(path))
    assert not caps.encoder_replay.enabled
    assert caps.encoder_replay.reasons == ("[matrix:rocm:gfx942] no clamping prefill path here",)


def test_unclamped_attention_path_turns_encoder_off(monkeypatch):
    unclamped = Variant(op="sparse_mla", name="maskmode4", impl="swa_backends.common.ops.sparse_mla:reference",
                        platforms=("cpu",), clamps_window=False, index_layout="plain")
    table = {op: dict(vs) for op, vs in dispatch.all_variants().items()}
    table["sparse_mla"]["maskmode4"] = unclamped
    import swa_backends.dispatch as dsp

    monkeypatch.setattr(dsp, "all_variants", lambda: table)
    monkeypatch.setattr(dsp, "variant", lambda op, name: table.get(op, {}).get(name))
    def only_maskmode4(d):
        row = _row(d, "cpu")
        row["variants"].update({"sparse_mla": ["maskmode4", "reference"]})
        row["verified"] = {k: v for k, v in row["verified"].items() if k == "reference"}  # keep the row consistent

    data = _broken(only_maskmode4)
    monkeypatch.setattr(dsp, "priority", lambda platform, op: ("maskmode4", "reference") if op == "sparse_mla" else ("reference",))
    caps = sb.capabilities("cpu", matrix=parse_matrix(data, "t.yaml", table))
    assert not caps.encoder_replay.enabled
    assert any("sparse_mla/maskmode4 reads its window without the replay-start clamp" in r
               for r in caps.encoder_replay.reasons)


@pytest.mark.parametrize("prefer", [None, "triton"])
def test_unchecked_backend_never_validates_and_gives_the_same_results(prefer):
    """``select(checked=False)``: no op validates (the process switch stays on); valid
    inputs give what a checked backend gives, for single-variant and per-call chains alike."""
    from swa_backends import validation_enabled
    from swa_backends.testing.conformance import case_for

    checked, unchecked = sb.select("cpu", prefer=prefer), sb.select("cpu", prefer=prefer, checked=False)
    assert checked.checked and not unchecked.checked and validation_enabled()
    rng = np.random.default_rng(3)
    for op in ("swa_indices_and_lens", "prefill_gather_lens", "pad_replayed_slots", "sparse_mla"):
        args, kw = case_for(op, rng, "cpu", poison=False)
        clone = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
        a = getattr(checked, op)(*[clone(x) for x in args], **kw)
        b = getattr(unchecked, op)(*[clone(x) for x in args], **kw)
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert (x is None and y is None) or torch.equal(x, y), op
    bad = (torch.tensor([-2, 1], dtype=torch.int32), torch.tensor([3], dtype=torch.int32),
           torch.tensor([0], dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="prefill_gather_lens: query_start_loc"):
        checked.prefill_gather_lens(*bad)
    assert unchecked.prefill_gather_lens(*bad).tolist() == [3]
    # and each backend's explain() says which it is
    assert checked.explain().checked and checked.explain().as_dict()["checked"] is True
    assert "validation: on while the thread's switch is on" in str(checked.explain())
    assert not unchecked.explain().checked and unchecked.explain().as_dict()["checked"] is False
    assert "validation: never" in str(unchecked.explain()) and "(select(checked=False))" in str(unchecked.explain())


def test_backend_for_caches_per_device_and_settings():
    """``dispatch.backend_for``: one backend per (device, prefer, checked) for the process (the
    custom ops and the vLLM integration share it); ``clear_backends`` forgets them."""
    from swa_backends.dispatch import backend_for, clear_backends

    a = backend_for("cpu")
    assert backend_for(torch.device("cpu")) is a and a.checked
    b = backend_for("cpu", checked=False)
    assert b is not a and not b.checked and backend_for("cpu", checked=False) is b
    c = backend_for("cpu", prefer="triton")
    assert c.variants["swa_indices_and_lens"] == ("triton",) and c is not a
    clear_backends()
    assert backend_for("cpu") is not a


def test_backend_for_answers_a_device_seen_before_from_one_read(monkeypatch):
    """The custom ops ask ``backend_for`` on every call: the arguments it has answered before (a
    device with its index or the host, no preference or a name, a bool ``checked``) are answered
    without parsing them again; a ``checked`` of 1, equal to True as a key, is still refused."""
    from swa_backends import dispatch

    dispatch.clear_backends()
    try:
        dev = torch.device("cpu")
        a = dispatch.backend_for(dev)
        t = dispatch.backend_for(dev, prefer="triton")

        def parsed(*args, **kwargs):
            raise AssertionError("parsed again")

        monkeypatch.setattr(dispatch, "_normalise_prefer", parsed)
        assert dispatch.backend_for(dev) is a and dispatch.backend_for(dev, prefer="triton") is t
        with pytest.raises(ValueError, match="checked=1: expected a bool"):
            dispatch.backend_for(dev, checked=1)
    finally:
        dispatch.clear_backends()


@pytest.fixture
def two_gpus(monkeypatch):
    """torch.cuda as two sm90 GPUs (``current[0]``: the current one, as ``torch.cuda.set_device``
    sets it); detection's caches cleared before and after."""
    import types

    from swa_backends.common.device import clear_cache
    from swa_backends.dispatch import clear_backends

    current = [0]
    props = types.SimpleNamespace(major=9, minor=0, name="fake H100", L2_cache_size=50 << 20)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.version, "hip", None)
    clear_cache()
    clear_backends()
    yield current
    clear_cache()
    clear_backends()


def test_the_current_gpu_is_read_on_every_call(two_gpus):
    """Detection is cached per index, the current index read before any cache: after
    ``torch.cuda.set_device(1)``, ``"cuda"`` and None are cuda:1 (a cache of the first current GPU
    kept cuda:0, and validated calls then wanted their tensors there)."""
    from swa_backends.dispatch import backend_for

    for i in (0, 1, 0, 1):
        two_gpus[0] = i
        assert sb.select("cuda").device.torch_device == f"cuda:{i}"
        assert sb.select(None).device.torch_device == f"cuda:{i}"
        assert sb.explain(None).home == f"cuda:{i}"
        assert sb.current_device().torch_device == f"cuda:{i}"
        assert backend_for("cuda").device.torch_device == f"cuda:{i}"
    assert sb.select("cuda:1").device.torch_device == "cuda:1"
    with pytest.raises(ValueError, match="device='cuda:2': expected an index below 2"):
        sb.select("cuda:2")


def test_backend_for_takes_what_select_takes():
    """``backend_for``: ``prefer`` as a mapping (select takes one; the cache needed a hashable key),
    ``torch.device("cpu:0")`` (select takes it), and a device torch does not have is select's
    ValueError (torch.cuda's AssertionError on a CPU-only torch before)."""
    from swa_backends.dispatch import backend_for, clear_backends

    clear_backends()
    try:
        a = backend_for("cpu", prefer={"gather_rows": "reference", "swa_indices_and_lens": "triton"})
        assert a.variants["gather_rows"] == ("reference",) and a.variants["swa_indices_and_lens"] == ("triton",)
        assert backend_for("cpu", prefer={"swa_indices_and_lens": "triton", "gather_rows": "reference"}) is a
        assert backend_for(torch.device("cpu:0")) is backend_for("cpu") is backend_for(torch.device("cpu"))
        with pytest.raises(ValueError, match=r"backend_for: prefer\['gather_rows'\]=\['reference'\]: expected one of"):
            backend_for("cpu", prefer={"gather_rows": ["reference"]})
        with pytest.raises(ValueError, match="backend_for: prefer='nope': expected a declared variant name"):
            backend_for("cpu", prefer="nope")
        with pytest.raises(ValueError, match="backend_for: checked=1: expected a bool"):
            backend_for("cpu", checked=1)
        with pytest.raises(ValueError, match="backend_for: device='tpu:0': expected a torch device"):
            backend_for("tpu:0")
        if not torch.cuda.is_available():
            for d in ("cuda", "cuda:0", torch.device("cuda")):
                with pytest.raises(ValueError, match="expected an available CUDA/ROCm device"):
                    backend_for(d)
    finally:
        clear_backends()


@pytest.mark.parametrize("fn", [sb.capabilities, sb.explain, sb.select])
def test_matrix_as_a_path_object(fn, tmp_path):
    """``matrix=`` takes a path as ``load_matrix`` does, ``os.PathLike`` included (a
    ``pathlib.Path`` was refused as neither a path nor a Matrix)."""
    data = _broken(lambda d: _row(d, "cpu").update(encoder_replay={"enabled": False, "because": "from the Path"}))
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    out = fn("cpu", matrix=path)
    caps = out if isinstance(out, sb.Capabilities) else out.capabilities
    assert caps.encoder_replay.reasons == ("[matrix:cpu] from the Path",)


@pytest.mark.parametrize("arch", ["sm80", "sm89", "sm90", "sm100", "sm120"])
def test_a_hand_built_cuda_deviceinfo_has_its_archs_capability(arch):
    """``DeviceInfo("cuda", "sm90")`` left without a capability has the one its arch names, and
    selects as ``parse_device("cuda:sm90")`` does (every capability-gated variant was rejected:
    "requires a known CUDA compute capability, device has none")."""
    parsed = sb.parse_device(f"cuda:{arch}")
    built = sb.DeviceInfo("cuda", arch, fake=True)
    assert built.capability == parsed.capability
    table = lambda d: [(c.op, c.variant, c.status, c.reasons) for c in sb.explain(d).table]  # noqa: E731
    assert table(built) == table(parsed)
    assert sb.select(built).variants == sb.select(parsed).variants


def test_deviceinfo_capability_is_derived_only_where_an_arch_names_one():
    assert sb.DeviceInfo("cuda", "sm121").capability == (12, 1)
    assert sb.DeviceInfo("cuda", "sm90", capability=(9, 0)).capability == (9, 0)
    assert sb.DeviceInfo("cuda", "sm_90").capability is None  # not an arch the pack names: its variants say so
    assert sb.DeviceInfo("rocm", "gfx942").capability is None and sb.DeviceInfo("cpu", "cpu").capability is None


@pytest.mark.parametrize("fn", [sb.capabilities, sb.explain, sb.select])
def test_argument_errors_name_the_function_called(fn):
    """explain() and capabilities() validate as select() does, and their errors say which of them
    was called (each was ``select: ...``)."""
    name = fn.__name__
    with pytest.raises(ValueError, match=f"^{name}: config=7: expected None, a ServingConfig"):
        fn("cpu", config=7)
    with pytest.raises(ValueError, match=f"^{name}: config=.*'bogus'"):
        fn("cpu", config={"bogus": 1})
    with pytest.raises(ValueError, match=f"^{name}: matrix=7: expected None, a path"):
        fn("cpu", matrix=7)
    if fn is not sb.capabilities:  # (capabilities takes no prefer)
        with pytest.raises(ValueError, match=f"^{name}: prefer='nope': expected a declared variant name"):
            fn("cpu", prefer="nope")
        with pytest.raises(ValueError, match=rf"^{name}: prefer\['gather_rows'\]='nope'"):
            fn("cpu", prefer={"gather_rows": "nope"})
