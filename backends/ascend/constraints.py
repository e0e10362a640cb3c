"""What ``npu_sparse_flash_mla`` accepts per Ascend SoC, as data.

Source: the SparseFlashMla tiling checks of CANN ops-transformer as built into vllm-ascend
(``sparse_flash_mla_tiling`` with the DSpark "ori sparse" SWA mode) and the op's
``sparse_flash_mla`` interface document. The pack's wrapper uses the op's SWA mode with
**explicit window indices** (``ori_sparse_indices`` + ``ori_topk_length``, ``ori_mask_mode=0``):
the op's own band mask (``ori_mask_mode=4``, ``ori_win_left=127``) has no replay start and
cannot clamp. Older builds reject ``ori_sparse_indices`` outside A5 ("ori_sparse_indices is
only supported on A5"); the ``vllm_ascend_sparse_flash_mla`` probe self-tests that mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NpuSparseMlaConstraints:
    """``window``: the SWA window the band mask is built for (``ori_win_left = window - 1``);
    ``head_dim``: D of q and KV (= d_v); ``heads_power_of_two``/``max_heads``: local query
    heads; ``cmp_topk``: accepted top-k widths of the compressed path (CSA mode; the pack's
    wrapper passes one explicit list instead); ``block_size``: paged-KV block size rule;
    ``explicit_window_indices``: ``ori_sparse_indices`` accepted in the SWA mode;
    ``dtypes``: q / KV dtypes (same dtype for both)."""

    soc: str
    window: int
    head_dim: int
    max_heads: int
    heads_power_of_two: bool
    cmp_topk: tuple[int, ...]
    block_size: str
    explicit_window_indices: bool
    dtypes: tuple[torch.dtype, ...]

    def head_reason(self, heads: int) -> str | None:
        pow2 = heads > 0 and heads & (heads - 1) == 0
        if heads < 1 or heads > self.max_heads or (self.heads_power_of_two and not pow2):
            rule = "a power of two" if self.heads_power_of_two else "an int"
            return f"npu_sparse_flash_mla on {self.soc} needs {rule} in [1, {self.max_heads}] local heads, got {heads}"
        return None


_A2_A3 = dict(window=128, head_dim=512, max_heads=128, heads_power_of_two=True, cmp_topk=(512, 1024),
              block_size="a multiple of 16 in [16, 1024]", explicit_window_indices=True,
              dtypes=(torch.bfloat16, torch.float16))

CONSTRAINTS = {
    "910b": NpuSparseMlaConstraints(soc="910b", **_A2_A3),
    "910_93": NpuSparseMlaConstraints(soc="910_93", **_A2_A3),
    "950": NpuSparseMlaConstraints(
        soc="950", window=128, head_dim=512, max_heads=128, heads_power_of_two=False, cmp_topk=(),
        block_size="in [1, 1024]", explicit_window_indices=True, dtypes=(torch.bfloat16, torch.float16)),
}

# The strictest rules over the SoCs the matrix serves (A2/A3): what a per-call check can
# enforce without knowing which SoC the call runs on.
SERVED = CONSTRAINTS["910b"]
