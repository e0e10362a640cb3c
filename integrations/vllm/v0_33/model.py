"""DeepSeek-V4.1 in vLLM 0.33, with its replay metadata through swa_backends.

Imported only by vLLM's model registry (``install()`` registers
``"swa_backends.integrations.vllm.v0_33.model:DeepseekV41ForCausalLM"`` under the architecture
name ``DeepseekV41ForCausalLM``). Everything here goes through vLLM's supported extension
points; the only patches are the module globals of :mod:`.patches`.

* ``DeepseekV41ForCausalLM`` (:func:`model_class`) subclasses the class vLLM picks on this platform
  (``vllm.models.deepseek_v41.DeepseekV41ForCausalLM``: NVIDIA or AMD), same name. Before the
  layers are built it computes :func:`swa_backends.capabilities` from vLLM's config (the
  core's ``config.decide``); encoder replay the pack turns off is turned off in vLLM
  (``cache_config.swa_bounded_replay = False``, read by the attention layers it is about to
  build). On ROCm, where vLLM builds encoder replay off and the pack runs it, the pack turns it
  on after the build (:func:`_encoder_on_rocm`: ``bounded_replay`` on every window cache, read
  when the runner collects the KV-cache specs), its prefill attention through the pack too.
  After they are built, decoder replay the pack turns off is removed
  (``decoder_replay_layers = None``) and the replay layers it keeps run their row gather and
  scatter through the pack (:class:`ReplayLayersMixin`, by a class swap of that one object).
  Every "off" is logged once with the pack's reasons.
* ``get_model_state_cls()`` keeps whatever class vLLM picks (the latency-specialized decode
  state included) as the base of a subclass with :class:`ModelStateMixin`: the decoder
  sub-batch gather (``_kept_input_batch``) through the pack's ``gather_replay_batch`` into
  vLLM's persistent ``_kept_*`` buffers, the replay graphs' row gather
  (:class:`ReplayGraphsMixin`), and the warmup of every pack kernel the step launches.

Any failure in this module's own code is one warning and vLLM's path for that piece.

Importing this module imports no vLLM: the model class is built on first access (the
registry's ``getattr``, through the module's ``__getattr__``) on top of the class vLLM
defines, and the forward-context helpers are imported where they are called.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import torch

from .. import log_once, runtime
from ..config import Decision, _text_config, decide
from . import patches

#: routes of the encoder side (launches in prepare_attn and the SWA builders)
ENCODER_ROUTES = ("pad_replayed_slots",)
BUILDER_ROUTES = ("swa_indices_and_lens", "prefill_gather_lens")
#: ROCm, where the pack turns encoder replay on: the consumer of the clamped window as well
ROCM_ROUTES = ("rocm_sparse_attn_prefill",)


@dataclass
class Route:
    """What runs through the pack for this model: ``encoder`` (slot padding), ``builders``
    (clamped window indices and prefill gather lengths), ``decoder`` (sub-batch gather, row
    gather/scatter), ``rocm`` (encoder replay turned on on ROCm, its prefill consumer through
    the pack's ``sparse_mla``); ``decision`` the pack's, None when it could not be computed."""

    decision: Decision | None
    encoder: bool = False
    builders: bool = False
    decoder: bool = False
    rocm: bool = False  # encoder replay turned on by the pack on ROCm (vLLM builds it off there)
    vllm_keeps_encoder: bool = False  # encoder replay on through vLLM's own kernels (the pack would turn it off)

    @property
    def any(self) -> bool:
        return self.encoder or self.builders or self.decoder


def _reasons(side) -> str:
    return "; ".join(side.reasons) or "(no reason given)"


def _before_build(vllm_config) -> Route:
    """The pack's decision; encoder replay off in vLLM where the pack turns it off."""
    try:
        decision = decide(vllm_config)
    except Exception as exc:  # noqa: BLE001
        log_once(logging.WARNING, "the capability decision failed (%s: %s); DeepSeek-V4.1 runs vLLM's own replay path",
                 type(exc).__name__, exc)
        return Route(None)
    enc = decision.capabilities.encoder_replay
    dev = decision.capabilities.device
    rocm = keeps = False
    if decision.encoder:
        encoder = True
    elif decision.vllm_off_for_rocm_only and decision.encoder_on_rocm is None:
        encoder = rocm = True
        log_once(logging.INFO, "encoder replay on %s: vLLM builds it off on ROCm (%s); the pack turns it on once the "
                 "layers are built, with every window index, gather length and prefill attention through the pack",
                 dev, decision.vllm_encoder_reason)
    elif enc.enabled:
        encoder = False
        log_once(logging.INFO, "encoder replay stays off on %s: the pack would turn it on, vLLM does not (%s)%s; "
                 "left as vLLM decides", dev, decision.vllm_encoder_reason,
                 f", and {decision.encoder_on_rocm}" if decision.vllm_off_for_rocm_only else "")
    elif not decision.vllm_encoder:
        encoder = False
        log_once(logging.INFO, "encoder replay is off on %s: vLLM: %s; the pack: %s", dev,
                 decision.vllm_encoder_reason, _reasons(enc))
    elif decision.must_keep_encoder:
        encoder = False
        keeps = True
        log_once(logging.WARNING, "the pack turns encoder replay off on %s (%s), but %s: it stays on, through vLLM's "
                 "own kernels; disable prefix caching to follow the pack", dev, _reasons(enc),
                 decision.must_keep_encoder)
    else:
        encoder = False
        vllm_config.cache_config.swa_bounded_replay = False
        log_once(logging.WARNING, "encoder replay turned off on %s (cache_config.swa_bounded_replay=False): %s",
                 dev, _reasons(enc))
    try:
        patches.apply()
    except Exception as exc:  # noqa: BLE001
        log_once(logging.WARNING, "applying the patches failed (%s: %s)", type(exc).__name__, exc)
    return Route(decision, encoder=encoder, rocm=rocm, vllm_keeps_encoder=keeps)


#: why the replay layers vLLM built go when encoder replay ends up off (the core's reason code)
_NEEDS_ENCODER = "[needs-encoder] decoder replay requires encoder replay, which is off in vLLM ({})"


def _decoder_off(inner, dev, why: str) -> None:
    """Decoder replay off in the built model: every layer runs on the whole batch."""
    inner.decoder_replay_layers = None
    inner.decoder_replay_start = inner.end_layer
    log_once(logging.WARNING, "decoder replay turned off on %s (every layer runs on the whole batch): %s", dev, why)


def _language_model(model):
    lm = getattr(model, "language_model", model)
    return getattr(lm, "model", None)


def _after_build(model, route: Route) -> Route:
    """Decoder replay per the pack; routes on for what runs through the pack."""
    if route.decision is None:
        return route
    dec = route.decision.capabilities.decoder_replay
    dev = route.decision.capabilities.device
    inner = _language_model(model)
    layers = getattr(inner, "decoder_replay_layers", None)
    if layers is not None and not dec.enabled:
        _decoder_off(inner, dev, _reasons(dec))
    elif layers is not None and not (route.encoder or route.vllm_keeps_encoder):
        # vLLM builds its replay layers from the config flag alone, also where its attention keeps
        # encoder replay off (ROCm) and the pack cannot turn it on
        _decoder_off(inner, dev, _NEEDS_ENCODER.format(route.decision.vllm_encoder_reason))
    elif layers is not None:
        layers.__class__ = _swapped(type(layers), ReplayLayersMixin)
        route.decoder = True
    elif dec.enabled:
        log_once(logging.INFO, "decoder replay stays off on %s: the pack would turn it on, vLLM does not on this "
                 "rank (its own log says why); left as vLLM decides", dev)
    else:
        log_once(logging.INFO, "decoder replay is off on %s: %s", dev, _reasons(dec))
    route.builders = route.encoder or route.decoder
    on = []
    groups = ((ENCODER_ROUTES, route.encoder), (BUILDER_ROUTES, route.builders), (ROCM_ROUTES, route.rocm))
    for names, wanted in groups:
        for name in names:
            if patches.route(name, runtime.backend_for if wanted else None):
                on.append(name)
            elif wanted:
                log_once(logging.WARNING, "%s stays vLLM's kernel: patch %s", name, patches.status().get(name))
    if route.rocm:
        route = _encoder_on_rocm(model, route, on)
        if not route.rocm and route.decoder:  # encoder replay stayed off after all: so does decoder replay
            _unswap(inner.decoder_replay_layers)
            _decoder_off(inner, dev, _NEEDS_ENCODER.format(route.decision.vllm_encoder_reason))
            route.decoder = route.builders = False
            for name in BUILDER_ROUTES:
                patches.route(name, None)
        on = [name for name, is_on in patches.routes().items() if is_on]
    if route.decoder:
        on += ["gather_replay_batch", "gather_rows", "scatter_rows"]
    if on:
        log_once(logging.INFO, "DeepSeek-V4.1 on %s: %s run through the pack (variants: %s)", dev, ", ".join(on),
                 _variants(dev, on))
    return route


def _window_caches(model) -> list:
    """The model's DeepSeek-V4.1 window caches (``DeepseekV4SWACache`` modules)."""
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    modules = getattr(model, "modules", None)
    return [mod for mod in (modules() if modules is not None else ()) if isinstance(mod, DeepseekV4SWACache)]


def _encoder_on_rocm(model, route: Route, on: list[str]) -> Route:
    """Turn encoder replay on in the model vLLM built with it off (ROCm): every DeepSeek-V4.1
    window cache (``DeepseekV4SWACache``) gets ``bounded_replay = True``, which its
    ``get_kv_cache_spec`` reads when the model runner collects the KV-cache specs after the
    build (the scheduler then replays and keeps the window out of the prefix cache). Only
    when every launch that makes or reads the clamped window runs through the pack: the slot
    padding, the window indices and gather lengths, and the prefill attention
    (``rocm_sparse_attn_prefill``); else it stays off and those routes go back to vLLM."""
    dev = route.decision.capabilities.device
    missing = [n for n in (*ENCODER_ROUTES, *BUILDER_ROUTES, *ROCM_ROUTES) if n not in on]
    caches = [] if missing else _window_caches(model)
    if missing or not caches:
        why = (f"routes not through the pack: {', '.join(missing)}" if missing
               else "the model holds no DeepseekV4SWACache")
        log_once(logging.WARNING, "encoder replay stays off on %s (vLLM's ROCm decision): %s", dev, why)
        for name in (*ENCODER_ROUTES, *ROCM_ROUTES):
            patches.route(name, None)
        route.encoder = route.rocm = False
        route.builders = route.decoder
        if not route.builders:
            for name in BUILDER_ROUTES:
                patches.route(name, None)
        return route
    for cache in caches:
        cache.bounded_replay = True
    patches.pin((*ENCODER_ROUTES, *BUILDER_ROUTES, *ROCM_ROUTES))  # vLLM's ROCm path has no clamp to fall back to
    log_once(logging.WARNING, "encoder replay turned on on %s for %d window caches (vLLM keeps it off on ROCm: %s); "
             "the clamped window indices, gather lengths and prefill attention run through the pack",
             dev, len(caches), route.decision.vllm_encoder_reason)
    return route


def _variants(dev, ops) -> str:
    try:
        be = runtime.backend_for(dev.torch_device)
        return ", ".join(f"{op}={'|'.join(be.variants[op])}" for op in ops)
    except Exception as exc:  # noqa: BLE001 - a log line only
        return f"unknown ({type(exc).__name__})"


_SWAPPED: dict[tuple[type, type], type] = {}


def _swapped(cls: type, mixin: type) -> type:
    """``type(prefix + cls.__name__, (mixin, cls), {})``, cached: the pack's behaviour on top
    of whatever class vLLM built (its subclasses included)."""
    if issubclass(cls, mixin):
        return cls
    key = (cls, mixin)
    sub = _SWAPPED.get(key)
    if sub is None:
        sub = type(f"SwaBackends{cls.__name__}", (mixin, cls), {"__module__": __name__})
        _SWAPPED[key] = sub
    return sub


def _unswap(obj) -> None:
    """Back to vLLM's class if :func:`_swapped` replaced it."""
    if obj is not None and type(obj) in _SWAPPED.values():
        obj.__class__ = type(obj).__mro__[2]


def model_state_class(base: type) -> type:
    """The pack's model state on top of the class vLLM picked."""
    return _swapped(base, ModelStateMixin)


class ModelMixin:
    """On top of vLLM's DeepSeek-V4.1 (this platform's class): its replay metadata through
    swa_backends (the pack's ``DeepseekV41ForCausalLM`` is this mixin on vLLM's class)."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        try:
            route = _before_build(vllm_config)
        except Exception as exc:  # noqa: BLE001
            log_once(logging.WARNING, "the pack's set-up before the build failed (%s: %s); DeepSeek-V4.1 runs vLLM's "
                     "own replay path", type(exc).__name__, exc)
            route = Route(None)
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        try:
            route = _after_build(self, route)
        except Exception as exc:  # noqa: BLE001
            log_once(logging.WARNING, "setting up the pack's routes failed (%s: %s); vLLM's kernels run",
                     type(exc).__name__, exc)
            for name in (*ENCODER_ROUTES, *BUILDER_ROUTES, *ROCM_ROUTES):
                patches.route(name, None)
            _unswap(getattr(_language_model(self), "decoder_replay_layers", None))
            if route.rocm:  # back to what vLLM built on ROCm
                patches.pin(())
                for cache in _window_caches(self):
                    cache.bounded_replay = False
            route = Route(route.decision)
        self.swa_backends_route = route

    def get_model_state_cls(self):
        base = super().get_model_state_cls()
        route = getattr(self, "swa_backends_route", None)
        if route is None or not route.any:
            return base
        try:
            return model_state_class(base)
        except Exception as exc:  # noqa: BLE001
            log_once(logging.WARNING, "the pack's model state could not be built on %s (%s: %s)", base.__name__,
                     type(exc).__name__, exc)
            return base


_MODEL_CLASS: list[type] = []


def model_class() -> type:
    """``DeepseekV41ForCausalLM``: :class:`ModelMixin` on the class vLLM picks on this platform
    (imports vLLM; built once)."""
    if not _MODEL_CLASS:
        from vllm.models.deepseek_v41 import DeepseekV41ForCausalLM as base

        cls = type("DeepseekV41ForCausalLM", (ModelMixin, base), {"__module__": __name__, "__doc__": (
            "vLLM's DeepSeek-V4.1 (this platform's class), its replay metadata through swa_backends.")})
        _MODEL_CLASS.append(cls)
    return _MODEL_CLASS[0]


def __getattr__(name: str):
    if name == "DeepseekV41ForCausalLM":  # what vLLM's registry looks up
        try:
            return model_class()
        except Exception as exc:  # noqa: BLE001 - the architecture must load: vLLM's own class then
            from vllm.models.deepseek_v41 import DeepseekV41ForCausalLM as vllm_class

            log_once(logging.WARNING, "building the pack's DeepSeek-V4.1 class failed (%s: %s); vLLM's own class "
                     "is used", type(exc).__name__, exc)
            return vllm_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------
# the model state
# ---------------------------------------------------------------------------------------


class ModelStateMixin:
    """On top of ``DeepseekV41ModelState`` (or a subclass vLLM picked): the decoder sub-batch
    gather through the pack, and the pack's kernels warmed up with vLLM's."""

    def __init__(self, vllm_config, model, encoder_cache, device) -> None:
        super().__init__(vllm_config, model, encoder_cache, device)
        route = getattr(model, "swa_backends_route", None) or Route(None)
        self.swa_backends_route = route
        self._swa_backend = None
        self._swa_gather = False  # the decoder sub-batch gathered by the pack
        self._swa_fuse = False  # the step's replay metadata in one launch (runtime.prepare_step)
        self._swa_step_buffers = None
        self._swa_batch_out = None  # vLLM's sub-batch buffers as the step's launch takes them (_swa_gather_args)
        self._swa_heads = None  # the last sub-batch views of vLLM's buffers handed out (_swa_kept_views)
        self._swa_builder = None  # (attn_groups, _window_builder's answer): the step's window builder
        self._swa_predicted = None  # (kept_lens, num_padded, gather args, longest kept, kept_lens as a list or None)
        self._swa_kept_builders = None  # (replay groups, {KV group: _kept_builders' answer})
        self._swa_second = None  # (attn_groups, _window_builder's answer after the first's group)
        try:
            if route.any:
                self._swa_backend = runtime.backend_for(device)
            if route.decoder and self.decoder_replay_layers is not None and self.pcp_size == 1:
                self._swa_gather = True
                if self.replay_cudagraphs is not None:
                    self.replay_cudagraphs.__class__ = _swapped(type(self.replay_cudagraphs), ReplayGraphsMixin)
            # the builders' calls must reach the pack to be answered; PCP pads and gathers per rank
            self._swa_fuse = route.builders and self.pcp_size == 1
        except Exception as exc:  # noqa: BLE001
            if self._swa_backend is None and route.any:  # no backend for this device: nothing can go through it
                if route.rocm:  # encoder replay the pack turned on has no vLLM path to go back to
                    log_once(logging.ERROR, "the pack's backend for %s failed (%s: %s) where the pack turned encoder "
                             "replay on; set SWA_BACKENDS_VLLM=0 to serve with vLLM's own path", device,
                             type(exc).__name__, exc)
                    raise
                log_once(logging.WARNING, "the pack's backend for %s failed (%s: %s); DeepSeek-V4.1's replay metadata "
                         "runs through vLLM's kernels", device, type(exc).__name__, exc)
                self._swa_off()
            else:
                log_once(logging.WARNING, "the pack's decoder sub-batch is off (%s: %s); vLLM's gather runs",
                         type(exc).__name__, exc)
                self._swa_gather = False

    def _warm_up_replay_kernels(self, input_batch, slot_mappings) -> None:
        """vLLM's warmup for what stays vLLM's (the pad kernel's own ``warmup`` goes to the
        pack when routed), then one launch of every pack kernel this model state and its
        builders run: ``_prepare_replay_batch`` and the first prepare_attn never launch
        them during vLLM's startup (its dummy batches never replay or trim)."""
        gather = self._swa_gather
        layers = self.decoder_replay_layers
        if gather:  # vLLM's own gather kernel never runs: skip its compile
            self.decoder_replay_layers = None
        try:
            super()._warm_up_replay_kernels(input_batch, slot_mappings)
        finally:
            self.decoder_replay_layers = layers
        be = self._swa_backend
        route = self.swa_backends_route
        if be is None:
            return
        try:
            window, _ = self._replay
            cfg = self.vllm_config
            W = int(getattr(_text_config(cfg), "sliding_window", 0) or window or 128)
            rows = ()
            if gather and layers is not None:
                rows = _replay_row_shapes(cfg, layers)
            runtime.warm_up(be, self.device, swa=route.builders, gather_lens=route.builders, gather=gather,
                            step=self._swa_fuse,
                            num_groups=int(slot_mappings.shape[0]), window=W, block_size=_swa_block_size(cfg),
                            rows=rows)
            if route.rocm:  # the prefill attention (rocm_sparse_attn_prefill): this shard's heads, a sink
                be.warmup(ops=("sparse_mla",), num_heads=(_local_heads(cfg),), qk_head_dim=512, v_head_dim=512,
                          attn_dtypes=(torch.bfloat16,), attn_sink=(True,))
        except Exception as exc:  # noqa: BLE001 - a kernel that does not compile: vLLM's path, warmed as vLLM does
            if route.rocm:  # encoder replay the pack turned on has no vLLM path to go back to
                log_once(logging.ERROR, "warming up the pack's kernels failed (%s: %s) where the pack turned encoder "
                         "replay on; set SWA_BACKENDS_VLLM=0 to serve with vLLM's own path", type(exc).__name__, exc)
                raise
            log_once(logging.WARNING, "warming up the pack's kernels failed (%s: %s); DeepSeek-V4.1's replay metadata "
                     "runs through vLLM's kernels", type(exc).__name__, exc)
            self._swa_off()
            super()._warm_up_replay_kernels(input_batch, slot_mappings)

    def _swa_off(self) -> None:
        """Everything this state and its model route through the pack back to vLLM's path."""
        self._swa_gather = self._swa_fuse = False
        for name in (*ENCODER_ROUTES, *BUILDER_ROUTES, *ROCM_ROUTES):
            patches.route(name, None)
        for obj in (self.decoder_replay_layers, self.replay_cudagraphs):
            if isinstance(obj, (ReplayLayersMixin, ReplayGraphsMixin)):
                obj._swa_failed = True

    def _kept_input_batch(self, input_batch, slot_mappings, replay_start, kept_lens, num_padded):
        """vLLM's sub-batch, gathered by the pack's ``gather_replay_batch`` into vLLM's
        persistent buffers (or already gathered by the step's launch, :meth:`_build_attn_metadata`);
        everything around the launch is vLLM's (PCP keeps vLLM's whole method: the pack turns
        decoder replay off under PCP)."""
        if not self._swa_gather:  # never set under PCP
            return super()._kept_input_batch(input_batch, slot_mappings, replay_start, kept_lens, num_padded)
        try:
            return self._swa_kept_input_batch(input_batch, slot_mappings, replay_start, kept_lens, num_padded)
        except Exception as exc:  # noqa: BLE001 - vLLM's gather rewrites every output
            self._swa_gather = False
            log_once(logging.WARNING, "gather_replay_batch through the pack failed (%s: %s); vLLM's gather runs "
                     "from now on", type(exc).__name__, exc)
            return super()._kept_input_batch(input_batch, slot_mappings, replay_start, kept_lens, num_padded)

    def _swa_gather_args(self, input_batch, slot_mappings, kept_lens, num_padded, kept_list=None) -> tuple:
        """``(plan, out, kept query_start_loc (host), kept rows)`` of the sub-batch gather:
        vLLM's ``dropped_before`` uploaded to its UVA buffer, ``out`` vLLM's whole ``_kept_*``
        buffers (the step's launch writes their leading rows, SPEC §3.6; a gather of its own
        takes the plan's extents of them, ``runtime.gather_replay_batch``). ``kept_list``:
        ``kept_lens`` as a list, when the caller has one (a small batch)."""
        num_reqs = input_batch.num_reqs
        window = self.decoder_replay_layers.window
        qsl_np = input_batch.query_start_loc_np[: num_reqs + 1]
        kept_query_start_loc_np = runtime.kept_query_start_loc(kept_lens, kept_list)
        num_tokens = int(kept_query_start_loc_np[-1])
        dropped_np = np.subtract(qsl_np, kept_query_start_loc_np, dtype=np.int32)  # rows dropped before each boundary
        dropped = self._dropped_before.copy_to_uva(dropped_np)
        # the host prefill flags are for validation alone (a checked backend holds prefills to their host length)
        pre = input_batch.is_prefilling_np[:num_reqs] if self._swa_backend.checked else None
        plan = runtime.replay_plan(kept_lens, qsl_np, num_padded, window, dropped=dropped_np, device_dropped=dropped,
                                   is_prefilling=pre)
        out = self._swa_batch_out
        if (out is None or out["rows"] is not self._kept_rows  # vLLM's persistent buffers, named once
                or out["query_start_loc"] is not self._kept_query_start_loc
                or out["positions"] is not self._kept_positions
                or out["slot_mappings"] is not self._kept_slot_mappings or out["kv_start"] is not self._kept_kv_start):
            out = self._swa_batch_out = {"rows": self._kept_rows, "query_start_loc": self._kept_query_start_loc,
                                         "positions": self._kept_positions, "slot_mappings": self._kept_slot_mappings,
                                         "kv_start": self._kept_kv_start}
        return plan, out, kept_query_start_loc_np, num_tokens

    def _swa_kept_input_batch(self, input_batch, slot_mappings, replay_start, kept_lens, num_padded):
        num_reqs = input_batch.num_reqs
        window = self.decoder_replay_layers.window
        predicted = self._swa_predicted
        if predicted is not None and predicted[1] == num_padded and runtime.same_lens(predicted[0], kept_lens):
            args = predicted[2]  # the step's launch gathered it: runtime.gather_replay_batch finds it answered
            longest = predicted[3]
        else:
            args = self._swa_gather_args(input_batch, slot_mappings, kept_lens, num_padded)
            longest = int(kept_lens.max())
        plan, out, kept_query_start_loc_np, num_tokens = args
        runtime.gather_replay_batch(self._swa_backend, plan, input_batch.query_start_loc, input_batch.seq_lens,
                                    replay_start, input_batch.positions, slot_mappings, window, out)
        max_query_len = max(longest, input_batch.max_query_len or 0)
        kept_qsl, kept_positions, kept_slots = self._swa_kept_views(num_reqs, num_padded, slot_mappings.shape[0])
        kept_batch = runtime.replaced(
            input_batch,
            num_tokens=num_tokens,
            num_tokens_after_padding=num_padded,
            query_start_loc=kept_qsl,
            query_start_loc_np=kept_query_start_loc_np,
            max_query_len=max_query_len,
            positions=kept_positions,
            is_padding=input_batch.is_padding,
            fast_prefill=None,
        )
        return kept_batch, kept_slots

    def _swa_kept_views(self, num_reqs: int, num_padded: int, num_groups: int) -> tuple:
        """vLLM's views of its sub-batch buffers, ``(_kept_query_start_loc[:B+1],
        _kept_positions[:n], _kept_slot_mappings[:G, :n])``, the last sizes' made once: a slice
        is a new tensor object (host time), and the steps of one long prefill ask for the same
        sizes one after another. The same views of the same memory vLLM's method makes; no
        caller changes a view's sizes (vLLM's builders read them)."""
        heads = self._swa_heads
        if (heads is None or heads[0] != num_reqs or heads[1] != num_padded or heads[2] != num_groups
                or heads[3] is not self._kept_query_start_loc or heads[4] is not self._kept_positions
                or heads[5] is not self._kept_slot_mappings):
            qsl, pos, slots = self._kept_query_start_loc, self._kept_positions, self._kept_slot_mappings
            heads = self._swa_heads = (num_reqs, num_padded, num_groups, qsl, pos, slots,
                                       (qsl[: num_reqs + 1], pos[:num_padded], slots[:num_groups, :num_padded]))
        return heads[6]

    # -- one launch per step ----------------------------------------------------------

    def prepare_attn(self, *args, **kwargs):
        """vLLM's ``prepare_attn`` inside one step of the pack's runtime: its pad call is held
        and :meth:`_build_attn_metadata` launches the whole step's replay metadata at once."""
        if not self._swa_fuse:
            return super().prepare_attn(*args, **kwargs)
        runtime.begin_step()
        try:
            return super().prepare_attn(*args, **kwargs)
        finally:
            self._swa_predicted = None
            try:
                runtime.end_step()
            except Exception as exc:  # noqa: BLE001 - the held pad ran vLLM's kernel (runtime.flush_step)
                patches.failed("pad_replayed_slots", exc)

    def _build_attn_metadata(self, *args, **kwargs):
        """Before vLLM's builders run: one ``prepare_replay_step`` launch writes the held
        slot padding, the window builder's decode and prefill rows and gather lengths and,
        when vLLM's plan can be told now, the decoder sub-batch, into the buffers those call
        sites pass (``runtime.prepare_step``); the routed calls whose arguments match then
        launch nothing. Anything else (graph captures, FULL graphs, a second window group, a
        split or plan vLLM decides differently) launches as before."""
        if self._swa_fuse:
            try:
                self._swa_prepare_step(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - nothing answered: every call launches
                self._swa_fuse = False
                log_once(logging.WARNING, "the pack's one-launch step failed (%s: %s); each replay-metadata call "
                         "launches its own kernel from now on", type(exc).__name__, exc)
            try:
                runtime.flush_step()  # a pad the step did not take runs before the builders read the slots
            except Exception as exc:  # noqa: BLE001 - the held pad ran vLLM's kernel (runtime.flush_step)
                patches.failed("pad_replayed_slots", exc)
        return super()._build_attn_metadata(*args, **kwargs)

    def _swa_prepare_step(self, input_batch, cudagraph_mode, block_tables, slot_mappings, attn_groups,
                          kv_cache_config, for_capture=False, ubatch_idx=0, model_specific_attn_metadata=None) -> None:
        none, piecewise, full = _graph_modes()
        self._swa_predicted = None
        replay_start = getattr(model_specific_attn_metadata, "replay_start", None)
        B, T = input_batch.num_reqs, input_batch.num_tokens
        if replay_start is None or for_capture or ubatch_idx or cudagraph_mode == full or B == 0 or T == 0:
            return
        qsl_np = input_batch.query_start_loc_np
        q = runtime.query_lens(qsl_np, B)  # host query lengths, for both predictions
        target = self._swa_window_target(input_batch, q, block_tables, attn_groups, kv_cache_config)
        if target is None:
            return
        second = self._swa_second_target(input_batch, q, block_tables, attn_groups, kv_cache_config, target)
        gather = kept = second_kept = None
        if self._swa_gather and cudagraph_mode in (none, piecewise):
            gather = self._swa_predicted_gather(input_batch, q, slot_mappings, cudagraph_mode == piecewise)
            if gather is not None:
                kept = self._swa_kept_targets(input_batch, attn_groups, target)
                if second is not None and kept is not None:
                    second_kept = self._swa_kept_targets(input_batch, attn_groups, second, first_layer=False)
        runtime.prepare_step(self._swa_backend, target, input_batch.query_start_loc, input_batch.seq_lens,
                             input_batch.positions, slot_mappings, replay_start, B, T, self._swa_scratch(),
                             gather=gather, kept=kept, second=second, second_kept=second_kept)

    def _swa_window_target(self, input_batch, q, block_tables, attn_groups, kv_cache_config):
        """The first sparse-SWA builder whose build is vLLM's own (:func:`_known_swa_builds`),
        on the KV group's own block table (no kernel-block mapping), text windows only (found
        once per ``attn_groups``), with vLLM's decode/prefill split for this batch."""
        found = self._swa_builder
        if found is None or found[0] is not attn_groups:
            found = self._swa_builder = (attn_groups, _window_builder(attn_groups, kv_cache_config))
        return _for_batch(found[1], input_batch, q, block_tables)

    def _swa_second_target(self, input_batch, q, block_tables, attn_groups, kv_cache_config, target):
        """A second window group's sparse-SWA builder the step's second launch writes (the next
        one :func:`_window_builder` finds after ``target``'s group, found once per ``attn_groups``),
        with its own split (its builder's decode threshold) and block table; None if there is none."""
        found = self._swa_second
        if found is None or found[0] is not attn_groups:
            found = self._swa_second = (attn_groups, _window_builder(attn_groups, kv_cache_config, after=target.group))
        return _for_batch(found[1], input_batch, q, block_tables)

    def _swa_predicted_gather(self, input_batch, q, slot_mappings, piecewise: bool):
        """``(plan, window, out)`` of the sub-batch vLLM's ``_prepare_replay_batch`` will ask
        for, when it can be told now: no data parallelism (its ranks agree later); an eager
        step with a prefill trimmed, or a PIECEWISE step whose graph breaks out to the
        sub-batch (``graph_uses_replay_batch``); vLLM's trim rule (``runtime.predicted_kept``);
        the padded size from its replay graphs' dispatch. Kept for
        :meth:`_swa_kept_input_batch`, which reuses it when vLLM decided the same."""
        layers = self.decoder_replay_layers
        if (layers is None or self._kept_slot_mappings is None
                or self.vllm_config.parallel_config.data_parallel_size > 1):
            return None
        if piecewise and not layers.graph_uses_replay_batch(input_batch.num_tokens_after_padding):
            return None  # vLLM runs the whole batch through the graph: no sub-batch
        B = input_batch.num_reqs
        keeps_all = self._keeps_rows_np  # vLLM's per-request flags (prompt logprobs); mostly all False
        keeps = keeps_all[input_batch.idx_mapping_np[:B]] if np.count_nonzero(keeps_all) else None
        kept = runtime.predicted_kept(q, keeps, input_batch.is_prefilling_np[:B], layers.window, forced=piecewise)
        if kept is None:
            return None
        kept_list = kept.tolist() if B <= runtime.SMALL_BATCH else None  # then sums and maxima in Python
        num_padded = sum(kept_list) if kept_list is not None else int(kept.sum())
        longest = max(kept_list) if kept_list is not None else int(kept.max())
        if self.replay_cudagraphs is not None:
            desc = self.replay_cudagraphs.dispatch(B, num_padded, None, 0)
            if desc.cg_mode == _graph_modes()[1]:  # a PIECEWISE replay graph: vLLM pads to its size
                num_padded = desc.num_tokens
        args = self._swa_gather_args(input_batch, slot_mappings, kept, num_padded, kept_list)
        self._swa_predicted = (kept, num_padded, args, longest, kept_list)
        return args[0], layers.window, args[1]

    def _swa_kept_targets(self, input_batch, attn_groups, target, *, first_layer: bool = True):
        """The sub-batch's window builds the step's launch can make too (``runtime.KeptTargets``):
        the replay layers' sparse-SWA builder of the first window builder's KV group and, when
        the first replay layer's is that group's too, its builder, from vLLM's replay groups
        (``_replay_attn_groups``: made here as vLLM makes them in this step's
        ``_prepare_replay_batch`` when it has none yet); the sub-batch's split from the kept
        lengths the prediction made. None when the replay layers have no such builder.
        ``first_layer=False``: the replay layers' build alone (a second window group's)."""
        if self._replay_attn_groups is None:  # vLLM's own lazy copies, made a little earlier in the same step
            layers = self.decoder_replay_layers
            self._replay_attn_groups = (self._copy_attn_groups(attn_groups, layers.metadata_prefixes),
                                        self._copy_attn_groups(attn_groups, {layers.first_swa_prefix}))
        groups = self._replay_attn_groups
        cache = self._swa_kept_builders
        if cache is None or cache[0] is not groups:
            cache = self._swa_kept_builders = (groups, {})
        builders = cache[1].get(target.group)
        if builders is None:
            builders = cache[1][target.group] = _kept_builders(groups, target)
        if not first_layer:
            builders = builders[:1]
        if not builders:
            return None
        kept_lens, _, (_, _, kept_qsl_np, num_tokens), longest, kept_list = self._swa_predicted
        max_query_len = max(longest, input_batch.max_query_len or 0)  # as the sub-batch says
        q = kept_lens if kept_list is None else kept_list  # the sub-batch's query lengths
        d, D = runtime.predicted_split(q, kept_qsl_np, num_tokens, max_query_len, builders[0][0].decode_threshold)
        gather_lens = ("kept_gather_lens", "first_gather_lens") if first_layer else ("second_gather_lens",)
        return runtime.KeptTargets(tuple(b[1] for b in builders), d, D, gather_lens[: len(builders)])

    def _swa_scratch(self) -> dict:
        scratch = self._swa_step_buffers
        if scratch is None:
            n, dev = int(self.max_num_reqs) + 1, self.device
            scratch = self._swa_step_buffers = {
                "arange": torch.arange(n, dtype=torch.int32, device=dev),
                "ones": torch.ones(n, dtype=torch.bool, device=dev),
                "replay_start": torch.zeros(n, dtype=torch.int32, device=dev),
                "stale_replay": torch.zeros(n, dtype=torch.int32, device=dev),
                "gather_lens": torch.zeros(n, dtype=torch.int32, device=dev),
                "kept_gather_lens": torch.zeros(n, dtype=torch.int32, device=dev),
                "first_gather_lens": torch.zeros(n, dtype=torch.int32, device=dev),
                "second_gather_lens": torch.zeros(n, dtype=torch.int32, device=dev),
                "no_groups": torch.zeros(0, dtype=torch.int32, device=dev), "views": {}}
        return scratch


def _for_batch(found, input_batch, q, block_tables):
    """``found`` (:func:`_window_builder`'s ``(builder, WindowTarget)``, or None) set for this
    batch: vLLM's decode/prefill split by the builder's decode threshold, the group's block
    table. Returns the target (None for None)."""
    if found is None:
        return None
    b, target = found
    max_query_len = input_batch.max_query_len
    if max_query_len is None:  # as DefaultModelState.prepare_attn computes it
        max_query_len = int(input_batch.num_scheduled_tokens.max())
    target.num_decodes, target.num_decode_tokens = runtime.predicted_split(
        q, input_batch.query_start_loc_np, input_batch.num_tokens, max_query_len, b.decode_threshold)
    target.block_table = block_tables[target.group]
    return target


def _predictable(b, group) -> bool:
    """A sparse-SWA builder whose window rows the step's launch can write: a ``build`` vLLM's
    own (:func:`_known_swa_builds`), the group's own block table (no kernel-block mapping),
    text windows only (prefill rows as wide as decode rows)."""
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadataBuilder as SWA

    cls = type(b)
    return (isinstance(b, SWA) and cls.build in _known_swa_builds()
            and cls._build_deepseek_v4_metadata is SWA._build_deepseek_v4_metadata
            and group.kernel_block_size is None and not b.max_image_tokens
            and b.prefill_index_width == b.window_size)


def _rows_of(b) -> tuple:
    """A sparse-SWA builder's decode rows, decode lengths, prefill rows, prefill lengths (its
    ``[N, 1, width]`` buffers as ``[N, width]`` rows: same address)."""
    return b.decode_swa_indices[:, 0], b.decode_swa_lens, b.prefill_swa_indices[:, 0], b.prefill_swa_lens


def _kept_builders(replay_attn_groups, target) -> list:
    """``[(builder, its rows)]`` of the sub-batch builds of ``target``'s KV group the step's launch
    makes: the replay layers' builder (vLLM's first replay group) and then, if it is there
    too, the first replay layer's; the same window, block size and index width as ``target``'s.
    Empty when the replay layers have no predictable builder in that group."""
    replay_groups, first_groups = replay_attn_groups
    found = []
    for groups in (replay_groups, first_groups):
        hit = None
        for group in groups[target.group] if target.group < len(groups) else ():
            b = group.get_metadata_builder(0)
            if (_predictable(b, group) and b.window_size == target.window and b.block_size == target.block_size
                    and b.decode_swa_indices.shape[-1] == target.decode_rows.shape[1]):
                hit = (b, _rows_of(b))
                break
        if hit is None:
            break  # the first replay layer's build only beside the replay layers' (kept_windows 2)
        found.append(hit)
    return found


def _window_builder(attn_groups, kv_cache_config, *, after: int = -1):
    """``(builder, its runtime.WindowTarget)`` (block table and split set per step) of the
    first sparse-SWA builder in a KV group past ``after`` the one-launch step can predict:
    a window group (not prefix-cacheable, so never padded: its slots are the step's validity
    row), a ``build`` vLLM's own, the group's own block table (no kernel-block mapping), text
    windows only (prefill rows as wide as decode rows); None if there is none."""
    for gid, groups in enumerate(attn_groups):
        if gid <= after or getattr(kv_cache_config.kv_cache_groups[gid].kv_cache_spec, "prefix_cacheable", False):
            continue
        for group in groups:
            b = group.get_metadata_builder(0)
            if _predictable(b, group):
                return b, runtime.WindowTarget(gid, None, b.block_size, b.window_size, 0, 0, *_rows_of(b))
    return None


def _known_swa_builds() -> tuple:
    """The sparse-SWA ``build`` methods whose launches the step predicts: vLLM's and its
    DeepSeek-V4.1 subclass's (which changes only PCP slot mappings; the step runs without PCP),
    and FlashInfer's subclass's (vLLM's default on sm120: that build, then for a non-causal
    batch a torch fill from the lengths vLLM's non-causal kernel wrote; its module is imported
    wherever its builder exists). Each is a seam (``seams.py``): a release that changed one
    is left untouched."""
    import sys

    from vllm.models.deepseek_v41.sparse_mla import DeepseekV41SparseSWAMetadataBuilder
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadataBuilder

    builds = (DeepseekSparseSWAMetadataBuilder.build, DeepseekV41SparseSWAMetadataBuilder.build)
    flashinfer = sys.modules.get("vllm.models.deepseek_v41.nvidia.flashinfer_sparse")
    if flashinfer is not None:
        builds += (flashinfer.DeepseekSparseSWAFlashInferMetadataBuilder.build,)
    return builds


@functools.cache
def _graph_modes() -> tuple:
    """vLLM's ``CUDAGraphMode`` NONE, PIECEWISE, FULL (imported on first use, once)."""
    from vllm.config import CUDAGraphMode

    return CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL


def _local_heads(vllm_config) -> int:
    """The attention heads of this tensor-parallel shard (vLLM's ``n_local_heads``; ROCm pads
    none: its ``get_padded_num_q_heads`` is the identity)."""
    return int(_text_config(vllm_config).num_attention_heads) // int(vllm_config.parallel_config.tensor_parallel_size)


def _swa_block_size(vllm_config) -> int:
    # DeepseekV4SWACache(block_size=32) in vLLM 0.33's attention.py; a runtime argument of
    # the pack's kernel (never part of its launch key), so any value warms the same kernel.
    return 32


def _replay_row_shapes(vllm_config, layers) -> tuple:
    """``(trailing shape, dtype)`` of the inputs the replay layers gather: hidden states,
    positions, input ids, pre/post/res mix, residual (``DecoderReplayCudaGraphManager``'s
    buffers); its ``input_buffers`` when it exists."""
    text = _text_config(vllm_config)
    act = vllm_config.model_config.dtype
    hc, h, f32 = int(text.hc_mult), int(text.hidden_size), torch.float32
    # input ids are int64 under native MegaMoE, else int32: warm both
    shapes = [((h,), act), ((), torch.int64), ((), torch.int32), ((hc,), f32), ((hc, 1), f32), ((hc, hc), f32),
              ((hc, h), act)]
    return tuple(dict.fromkeys(shapes))


# ---------------------------------------------------------------------------------------
# the replay layers and their graphs
# ---------------------------------------------------------------------------------------


class ReplayLayersMixin:
    """``DecoderReplayLayers._run`` with the rows gathered and scattered by the pack
    (``gather_rows`` / ``scatter_rows``); PCP's padded batches keep vLLM's ``_run``. If the
    pack's gather or scatter raises, that call and every later one are vLLM's (one warning);
    vLLM's layers run once either way."""

    def _run(self, hidden_states, *states):
        replay_batch = self.replay_batch
        if replay_batch is None or replay_batch.num_padded is not None or getattr(self, "_swa_failed", False):
            return super()._run(hidden_states, *states)
        assert isinstance(hidden_states, torch.Tensor)
        rows = replay_batch.rows
        inputs = (hidden_states, *states)
        try:
            be = runtime.backend_for(hidden_states.device)
            row_inputs = None
            if replay_batch.run_graph is None:
                row_inputs = [None if t is None else runtime.gather_rows(be, t, rows) for t in inputs]
        except Exception as exc:  # noqa: BLE001 - nothing ran yet: vLLM's _run does it all
            _piece_failed(self, "the replay layers' row gather", exc)
            return super()._run(hidden_states, *states)
        from vllm.forward_context import override_forward_context

        with override_forward_context(replay_batch.forward_context):
            if replay_batch.run_graph is not None:
                row_outputs = replay_batch.run_graph(rows, inputs)
            else:
                row_outputs = self.run_layers(*row_inputs)
        num_tokens = hidden_states.shape[0]
        n = rows.numel()
        try:
            return tuple(runtime.scatter_rows(be, out[:n], rows, num_tokens) for out in row_outputs)
        except Exception as exc:  # noqa: BLE001 - the layers ran: scattered as vLLM's _run scatters them
            _piece_failed(self, "the replay layers' row scatter", exc)
            return tuple(out.new_zeros((num_tokens, *out.shape[1:])).index_copy_(0, rows, out[:n])
                         for out in row_outputs)


class ReplayGraphsMixin:
    """``DecoderReplayCudaGraphManager.run`` with the rows gathered into its static input
    buffers by the pack's ``gather_rows`` (if that raises, vLLM's ``run``, which writes every
    buffer row the graph reads, from then on)."""

    def run(self, rows, inputs):
        if getattr(self, "_swa_failed", False):
            return super().run(rows, inputs)
        num_rows = rows.shape[0]
        try:
            be = runtime.backend_for(rows.device)
            for buf, t in zip(self.input_buffers, inputs):
                runtime.gather_rows(be, t, rows, out=buf[:num_rows])
        except Exception as exc:  # noqa: BLE001
            _piece_failed(self, "the replay graphs' row gather", exc)
            return super().run(rows, inputs)
        from vllm.forward_context import get_forward_context

        batch_descriptor = get_forward_context().batch_descriptor
        assert batch_descriptor is not None
        num_tokens = batch_descriptor.num_tokens
        outputs = self.breakable_cg_runner(*(buf[:num_tokens] for buf in self.input_buffers))
        return tuple(out[:num_rows] for out in outputs)


def _piece_failed(obj, what: str, exc: BaseException) -> None:
    """A pack call inside a swapped vLLM object raised: vLLM's method for it from now on, one warning."""
    obj._swa_failed = True
    log_once(logging.WARNING, "%s through the pack failed (%s: %s); vLLM's runs from now on", what,
             type(exc).__name__, exc)
