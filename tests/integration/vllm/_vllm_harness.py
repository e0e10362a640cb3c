"""vLLM 0.33's DeepSeek-V4.1 replay-metadata preparation, built without a model (needs vLLM).

A ``DeepseekV41ModelState`` on a ``MagicMock``
config with every field it and the sparse-SWA metadata builders read set explicitly, real
``SlidingWindowMLASpec`` KV-cache groups with real metadata builders (FlashMLA's and
FlashInfer's DeepSeek-V4.1 SWA builders) in real ``AttentionGroup``s, real
``DecoderReplayLayers``, ``InputBatch.make_dummy`` + ``dataclasses.replace`` batches, and
``DefaultModelState.prepare_attn`` running for real. Two stubs only: vLLM's UVA buffers
(pinned memory needs a driver) become CPU tensors, and the FlashMLA tile-scheduler planner
(a CUDA extension) returns empty plans.

:func:`run_step` runs one step through a model state and returns a snapshot of every
metadata tensor it produced (slot mappings after padding, each layer's SWA metadata, the
decoder replay batch and its metadata).
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from types import SimpleNamespace
from unittest.mock import MagicMock

import numpy as np
import torch
from vllm.config import CUDAGraphMode
from vllm.models.deepseek_v41.decoder_replay_layers import DecoderReplayLayers
from vllm.models.deepseek_v41.nvidia import model_state as ms
from vllm.models.deepseek_v41.nvidia.flashinfer_sparse import DeepseekSparseSWAFlashInferBackend
from vllm.models.deepseek_v41.nvidia.flashmla import DeepseekSparseSWAFlashMLABackend
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadataBuilder
from vllm.v1.kv_cache_interface import SlidingWindowMLASpec
from vllm.v1.worker.gpu import buffer_utils
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
from vllm.v1.worker.utils import AttentionGroup

DEV = torch.device("cpu")
HIDDEN, HC = 64, 4  # the replay layers' hidden size and hyper-connection multiplier
LAYER = "model.layers.{}.attn"


class CpuUvaBuffer:
    """``buffer_utils.UvaBuffer`` on the CPU (pinning memory needs a driver)."""

    def __init__(self, size, dtype):
        self.cpu = torch.zeros(size, dtype=dtype)
        self.np = self.cpu.numpy()

    def uva(self, n=None):
        return self.cpu[:n] if n is not None else self.cpu


def _empty_tile_plans(self, num_decode_tokens):
    return {k: None for k in ("swaonly", "c4a", "c128a", "c1a", "c2a")}


#: the replay-metadata launches the patches route (model state and sparse-SWA builders)
METADATA_ROUTES = ("pad_replayed_slots", "swa_indices_and_lens", "prefill_gather_lens")


def route_to(be, names=METADATA_ROUTES, *, platform: str | None = None) -> None:
    """Apply the installed release's patches (``platform``: as its ``patches.apply``) and send
    the launches ``names`` to the backend ``be``; each patch must have applied."""
    from _release import installed

    patches = installed().patches

    status = patches.apply(platform)
    for name in names:
        assert status[name] == "applied", status
        assert patches.route(name, lambda device: be)


def install_cpu_stubs(monkeypatch) -> None:
    monkeypatch.setattr(buffer_utils, "UvaBuffer", CpuUvaBuffer)
    monkeypatch.setattr(DeepseekSparseSWAMetadataBuilder, "build_tile_scheduler", _empty_tile_plans)


def make_config(*, W: int, spec: int, max_seqs: int = 32, max_tokens: int = 2048):
    cfg = MagicMock()
    cfg.model_config.enable_prompt_embeds = False
    cfg.model_config.uses_mrope = False
    cfg.model_config.is_multimodal_model = False
    cfg.model_config.max_model_len = 8192
    hf = SimpleNamespace(sliding_window=W, compress_ratios=[0, 0, 2, 1], hidden_size=HIDDEN, hc_mult=HC)
    cfg.model_config.hf_config = hf
    cfg.model_config.hf_text_config = hf
    cfg.model_config.dtype = torch.bfloat16
    cfg.compilation_config.fast_moe_cold_start = False
    cfg.compilation_config.static_forward_context = {}
    cfg.scheduler_config.max_num_seqs = max_seqs
    cfg.scheduler_config.max_num_batched_tokens = max_tokens
    cfg.parallel_config.prefill_context_parallel_size = 1
    cfg.parallel_config.data_parallel_size = 1
    cfg.aux_output_config.enable_return_routed_experts = False
    cfg.compilation_config.cudagraph_decoder_replay = False
    cfg.speculative_config = (SimpleNamespace(num_speculative_tokens=spec, parallel_drafting=False, max_num_new_slots_for_drafting=0,
                                              use_dspark=lambda: False) if spec else None)
    cfg.use_v2_model_runner = True
    cfg.lora_config = None
    return cfg


def make_spec(W: int, block_size: int):
    return SlidingWindowMLASpec(block_size=block_size, num_kv_heads=1, head_size=512, dtype=torch.uint8,
                                sliding_window=W, cache_dtype_str="fp8_ds_mla", bounded_replay=True,
                                model_version="deepseek_v4", max_tp_shards=1)


@dataclasses.dataclass
class Setup:
    cfg: object
    kv_cache_config: object
    attn_groups: list
    layers: DecoderReplayLayers | None
    window_groups: list[int]


def make_setup(batch, *, spec: int, decoder: bool = True, backends=None) -> Setup:
    """KV-cache groups of ``batch`` (group 1 and, with four groups, group 3 are window groups
    with builders; the others prefix-cacheable, no builder) and the replay layers.
    ``backends``: the window groups' attention backend classes, in order (default: FlashMLA's
    DeepSeek-V4.1 SWA backend for group 1, FlashInfer's for group 3)."""
    W, bs = batch.W, batch.block_size
    G = batch.slots.shape[0]
    cfg = make_config(W=W, spec=spec)
    groups, attn_groups, window_groups = [], [], []
    for g in range(G):
        name = LAYER.format(g)
        if g in batch.cacheable:
            groups.append(SimpleNamespace(layer_names=[name],
                                          kv_cache_spec=SimpleNamespace(prefix_cacheable=True, prefix_replay_tokens=0)))
            attn_groups.append([])
            continue
        spec_g = make_spec(W, bs)
        if backends is not None:
            backend = backends[len(window_groups)]
        else:
            backend = DeepseekSparseSWAFlashMLABackend if g == 1 else DeepseekSparseSWAFlashInferBackend
        group = AttentionGroup(backend=backend, layer_names=[name + ".swa_cache"], kv_cache_spec=spec_g,
                               kv_cache_group_id=g)
        group.create_metadata_builders(cfg, DEV)
        groups.append(SimpleNamespace(layer_names=[name + ".swa_cache"], kv_cache_spec=spec_g))
        attn_groups.append([group])
        window_groups.append(g)
    layers = None
    if decoder:
        prefixes = {LAYER.format(g) + ".swa_cache" for g in window_groups}
        layers = DecoderReplayLayers(W, _no_layers, _no_layers, prefixes, LAYER.format(window_groups[0]) + ".swa_cache")
    return Setup(cfg, SimpleNamespace(kv_cache_groups=groups), attn_groups, layers, window_groups)


