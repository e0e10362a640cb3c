"""Grid sizing for triton-ascend: one program per vector core at most, at least one."""

from __future__ import annotations

import functools

import torch

# Under Triton's interpreter (CPU) a few programs are enough to exercise the grid-stride loops.
INTERPRETER_CORES = 3
# Ascend 910B/910_93 expose 40 or 48 vector cores; used when the driver cannot be asked.
DEFAULT_NPU_CORES = 40


@functools.cache
def core_count(device: str) -> int:
    """Vector cores of ``device`` (``"cpu"`` -> the interpreter's small count)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return INTERPRETER_CORES
    try:  # triton-ascend's driver reports the core counts of the NPU
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(dev.index or 0)
        return int(props.get("num_vectorcore") or props.get("num_aicore") or DEFAULT_NPU_CORES)
    except Exception:
        return DEFAULT_NPU_CORES


def grid(work: int, per_program: int, device: torch.device) -> tuple[int]:
    """``(programs,)`` with ``1 <= programs <= core count`` and no idle program."""
    need = -(-work // max(1, per_program))
    return (max(1, min(core_count(str(device)), need)),)


def search_steps(num_reqs: int) -> int:
    """Iterations of the branch-free binary search over ``query_start_loc`` (constexpr)."""
    return max(1, int(num_reqs).bit_length() + 1)
