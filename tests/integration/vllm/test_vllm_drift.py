"""Drift guard: what the vLLM integration relies on, checked against the installed vLLM.

A vLLM release that renames, re-signs or rewrites any of these fails here, in CI, instead of
at serving time:

* the patch targets (the release's ``patches.PATCHES``): each applies (its own signature check
  passes);
* the config fields and model-state attributes the integration reads, and vLLM's rules it
  mirrors (checked by behaviour or by the lines it mirrors: the release's ``config.MIRRORS``).

The signatures and source fingerprints of every vLLM definition the integration calls,
overrides, reproduces or mirrors are the release's seam table (``integrations/vllm/v0_33/seams.py``),
which ``install()`` itself checks before it touches vLLM; ``test_vllm_seams.py`` holds it to
the installed release. On a mismatch: read vLLM's diff, adapt the release's subpackage (and the
differential), then take the new values (``python -m swa_backends.integrations.vllm.v0_33.seams``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="needs vLLM (the CI stage installs each supported release in a venv of its own)")

from _release import installed  # noqa: E402
from swa_backends.integrations import vllm as integration  # noqa: E402
from swa_backends.integrations.vllm import config as icfg  # noqa: E402
from swa_backends.integrations.vllm import patches as patching  # noqa: E402

release = installed()  # the installed vLLM's release subpackage (skips this module where there is none)
patches = release.patches


def _resolve(path: str):
    import importlib

    module, _, rest = path.partition(":")
    obj = importlib.import_module(module)
    for part in rest.split(".") if rest else ():
        obj = getattr(obj, part)
    return obj


def test_installed_vllm_is_the_release_its_subpackage_pins():
    version = integration.vllm_version()
    assert integration.supported(version), version
    assert version == release.RELEASE, (
        f"vLLM {version} is installed; {release.__name__} was pinned from {release.RELEASE}")


def test_every_patch_applies_and_restores():
    """Every patch for this platform applies; the ROCm one is left alone (and its module not
    imported: it cannot import without an AMD GPU); ``rocm/`` applies it on a faked one."""
    everywhere = [p for p in patches.PATCHES if p.platform is None]
    try:
        status = patches.apply()
        assert status == {p.name: "applied" if p.platform is None else f"not applied: {p.platform} only (this is other)"
                          for p in patches.PATCHES}, status
        for p in everywhere:
            assert isinstance(_resolve(f"{p.module}:{p.attr}"), p.shim)
    finally:
        patches.restore()
    for p in everywhere:
        assert not isinstance(_resolve(f"{p.module}:{p.attr}"), patching.Shim)


def test_patch_list_is_the_documented_one():
    """The release's patches.py names every global it patches in its module docstring (README's
    patch list follows it); ``test_releases.py`` holds each to a seam of the table."""
    doc = " ".join(patches.__doc__.split())
    for p in patches.PATCHES:
        assert p.attr.replace("_", "") in doc.replace("_", "").replace("\\", ""), p.attr


def test_replay_batch_and_config_fields():
    from vllm.config import CacheConfig, CompilationConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode
    from vllm.models.deepseek_v41.decoder_replay_layers import ReplayBatch

    assert [f.name for f in dataclasses.fields(ReplayBatch)] == ["rows", "forward_context", "run_graph", "num_padded"]

    def names(cls):
        return {f.name for f in dataclasses.fields(cls)}

    assert {"swa_bounded_replay", "enable_prefix_caching"} <= names(CacheConfig)
    assert {"pipeline_parallel_size", "prefill_context_parallel_size", "decode_context_parallel_size",
            "data_parallel_size", "tensor_parallel_size", "enable_expert_parallel"} <= names(ParallelConfig)
    assert hasattr(ParallelConfig, "use_ubatching")
    assert {"cudagraph_mode", "decoder_replay_trim_threshold", "cudagraph_decoder_replay"} <= names(CompilationConfig)
    assert "async_scheduling" in names(SchedulerConfig)
    assert {"speculative_config", "kv_transfer_config", "lora_config", "kernel_config"} <= names(VllmConfig)
    if release.config.model_runner(SimpleNamespace()) == "v2":  # a release with model runner V2 only (0.34)
        assert not hasattr(VllmConfig, "use_v2_model_runner")
    else:
        assert isinstance(VllmConfig.use_v2_model_runner, property)
    assert set(icfg.GRAPH_MODES) == {m.name for m in CUDAGraphMode}
    from vllm.config.kernel import MEGA_MOE_BACKENDS  # noqa: F401


def test_model_state_attributes_the_mixin_uses(monkeypatch):
    import _cases
    import _vllm_harness as h

    h.install_cpu_stubs(monkeypatch)
    batch = dict(_cases.mixed_batches(0))["mixed"]
    setup = h.make_setup(batch, spec=0)
    state = h.make_state(h.VllmState, setup)
    for name in ("_replay", "_dropped_before", "_kept_rows", "_kept_query_start_loc", "_kept_positions",
                 "_kept_slot_mappings", "_kept_kv_start", "_replay_start", "decoder_replay_layers", "replay_cudagraphs",
                 "pcp_size", "device", "vllm_config", "max_num_reqs", "max_num_tokens"):
        assert hasattr(state, name), name
    layers = setup.layers
    for name in ("window", "run_layers", "replay_batch", "trim_threshold", "metadata_prefixes", "first_swa_prefix"):
        assert hasattr(layers, name), name


def test_sequence_parallel_rule_matches_vllm():
    from vllm.models.deepseek_v41.nvidia.model import _use_sequence_parallel

    for pp in (1, 2):
        for ep in (False, True):
            for tp in (1, 4):
                for dp in (1, 2):
                    for moe in ("auto", "deep_gemm_mega_moe"):
                        cfg = SimpleNamespace(
                            parallel_config=SimpleNamespace(pipeline_parallel_size=pp, enable_expert_parallel=ep,
                                                            tensor_parallel_size=tp, data_parallel_size=dp),
                            kernel_config=SimpleNamespace(moe_backend=moe))
                        assert icfg.sequence_parallel_moe(cfg) == _use_sequence_parallel(cfg), (pp, ep, tp, dp, moe)


def test_mega_moe_backends_are_vllms():
    """The release's copy (config.py's fallback for configs built without vLLM) is vLLM's own set."""
    from vllm.config.kernel import MEGA_MOE_BACKENDS, MoEBackend
    from typing import get_args

    assert release.config.MEGA_MOE_BACKENDS == MEGA_MOE_BACKENDS
    for backend in get_args(MoEBackend):
        cfg = SimpleNamespace(kernel_config=SimpleNamespace(moe_backend=backend))
        assert icfg.mega_moe(cfg) == (backend in MEGA_MOE_BACKENDS or backend == "aiter_mega_moe"), backend