def _no_layers(*args):
    raise AssertionError("the metadata differential runs no layer")


def make_input_batch(batch, bufs: InputBuffers, *, full: bool = False, host_q=None) -> InputBatch:
    """``batch`` as vLLM's ``InputBatch`` (request-state index = batch row). ``host_q``: the
    query lengths the host counts when they differ from the device's ``batch.q`` (adaptive
    verification resizes decodes on the device alone): ``query_start_loc_np`` and the
    scheduled counts follow them, the device ``query_start_loc`` follows ``batch``."""
    B, B_all = batch.num_reqs, batch.B_all
    ib = InputBatch.make_dummy(B_all if full else B, batch.T_pad if full else batch.T, bufs)
    qsl = batch.qsl if full else batch.qsl[: B + 1]
    qsl_np = batch.qsl_np if full else batch.qsl_np[: B + 1]
    seq = batch.seq if full else batch.seq[:B]
    is_prefilling = batch.is_prefilling[: B_all if full else B]
    q = batch.q[: B_all if full else B]
    if host_q is not None:
        q = np.asarray(host_q)[: len(q)]
        qsl_np = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
    return replace(
        ib,
        num_reqs=B,
        num_reqs_after_padding=B_all,
        num_tokens=batch.T,
        num_tokens_after_padding=batch.T_pad,
        query_start_loc=qsl,
        query_start_loc_np=qsl_np,
        seq_lens=seq,
        seq_lens_cpu_upper_bound=seq.clone(),
        idx_mapping_np=np.arange(len(q), dtype=np.intp),
        is_prefilling_np=is_prefilling,
        num_scheduled_tokens=q.astype(np.int32),
        positions=batch.positions,
        max_query_len=int(max(q.max(), 1)),
    )


