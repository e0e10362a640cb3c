"""Where ``prepare_replay_step``'s GPU time goes at the small steps, and what its launch shape buys (one H200).

    . bench/gpu_env.sh && SWA_VLLM_KERNELS_DIR=.vllm_kernels python3 bench/exp_prepare_config.py --out DIR
    TRITON_INTERPRET=1 python bench/exp_prepare_config.py --out DIR --smoke   # no GPU: checks the script

``bench_replay_step.py`` put the pack's one launch at 0.52-0.54x vLLM's GPU time at 1x1K with L2
warm (5.7 against 10.5 µs) before the token tile was chosen by the step's size from this
experiment's sweep (commit 7f767ef; bench/README.md), where an empty Triton kernel costs 3.5 µs.
It takes that launch apart on ``bench_replay_step.py``'s steps (1x1K, 1x16K, 16x1K+240d: its shapes, layouts and
vLLM's sequence; padding only where a request replays, as the integration launches it). GPU µs
per step, L2 flushed and warm (``bench_triton_ops.gpu_us``, a ~2 ms GPU sleep before each call),
the median over interleaved rounds:

* ``vllm``: vLLM's kernel sequence for the step (the ratios' base);
* ``empty``: the empty Triton kernel (one launch's floor);
* ``op``: the op as the pack launches it (its tile chosen by the step's size);
* ``tokens only`` / ``requests only``: the same launch with its request programs cut off (the grid
  ends at the token tiles) / with no token tiles (``tok_tiles`` 0): which role is the long pole;
* ``T<t>W<w>n<k>``: the launch built for a token tile of ``t`` tokens, ``w`` window columns per
  program and ``k`` warps (the tile forced while the op builds its arguments, launched through
  Triton's JIT); every one is first checked bit-identical to vLLM's outputs
  (to the reference's without vLLM).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

# the sibling scripts (python puts the script's folder first on sys.path); importing them sets
# TRITON_INTERPRET for --smoke before Triton loads
import bench_replay_step as brs  # noqa: E402
import bench_triton_ops as bto  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

import swa_backends  # noqa: E402
from swa_backends.kernels import prepare_replay_step as kp  # noqa: E402
from swa_backends.testing import vllm_kernels as vk  # noqa: E402

STEPS = ("1x1K", "1x16K", "16x1K+240d")
CONFIGS = tuple((t, w, k) for t in (8, 16) for w in (64, 128) for k in (1, 2, 4, 8))
SMOKE_SHAPES = {"1x1K": (1, 140, 0), "1x16K": (1, 300, 0), "16x1K+240d": (3, 140, 3)}


def step_shape(name: str) -> tuple:
    """``(prefills, tokens per prefill, decodes)`` of a step named as ``bench_replay_step``'s
    (``8x4K+32d``: 8 prefills of 4096 tokens after 32 decodes)."""
    m = re.fullmatch(r"(\d+)x(\d+)(K?)(?:\+(\d+)d)?", name)
    if m is None:
        raise ValueError(f"step {name!r}: expected <prefills>x<tokens>[K][+<decodes>d], e.g. 8x4K+32d")
    return int(m[1]), int(m[2]) * (1024 if m[3] else 1), int(m[4] or 0)


def config_of(name: str) -> tuple:
    m = re.fullmatch(r"T(\d+)W(\d+)n(\d+)", name)
    if m is None:
        raise ValueError(f"config {name!r}: expected T<tokens>W<columns>n<warps>, e.g. T8W128n2")
    return int(m[1]), int(m[2]), int(m[3])


def captured(op, tile=None) -> tuple:
    """``(grid, args, warps)`` the op passes its kernel (nothing launched), with its token tile
    ``(tokens, window columns, warps)`` set to ``tile`` (None: the op's own choice)."""
    got = {}
    saved = kp._K, kp._forced_tile
    kp._K = lambda key, grid, *args: got.update(grid=grid, args=args, warps=kp._compile_options(key)["num_warps"])
    kp._forced_tile = tile  # any tile, not only the module's TILES (what forced_tile allows)
    try:
        op()
    finally:
        kp._K, kp._forced_tile = saved
    return got["grid"], got["args"], got["warps"]


def with_arg(args: tuple, name: str, value) -> tuple:
    names = list(kp._prepare_replay_step.arg_names)
    a = list(args)
    a[names.index(name)] = value
    return tuple(a)


def step_fns(name: str, configs, be, ref, K, dev, rng) -> dict:
    s = brs.ServingStep(*(SMOKE_SHAPES.get(name, (1, 140, 0)) if bto.SMOKE else step_shape(name)), dev, rng)
    want = s.buffers()
    if K is not None:
        kept_want = brs.vllm_step(K, s, want)
    else:
        brs.ref_step(ref, s, want, brs.gather_out_view(s, want))
        kept_want = want["kslots"][:, : s.n]
    kern = kp._prepare_replay_step
    fns = {}
    if K is not None:
        bv = s.buffers()
        fns["vllm"] = lambda: brs.vllm_step(K, s, bv)
    x = torch.zeros(64, dtype=torch.int32, device=dev)
    empty = bto.empty_kernel()
    fns["empty"] = lambda: empty[(1,)](x, 1, BLOCK=32)
    b = s.buffers()
    out = brs.fused_out(s, b)
    op = lambda: brs.fused_step(be, s, b, out)  # noqa: E731
    op()
    _sync(dev)
    brs.check(s, want, kept_want, b, out["replay_batch"])
    fns["op"] = op
    grid, args, warps = captured(op)
    tok = args[list(kern.arg_names).index("tok_tiles")]
    fns["tokens only"] = lambda: kern[(tok, 1, 1)](*args, num_warps=warps)
    if grid[0] > tok:
        no_tok = with_arg(args, "tok_tiles", 0)
        fns["requests only"] = lambda: kern[(grid[0] - tok, 1, 1)](*no_tok, num_warps=warps)
    for t, w, k in configs:
        cb = s.buffers()
        cout = brs.fused_out(s, cb)
        g, a, _ = captured(lambda: brs.fused_step(be, s, cb, cout), (t, w, k))
        kern[g](*a, num_warps=k)
        _sync(dev)
        brs.check(s, want, kept_want, cb, cout["replay_batch"])
        fns[f"T{t}W{w}n{k}"] = (lambda g=g, a=a, k=k: kern[g](*a, num_warps=k))
    print(f"{name}: B {s.B}, T {s.T}, kept rows {s.n}, grid {grid} ({tok} token tiles); "
          f"{len(configs)} configs checked against {'vLLM' if K is not None else 'the reference'}")
    return fns


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def gpu_rounds(fns: dict, rounds: int) -> dict:
    """``{name: {"flushed": µs, "warm": µs}}``: medians over ``rounds`` interleaved rounds of
    ``bto.gpu_pair`` (100 calls each)."""
    got = {k: {"flushed": [], "warm": []} for k in fns}
    keys = list(fns)
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            p = bto.gpu_pair(fns[k], calls=100 if not bto.SMOKE else 2, lead_cycles=bto.REFERENCE_LEAD_CYCLES)
            got[k]["flushed"].append(p["gpu_us_flushed"])
            got[k]["warm"].append(p["gpu_us_warm"])
    return {k: {m: statistics.median(v) for m, v in d.items()} | {"warm_all": d["warm"]} for k, d in got.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="no GPU: tiny steps through Triton's interpreter")
    ap.add_argument("--vllm-kernels", default=None)
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated, e.g. 1x1K,8x4K+32d")
    ap.add_argument("--configs", default=None, help="comma-separated T<tokens>W<columns>n<warps> (default: "
                                                      "T 8/16 x W 64/128 x 1/2/4/8 warps)")
    a = ap.parse_args(argv)
    steps = a.steps.split(",")
    for name in steps:
        step_shape(name)
    configs = CONFIGS if a.configs is None else tuple(config_of(c) for c in a.configs.split(","))
    if a.smoke:
        if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
            print("--smoke runs on a CPU-only machine under TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        bto.SMOKE = True
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cpu") if bto.SMOKE else torch.device("cuda", torch.cuda.current_device())
    be = brs.integration_backend(dev)
    ref = swa_backends.select(dev, prefer="reference")
    K, origin = vk.load(a.vllm_kernels)
    rng = np.random.default_rng(0)
    res = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": os.environ.get("SWA_COMMIT"),
                    "gpu": "cpu (smoke)" if bto.SMOKE else torch.cuda.get_device_name(dev), "torch": torch.__version__,
                    "triton": triton.__version__, "vllm_kernels": origin, "rounds": a.rounds,
                    "op_tiles": {"small_step_tokens": kp.SMALL_STEP_TOKENS, "small": kp.SMALL_TILE,
                                 "other": kp.TILE}}, "steps": {}}
    for name in steps:
        fns = step_fns(name, configs, be, ref, K, dev, rng)
        row = res["steps"][name] = gpu_rounds(fns, a.rounds if not bto.SMOKE else 1)
        base = row.get("vllm")
        print(f"\n{name}: GPU µs per step, flushed / warm (ratio to vLLM's warm; warm per round)")
        for k, v in sorted(row.items(), key=lambda kv: kv[1]["warm"]):
            ratio = f" ({v['warm'] / base['warm']:.2f})" if base else ""
            rounds = " ".join(f"{x:.2f}" for x in v["warm_all"])
            print(f"  {k:>14} {v['flushed']:7.2f} / {v['warm']:6.2f}{ratio}   [{rounds}]")
    (a.out / "exp_prepare_config.json").write_text(json.dumps(res, indent=1))
    print(f"\nwrote {a.out / 'exp_prepare_config.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
