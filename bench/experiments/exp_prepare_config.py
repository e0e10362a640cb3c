"""Where ``prepare_replay_step``'s GPU time goes at the small steps, and what its launch shape buys (one H200).

    . bench/gpu_env.sh && SWA_VLLM_KERNELS_DIR=.vllm_kernels python3 bench/experiments/exp_prepare_config.py --out DIR
    python bench/experiments/exp_prepare_config.py --out DIR --smoke   # no GPU: checks the script, one call each

``bench_replay_step.py`` put the pack's one launch at 0.52-0.54x vLLM's GPU time at 1x1K with L2
warm (5.7 against 10.5 µs) before the token tile was chosen by the step's size from this
experiment's sweep (commit 7f767ef; bench/README.md), where an empty Triton kernel costs 3.5 µs.
It takes that launch apart on the replay step's shapes (1x1K, 1x16K, 16x1K+240d, ``lib/steps.py``;
``lib/replay_step.py``'s layouts and vLLM's sequence; padding only where a request replays, as
the integration launches it). GPU µs
per step, L2 flushed and warm (``lib.timing.gpu_pair_rounds``, a ~2 ms GPU sleep before each
call), the median over interleaved rounds:

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
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

from lib import smoke  # noqa: E402

smoke.use_interpreter()  # before anything imports Triton

import numpy as np  # noqa: E402
import torch  # noqa: E402

import swa_backends  # noqa: E402
from lib import floors, replay_step as rs, results, timing as tm  # noqa: E402
from lib.steps import step_shape  # noqa: E402
from swa_backends.kernels import prepare_replay_step as kp  # noqa: E402
from swa_backends.testing import vllm_kernels as vk  # noqa: E402

STEPS = ("1x1K", "1x16K", "16x1K+240d")
CONFIGS = tuple((t, w, k) for t in (8, 16) for w in (64, 128) for k in (1, 2, 4, 8))
SMOKE_SHAPES = {"1x1K": (1, 140, 0), "1x16K": (1, 300, 0), "16x1K+240d": (3, 140, 3)}


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
    s = rs.ServingStep(*(SMOKE_SHAPES.get(name, (1, 140, 0)) if tm.smoke() else step_shape(name)), dev, rng)
    want = s.buffers()
    if K is not None:
        kept_want = rs.vllm_step(K, s, want)
    else:
        rs.ref_step(ref, s, want, rs.gather_out_view(s, want))
        kept_want = want["kslots"][:, : s.n]
    kern = kp._prepare_replay_step
    fns = {}
    if K is not None:
        bv = s.buffers()
        fns["vllm"] = lambda: rs.vllm_step(K, s, bv)
    x = torch.zeros(64, dtype=torch.int32, device=dev)
    empty = floors.empty_kernel()
    fns["empty"] = lambda: empty[(1,)](x, 1, BLOCK=32)
    b = s.buffers()
    out = rs.fused_out(s, b)
    op = lambda: rs.fused_step(be, s, b, out)  # noqa: E731
    op()
    _sync(dev)
    rs.check(s, want, kept_want, b, out["replay_batch"])
    fns["op"] = op
    grid, args, warps = captured(op)
    tok = args[list(kern.arg_names).index("tok_tiles")]
    fns["tokens only"] = lambda: kern[(tok, 1, 1)](*args, num_warps=warps)
    if grid[0] > tok:
        no_tok = with_arg(args, "tok_tiles", 0)
        fns["requests only"] = lambda: kern[(grid[0] - tok, 1, 1)](*no_tok, num_warps=warps)
    for t, w, k in configs:
        cb = s.buffers()
        cout = rs.fused_out(s, cb)
        g, a, _ = captured(lambda: rs.fused_step(be, s, cb, cout), (t, w, k))
        kern[g](*a, num_warps=k)
        _sync(dev)
        rs.check(s, want, kept_want, cb, cout["replay_batch"])
        fns[f"T{t}W{w}n{k}"] = (lambda g=g, a=a, k=k: kern[g](*a, num_warps=k))
    print(f"{name}: B {s.B}, T {s.T}, kept rows {s.n}, grid {grid} ({tok} token tiles); "
          f"{len(configs)} configs checked against {'vLLM' if K is not None else 'the reference'}")
    return fns


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


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
    why = smoke.refusal(a.smoke)
    if why:
        print(why, file=sys.stderr)
        return 2
    tm.set_smoke(a.smoke)
    a.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cpu") if a.smoke else torch.device("cuda", torch.cuda.current_device())
    be = rs.integration_backend(dev)
    ref = swa_backends.select(dev, prefer="reference")
    K, origin = vk.load(a.vllm_kernels)
    rng = np.random.default_rng(0)
    res = {"meta": {**results.machine(dev), "smoke": a.smoke, "vllm_kernels": origin, "rounds": a.rounds,
                    "op_tiles": {"small_step_tokens": kp.SMALL_STEP_TOKENS, "small": kp.SMALL_TILE,
                                 "other": kp.TILE}}, "steps": {}}
    for name in steps:
        fns = step_fns(name, configs, be, ref, K, dev, rng)
        row = res["steps"][name] = tm.gpu_pair_rounds(fns, a.rounds, calls=100)
        base = row.get("vllm")
        print(f"\n{name}: GPU µs per step, flushed / warm (ratio to vLLM's warm; warm per round)")
        for k, v in sorted(row.items(), key=lambda kv: kv[1]["warm"]):
            ratio = f" ({v['warm'] / base['warm']:.2f})" if base else ""
            rounds = " ".join(f"{x:.2f}" for x in v["warm_all"])
            print(f"  {k:>14} {v['flushed']:7.2f} / {v['warm']:6.2f}{ratio}   [{rounds}]")
    results.write_json(a.out / "exp_prepare_config.json", res)
    print(f"\nwrote {a.out / 'exp_prepare_config.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
