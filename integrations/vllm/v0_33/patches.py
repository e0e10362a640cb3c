"""THE module holding every patch the vLLM integration cannot avoid with vLLM 0.33.

vLLM 0.33 has no seam for three kernel launches of DeepSeek-V4.1's replay metadata: they
are inline in ``DeepseekV41ModelState.prepare_attn`` and in
``DeepseekSparseSWAMetadataBuilder.build`` / ``update_draft_decode_metadata``, and each
looks its kernel up as a module global at call time. On ROCm a fourth: the sparse-MLA prefill
of ``DeepseekV41ROCMAiterMLAAttention`` (the consumer of the clamped window, when the pack
turns encoder replay on there), a module global of ``vllm.models.deepseek_v41.amd.rocm``.
Each patch below replaces one such global with a shim that keeps the original's calling
convention; while its route is off (:func:`route`) a shim hands every call to vLLM's original
object unchanged, so a patch applied for a model the pack does not serve is inert (the
machinery, the same for every release: ``swa_backends.integrations.vllm.patches``). Nothing
else in vLLM is patched: the model class goes through ``ModelRegistry.register_model`` and the
model state through the model's ``get_model_state_cls`` (see ``model.py``).

===================================  ==========================================  =========================
patched global                       replaced launch                             routed to
===================================  ==========================================  =========================
``vllm.models.deepseek_v41.nvidia.   ``_pad_replayed_slots_kernel[(num_reqs,)]``  ``Backend.pad_replayed_
model_state._pad_replayed_slots_     in ``prepare_attn`` and ``.warmup(...)`` in  slots``
kernel``                             ``_warm_up_replay_kernels``
``vllm.v1.attention.backends.mla.    ``_COMPUTE_SWA_INDICES_AND_LENS_KERNEL(...)``  ``Backend.swa_indices_
sparse_swa._COMPUTE_SWA_INDICES_     (decode and prefill rows in ``build``, draft  and_lens`` (image
AND_LENS_KERNEL``                    rows in ``update_draft_decode_metadata``)    widening stays vLLM's)
``vllm.v1.attention.backends.mla.    ``_COMPUTE_PREFILL_METADATA_KERNEL(...)`` in   ``Backend.prefill_gather_
sparse_swa._COMPUTE_PREFILL_         ``_build_deepseek_v4_metadata``              lens``
METADATA_KERNEL``
``vllm.models.deepseek_v41.amd.      ``rocm_sparse_attn_prefill(...)`` in           ``Backend.sparse_mla``
rocm.rocm_sparse_attn_prefill``      ``DeepseekV41ROCMAiterMLAAttention``'s         (ROCm only)
                                     default prefill, per chunk
===================================  ==========================================  =========================

:func:`apply` checks each target against the pinned vLLM (the callable's parameter names,
the attributes the shim forwards) and applies only the patches whose check passes;
:func:`status` gives each patch's outcome and reason (this module hands on the machinery's
:func:`route`, :func:`status`, :func:`restore`, ... so that a release's patches read as one
module). ``tests/integration/vllm`` checks the list, the signatures and the sources of the
replaced functions against vLLM.
"""

from __future__ import annotations

import functools

from ....common.types import PAD
from .. import runtime
from ..patches import (Patch, Shim, applied, check_call, check_function, check_jit, failed, pin, restore,  # noqa: F401
                       route, routes, status)
from ..patches import apply as _apply
from . import RELEASE

MODEL_STATE = "vllm.models.deepseek_v41.nvidia.model_state"
SPARSE_SWA = "vllm.v1.attention.backends.mla.sparse_swa"
ROCM_ATTENTION = "vllm.models.deepseek_v41.amd.rocm"


# ---------------------------------------------------------------------------------------
# the shims
# ---------------------------------------------------------------------------------------