def _literal_values(tp) -> set[str]:
    from typing import get_args

    args = get_args(tp)
    return {tp} if not args else {v for a in args for v in _literal_values(a)}


def test_every_speculative_method_has_a_drafter_kind():
    """Every method vLLM's ``SpeculativeConfig`` takes maps to a ``ServingConfig.drafter`` the
    rules know; the release's lists (``DRAFTER_KINDS``, ``OTHER_DRAFTERS``) name every one, so a
    new vLLM method shows up here, to be named or left ``other`` on purpose."""
    from vllm.config.speculative import MTPModelTypes, SpeculativeMethod

    from swa_backends.common.config import DRAFTERS

    facts = release.config
    methods = _literal_values(SpeculativeMethod)
    mtp_types = _literal_values(MTPModelTypes)
    assert methods - mtp_types == (set(facts.DRAFTER_KINDS) - {"mtp"}) | set(facts.OTHER_DRAFTERS)
    assert "mtp" in mtp_types
    for method in methods:
        kind = icfg.drafter(SimpleNamespace(speculative_config=SimpleNamespace(method=method)))
        assert kind in DRAFTERS and kind != "none", method
        assert (kind == "mtp") == (method in mtp_types), method
    for method in facts.OTHER_DRAFTERS:
        assert icfg.drafter(SimpleNamespace(speculative_config=SimpleNamespace(method=method))) == "other"


@pytest.mark.parametrize("rule,where,lines", release.config.MIRRORS, ids=[m[0] for m in release.config.MIRRORS])
def test_the_lines_each_restated_rule_follows(rule, where, lines):
    """Each rule the integration restates (the PCP refusals of matrix.yaml's pcp-* rows, the
    encoder gates of ``config.vllm_encoder_replay``, the replay layers ``model._after_build``
    removes, ...) follows lines of vLLM's source the release lists: each is there. Read from the
    files, not imported (the ROCm model cannot import without an AMD GPU)."""
    source = _source_of(where)
    missing = [line for line in lines if line not in source]
    assert not missing, f"{rule}: {where} no longer holds {missing}"


def _source_of(where: str) -> str:
    """The source text of ``"module:Qual.name"`` (that definition) or of a module (its file)."""
    import ast

    from swa_backends.integrations.vllm import seams

    module, _, qualname = where.partition(":")
    text = Path(seams.module_file(module)).read_text()
    if not qualname:
        return text
    node = seams.definition(seams.Seam(where, "a restated rule"), live=False)
    return ast.get_source_segment(text, node)