class FakeReplayGraphs:
    """``DecoderReplayCudaGraphManager``'s planning surface: PIECEWISE graphs of ``sizes``."""

    def __init__(self, sizes):
        self.sizes = sorted(sizes)

    def dispatch(self, num_reqs, num_tokens, uniform, loras):
        fits = [s for s in self.sizes if s >= num_tokens]
        if not fits:
            return BatchExecutionDescriptor(CUDAGraphMode.NONE, num_tokens, None)
        return BatchExecutionDescriptor(CUDAGraphMode.PIECEWISE, fits[0], None)

    def run(self, rows, inputs):  # pragma: no cover - never called by the metadata run
        raise AssertionError

    def capture_replay_graphs(self, prepare):
        for size in reversed(self.sizes):
            prepare(BatchExecutionDescriptor(CUDAGraphMode.PIECEWISE, size, None))


class FakeBlockTables:
    """``BlockTables.get_dummy_block_tables`` / ``get_dummy_slot_mappings`` for captures."""

    def __init__(self, tables, num_groups, max_tokens):
        self.tables = tables
        self.slot_mappings = torch.full((num_groups, max_tokens), -1, dtype=torch.int64)

    def get_dummy_block_tables(self, num_reqs):
        return tuple(torch.zeros(num_reqs, t.shape[1], dtype=t.dtype) for t in self.tables)

    def get_dummy_slot_mappings(self, num_tokens):
        self.slot_mappings.fill_(-1)
        return self.slot_mappings[:, :num_tokens]


def make_state(state_cls, setup: Setup, model_extra: dict | None = None):
    model = SimpleNamespace(token_lookback_depth=0, decoder_replay_layers=setup.layers, **(model_extra or {}))
    return state_cls(setup.cfg, model, None, DEV)


def add_requests(state, batch) -> None:
    for i in range(batch.num_reqs):
        params = SimpleNamespace(prompt_logprobs=1 if batch.keeps_rows[i] else None, prompt_logprob_token_ids=None)
        state.add_request(i, SimpleNamespace(replay_start=int(batch.R[i]), sampling_params=params,
                                             prefill_token_ids=[0]))


# ---------------------------------------------------------------------------------------
# snapshots
# ---------------------------------------------------------------------------------------


def _snap(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _snap(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _snap(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_snap(v) for v in value)
    if isinstance(value, (int, float, bool, str, type(None), np.integer)):
        return value
    return f"<{type(value).__name__}>"


def run_step(state, setup: Setup, batch, *, mode=CUDAGraphMode.NONE, full: bool = False, slots=None,
             host_q=None) -> dict:
    """One ``prepare_attn`` on ``batch``; a snapshot of what it produced."""
    bufs = InputBuffers(setup.cfg.scheduler_config.max_num_seqs, setup.cfg.scheduler_config.max_num_batched_tokens,
                        DEV)
    ib = make_input_batch(batch, bufs, full=full, host_q=host_q)
    slot_mappings = (batch.slots if slots is None else slots).clone()
    if setup.layers is not None:
        setup.layers.replay_batch = None
    md = state.prepare_attn(ib, mode, tuple(batch.block_tables), slot_mappings, setup.attn_groups,
                            setup.kv_cache_config)
    out = {"slot_mappings": slot_mappings.clone(), "metadata": _snap(md)}
    out.update(snapshot_replay(state, setup))
    return out


def snapshot_replay(state, setup: Setup) -> dict:
    layers = setup.layers
    rb = None if layers is None else layers.replay_batch
    if rb is None:
        return {"replay": None}
    fc = rb.forward_context
    n = rb.rows.numel()
    n_pad = fc.batch_descriptor.num_tokens
    return {"replay": {
        "rows": rb.rows.clone(),
        "num_padded": n_pad,
        "run_graph": rb.run_graph is not None,
        "attn_metadata": _snap(fc.attn_metadata),
        "slot_mapping": _snap(fc.slot_mapping),
        # the sub-batch positions of the real rows (vLLM leaves the padded ones stale)
        "kept_positions": state._kept_positions[:n].clone(),
    }}


def diff(a, b, path="") -> list[str]:
    """Every place two snapshots differ (tensors: dtype, shape, values)."""
    out: list[str] = []
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"]
        if not torch.equal(a, b):
            bad = (a != b).nonzero()[:3].tolist()
            return [f"{path}: values differ at {bad}"]
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'b' if k not in a else 'a'}")
            else:
                out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        for i, (x, y) in enumerate(zip(a, b)):
            out += diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def count_tensors(snapshot) -> int:
    if isinstance(snapshot, torch.Tensor):
        return 1
    if isinstance(snapshot, dict):
        return sum(count_tensors(v) for v in snapshot.values())
    if isinstance(snapshot, (list, tuple)):
        return sum(count_tensors(v) for v in snapshot)
    return 0


VllmState = ms.DeepseekV41ModelState