class PadReplayedSlotsShim(Shim):
    """``_pad_replayed_slots_kernel``: a Triton ``JITFunction`` used as ``kernel[grid](...)``
    and ``kernel.warmup(..., grid=)``."""

    route_name = "pad_replayed_slots"

    def __getitem__(self, grid):
        if not self._routed():
            return self._swa_original[grid]
        return functools.partial(self._launch, grid)

    def _launch(self, grid, slot_mappings, group_stride, cacheable_groups, query_start_loc, positions, replay_start,
                window, pad_slot_id, *, NUM_GROUPS=None, BLOCK=None, **meta):
        try:
            be = self._backend(slot_mappings.device)
            if be is not None and pad_slot_id == PAD and group_stride == slot_mappings.stride(0) and not meta:
                # a call held for the step's launch keeps vLLM's kernel as its fallback (runtime.flush_step)
                runtime.pad_replayed_slots(be, slot_mappings, cacheable_groups, query_start_loc, positions,
                                           replay_start, window, int(grid[0]),
                                           fallback=functools.partial(self._vllm, grid, slot_mappings, group_stride,
                                                                      cacheable_groups, query_start_loc, positions,
                                                                      replay_start, window, pad_slot_id, NUM_GROUPS,
                                                                      BLOCK))
                return None
        except Exception as exc:  # noqa: BLE001 - the kernel raises before writing (a held pad ran vLLM's)
            self._failed(exc)
        return self._vllm(grid, slot_mappings, group_stride, cacheable_groups, query_start_loc, positions, replay_start,
                          window, pad_slot_id, NUM_GROUPS, BLOCK, meta)

    def _vllm(self, grid, slot_mappings, group_stride, cacheable_groups, query_start_loc, positions, replay_start,
              window, pad_slot_id, NUM_GROUPS=None, BLOCK=None, meta=None):
        """vLLM's own launch of this call."""
        kwargs = dict(meta or ())
        if NUM_GROUPS is not None:
            kwargs["NUM_GROUPS"] = NUM_GROUPS
        if BLOCK is not None:
            kwargs["BLOCK"] = BLOCK
        return self._swa_original[grid](slot_mappings, group_stride, cacheable_groups, query_start_loc, positions,
                                        replay_start, window, pad_slot_id, **kwargs)

    def warmup(self, *args, grid=None, **kwargs):
        """vLLM compiles the pad kernel on its buffers; routed, the pack's kernel is warmed
        instead (``runtime.warm_up``); if that fails, the route goes back to vLLM's kernel,
        which is warmed as vLLM asked."""
        slot_mappings = args[0] if args else kwargs.get("slot_mappings_ptr")
        try:
            be = self._backend(slot_mappings.device) if slot_mappings is not None else None
            if be is not None:
                runtime.warm_up(be, slot_mappings.device, pad=True, num_groups=int(slot_mappings.shape[0]))
                return None
        except Exception as exc:  # noqa: BLE001 - vLLM's first prepare_attn must not see it
            self._failed(exc)
        return self._swa_original.warmup(*args, grid=grid, **kwargs)


class SwaIndicesAndLensShim(Shim):
    """``_COMPUTE_SWA_INDICES_AND_LENS_KERNEL``: a ``VllmTritonJitKernel`` called as
    ``kernel(swa_indices, swa_lens, window_size, index_width, left_visible, right_visible,
    query_start_loc, seq_lens, token_to_req_indices, is_valid_token, block_table, block_size,
    replay_start, *, num_tokens, token_offset, has_image=False)``; ``register_warmup`` and
    everything else go to the original."""

    route_name = "swa_indices_and_lens"

    def __call__(self, swa_indices, swa_lens, window_size, index_width, left_visible, right_visible, query_start_loc,
                 seq_lens, token_to_req_indices, is_valid_token, block_table, block_size, replay_start, *, num_tokens,
                 token_offset, has_image=False):
        if not has_image:
            try:
                if runtime.answered_swa(swa_indices, query_start_loc, replay_start, block_table, num_tokens,
                                        token_offset):
                    return None  # the step's one launch wrote it
                be = self._backend(swa_indices.device)
                if be is not None and runtime.swa_indices_and_lens(
                        be, swa_indices, swa_lens, window_size, index_width, query_start_loc, seq_lens,
                        is_valid_token, block_table, block_size, replay_start, num_tokens=num_tokens,
                        token_offset=token_offset):
                    return None
            except Exception as exc:  # noqa: BLE001 - the kernel raises before writing
                self._failed(exc)
        return self._swa_original(swa_indices, swa_lens, window_size, index_width, left_visible, right_visible,
                                  query_start_loc, seq_lens, token_to_req_indices, is_valid_token, block_table,
                                  block_size, replay_start, num_tokens=num_tokens, token_offset=token_offset,
                                  has_image=has_image)


class PrefillMetadataShim(Shim):
    """``_COMPUTE_PREFILL_METADATA_KERNEL``: called as ``kernel(prefill_gather_lens,
    seq_lens, query_start_loc, replay_start, num_prefills, num_decodes, window_size)``."""

    route_name = "prefill_gather_lens"

    def __call__(self, prefill_gather_lens, seq_lens, query_start_loc, replay_start, num_prefills, num_decodes,
                 window_size):
        try:
            if runtime.answered_gather_lens(prefill_gather_lens, query_start_loc, replay_start, num_prefills,
                                            num_decodes, window_size):
                return None  # the step's one launch wrote them
            be = self._backend(prefill_gather_lens.device)
            if be is not None and runtime.prefill_gather_lens(be, prefill_gather_lens, seq_lens, query_start_loc,
                                                              replay_start, int(num_prefills), int(num_decodes),
                                                              int(window_size)):
                return None
        except Exception as exc:  # noqa: BLE001 - the kernel raises before writing
            self._failed(exc)
        return self._swa_original(prefill_gather_lens, seq_lens, query_start_loc, replay_start, num_prefills,
                                  num_decodes, window_size)


