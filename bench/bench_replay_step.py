"""One serving step's replay metadata, everything DeepSeek-V4.1's model state does for it in
vLLM 0.33: vLLM's own kernels as vLLM calls them against the pack as it runs installed.

    . bench/gpu_env.sh && SWA_VLLM_KERNELS_DIR=.vllm_kernels python3 bench/bench_replay_step.py --out DIR
    python bench/bench_replay_step.py --out DIR --smoke   # no GPU: tiny steps, Triton's interpreter
    python bench/bench_replay_step.py --out DIR --parts 1x1K   # where the pack's own part goes (run_parts)

A step is ``DeepseekV41ModelState.prepare_attn``'s replay work for an eager step without PCP or
DP (:class:`VllmModelState`, the same code in both columns): the replay starts' upload, the slot
padding when a request replays, each window group's sparse-SWA build (decode window rows,
prefill window rows, each when its part has tokens, and the prefill gather lengths in a tensor
allocated per build), then ``_prepare_replay_batch``: vLLM's trim planning, ``_kept_input_batch``
(kept boundaries, the ``dropped_before`` upload, the PAD fill and the sub-batch gather) and the
sub-batch's builds (one per window group for the replay layers, one more for the first replay
layer). The five step shapes of ``bench_triton_ops.py`` (1x1K, 1x16K, 8x4K+32d, 32x4K+128d,
16x1K+240d; decodes first; every third prefill replays from 896 after a 1024-token hit; W 128,
block 64; 5 slot groups, 0/2/4 prefix-cacheable) with one window group (group 1), and the two
mixed ones with two (groups 1 and 3); each prefill keeps its last 128 rows.

* **vllm** -- the step with vLLM's kernels where vLLM's code finds them
  (``testing/vllm_kernels.load_launchers``): ``_pad_replayed_slots_kernel[grid]`` and
  ``_gather_replay_batch_kernel[grid]``, and the builders' ``_COMPUTE_SWA_INDICES_AND_LENS_KERNEL(...)``
  and ``_COMPUTE_PREFILL_METADATA_KERNEL(...)``: vLLM's ``VllmTritonJitKernel`` launch objects,
  whose every call binds its arguments before ``kernel[grid](**kwargs)`` (from the installed
  vLLM, or vLLM's own classes taken out of copies of its source files: vLLM's wheel cannot
  travel to the GPU machine).
* **pack** -- the same step with the pack installed: the pack's model state
  (``integrations/vllm/model.py``'s ``ModelStateMixin``, its own methods: the step opened, the
  prediction with its ``ReplayPlan.from_kept``, one ``prepare_replay_step`` launch that also makes
  the first window group's sub-batch builds, the sub-batch gather and those builds answered) on
  top of the same model state, and the patches' shims where vLLM's module globals were
  (``testing/vllm_shims.py``): a second window group's rows, in the batch and in the sub-batch,
  launch the pack's kernels one call at a time.

Left out of both alike, as work that is not replay metadata and the same either way: the common
attention metadata and everything else a build makes (``torch.ge`` for ``is_valid_token``,
``token_to_req_indices``, vLLM's split, the decode-lens tail fill, the tile scheduler; made once
before timing), the sub-batch's forward context. vLLM's ``UvaBufferPool`` maps pinned memory for
the GPU with vLLM's extension; here ``copy_to_uva`` writes the pinned buffer as vLLM's does and
hands the kernels a device copy of the same values, in both columns.

Before timing, every output of both columns is compared (bit-identical; without vLLM's kernels,
``--smoke`` compares the pack's step with the pack's torch reference one call at a time), and each
column's kernel launches in one step are counted and checked against the step's shape (the rules
``tests/integration/vllm/test_launch_counts.py`` checks in real vLLM steps). GPU time: events around
the whole step, median of 200 steps, L2 flushed and warm (``lib.timing.gpu_pair``), the GPU
asleep ~2 ms before each step so that all of its launches are queued before it starts (device time,
not host time). Host time: back-to-back steps without a sync, validation off, in rounds over every
step shape, each shape's columns taking turns of 25 steps within a round (every shape is timed early
and late in the run alike, and a slow stretch of the host falls on every column); the ratio to
vLLM's as the ratio of the medians and as the median of each round's ratio (the host's drift
between rounds cancels there). In the same rounds, vLLM's column with its four kernels doing
nothing (``vllm_no_kernels``: vLLM's Python around its launches, which the pack's column runs too
but for ``_kept_input_batch``'s body): what vLLM's kernel calls cost its column, and what the
pack's column costs past that Python.

The step's inputs (``ServingStep``) and the first window group's main batch alone (``vllm_step``,
``pack_step``, ...: this script's scope before the whole step, and the experiments') are in
``lib/replay_step.py``; the timing methods in ``lib/timing.py``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import time
import types
from dataclasses import dataclass, replace
from pathlib import Path

from lib import smoke

if not smoke.use_interpreter() and "--parts" in sys.argv[1:] and not smoke._has_gpu():  # before Triton's import
    os.environ.setdefault("TRITON_INTERPRET", "1")  # --parts off a GPU: its one real call runs interpreted

import numpy as np  # noqa: E402
import torch  # noqa: E402

import swa_backends  # noqa: E402
from lib import results, timing as tm  # noqa: E402
from lib.replay_step import ServingStep  # noqa: E402
from lib.steps import BS, G, STEPS, W  # noqa: E402
from swa_backends.common.types import INDEX_DTYPE  # noqa: E402
from swa_backends.common.validation import set_validation, validation  # noqa: E402
from swa_backends.integrations.vllm import runtime  # noqa: E402
from swa_backends.integrations.vllm.v0_33 import model as vllm_model  # noqa: E402
from swa_backends.kernels import _launch  # noqa: E402
from swa_backends.testing import vllm_kernels as vk  # noqa: E402
from swa_backends.testing.vllm_shims import routed_shims  # noqa: E402

SMOKE_STEPS = {"1x140": (1, 140, 0), "3x140+3d": (3, 140, 3)}


# ---------------------------------------------------------------------------------------
# the whole step: DeepseekV41ModelState.prepare_attn's replay work
# ---------------------------------------------------------------------------------------

PAD_SLOT_ID = vk.PAD_SLOT_ID
CACHEABLE = (0, 2, 4)  # of the G slot groups; the others are window groups
WINDOW_GROUPS = {1: (1,), 2: (1, 3)}
#: (step shape, window groups) timed
CONFIGS = [(name, 1) for name in STEPS] + [("8x4K+32d", 2), ("16x1K+240d", 2)]
SMOKE_CONFIGS = [("1x140", 1), ("3x140+3d", 1), ("3x140+3d", 2)]
COLUMNS = ("vllm", "pack")


class GraphMode:
    """Stands for vLLM's ``CUDAGraphMode`` (``model._graph_modes`` imports vLLM's)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"CUDAGraphMode.{self.name}"


