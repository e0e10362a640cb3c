"""The pack's capability decision from vLLM's own configuration.

:func:`serving_config` maps a ``VllmConfig`` onto :class:`swa_backends.ServingConfig`;
:func:`decide` adds the device and returns the pack's :class:`~swa_backends.Capabilities`
next to what vLLM itself would do with encoder replay (its ``attention.py`` turns it off under
PCP without prefix caching, and on ROCm: 0.33 on every ROCm device and without model runner V2,
0.34 outside CDNA 3 and 4). Both are pure
functions of the config objects (attribute reads only), so they are unit-tested on configs
built without a model. See ``swa-backends info --config KEY=VALUE`` for the same decision.

What a release pins -- vLLM's lists mirrored here, its speculative methods, the rules that differ
between releases (the model runner, sequence-parallel MoE, the ROCm gate of encoder replay), the
lines each rule restates -- is the release subpackage's ``config`` module (``v0_33/config.py``,
``v0_34/config.py``), read for the
installed vLLM's release (``current_release()``: the newest supported where vLLM is absent).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...common.config import ServingConfig
from ...dispatch import Capabilities, capabilities

#: CUDAGraphMode names -> ServingConfig.graph_mode
GRAPH_MODES = {"NONE": "none", "PIECEWISE": "piecewise", "FULL": "full", "FULL_DECODE_ONLY": "decode_only",
               "FULL_AND_PIECEWISE": "full_and_piecewise"}


def _text_config(vllm_config):
    mc = vllm_config.model_config
    return getattr(mc, "hf_text_config", None) or mc.hf_config


def cut_layer(vllm_config) -> int | None:
    """The last KV-source layer (``max(kv_source_layer_ids)``), None when the config has none."""
    ids = getattr(_text_config(vllm_config), "kv_source_layer_ids", None)
    return max(ids) if ids else None


def graph_mode(vllm_config) -> str:
    if getattr(vllm_config.model_config, "enforce_eager", False):
        return "none"
    mode = getattr(vllm_config.compilation_config, "cudagraph_mode", None)
    name = getattr(mode, "name", None)
    return GRAPH_MODES.get(name, "none" if mode is None else "full_and_piecewise")


def facts():
    """The release's ``config`` module (``v0_33/config.py``, ...) for the installed vLLM."""
    from . import current_release

    return current_release().config


def _mega_moe_backends() -> frozenset:
    try:
        from vllm.config.kernel import MEGA_MOE_BACKENDS
    except Exception:  # noqa: BLE001 - config objects built without vLLM (tests): the release's copy
        return facts().MEGA_MOE_BACKENDS
    return frozenset(MEGA_MOE_BACKENDS)


def mega_moe(vllm_config) -> bool:
    """The MoE backend is a MegaMoE kernel: one of vLLM's ``MEGA_MOE_BACKENDS`` (what
    DeepSeek-V4.1's PCP check refuses) or ``aiter_mega_moe`` (ROCm's, which vLLM's LoRA check
    refuses as a MegaMoE too)."""
    backend = getattr(getattr(vllm_config, "kernel_config", None), "moe_backend", None)
    return backend in _mega_moe_backends() or backend == "aiter_mega_moe"


def sequence_parallel_moe(vllm_config) -> bool:
    """vLLM's ``_use_sequence_parallel`` (DeepSeek-V4.1 ``nvidia/model.py``), as the release
    states it (its ``config.sequence_parallel_moe``): expert parallel, TP > 1 and (a MegaMoE
    backend or DP > 1); 0.33 also needs PP 1."""
    kernel = getattr(vllm_config, "kernel_config", None)
    mega = getattr(kernel, "moe_backend", None) in _mega_moe_backends()
    return bool(facts().sequence_parallel_moe(vllm_config.parallel_config, mega))


def model_runner(vllm_config) -> str:
    """``"v2"`` or ``"v1"``: the model runner vLLM runs (the release's ``config.model_runner``:
    0.33 reads ``use_v2_model_runner``; 0.34 has model runner V2 only)."""
    return facts().model_runner(vllm_config)


def stage_holds_all_layers_after_cut(vllm_config, pp_rank: int | None = None) -> bool:
    """This pipeline stage holds the cut and every layer after it (vLLM's
    ``_decoder_replay_supported``). ``pp_rank`` None: this process's PP rank when vLLM's
    PP group exists, else the last stage (the only one that can hold them)."""
    pc = vllm_config.parallel_config
    size = pc.pipeline_parallel_size
    if size == 1:
        return True
    cut = cut_layer(vllm_config)
    num_layers = _text_config(vllm_config).num_hidden_layers
    if pp_rank is None:
        try:
            from vllm.distributed.parallel_state import get_pp_group

            pp_rank = get_pp_group().rank_in_group
        except Exception:  # noqa: BLE001 - no process group (config-only use)
            pp_rank = size - 1
    from vllm.distributed.utils import get_pp_indices

    start, end = get_pp_indices(num_layers, pp_rank, size)
    return cut is not None and start <= cut and end >= num_layers