class RocmSparsePrefillShim(Shim):
    """``rocm_sparse_attn_prefill``: a plain function called as ``fn(q, kv, indices,
    topk_length, scale, head_dim, nope_head_dim, rope_head_dim, attn_sink, output,
    ragged_indices=None, ragged_indptr=None)``, writing ``output`` in place."""

    route_name = "rocm_sparse_attn_prefill"

    def __call__(self, q, kv, indices, topk_length, scale, head_dim, nope_head_dim, rope_head_dim, attn_sink, output,
                 ragged_indices=None, ragged_indptr=None):
        if ragged_indices is None and ragged_indptr is None and head_dim == q.shape[-1]:
            try:
                be = self._backend(q.device)
                if be is not None and runtime.rocm_sparse_prefill(be, q, kv, indices, topk_length, scale, attn_sink,
                                                                  output):
                    return None
            except Exception as exc:  # noqa: BLE001 - sparse_mla raises before it writes output
                self._failed(exc)
        return self._swa_original(q, kv, indices, topk_length, scale, head_dim, nope_head_dim, rope_head_dim,
                                  attn_sink, output, ragged_indices=ragged_indices, ragged_indptr=ragged_indptr)


# ---------------------------------------------------------------------------------------
# the patch list and its checks
# ---------------------------------------------------------------------------------------


PAD_PARAMS = ("slot_mappings_ptr", "group_stride", "cacheable_groups_ptr", "query_start_loc_ptr", "positions_ptr",
              "replay_start_ptr", "window", "pad_slot_id", "NUM_GROUPS", "BLOCK")
SWA_PARAMS = ("self", "swa_indices", "swa_lens", "window_size", "index_width", "left_visible", "right_visible",
              "query_start_loc", "seq_lens", "token_to_req_indices", "is_valid_token", "block_table", "block_size",
              "replay_start", "num_tokens", "token_offset", "has_image")
PREFILL_PARAMS = ("self", "prefill_gather_lens", "seq_lens", "query_start_loc", "replay_start", "num_prefills",
                  "num_decodes", "window_size")
ROCM_PREFILL_PARAMS = ("q", "kv", "indices", "topk_length", "scale", "head_dim", "nope_head_dim", "rope_head_dim",
                       "attn_sink", "output", "ragged_indices", "ragged_indptr")

PATCHES: tuple[Patch, ...] = (
    Patch("pad_replayed_slots", MODEL_STATE, "_pad_replayed_slots_kernel", PadReplayedSlotsShim,
          lambda o: check_jit(o, PAD_PARAMS, ("warmup",)),
          "launched inline in DeepseekV41ModelState.prepare_attn (no method seam)"),
    Patch("swa_indices_and_lens", SPARSE_SWA, "_COMPUTE_SWA_INDICES_AND_LENS_KERNEL", SwaIndicesAndLensShim,
          lambda o: check_call(o, SWA_PARAMS, ("register_warmup",)),
          "called inline in DeepseekSparseSWAMetadataBuilder.build / update_draft_decode_metadata"),
    Patch("prefill_gather_lens", SPARSE_SWA, "_COMPUTE_PREFILL_METADATA_KERNEL", PrefillMetadataShim,
          lambda o: check_call(o, PREFILL_PARAMS, ("register_warmup",)),
          "called inline in DeepseekSparseSWAMetadataBuilder._build_deepseek_v4_metadata"),
    Patch("rocm_sparse_attn_prefill", ROCM_ATTENTION, "rocm_sparse_attn_prefill", RocmSparsePrefillShim,
          lambda o: check_function(o, ROCM_PREFILL_PARAMS),
          "called inline in DeepseekV41ROCMAiterMLAAttention's default prefill (its module imports only on ROCm)",
          platform="rocm"),
)


def apply(platform: str | None = None) -> dict[str, str]:
    """Apply every patch of :data:`PATCHES` whose check passes (idempotent); returns
    :func:`status`. ``platform``: ``"rocm"``, ``"cuda"``, ... (None: vLLM's current platform);
    a patch for another platform is not applied and its module not imported."""
    return _apply(PATCHES, release=RELEASE, platform=platform)