NONE, PIECEWISE, FULL = GraphMode("NONE"), GraphMode("PIECEWISE"), GraphMode("FULL")


@dataclass
class InputBatch:
    """vLLM 0.33's ``InputBatch``: the fields the replay path reads, then the others (None here)
    -- vLLM's ``_kept_input_batch`` makes the sub-batch with ``dataclasses.replace``, whose cost
    follows the number of fields (``test_bench_replay_step.py`` pins the names to vLLM's)."""

    num_reqs: int
    num_tokens: int
    num_tokens_after_padding: int
    query_start_loc: torch.Tensor
    query_start_loc_np: np.ndarray
    seq_lens: torch.Tensor
    seq_lens_cpu_upper_bound: torch.Tensor
    positions: torch.Tensor
    idx_mapping_np: np.ndarray
    is_prefilling_np: np.ndarray
    num_scheduled_tokens: np.ndarray
    max_query_len: int
    is_padding: object = None
    fast_prefill: object = None
    req_ids: object = None
    num_reqs_after_padding: object = None
    idx_mapping: object = None
    expanded_idx_mapping: object = None
    expanded_local_pos: object = None
    num_draft_tokens: object = None
    num_draft_tokens_per_req: object = None
    dcp_local_seq_lens: object = None
    num_computed_tokens_np: object = None
    prefill_len_np: object = None
    num_computed_prefill_tokens_np: object = None
    has_prefill: object = None
    decode_graph_eligible: object = None
    input_ids: object = None
    logits_indices: object = None
    cu_num_logits: object = None
    cu_num_logits_np: object = None
    has_structured_output_reqs: object = None
    prompt_lens: object = None
    max_seq_len_np: object = None
    pcp: object = None
    prefill_runs_as_decode_np: object = None
    num_admitted_draft_tokens: object = None


@dataclass
class BuildInputs:
    """What a build reads besides replay metadata, made before timing (the same in both
    columns): vLLM's decode/prefill split, ``is_valid_token``, ``token_to_req_indices``."""

    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    valid: torch.Tensor
    token_to_req: torch.Tensor


class SwaBuilder:
    """One window group's sparse-SWA metadata builder (``DeepseekSparseSWAMetadataBuilder``),
    the replay metadata of its ``build``: decode window rows into its persistent decode buffer,
    prefill window rows into the head of its prefill buffer (each only when its part has
    tokens), the prefill gather lengths into a tensor allocated per build
    (``_build_deepseek_v4_metadata``), each through ``kernels.swa`` / ``kernels.prefill`` (the
    globals of vLLM's ``sparse_swa.py``: vLLM's launch objects, or the patches' shims)."""

    def __init__(self, group: int, max_tokens: int, dev, kernels):
        self.group, self.kernels = group, kernels
        self.window_size, self.block_size, self.decode_threshold = W, BS, 1
        self.prefill_index_width, self.max_image_tokens = W, 0
        e = lambda *shape: torch.full(shape, -77, dtype=INDEX_DTYPE, device=dev)  # noqa: E731 - poisoned
        self.decode_swa_indices, self.decode_swa_lens = e(max_tokens, 1, W), e(max_tokens)
        self.prefill_swa_indices, self.prefill_swa_lens = e(max_tokens, 1, W), e(max_tokens)
        self.inputs: dict[str, BuildInputs] = {}  # "main" / "kept": the batch it builds for
        self.gather_lens = None

    def build(self, kind: str, batch: InputBatch, block_table, replay_start) -> None:
        x, K = self.inputs[kind], self.kernels
        qsl, seq, D, P = batch.query_start_loc, batch.seq_lens, x.num_decode_tokens, x.num_prefill_tokens
        if D:
            K.swa(self.decode_swa_indices, self.decode_swa_lens, self.window_size, self.decode_swa_indices.shape[-1],
                  self.decode_swa_lens, self.decode_swa_lens, qsl, seq, x.token_to_req, x.valid, block_table,
                  self.block_size, replay_start, num_tokens=D, token_offset=0)
        if P:
            rows, lens = self.prefill_swa_indices[:P], self.prefill_swa_lens[:P]
            K.swa(rows, lens, self.window_size, self.prefill_index_width, lens, lens, qsl, seq, x.token_to_req,
                  x.valid, block_table, self.block_size, replay_start, num_tokens=P, token_offset=D, has_image=False)
        if x.num_prefills:
            self.gather_lens = torch.empty(x.num_prefills, dtype=torch.int32, device=seq.device)
            K.prefill(self.gather_lens, seq, qsl, replay_start, x.num_prefills, x.num_decodes, self.window_size)


class ReplayAttnMetadata:
    __slots__ = ("replay_start",)

    def __init__(self, replay_start):
        self.replay_start = replay_start


