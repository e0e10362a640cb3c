"""Check copies of the ws kernel against the reference on inputs whose running max moves a lot (every pair, inside a
pair, per row, down): the lazy rescale's rare paths. Prints one line per (pattern, H, K, sink, path); exit 1 on a miss."""
import sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench")]
import torch
from lib.sparse_mla import load_module_copy, check
from swa_backends.kernels import sparse_mla_gluon_ws as base

dev = torch.device("cuda")
mods = {"base": base}
for i, f in enumerate(sys.argv[1:]):
    mods[Path(f).stem] = load_module_copy(f"_chk_{i}", Path(f))
D = 512
scale = D ** -0.5


def gains(pattern, K, g):
    tile = torch.arange(K, device=dev) // 64
    if pattern == "random":
        return torch.ones(K, device=dev)
    if pattern == "grow":  # every tile's max far above the one before
        return 1.0 + 4.0 * tile
    if pattern == "shrink":
        return 1.0 + 4.0 * (tile.max() - tile)
    if pattern == "odd_high":  # tile B of each pair above tile A: consumer 1 moves the reference
        return torch.where(tile % 2 == 1, 2.0 + 3.0 * tile, 1.0)
    if pattern == "even_high":  # tile A above B: consumer 0 moves it, consumer 1's early P_B follows
        return torch.where(tile % 2 == 0, 2.0 + 3.0 * tile, 1.0)
    if pattern == "spiky":  # random tiles far above the others
        return torch.where(torch.rand(K, device=dev, generator=g) < 0.05, 12.0, 1.0)
    raise ValueError(pattern)


bad = 0
g = torch.Generator(device=dev).manual_seed(0)
for pattern in ("random", "grow", "shrink", "odd_high", "even_high", "spiky"):
    for H in (64, 128):
        for K in (200, 640, 1152):
            T = 96
            # every token reads rows [0, K) in order, each row scaled by its position's gain; heads scaled apart so
            # that rows of one tile differ in where their max lies
            kv = (torch.randn(K, D, device=dev, generator=g) * gains(pattern, K, g)[:, None]).to(torch.bfloat16)
            q = (torch.randn(T, H, D, device=dev, generator=g)
                 * (0.25 + torch.rand(1, H, 1, device=dev, generator=g) * 1.5)).to(torch.bfloat16)
            idx = torch.arange(K, device=dev, dtype=torch.int32).repeat(T, 1)
            lens = torch.full((T,), K, dtype=torch.int32, device=dev)
            lens[1::7] = torch.randint(0, K + 1, (len(range(1, T, 7)),), device=dev, generator=g).to(torch.int32)
            lens[3] = 0
            idx[5::11, 64:130] = -1
            idx[9::13] = idx[9::13].flip(1)  # the same rows, the max falling instead
            for sink in (None, torch.randn(H, device=dev, generator=g)):
                rels = {}
                for name, mod in mods.items():
                    for wide in (False, True):
                        mod_wide = mod.wide_gathers
                        mod.wide_gathers = lambda kv, w=wide: w
                        try:
                            got = mod.sparse_mla(q, kv, idx, lens, scale, D, sink=sink)
                        finally:
                            mod.wide_gathers = mod_wide
                        why, rel = check(got, q, kv, idx, lens, scale, D, sink)
                        rels[(name, wide)] = rel
                        finite = bool(torch.isfinite(got[0]).all())
                        ok = why is None and finite
                        if name != "base":
                            ok = ok and rel <= max(2.0 * rels[("base", wide)], 4e-3)
                        bad += not ok
                        if not ok or pattern == "random" or wide:
                            print(f"{pattern:9} H {H:3} K {K:4} sink {sink is not None:d} {name:20} wide {wide:d}: "
                                  f"{'ok' if ok else 'MISS'} rel {rel:.2e} {why or ''}", flush=True)
print("bad", bad)
sys.exit(1 if bad else 0)