def drafter(vllm_config) -> str:
    """The speculative drafter's kind: ``none`` without a ``speculative_config``, else its
    method by the release's ``DRAFTER_KINDS``; an MTP model type (``deepseek_mtp``, ...: vLLM's
    post-init folds them into ``mtp``, and every one ends in ``_mtp``) is ``mtp``; the release's
    ``OTHER_DRAFTERS`` (``custom_class``, ``extract_hidden_states``) or a method the release
    does not know is ``other``."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return "none"
    method = getattr(spec, "method", None)
    kinds = facts().DRAFTER_KINDS
    if method in kinds:
        return kinds[method]
    if isinstance(method, str) and method.endswith("_mtp"):
        return "mtp"
    return "other"


def drafter_window(vllm_config) -> int | None:
    """The drafter's window as the pack judges it: None without a drafter; the draft
    model's ``sliding_window`` when every draft layer is a sliding-window layer; else
    ``max_model_len`` (it reads hidden states outside any window, vLLM's own test)."""
    spec = getattr(vllm_config, "speculative_config", None)
    draft = getattr(spec, "draft_model_config", None) if spec is not None else None
    if draft is None:
        return None
    hf = getattr(draft, "hf_config", None)
    window = getattr(hf, "sliding_window", None)
    types = getattr(hf, "layer_types", None) or ()
    if window is None or any(t != "sliding_attention" for t in types):
        return max(int(getattr(vllm_config.model_config, "max_model_len", 1) or 1),
                   int(getattr(_text_config(vllm_config), "sliding_window", 1) or 1) + 1)
    return int(window)


def serving_config(vllm_config, *, pp_rank: int | None = None) -> ServingConfig:
    """``VllmConfig`` -> :class:`ServingConfig` (SPEC §4's fields).

    ``engram_after_cut`` counts an Engram layer *at* the cut too: vLLM's replay batch
    starts at the cut layer (it writes every row's KV, then runs trimmed).
    ``drafter_aux_layers`` stays empty: vLLM (0.33, 0.34) hands the drafter the replay layers'
    aux hidden states for the kept rows and gates the drafter by its window instead
    (``drafter_window``). ``kv_connector`` and ``kv_connector_owns_scheduling`` are both
    "a ``kv_transfer_config`` is set": vLLM's PCP check refuses any connector."""
    pc = vllm_config.parallel_config
    text = _text_config(vllm_config)
    cut = cut_layer(vllm_config)
    engram = tuple(getattr(text, "engram_layer_ids", None) or ())
    sched = vllm_config.scheduler_config
    return ServingConfig(
        model_runner=model_runner(vllm_config),
        pipeline_parallel_size=int(pc.pipeline_parallel_size),
        prefill_context_parallel_size=int(getattr(pc, "prefill_context_parallel_size", 1) or 1),
        decode_context_parallel_size=int(getattr(pc, "decode_context_parallel_size", 1) or 1),
        data_parallel_size=int(pc.data_parallel_size),
        stage_holds_all_layers_after_cut=stage_holds_all_layers_after_cut(vllm_config, pp_rank),
        sequence_parallel_moe=sequence_parallel_moe(vllm_config),
        mega_moe=mega_moe(vllm_config),
        microbatching=bool(getattr(pc, "use_ubatching", False)),
        drafter=drafter(vllm_config),
        drafter_window=drafter_window(vllm_config),
        cut_layer=cut,
        engram_after_cut=cut is not None and any(i >= cut for i in engram),
        lora=getattr(vllm_config, "lora_config", None) is not None,
        graph_mode=graph_mode(vllm_config),
        async_scheduling=bool(getattr(sched, "async_scheduling", False)),
        kv_connector=getattr(vllm_config, "kv_transfer_config", None) is not None,
        kv_connector_owns_scheduling=getattr(vllm_config, "kv_transfer_config", None) is not None,
        window=int(getattr(text, "sliding_window", 128) or 128),
    )


def vllm_encoder_replay(vllm_config, *, platform: str | None = None, arch: str | None = None
                        ) -> tuple[bool, str | None]:
    """What vLLM itself does with encoder replay (DeepSeek-V4.1's ``attention.py``):
    ``(on, reason it is off)``. ``platform``: ``"rocm"``, ``"cuda"``, ... (None: vLLM's);
    ``arch``: the device's (``gfx942``, ...), which the release's ROCm gate may read
    (``config.rocm_replay_off``: 0.33 keeps it off on every ROCm device, 0.34 on all but CDNA 3
    and 4)."""
    cc = vllm_config.cache_config
    if not getattr(cc, "swa_bounded_replay", False):
        return False, "--swa-bounded-replay is off (cache_config.swa_bounded_replay=False)"
    if model_runner(vllm_config) != "v2":
        return False, "vLLM needs model runner V2 for SWA bounded replay"
    if getattr(vllm_config.parallel_config, "prefill_context_parallel_size", 1) > 1 and not cc.enable_prefix_caching:
        return False, "vLLM turns SWA bounded replay off under PCP without prefix caching"
    if platform is None:
        from vllm.platforms import current_platform

        platform = "rocm" if current_platform.is_rocm() else "other"
    if platform == "rocm":
        why = facts().rocm_replay_off(arch)
        if why is not None:
            return False, why
    return True, None


def vllm_requires_encoder_replay(vllm_config) -> str | None:
    """Why vLLM would refuse to start with encoder replay off (``nvidia/model.py``: PCP with
    prefix caching requires it), else None: the pack then cannot turn it off."""
    pc = vllm_config.parallel_config
    if getattr(pc, "prefill_context_parallel_size", 1) > 1 and vllm_config.cache_config.enable_prefix_caching:
        return "vLLM requires SWA bounded replay under PCP with prefix caching (it raises otherwise)"
    return None


@dataclass(frozen=True)
class Decision:
    """The pack's decision for a vLLM configuration on a device, next to vLLM's own."""

    config: ServingConfig
    capabilities: Capabilities
    vllm_encoder: bool
    vllm_encoder_reason: str | None
    must_keep_encoder: str | None = None
    vllm_off_for_rocm_only: bool = False

    @property
    def encoder(self) -> bool:
        """Encoder replay runs, through the pack: both agree it is on."""
        return self.capabilities.encoder_replay.enabled and self.vllm_encoder

    @property
    def encoder_on_rocm(self) -> str | None:
        """Why the pack cannot turn on, on ROCm, the encoder replay vLLM keeps off there; None
        when it can: the pack's capabilities say on, ROCm is vLLM's only reason for off (its
        other gates pass) and no drafter is configured (vLLM builds a drafter's window caches
        with replay off on ROCm, and the pack switches only the target's). Not applicable
        (a reason) when vLLM turns it off for another reason or on another platform."""
        if not self.capabilities.encoder_replay.enabled:
            return "the pack turns encoder replay off here"
        if self.vllm_encoder or not self.vllm_off_for_rocm_only:
            return "vLLM does not turn encoder replay off for ROCm here"
        if self.config.drafter_window is not None:
            return ("a drafter is configured: vLLM builds its window caches with replay off on ROCm and the pack "
                    "turns on only the target model's")
        return None

    def as_dict(self) -> dict:
        import dataclasses

        return {"serving_config": dataclasses.asdict(self.config), "capabilities": self.capabilities.as_dict(),
                "vllm_encoder": self.vllm_encoder, "vllm_encoder_reason": self.vllm_encoder_reason,
                "must_keep_encoder": self.must_keep_encoder, "vllm_off_for_rocm_only": self.vllm_off_for_rocm_only,
                "pack_turns_encoder_on_on_rocm": self.vllm_off_for_rocm_only and self.encoder_on_rocm is None,
                "encoder_on_rocm_blocked_by": self.encoder_on_rocm if self.vllm_off_for_rocm_only else None}


def decide(vllm_config, device=None, *, pp_rank: int | None = None, platform: str | None = None) -> Decision:
    """The pack's capabilities for ``vllm_config`` on ``device`` (a torch device, a
    ``"platform:arch"`` string such as ``"cuda:sm90"``, or None: vLLM's
    ``device_config.device``) plus vLLM's own encoder-replay decision."""
    if device is None:
        device = getattr(getattr(vllm_config, "device_config", None), "device", None)
    cfg = serving_config(vllm_config, pp_rank=pp_rank)
    caps = capabilities(device, config=cfg)
    on, why = vllm_encoder_replay(vllm_config, platform=platform, arch=caps.device.arch)
    # the pack turns on what vLLM keeps off for ROCm alone only where the release's ROCm path lets it
    rocm_only = (facts().PACK_TURNS_ROCM_ENCODER_ON and not on and why is not None
                 and vllm_encoder_replay(vllm_config, platform="cuda")[0])
    return Decision(cfg, caps, on, why, vllm_requires_encoder_replay(vllm_config), rocm_only)