class UvaPool:
    """vLLM's ``UvaBufferPool`` as the replay path uses it: the host values written into a
    pinned buffer; ``copy_to_gpu`` then a non-blocking copy into ``out``; ``copy_to_uva`` hands
    back the device view of that buffer, here a device tensor holding the step's values
    (``values``, set before timing)."""

    def __init__(self, n: int, dtype, dev):
        self.cpu = torch.zeros(n, dtype=dtype, pin_memory=dev.type == "cuda")
        self.np = self.cpu.numpy()
        self.values = torch.zeros(n, dtype=dtype, device=dev)

    def copy_to_uva(self, x):
        n = len(x)
        self.np[:n] = x
        return self.values[:n]

    def copy_to_gpu(self, x, out):
        n = len(x)
        self.np[:n] = x
        return out.copy_(self.cpu[:n], non_blocking=True)


class ReplayLayers:
    """``DecoderReplayLayers``' planning surface (eager steps: no replay graphs)."""

    def __init__(self, window: int):
        self.window, self.replay_batch = window, None

    def graph_uses_replay_batch(self, num_tokens: int) -> bool:
        return False


class VllmModelState:
    """vLLM 0.33's ``DeepseekV41ModelState``: the replay work of ``prepare_attn`` (an eager step,
    no PCP, no DP), the kernels looked up where vLLM's code looks them up (``self.kernels``:
    ``pad`` and ``gather`` of ``model_state.py``, ``swa`` and ``prefill`` of ``sparse_swa.py``),
    its methods split as vLLM's are, so the pack's model state (``ModelStateMixin``) overrides
    exactly what it overrides in serving. Constructed as vLLM constructs a model state."""

    def __init__(self, vllm_config, model, encoder_cache, device):
        step = model.step
        self.vllm_config, self.device, self.kernels = vllm_config, device, model.kernels
        self.pcp_size, self.replay_cudagraphs = 1, None
        self.max_num_reqs, self.max_num_tokens = step.B, step.T
        self.decoder_replay_layers = ReplayLayers(W)
        self._replay = (W, torch.tensor(CACHEABLE, dtype=torch.int32, device=device))
        self._replay_start_np = step.R_np.astype(np.int32)  # per request state (add_request)
        self._replay_start = torch.zeros(step.B, dtype=torch.int32, device=device)
        self._replay_start_staging = UvaPool(step.B, torch.int32, device)
        self._dropped_before = UvaPool(step.B + 1, torch.int32, device)
        self._dropped_before.values[: step.B + 1] = torch.from_numpy(step.dropped_np)
        self._keeps_rows_np = np.zeros(step.B, dtype=bool)
        e = lambda shape, dt: torch.full(shape, -77, dtype=dt, device=device)  # noqa: E731 - poisoned
        self._kept_rows, self._kept_positions = e((step.T,), torch.int64), e((step.T,), torch.int64)
        self._kept_query_start_loc, self._kept_kv_start = e((step.B + 1,), torch.int32), e((step.B,), torch.int32)
        self._kept_slot_mappings = e((G, step.T), torch.int64)
        self._replay_attn_groups = (model.replay_groups, model.first_swa_groups)

    def prepare_attn(self, input_batch, cudagraph_mode, block_tables, slot_mappings, attn_groups, kv_cache_config,
                     for_capture=False, ubatch_idx=0, model_specific_attn_metadata=None):
        B = input_batch.num_reqs
        window, cacheable_groups = self._replay
        replay_start_np = np.where(input_batch.is_prefilling_np[:B],
                                   self._replay_start_np[input_batch.idx_mapping_np[:B]], 0).astype(np.int32)
        replay_start = self._replay_start_staging.copy_to_gpu(replay_start_np, out=self._replay_start[:B])
        if window and replay_start_np.any():
            self.kernels.pad[(B,)](slot_mappings, slot_mappings.stride(0), cacheable_groups,
                                   input_batch.query_start_loc, input_batch.positions, replay_start, window,
                                   PAD_SLOT_ID, NUM_GROUPS=cacheable_groups.numel(), BLOCK=1024)
        attn_metadata = self._build_attn_metadata(
            input_batch, cudagraph_mode, block_tables, slot_mappings, attn_groups, kv_cache_config,
            for_capture=for_capture, ubatch_idx=ubatch_idx,
            model_specific_attn_metadata=ReplayAttnMetadata(replay_start))
        self._prepare_replay_batch(input_batch, cudagraph_mode, block_tables, slot_mappings, attn_groups,
                                   kv_cache_config, replay_start)
        return attn_metadata

    def _build_attn_metadata(self, input_batch, cudagraph_mode, block_tables, slot_mappings, attn_groups,
                             kv_cache_config, for_capture=False, ubatch_idx=0, model_specific_attn_metadata=None):
        return self._builds("main", input_batch, block_tables, attn_groups, model_specific_attn_metadata)

    @staticmethod
    def _builds(kind, batch, block_tables, attn_groups, metadata) -> dict:
        """``DefaultModelState.prepare_attn``'s builds: every builder of every KV-cache group."""
        for gid, builders in enumerate(attn_groups):
            for b in builders:
                b.build(kind, batch, block_tables[gid], metadata.replay_start)
        return {}

    def _prepare_replay_batch(self, input_batch, cudagraph_mode, block_tables, slot_mappings, attn_groups,
                              kv_cache_config, replay_start) -> None:
        layers = self.decoder_replay_layers
        layers.replay_batch = None
        B = input_batch.num_reqs
        idx_mapping_np = input_batch.idx_mapping_np[:B]
        query_lens = np.diff(input_batch.query_start_loc_np[: B + 1])
        seq_lens = input_batch.seq_lens_cpu_upper_bound[:B].numpy()
        keeps_rows = self._keeps_rows_np[idx_mapping_np]
        kept_lens = np.where(keeps_rows, query_lens, np.minimum(query_lens, layers.window))
        is_dummy = not input_batch.is_prefilling_np[:B].any() and bool((seq_lens == query_lens).all())
        if is_dummy:
            kept_lens = np.zeros_like(kept_lens)
            kept_lens[0] = 1
        needs_replay_batch = bool((kept_lens < query_lens)[input_batch.is_prefilling_np[:B]].any())
        num_padded = int(kept_lens.sum())
        if not needs_replay_batch:
            return
        kept_batch, kept_slot_mappings = self._kept_input_batch(input_batch, slot_mappings, replay_start, kept_lens,
                                                                num_padded)
        replay_groups, first_swa_groups = self._replay_attn_groups
        self._builds("kept", kept_batch, block_tables, replay_groups, ReplayAttnMetadata(self._kept_kv_start[:B]))
        self._builds("kept", kept_batch, block_tables, first_swa_groups, ReplayAttnMetadata(replay_start))
        layers.replay_batch = (self._kept_rows[:num_padded], kept_batch, kept_slot_mappings)

    def _kept_input_batch(self, input_batch, slot_mappings, replay_start, kept_lens, num_padded):
        B = input_batch.num_reqs
        num_tokens = int(kept_lens.sum())
        kept_query_start_loc_np = np.zeros(B + 1, dtype=np.int32)
        np.cumsum(kept_lens, out=kept_query_start_loc_np[1:])
        dropped_before = self._dropped_before.copy_to_uva(input_batch.query_start_loc_np[: B + 1]
                                                          - kept_query_start_loc_np)
        kept_slot_mappings = self._kept_slot_mappings[:, :num_padded]
        kept_slot_mappings[:, num_tokens:].fill_(PAD_SLOT_ID)
        self.kernels.gather[(B,)](input_batch.query_start_loc, dropped_before, input_batch.seq_lens, replay_start,
                                  input_batch.positions, slot_mappings, slot_mappings.stride(0), self._kept_rows,
                                  self._kept_query_start_loc, self._kept_positions, kept_slot_mappings,
                                  kept_slot_mappings.stride(0), self._kept_kv_start, self.decoder_replay_layers.window,
                                  NUM_GROUPS=slot_mappings.shape[0], BLOCK=1024)
        max_query_len = max(int(kept_lens.max()), input_batch.max_query_len or 0)
        kept_batch = replace(input_batch, num_tokens=num_tokens, num_tokens_after_padding=num_padded,
                             query_start_loc=self._kept_query_start_loc[: B + 1],
                             query_start_loc_np=kept_query_start_loc_np, max_query_len=max_query_len,
                             positions=self._kept_positions[:num_padded], is_padding=input_batch.is_padding,
                             fast_prefill=None)
        return kept_batch, kept_slot_mappings


