"""vLLM 0.34's own rules for the fields it resolves per platform, re-derived by the decision
command for a device on another platform (the core's ``target.infer``).

0.34 has model runner V2 only; the graph mode, the async-scheduling default (0.33's without its
V1 branch, which ``v2=True`` never takes) and the prefix-caching default are 0.33's rules
(``v0_33/target.py``), over definitions the seam table pins with 0.34's values (scope ``cli``).
"""

from __future__ import annotations

from ..v0_33.target import async_scheduling, graph_mode, prefix_caching  # noqa: F401


def v2_model_runner(vllm_config, platform: str) -> tuple[bool, str]:
    """``(True, why)``: vLLM 0.34 runs model runner V2 on every platform."""
    return True, "vLLM 0.34 has model runner V2 only"
