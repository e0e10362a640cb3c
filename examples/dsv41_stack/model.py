"""A small attention stack shaped like DeepSeek-V4.1, with seeded random weights.

Per layer (pre-norm residual stream):

    h   = RMSNorm(x)
    q   = RMSNorm(h W_qa) W_qb                     [n, H, D]   (low-rank query, DeepSeek-style)
    kv  = RMSNorm(h W_kv)                          [n, D]      (one shared latent: MQA)
    q, kv <- rotary embedding on their last d_rope columns (position-dependent)
    write kv to the layer's SWA window cache; KV-source layers also write their
        prefix-cacheable compressed cache (one entry per ``ratio`` tokens)
    o   = sparse_mla(q, cache, indices, lens)      [n, H, D]   (the pack's op, value = whole latent)
    x  += (o W_uv) W_o                             (per-head value up-projection, output projection)
    x  += SwiGLU(RMSNorm(x))

Layers ``0 .. n_source-1`` are KV-source layers: they read ``top_k`` compressed entries
(a fixed spread over every closed entry: a stand-in for the indexer) plus their clamped
window. Layers ``n_source .. L-1`` own only window KV and read only their window; they are
the decoder side's *replay layers*.

The compressed entry ``k`` (positions ``[k r, (k+1) r)``) is the mean of the ``r`` window
latents, written by its closing token ``p = (k+1) r - 1`` after the step's window writes:
it reads window KV of positions ``p - r + 1 .. p`` only, which replayed and cold tokens alike
hold (a replayed closing token's write is PAD anyway).

Nothing here knows about replay: the clamp lives in the indices the engine builds with the
pack, and the padding in the slot mappings.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch

PAD = -1


@dataclass(frozen=True)
class StackConfig:
    d_model: int = 64
    n_heads: int = 4
    d_latent: int = 32  # D_qk = d_v of sparse_mla (512 on DeepSeek-V4.1)
    d_rope: int = 8  # rotary columns at the end of the latent
    q_rank: int = 32
    d_v_head: int = 16
    d_ffn: int = 128
    n_layers: int = 8
    n_source: int = 4  # KV-source layers 0 .. n_source-1; cut = n_source - 1
    window: int = 128  # W (= Wr, the replay length)
    block_size: int = 16
    ratio: int = 4  # compressed cache: one entry per `ratio` tokens
    top_k: int = 32  # compressed entries a query reads
    vocab: int = 512
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not 1 <= self.n_source <= self.n_layers:
            raise ValueError(f"n_source={self.n_source}: expected 1 <= n_source <= n_layers={self.n_layers}")
        if self.block_size % self.ratio:
            raise ValueError(f"ratio={self.ratio}: expected a divisor of block_size={self.block_size}")
        if self.d_rope % 2 or self.d_rope > self.d_latent:
            raise ValueError(f"d_rope={self.d_rope}: expected an even number <= d_latent={self.d_latent}")
        if self.ratio > self.window:
            raise ValueError(f"ratio={self.ratio}: expected <= window={self.window} (entries are built from window KV)")

    @classmethod
    def small(cls, **kw) -> StackConfig:
        """CPU-sized (tests): W = 128 as on V4.1, everything else tiny."""
        return replace(cls(), **kw)

    @classmethod
    def h200(cls, **kw) -> StackConfig:
        """Realistic attention widths: 64 heads over a 512-wide latent, 64 rotary columns,
        block 64, top-k 512; 8 layers of which the last 4 are replay layers (V4.1-Flash:
        19 of 40)."""
        base = cls(d_model=4096, n_heads=64, d_latent=512, d_rope=64, q_rank=1024, d_v_head=128, d_ffn=8192,
                   n_layers=8, n_source=4, window=128, block_size=64, ratio=4, top_k=512, vocab=32000,
                   dtype="bfloat16")
        return replace(base, **kw)

    @property
    def cut(self) -> int:
        return self.n_source - 1

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.d_latent)

    def as_dict(self) -> dict:
        return asdict(self)

    def flops_per_token(self, layer: int, attended: int) -> float:
        """Matmul FLOPs of one token through ``layer`` reading ``attended`` KV rows."""
        c = self
        proj = (c.d_model * c.q_rank + c.q_rank * c.n_heads * c.d_latent + c.d_model * c.d_latent
                + c.n_heads * c.d_latent * c.d_v_head + c.n_heads * c.d_v_head * c.d_model + 3 * c.d_model * c.d_ffn)
        attn = 2 * c.n_heads * attended * c.d_latent
        return 2.0 * proj + 2.0 * attn


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class Stack:
    """Weights and per-layer math. The engine owns caches, metadata and the pack."""

    def __init__(self, cfg: StackConfig, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        dt = cfg.torch_dtype
        g = torch.Generator(device=self.device)
        g.manual_seed(cfg.seed)

        def w(*shape, fan_in, scale=1.0):
            t = torch.randn(*shape, generator=g, device=self.device, dtype=torch.float32)
            return (t * (scale / math.sqrt(fan_in))).to(dt)

        def ones(n):
            return torch.ones(n, device=self.device, dtype=dt)

        c = cfg
        res = 1.0 / math.sqrt(2 * c.n_layers)  # residual branches scaled so x stays O(1)
        self.embed = w(c.vocab, c.d_model, fan_in=1)
        self.final_norm = ones(c.d_model)
        self.layers = []
        for _ in range(c.n_layers):
            self.layers.append({
                "attn_norm": ones(c.d_model),
                "wq_a": w(c.d_model, c.q_rank, fan_in=c.d_model),
                "q_norm": ones(c.q_rank),
                "wq_b": w(c.q_rank, c.n_heads * c.d_latent, fan_in=c.q_rank),
                "wkv": w(c.d_model, c.d_latent, fan_in=c.d_model),
                "kv_norm": ones(c.d_latent),
                "sink": torch.randn(c.n_heads, generator=g, device=self.device, dtype=torch.float32),
                "wuv": w(c.n_heads, c.d_latent, c.d_v_head, fan_in=c.d_latent),
                "wo": w(c.n_heads * c.d_v_head, c.d_model, fan_in=c.n_heads * c.d_v_head, scale=res),
                "mlp_norm": ones(c.d_model),
                "w_gate": w(c.d_model, c.d_ffn, fan_in=c.d_model),
                "w_up": w(c.d_model, c.d_ffn, fan_in=c.d_model),
                "w_down": w(c.d_ffn, c.d_model, fan_in=c.d_ffn, scale=res),
            })
        half = c.d_rope // 2
        self._inv_freq = 1.0 / (10000.0 ** (torch.arange(half, device=self.device, dtype=torch.float32) / max(half, 1)))

    # -- pieces ------------------------------------------------------------------------

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate the last ``d_rope`` columns of ``x [n, ..., D]`` by ``positions [n]``."""
        r = self.cfg.d_rope
        if r == 0:
            return x
        ang = positions.to(torch.float32)[:, None] * self._inv_freq[None, :]  # [n, r/2]
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (r // 2,)
        cos, sin = ang.cos().view(shape), ang.sin().view(shape)
        head, rot = x[..., :-r], x[..., -r:].float()
        a, b = rot[..., : r // 2], rot[..., r // 2:]
        rot = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).to(x.dtype)
        return torch.cat([head, rot], dim=-1)

    def qkv(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p, c = self.layers[layer], self.cfg
        h = rms_norm(x, p["attn_norm"])
        q = (rms_norm(h @ p["wq_a"], p["q_norm"]) @ p["wq_b"]).view(-1, c.n_heads, c.d_latent)
        kv = rms_norm(h @ p["wkv"], p["kv_norm"])
        return self.rope(q, positions), self.rope(kv, positions)

    def out_and_mlp(self, layer: int, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        p = self.layers[layer]
        o = torch.einsum("nhd,hdv->nhv", o, p["wuv"]).reshape(o.shape[0], -1)
        x = x + o @ p["wo"]
        h = rms_norm(x, p["mlp_norm"])
        return x + (torch.nn.functional.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed.index_select(0, token_ids)

    def final(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.final_norm)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return h.float() @ self.embed.float().t()