@contextlib.contextmanager
def graph_modes():
    """The pack's model state asks ``model._graph_modes()`` for vLLM's ``CUDAGraphMode``:
    :data:`NONE`, :data:`PIECEWISE`, :data:`FULL` for the ``with`` block."""
    saved = vllm_model._graph_modes
    vllm_model._graph_modes = lambda: (NONE, PIECEWISE, FULL)
    try:
        yield
    finally:
        vllm_model._graph_modes = saved


class WholeStep:
    """One step's inputs (as :class:`ServingStep` makes them; one block table per slot group)
    and, per column, a model state with its builders and slot mappings."""

    def __init__(self, prefills: int, q: int, decodes: int, windows: int, dev, rng):
        s = ServingStep(prefills, q, decodes, dev, rng)
        self.s, self.dev, self.windows = s, dev, WINDOW_GROUPS[windows]
        self.B, self.T, self.n, self.R_np = s.B, s.T, s.n, np.zeros(s.B, np.int64)
        self.R_np[:] = s.R.cpu().numpy()
        self.dropped_np = runtime.dropped_before(s.kept, s.qsl_np)
        q_np = np.diff(s.qsl_np)
        seq_np = s.seq.cpu().numpy()
        self.batch = InputBatch(s.B, s.T, s.T, s.qsl, s.qsl_np, s.seq, torch.from_numpy(seq_np.copy()), s.positions,
                                np.arange(s.B), s.prefilling_np, q_np.astype(np.int32), int(q_np.max()))
        self.tables = tuple(s.table if g == 1 else s.table[:, torch.randperm(s.table.shape[1], device="cpu").to(dev)]
                            for g in range(G))
        for g in self.windows:  # the window groups' own block tables: valid slots
            pos = s.positions.cpu().numpy()
            req = np.repeat(np.arange(s.B), q_np)
            table = self.tables[g].cpu().numpy()
            s.slots0[g] = torch.from_numpy(table[req, pos // BS].astype(np.int64) * BS + pos % BS).to(dev)
        kept_qsl = np.concatenate([[0], np.cumsum(s.kept)]).astype(np.int32)
        kept_rows = np.concatenate([np.arange(s.qsl_np[i + 1] - k, s.qsl_np[i + 1]) for i, k in enumerate(s.kept)])
        d = s.D  # decodes are one-token requests, one token each (decode threshold 1)
        self.inputs = {}
        for g in self.windows:
            valid = s.slots0[g] >= 0
            self.inputs[("main", g)] = BuildInputs(d, d, s.P, s.T - d, valid, s.t2r)
            kq = torch.tensor(kept_qsl, dtype=torch.int32, device=dev)
            self.inputs[("kept", g)] = BuildInputs(d, d, s.P, s.n - d, valid[torch.from_numpy(kept_rows).to(dev)],
                                                   vk.token_to_req_indices(kq, s.n))

    def model_state(self, kernels, cls=VllmModelState):
        """A model state (``cls``: vLLM's, or the pack's on top of it) whose builders call
        ``kernels``; ``(state, call)``, ``call()`` one step."""
        dev = self.dev

        def builders():
            out = []
            for g in range(G):
                if g in self.windows:
                    b = SwaBuilder(g, self.T, dev, kernels)
                    b.inputs = {kind: self.inputs[(kind, g)] for kind in ("main", "kept")}
                    out.append([b])
                else:
                    out.append([])
            return out

        attn_groups, replay_groups = builders(), builders()
        first = [[b for b in grp] if g == self.windows[0] else [] for g, grp in enumerate(builders())]
        route = vllm_model.Route(None, encoder=True, builders=True, decoder=True)
        model = type("Model", (), {})()
        model.step, model.kernels, model.swa_backends_route = self, kernels, route
        model.replay_groups, model.first_swa_groups = replay_groups, first
        config = type("Config", (), {})()
        config.parallel_config = type("Parallel", (), {"data_parallel_size": 1})()
        state = cls(config, model, None, dev)
        if getattr(state, "_swa_fuse", False):  # what model._window_builder finds: each window group's builder
            targets = []
            for g in self.windows:
                b = attn_groups[g][0]
                targets.append((b, runtime.WindowTarget(b.group, None, b.block_size, b.window_size, 0, 0,
                                                        *vllm_model._rows_of(b))))
            state._swa_builder = (attn_groups, targets[0])
            state._swa_second = (attn_groups, targets[1] if len(targets) > 1 else None)
            # what model._kept_builders finds: each group's replay builder, then (the first group) the first
            # replay layer's
            kept = {g: [(b, vllm_model._rows_of(b)) for b in (replay_groups[g][0], *first[g])] for g in self.windows}
            state._swa_kept_builders = (state._replay_attn_groups, kept)
        slots = self.s.slots0.clone()
        state.bench = {"slots": slots, "attn_groups": attn_groups, "replay_groups": replay_groups, "first": first}

        def call():
            return state.prepare_attn(self.batch, NONE, self.tables, slots, attn_groups, None)

        return state, call

    def outputs(self, state) -> dict:
        """Everything the step wrote (the real rows of each buffer)."""
        D, B, n = self.s.D, self.B, self.n
        out = {"slot mappings": state.bench["slots"]}
        for kind, key in (("main", "attn_groups"), ("kept", "replay_groups"), ("kept", "first")):
            for g, builders in enumerate(state.bench[key]):
                for b in builders:
                    x = b.inputs[kind]
                    tag = f"{key} group {g}"
                    out[f"{tag} decode rows"] = b.decode_swa_indices[:D]
                    out[f"{tag} decode lens"] = b.decode_swa_lens[:D]
                    out[f"{tag} prefill rows"] = b.prefill_swa_indices[: x.num_prefill_tokens]
                    out[f"{tag} prefill lens"] = b.prefill_swa_lens[: x.num_prefill_tokens]
                    if x.num_prefills:
                        out[f"{tag} gather lens"] = b.gather_lens
        out.update({"kept rows": state._kept_rows[:n], "kept query_start_loc": state._kept_query_start_loc,
                    "kept positions": state._kept_positions[:n], "kept slot mappings": state._kept_slot_mappings[:, :n],
                    "kept kv_start": state._kept_kv_start[:B]})
        return out

    def expected_launches(self) -> tuple[dict, dict]:
        """vLLM's and the pack's launches in this step, by kernel, from its shape (the rules of
        ``tests/integration/vllm/test_launch_counts.py``: eager, trimmed, the first window
        group's builder one the step predicts)."""
        s, nw = self.s, len(self.windows)
        rows = (s.D > 0) + (s.T > s.D)
        lens = int(s.P > 0)
        builds = nw + (nw + 1)  # the main builds, then the sub-batch's
        vllm = {"pad": int(s.replays), "swa": builds * rows, "prefill": builds * lens, "gather": 1}
        # each window group's builds in one launch, the sub-batch's included (the second group's gather lengths
        # answered by the first's)
        pack = {"prepare_replay_step": nw}
        return {k: v for k, v in vllm.items() if v}, {k: v for k, v in pack.items() if v}


def shim_kernels(shims: dict) -> types.SimpleNamespace:
    """The kernels the pack's column finds where vLLM's code looks (``routed_shims``' shims)."""
    return types.SimpleNamespace(pad=shims["pad_replayed_slots"], swa=shims["swa_indices_and_lens"],
                                 prefill=shims["prefill_gather_lens"], gather=None)


def calls_since(before: dict) -> dict:
    """The routed calls counted (``runtime.CALLS``) since the copy ``before`` was taken."""
    return {k: n - before.get(k, 0) for k, n in runtime.CALLS.items() if n != before.get(k, 0)}


class _Nothing:
    """A kernel object whose launches (``obj[grid](...)``, ``obj(...)``) do nothing."""

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs) -> None:
        return None


_NOTHING = _Nothing()
#: vLLM's four kernels doing nothing (the ``vllm_no_kernels`` column: vLLM's Python around its launches)
NO_KERNELS = types.SimpleNamespace(pad=_NOTHING, swa=_NOTHING, prefill=_NOTHING, gather=_NOTHING)


class _Counting:
    """One kernel object with its launches (``obj[grid](...)`` or ``obj(...)``) counted."""

    def __init__(self, obj, name: str, counts: collections.Counter):
        self.obj, self.name, self.counts = obj, name, counts

    def __getitem__(self, grid):
        self.counts[self.name] += 1
        return self.obj[grid]

    def __call__(self, *args, **kwargs):
        self.counts[self.name] += 1
        return self.obj(*args, **kwargs)


@contextlib.contextmanager
def counting(kernels, counts: collections.Counter):
    """Every launch through ``kernels`` (a namespace the model state and its builders share)
    counted into ``counts`` for the ``with`` block."""
    saved = dict(vars(kernels))
    for name, obj in saved.items():
        setattr(kernels, name, _Counting(obj, name, counts))
    try:
        yield
    finally:
        vars(kernels).update(saved)


def pack_launches(fn) -> dict:
    """The pack's kernel launches of one ``fn()``, by op (``Kernel.launches``)."""
    before = {name: k.launches for name, k in _launch.KERNELS.items()}
    fn()
    out = collections.Counter()
    for name, k in _launch.KERNELS.items():
        if k.launches != before.get(name, 0):
            out[name.split(".")[0]] += k.launches - before.get(name, 0)
    return dict(out)


def compare(want: dict, got: dict) -> None:
    for key, a in want.items():
        if not torch.equal(a, got[key]):
            raise AssertionError(f"{key}: the pack's step differs from the oracle's")


def run_config(name: str, windows: int, shape, L, ref, dev, rng, shims: dict) -> tuple[dict, dict]:
    """One step shape: the equality check, the launch counts, the GPU timings; returns the row and
    the callables whose host time :func:`host_rounds` measures (the routes of ``shims``, the pack's
    shims, must stay where they are until then)."""
    w = WholeStep(*shape, windows, dev, rng)
    pack_cls = vllm_model.model_state_class(VllmModelState)
    pack_kernels = shim_kernels(shims)
    pack_state, pack_call = w.model_state(pack_kernels, pack_cls)
    assert pack_state._swa_fuse and pack_state._swa_gather, "the pack's model state is off"
    before = dict(runtime.CALLS)
    t0 = time.perf_counter()
    got_launches = pack_launches(pack_call)
    once = {"pack": (time.perf_counter() - t0) * 1e6}
    called = calls_since(before)
    fns = {"pack": pack_call}
    want_vllm, want_pack = w.expected_launches()
    if got_launches != want_pack:
        raise AssertionError(f"the pack's launches {got_launches}, expected {want_pack} ({called})")
    row = {"step": name, "window_groups": windows, "B": w.B, "T": w.T, "decodes": w.s.D, "prefills": w.s.P,
           "kept_rows": w.n, "launches": {"pack": got_launches}, "pack_calls": called}
    if L is not None:
        kernels = types.SimpleNamespace(pad=L.pad, swa=L.swa, prefill=L.prefill, gather=L.gather)
        vllm_state, vllm_call = w.model_state(kernels)
        counts: collections.Counter = collections.Counter()
        with counting(kernels, counts):
            t0 = time.perf_counter()
            vllm_call()  # also the oracle: every output of the pack's step compared with vLLM's
            once["vllm"] = (time.perf_counter() - t0) * 1e6
        if dict(counts) != want_vllm:
            raise AssertionError(f"vLLM's launches {dict(counts)}, expected {want_vllm}")
        row["launches"]["vllm"] = dict(counts)
        compare(w.outputs(vllm_state), w.outputs(pack_state))
        row["checked_against"] = "vllm"
        fns = {"vllm": vllm_call, **fns}
    else:  # the pack's torch reference, one call at a time, stands in as the oracle
        with routed_shims(lambda device: ref):
            ref_state, ref_call = w.model_state(pack_kernels, pack_cls)
            ref_state._swa_fuse, ref_state._swa_backend = False, ref
            ref_call()
        compare(w.outputs(ref_state), w.outputs(pack_state))
        row["checked_against"] = "reference"
    if tm.smoke():  # the wiring only: the host time of the checked calls above, no timing loops
        row.update({f"{col}_host_us": v for col, v in once.items()})
        if L is not None:
            row["pack_vs_vllm_host_us"] = once["pack"] / once["vllm"]
        return row, {}
    if L is not None:
        # vLLM's column with its kernels doing nothing: vLLM's Python around its launches, most of which
        # the pack's column runs too (timed with the columns; it writes no metadata)
        _, bare_call = w.model_state(NO_KERNELS)
    for col, f in fns.items():
        # ~2 ms of GPU sleep before each step: its launches take up to a few hundred us of host
        # time, and GPU time is to be device time
        row.update({f"{col}_{k}": v for k, v in tm.gpu_pair(f, lead_cycles=tm.LONG_LEAD_CYCLES).items()})
    return row, ({**fns, "vllm_no_kernels": bare_call} if L is not None else fns)


#: host timing: rounds over every step shape (untimed, then timed), each round timing each shape's
#: columns for this many back-to-back steps, in turns of HOST_TURN steps
HOST_WARM_ROUNDS, HOST_ROUNDS, HOST_CALLS, HOST_TURN = 2, 9, 300, 25


def host_rounds(configs: list[tuple[dict, dict]]) -> None:
    """Host µs per step of every shape's columns, into each row: rounds over all the shapes, each
    shape's columns taking turns of :data:`HOST_TURN` steps within a round
    (``lib.timing.host_alternating_us``), the median over the rounds. Every shape is timed early
    and late in the run alike (timed one shape after another, the first shapes came out slower, the
    pack's column more than vLLM's), and a slow stretch of the host within a round falls on every
    column (timed one column after another, single rounds' ratios at one shape spread 0.25-0.78)."""
    timed = [(row, fns) for row, fns in configs if fns]
    times: list[dict] = [{k: [] for k in fns} for _, fns in timed]
    for r in range(HOST_WARM_ROUNDS + HOST_ROUNDS):
        for i in range(len(timed)):
            j = (i + r) % len(timed)  # the shapes' order rotates too
            got = tm.host_alternating_us(timed[j][1], calls=HOST_CALLS, turn=HOST_TURN, rotate=r)
            if r >= HOST_WARM_ROUNDS:
                for k, v in got.items():
                    times[j][k].append(v)
    for (row, _), t in zip(timed, times):
        _host_row(row, t)


def _host_row(row: dict, rounds: dict) -> None:
    """A row's host columns from each column's round times."""
    host = {k: statistics.median(v) for k, v in rounds.items()}
    L = "vllm" in host
    row.update({f"{col}_host_us": v for col, v in host.items()})
    if L:
        # what vLLM's kernel calls cost its column on the host, and the pack's column past vLLM's Python
        bare = row["vllm_no_kernels_host_us"]
        row["vllm_kernel_calls_host_us"] = row["vllm_host_us"] - bare
        row["pack_over_vllm_no_kernels_host_us"] = row["pack_host_us"] - bare
        row["vllm_no_kernels_vs_vllm_host_us"] = bare / row["vllm_host_us"]
        for k in ("gpu_us_flushed", "gpu_us_warm", "host_us"):
            row[f"pack_vs_vllm_{k}"] = row[f"pack_{k}"] / row[f"vllm_{k}"]
        paired = [a / b for a, b in zip(rounds["pack"], rounds["vllm"])]
        row["pack_vs_vllm_host_us_rounds"] = paired
        row["pack_vs_vllm_host_us_paired"] = statistics.median(paired)


def print_table(res) -> None:
    print(f"\n{res['meta']['device']}: one step's replay metadata, us (ratio to vLLM's) and kernel launches")
    print(f"vLLM's kernels: {res['meta']['vllm_kernels']}")
    print(f"{'step':>12} {'windows':>7} {'col':>5} {'GPU flushed':>16} {'GPU warm':>16} {'host':>16} {'launches':>9}")
    for row in res["steps"]:
        for col in COLUMNS:
            if f"{col}_host_us" not in row:
                continue
            cells = []
            for k in ("gpu_us_flushed", "gpu_us_warm", "host_us"):
                v, r = row.get(f"{col}_{k}"), row.get(f"{col}_vs_vllm_{k}")
                ratio = f" ({r:4.2f})" if r is not None else "       "
                cells.append(("       -" if v is None else f"{v:8.2f}") + ratio)
            n = sum(row["launches"][col].values())
            print(f"{row['step']:>12} {row['window_groups']:>7} {col:>5} " + " ".join(f"{c:>16}" for c in cells)
                  + f" {n:>9}")
    paired = [(row["step"], row["window_groups"], row["pack_vs_vllm_host_us_paired"]) for row in res["steps"]
              if "pack_vs_vllm_host_us_paired" in row]
    if paired:
        print("host ratio, the median of each round's ratio: "
              + "; ".join(f"{step}/{w}w {r:.2f}" for step, w, r in paired))
    bare = [row for row in res["steps"] if "vllm_no_kernels_host_us" in row]
    if bare:
        print("host us: vLLM's column with its kernels doing nothing / its kernel calls / the pack's column past the "
              "former: " + "; ".join(f"{row['step']}/{row['window_groups']}w {row['vllm_no_kernels_host_us']:.1f} / "
                                     f"{row['vllm_kernel_calls_host_us']:.1f} / "
                                     f"{row['pack_over_vllm_no_kernels_host_us']:.1f}" for row in bare))


#: the model state's methods and the runtime's functions timed as pieces
MODEL_PIECES = ("_swa_prepare_step", "_swa_window_target", "_swa_second_target", "_swa_predicted_gather",
                "_swa_gather_args", "_swa_kept_targets", "_swa_kept_input_batch", "_swa_kept_views")
RUNTIME_PIECES = ("begin_step", "prepare_step", "flush_step", "end_step", "answered_swa", "answered_gather_lens",
                  "gather_replay_batch", "replay_plan", "predicted_kept", "predicted_split", "query_lens", "replaced")


def _timed_pieces(pack_cls, be, calls: int, call) -> dict:
    """Host µs per step inside each piece over ``calls`` steps (wrappers put back after)."""
    spent: dict = {}
    saved = []  # (owner, name, what its own __dict__ held under name, or None)

    def wrap(owner, name: str, label: str) -> None:
        real = getattr(owner, name)
        own = vars(owner).get(name)
        saved.append((owner, name, own))

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, name, timed)

    for name in MODEL_PIECES:
        wrap(pack_cls, name, f"model.{name}")
    for name in RUNTIME_PIECES:
        wrap(runtime, name, f"runtime.{name}")
    wrap(be, "prepare_replay_step", "backend.prepare_replay_step")
    try:
        for _ in range(calls):
            call()
    finally:
        for owner, name, own in reversed(saved):
            if own is None:
                delattr(owner, name)  # inherited, or looked up on the class: as before
            else:
                setattr(owner, name, own)
    return {k: v / calls * 1e6 for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}


