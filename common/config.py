"""The serving configuration the capability decision reads (SPEC §4).

Every field has the serving default; pass only what differs:
``ServingConfig(prefill_context_parallel_size=4, graph_mode="none")``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields

from .validation import fail

GRAPH_MODES = ("none", "decode_only", "piecewise", "full", "full_and_piecewise")
MODEL_RUNNERS = ("v1", "v2")
#: Speculative drafters by kind (vLLM's ``speculative_config.method``, its MTP model types
#: folded into ``mtp`` and ``ngram_gpu`` into ``ngram``); ``none``: no speculative decoding.
DRAFTERS = ("none", "dspark", "mtp", "eagle", "eagle3", "dflash", "draft_model", "ngram", "suffix", "other")

#: ``--config``'s short names (:meth:`ServingConfig.from_strings`)
ALIASES = {"pp": "pipeline_parallel_size", "pcp": "prefill_context_parallel_size",
           "dcp": "decode_context_parallel_size", "dp": "data_parallel_size"}


@dataclass(frozen=True)
class ServingConfig:
    """``model_runner``: the engine's model runner (vLLM V2 pads replayed writes);
    ``*_parallel_size``: PP / PCP (prefill context) / DCP (decode context) / DP;
    ``stage_holds_all_layers_after_cut``: this pipeline stage holds every layer after the
    cut; ``sequence_parallel_moe``; ``mega_moe`` (a MegaMoE backend: fused EP dispatch,
    expert GEMMs and combine); ``dsa_context_parallel`` (Ascend); ``microbatching``;
    ``drafter``: the speculative drafter's kind (one of :data:`DRAFTERS`, ``none`` without
    speculative decoding); ``drafter_window`` / ``drafter_aux_layers``: its window (None:
    unknown, or a drafter that reads no hidden states) and aux layers, both only with a
    drafter; ``cut_layer`` (last KV-source layer; needed to judge aux layers);
    ``engram_after_cut``; ``lora``; ``graph_mode`` (none, decode_only, piecewise, full,
    full_and_piecewise); ``async_scheduling``; ``kv_connector`` (a KV connector is
    configured); ``kv_connector_owns_scheduling`` (that connector drives the scheduler,
    e.g. disaggregated modes); ``window``: W."""

    model_runner: str = "v2"
    pipeline_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    data_parallel_size: int = 1
    stage_holds_all_layers_after_cut: bool = True
    sequence_parallel_moe: bool = False
    mega_moe: bool = False
    dsa_context_parallel: bool = False
    microbatching: bool = False
    drafter: str = "none"
    drafter_window: int | None = None
    drafter_aux_layers: tuple[int, ...] = ()
    cut_layer: int | None = None
    engram_after_cut: bool = False
    lora: bool = False
    graph_mode: str = "full_and_piecewise"
    async_scheduling: bool = True
    kv_connector: bool = False
    kv_connector_owns_scheduling: bool = False
    window: int = 128

    def __post_init__(self) -> None:
        op = "ServingConfig"
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                fail(op, f.name, value, "a bool")
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                fail(op, f.name, value, "an int >= 1")
        if self.model_runner not in MODEL_RUNNERS:
            fail(op, "model_runner", self.model_runner, f"one of {MODEL_RUNNERS}")
        if self.graph_mode not in GRAPH_MODES:
            fail(op, "graph_mode", self.graph_mode, f"one of {GRAPH_MODES}")
        if self.drafter not in DRAFTERS:
            fail(op, "drafter", self.drafter, f"one of {DRAFTERS}")
        if self.drafter_window is not None and (isinstance(self.drafter_window, bool) or not isinstance(self.drafter_window, int) or self.drafter_window < 1):
            fail(op, "drafter_window", self.drafter_window, "None or an int >= 1")
        if not isinstance(self.drafter_aux_layers, tuple) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.drafter_aux_layers):
            fail(op, "drafter_aux_layers", self.drafter_aux_layers, "a tuple of layer ids (ints >= 0)")
        if self.cut_layer is not None and (isinstance(self.cut_layer, bool) or not isinstance(self.cut_layer, int) or self.cut_layer < 0):
            fail(op, "cut_layer", self.cut_layer, "None or a layer id (int >= 0)")
        if self.drafter_aux_layers and self.cut_layer is None:
            fail(op, "cut_layer", None, "the last KV-source layer id when drafter_aux_layers are given")
        if self.drafter == "none" and (self.drafter_window is not None or self.drafter_aux_layers):
            fail(op, "drafter", "none", f"the drafter's kind (one of {DRAFTERS[1:]}) when drafter_window or "
                                        "drafter_aux_layers are given")
        if self.kv_connector_owns_scheduling and not self.kv_connector:
            fail(op, "kv_connector", False, "True when kv_connector_owns_scheduling=True (that connector is a KV "
                                            "connector)")

    def fields_for_rules(self) -> dict[str, object]:
        """The config as rule fields, plus the derived ones rules may name:
        ``drafter_window_exceeds_window`` and ``drafter_aux_at_or_before_cut``."""
        values = dataclasses.asdict(self)
        values["drafter_window_exceeds_window"] = self.drafter_window is not None and self.drafter_window > self.window
        values["drafter_aux_at_or_before_cut"] = any(
            layer <= self.cut_layer for layer in self.drafter_aux_layers) if self.cut_layer is not None else False
        return values

    @classmethod
    def from_mapping(cls, values: Mapping, op: str = "ServingConfig") -> "ServingConfig":
        """``{"prefill_context_parallel_size": 4, "graph_mode": "none"}`` -> a config: a key that is
        not a field name (misspelt, not a string, or one of the CLI's short names) is a
        ``ValueError`` of ``op``'s ``config`` naming it and every field, where ``cls(**values)``
        raised ``TypeError`` ("unexpected keyword argument", "keywords must be strings")."""
        known = sorted(f.name for f in fields(cls))
        for key in values:
            if key not in known:
                hint = f" ({key!r} is --config's short name of {ALIASES[key]})" if key in ALIASES else ""
                fail(op, "config", dict(values), f"ServingConfig field names as keys, not {key!r}{hint}: "
                                                 f"one of {known}")
        return cls(**values)

    @classmethod
    def from_strings(cls, items: list[str]) -> "ServingConfig":
        """``["pcp=4", "graph_mode=none", "lora=true"]`` -> a config (CLI ``--config``)."""
        aliases = ALIASES
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, object] = {}
        for item in items:
            key, sep, raw = item.partition("=")
            key = aliases.get(key.strip(), key.strip())
            if not sep or key not in known:
                fail("config", "item", item, f"key=value with key in {sorted(known)} or {sorted(aliases)}")
            kind = known[key].type
            raw = raw.strip()
            try:
                if kind == "bool":
                    if raw.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                        raise ValueError(raw)
                    value: object = raw.lower() in ("true", "1", "yes", "on")
                elif kind == "int":
                    value = int(raw)
                elif kind == "int | None":
                    value = None if raw.lower() == "none" else int(raw)
                elif kind == "tuple[int, ...]":
                    value = tuple(int(x) for x in raw.split(",") if x.strip())
                else:
                    value = raw
            except ValueError:
                fail("config", key, raw, f"a value of type {kind}")
            kwargs[key] = value
        return cls(**kwargs)


def _rule_field_kinds() -> dict[str, tuple[str, tuple | None]]:
    """Field -> (kind, allowed values or None) for matrix rules: ``bool``, ``int``,
    ``int?`` (None allowed), ``str`` (one of the allowed values: a tuple, or a function giving
    them, the registered platforms or their archs) or ``ints`` (a tuple)."""
    from .device import platform_names

    kinds: dict[str, tuple[str, tuple | None]] = {}
    for f in fields(ServingConfig):
        kind = {"bool": "bool", "int": "int", "int | None": "int?", "tuple[int, ...]": "ints"}.get(f.type, "str")
        kinds[f.name] = (kind, {"model_runner": MODEL_RUNNERS, "graph_mode": GRAPH_MODES,
                                "drafter": DRAFTERS}.get(f.name))
    kinds["drafter_window_exceeds_window"] = ("bool", None)
    kinds["drafter_aux_at_or_before_cut"] = ("bool", None)
    kinds["platform"] = ("str", platform_names)  # read when a rule is parsed: the platforms registered then
    kinds["arch"] = ("str", _arch_names)  # likewise their archs: a misspelt arch would never match (fail open)
    return kinds


def _arch_names() -> tuple[str, ...]:
    """Every registered platform's archs (what a matrix row may name)."""
    from .device import known_archs

    return tuple(dict.fromkeys(a for archs in known_archs().values() for a in archs))


#: Fields a matrix rule may read, with their kinds (the loader type-checks every predicate).
RULE_FIELD_KINDS = _rule_field_kinds()
RULE_FIELDS = frozenset(RULE_FIELD_KINDS)
