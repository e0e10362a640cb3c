"""Paged KV caches of the example stack: two KV groups with block tables, as in a serving engine.

* Group 0, ``main`` (prefix-cacheable): a token-level block table; each block of
  ``block_size`` tokens stores ``block_size // ratio`` compressed latent entries in every
  KV-source layer. Full blocks are registered in a prefix cache (hash chain over the tokens)
  and shared by later requests.
* Group 1, ``swa`` (window, NOT prefix-cacheable): a token-level block table; each block stores
  ``block_size`` window latents in every layer. Every request gets fresh blocks: after a hit
  only ``[R, ...)`` is rebuilt. With ``poison=True`` fresh and freed window blocks are filled
  with NaN, so a read below the replay start (or of a position never written) poisons the
  output.

Block 0 of each pool is the shared null block (zeros) and is never handed out: slot 0 is a
real slot, ``PAD = -1`` is "write nothing". Each layer's tensor has one extra *trash* row at
the end, where PAD writes land so that writes need no host-side masking; it is never read.
Layer ``l``'s tensor is ``[S_swa (+ S_comp for KV-source layers) + 1, D]``; attention gets the
view without the trash row, compressed slot ``c`` at row ``S_swa + c``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from .model import StackConfig

MAIN, SWA = 0, 1


class OutOfBlocks(RuntimeError):
    pass


class BlockPool:
    """Free list + (optionally) a prefix cache of full blocks with reference counts."""

    def __init__(self, num_blocks: int, *, prefix_caching: bool):
        if num_blocks < 2:
            raise ValueError(f"num_blocks={num_blocks}: expected >= 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self.free = list(range(num_blocks - 1, 0, -1))  # pop() hands out 1, 2, ...
        self.ref = [0] * num_blocks
        self.hash_of: dict[int, int] = {}
        self.block_of: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, refcount 0, LRU first

    def num_free(self) -> int:
        return len(self.free) + len(self.evictable)

    def allocate(self) -> int:
        if self.free:
            b = self.free.pop()
        elif self.evictable:
            b, _ = self.evictable.popitem(last=False)
            del self.block_of[self.hash_of.pop(b)]
        else:
            raise OutOfBlocks("no free block")
        self.ref[b] = 1
        return b

    def touch(self, b: int) -> None:
        """Take a reference on a cached block (a prefix hit)."""
        if self.ref[b] == 0:
            self.evictable.pop(b, None)
        self.ref[b] += 1

    def release(self, b: int) -> bool:
        """Drop a reference; returns True when the block went back to the free list."""
        self.ref[b] -= 1
        if self.ref[b] > 0:
            return False
        if b in self.hash_of:
            self.evictable[b] = None
            return False
        self.free.append(b)
        return True

    def register(self, b: int, key: int) -> None:
        if not self.prefix_caching or b in self.hash_of or key in self.block_of:
            return
        self.hash_of[b] = key
        self.block_of[key] = b

    def lookup(self, keys: list[int]) -> list[int]:
        """Cached blocks of the longest prefix of ``keys``."""
        hits = []
        if not self.prefix_caching:
            return hits
        for k in keys:
            b = self.block_of.get(k)
            if b is None:
                break
            hits.append(b)
        return hits

    def reset_prefix_cache(self) -> None:
        for b in list(self.evictable):
            self.free.append(b)
        self.evictable.clear()
        self.hash_of.clear()
        self.block_of.clear()


def block_keys(tokens: list[int], block_size: int, num_blocks: int) -> list[int]:
    """Hash chain of the first ``num_blocks`` full blocks of ``tokens``."""
    keys, h = [], 0
    for i in range(num_blocks):
        h = hash((h, tuple(tokens[i * block_size:(i + 1) * block_size])))
        keys.append(h)
    return keys


class PagedKV:
    """Per-layer cache tensors over the two block pools."""

    def __init__(self, cfg: StackConfig, *, num_main_blocks: int, num_swa_blocks: int, device, poison: bool = True,
                 prefix_caching: bool = True):
        self.cfg = cfg
        self.device = torch.device(device)
        self.poison = poison
        bs = cfg.block_size
        self.bs_c = bs // cfg.ratio
        self.S_swa = num_swa_blocks * bs
        self.S_comp = num_main_blocks * self.bs_c
        self.main = BlockPool(num_main_blocks, prefix_caching=prefix_caching)
        self.swa = BlockPool(num_swa_blocks, prefix_caching=False)
        self.layers: list[torch.Tensor] = []
        for layer in range(cfg.n_layers):
            rows = self.S_swa + (self.S_comp if layer < cfg.n_source else 0) + 1
            t = torch.empty(rows, cfg.d_latent, dtype=cfg.torch_dtype, device=self.device)
            t.fill_(float("nan") if poison else 0.0)
            t[:bs].zero_()  # null window block
            if layer < cfg.n_source:
                t[self.S_swa:self.S_swa + self.bs_c].zero_()  # null compressed block
            self.layers.append(t)

    def kv(self, layer: int) -> torch.Tensor:
        """What attention reads: the layer's rows without the trash row."""
        return self.layers[layer][:-1]

    def trash_row(self, layer: int) -> int:
        return self.layers[layer].shape[0] - 1

    def comp_rows(self, layer: int) -> torch.Tensor:
        return self.layers[layer][self.S_swa:self.S_swa + self.S_comp]

    def free_swa_block(self, b: int) -> None:
        if self.swa.release(b) and self.poison:
            bs = self.cfg.block_size
            for t in self.layers:
                t[b * bs:(b + 1) * bs].fill_(float("nan"))

    def write(self, layer: int, rows: torch.Tensor, values: torch.Tensor) -> None:
        """``cache[rows[i]] = values[i]``; rows of PAD go to the trash row (no host sync)."""
        t = self.layers[layer]
        idx = torch.where(rows < 0, self.trash_row(layer), rows)
        t.index_copy_(0, idx, values.to(t.dtype))
