"""A vLLM configuration as it would resolve on another device.

vLLM resolves part of its configuration by the platform it runs on: the model runner (V2
needs Triton, which vLLM's CPU platform lacks), the CUDA-graph mode (no graphs without a
static-graph platform), async scheduling (V1's incompatibilities), prefix caching (the CPU
platform turns it off for MLA models). The decision command
(``python -m swa_backends.integrations.vllm``) builds the config where it runs, then, for a
device on another platform (``--swa-device cuda:sm90`` on a CPU machine), re-derives the
fields the pack's decision reads with the release's own rules for that platform
(:func:`infer`); each re-derived field is reported with its value and the rule. The rules
are vLLM's and belong to its release: its subpackage's ``target`` module (``v0_33/target.py``)
restates them, and its seam table pins the vLLM functions they follow (scope ``cli``).

Platforms other than CUDA and ROCm (vllm-ascend's NPU) resolve through their own plugin:
nothing is re-derived for them, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: platforms whose resolution :func:`infer` re-derives
INFERRED_PLATFORMS = ("cuda", "rocm")


@dataclass(frozen=True)
class Given:
    """What the engine arguments set explicitly (None: left to vLLM's default), read before
    vLLM resolves them: ``enforce_eager``, ``cudagraph_mode`` (a ``CUDAGraphMode`` name),
    ``optimization_level``, ``async_scheduling``, ``enable_prefix_caching``."""

    enforce_eager: bool = False
    cudagraph_mode: str | None = None
    optimization_level: object = None
    async_scheduling: bool | None = None
    enable_prefix_caching: bool | None = None

    @classmethod
    def from_engine_args(cls, engine_args) -> "Given":
        cc = getattr(engine_args, "compilation_config", None)
        mode = getattr(cc, "cudagraph_mode", None) if cc is not None else None
        if isinstance(cc, dict):
            mode = cc.get("cudagraph_mode")
        return cls(enforce_eager=bool(getattr(engine_args, "enforce_eager", False)),
                   cudagraph_mode=getattr(mode, "name", mode),
                   optimization_level=getattr(engine_args, "optimization_level", None),
                   async_scheduling=getattr(engine_args, "async_scheduling", None),
                   enable_prefix_caching=getattr(engine_args, "enable_prefix_caching", None))


@dataclass
class Overlay:
    """``base`` with some attributes replaced (the resolved config for another device): the
    decision reads attributes only."""

    base: object
    values: dict = field(default_factory=dict)

    def __getattr__(self, name):
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        return getattr(self.__dict__["base"], name)


def infer(vllm_config, given: Given, platform: str, rules=None) -> tuple[object, dict[str, dict]]:
    """``(config, inferred)``: ``vllm_config`` (built on another platform) with the fields the
    pack's decision reads resolved as vLLM resolves them on ``platform``, and
    ``{field: {"value": ..., "rule": ...}}`` for each field re-derived. ``rules``: the release's
    ``target`` module, whose ``v2_model_runner``, ``graph_mode``, ``async_scheduling`` and
    ``prefix_caching`` each return ``(value, why)`` (None: ``current_release()``'s)."""
    if rules is None:
        from . import current_release

        rules = current_release().target
    v2, why_v2 = rules.v2_model_runner(vllm_config, platform)
    mode, why_mode = rules.graph_mode(given, vllm_config)
    run_async, why_async = rules.async_scheduling(given, vllm_config, v2, platform)
    caching, why_caching = rules.prefix_caching(given, vllm_config)
    config = Overlay(vllm_config, {
        "use_v2_model_runner": v2,
        "compilation_config": Overlay(vllm_config.compilation_config, {"cudagraph_mode": mode}),
        "scheduler_config": Overlay(vllm_config.scheduler_config, {"async_scheduling": run_async}),
        "cache_config": Overlay(vllm_config.cache_config, {"enable_prefix_caching": caching}),
    })
    inferred = {
        "model_runner": {"value": "v2" if v2 else "v1", "rule": why_v2},
        "graph_mode": {"value": mode.name, "rule": why_mode},
        "async_scheduling": {"value": run_async, "rule": why_async},
        "enable_prefix_caching": {"value": caching, "rule": why_caching},
    }
    return config, inferred