def run_parts(step: str, rounds: int, out: Path, smoke_run: bool) -> int:
    """``--parts``: where the pack's own part of the step goes, one step shape, one window group:
    the pack's column against vLLM's column with its kernels doing nothing, in rounds of 300 steps a
    column taking turns of 25 (two more untimed; ``own``: the median of each round's difference),
    then the host µs per step spent inside each of the pack's functions of the step (inclusive; a
    clock read around every call of them adds about 0.1-0.3 µs to a piece), over 3000 steps. On a
    GPU the pack's launch is real; off one every launch of the pack's kernels is a no-op after one
    real call through Triton's interpreter: the host's Python alone. Writes
    ``bench_replay_step_parts.json``."""
    gpu = torch.cuda.is_available() and not smoke_run
    dev = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    # the settings this needs, put back after (a test calls it in its own process)
    prefer = os.environ.get(runtime.PREFER_ENV)
    if not gpu and prefer is None:
        os.environ[runtime.PREFER_ENV] = "triton"  # the integration's backend runs the Triton kernels
    try:
        with validation(False):
            return _parts(step, rounds, out, smoke_run, gpu, dev)
    finally:
        if prefer is None:
            os.environ.pop(runtime.PREFER_ENV, None)


def _parts(step: str, rounds: int, out: Path, smoke_run: bool, gpu: bool, dev: torch.device) -> int:
    rounds, calls, pieces_calls = (1, 4, 4) if smoke_run else (rounds, 300, 3000)
    w = WholeStep(*STEPS[step], 1, dev, np.random.default_rng(0))
    pack_cls = vllm_model.model_state_class(VllmModelState)
    noop = not gpu
    real_call = _launch.Kernel.__call__
    with graph_modes(), routed_shims(runtime.backend_for) as shims:
        _, pack = w.model_state(shim_kernels(shims), pack_cls)
        before = dict(runtime.CALLS)
        pack()  # one real call (the interpreter's off a GPU): the launch compiled, the answers found
        answered = calls_since(before)
        _, bare = w.model_state(NO_KERNELS)
        if noop:
            _launch.Kernel.__call__ = lambda self, key, grid, *args: None
        try:
            times: dict = {}
            warm = 0 if smoke_run else 2
            for r in range(rounds + warm):
                got = tm.host_alternating_us({"pack": pack, "vllm_no_kernels": bare}, calls=calls, turn=HOST_TURN,
                                             rotate=r)
                if r >= warm:
                    for k, v in got.items():
                        times.setdefault(k, []).append(v)
            own = [p - b for p, b in zip(times["pack"], times["vllm_no_kernels"])]
            pieces = _timed_pieces(pack_cls, runtime.backend_for(dev), pieces_calls, pack)
        finally:
            _launch.Kernel.__call__ = real_call
    res = {"meta": results.machine(dev), "step": step, "launches": "no-ops after one real call" if noop else "real",
           "calls_in_the_step": answered, "rounds": len(own),
           "pack_host_us": statistics.median(times["pack"]),
           "vllm_no_kernels_host_us": statistics.median(times["vllm_no_kernels"]),
           "own_us": statistics.median(own), "own_us_rounds": own, "pieces_us": pieces}
    print(f"{step}: pack {res['pack_host_us']:.1f} us, vLLM's column without kernels "
          f"{res['vllm_no_kernels_host_us']:.1f}, the pack's own part {res['own_us']:.1f} "
          f"(launches: {res['launches']})")
    for k, v in pieces.items():
        print(f"  {k:34s} {v:7.2f}")
    results.write_json(results.out_file(out, "bench_replay_step_parts.json"), res)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="What each column measures: the module docstring and bench/README.md.")
    ap.add_argument("--out", required=True, help="directory for the JSON")
    ap.add_argument("--quick", action="store_true", help="the first step shape only")
    ap.add_argument("--smoke", action="store_true",
                    help="no GPU: tiny steps through Triton's interpreter (checks the script; numbers mean nothing)")
    ap.add_argument("--parts", metavar="STEP", default=None, choices=sorted(STEPS),
                    help="instead of the benchmark: where the pack's own part of one step shape goes "
                         "(bench_replay_step_parts.json; off a GPU every launch a no-op)")
    ap.add_argument("--rounds", type=int, default=11, help="--parts: timed rounds")
    ap.add_argument("--vllm-kernels", default=None,
                    help=f"folder with vLLM's model_state.py, sparse_swa.py, jit_warmup.py and "
                         f"jit_warmup_triton_helper.py (default: ${vk.ENV}, else the installed vLLM)")
    a = ap.parse_args(argv)
    if a.parts:
        return run_parts(a.parts, a.rounds, Path(a.out), a.smoke)
    why = smoke.refusal(a.smoke)
    if why:
        print(why, file=sys.stderr)
        return 2
    tm.set_smoke(a.smoke)
    configs, steps = (SMOKE_CONFIGS, SMOKE_STEPS) if a.smoke else (CONFIGS, STEPS)
    if a.smoke:
        os.environ.setdefault(runtime.PREFER_ENV, "triton")  # the integration's backend runs the Triton kernels
    if a.quick:
        configs = configs[:1]
    path = results.out_file(a.out, "bench_replay_step.json")
    dev = torch.device("cpu") if a.smoke else torch.device("cuda", torch.cuda.current_device())
    set_validation(False)
    ref = swa_backends.select(dev, prefer="reference")
    L, origin = vk.load_launchers(a.vllm_kernels)
    be = runtime.backend_for(dev)
    res = {"meta": {
        **results.machine(dev), "smoke": a.smoke,
        "launch_path": _launch.launch_path(_launcher_cls())[0] if not a.smoke else "interpreter",
        "vllm_kernels": origin, "vllm_ran": L is not None, "W": W, "block_size": BS, "groups": G,
        "pack_variants": {op: be.variants[op][0] for op in ("prepare_replay_step", "swa_indices_and_lens")},
        "method": "GPU us: events around the whole step, median of 200 steps, L2 flushed (256 MB zeroed before each) "
                  "and warm (a GPU sleep instead); host us: back-to-back steps without sync, validation off, "
                  f"rounds over every step shape, each shape's columns taking turns of {HOST_TURN} steps within a "
                  f"round (median of {HOST_ROUNDS} rounds of {HOST_CALLS} steps a column, after "
                  f"{HOST_WARM_ROUNDS} untimed rounds)",
    }, "steps": []}
    rng = np.random.default_rng(0)
    with graph_modes(), routed_shims(runtime.backend_for) as shims:
        done = [run_config(name, windows, steps[name], L, ref, dev, rng, shims) for name, windows in configs]
        host_rounds(done)
    res["steps"] = [row for row, _ in done]
    results.write_json(path, res)
    print_table(res)
    print(f"\nwrote {path}")
    return 0


def _launcher_cls():
    from triton.runtime import driver

    return driver.active.launcher_cls


if __name__ == "__main__":
    sys.exit(main())
