"""Where the replay step's host time goes, by leaving parts out (one H200, in context).

    . bench/gpu_env.sh && SWA_VLLM_KERNELS_DIR=.vllm_kernels python3 bench/experiments/exp_replay_step_ablation.py --out DIR

``profile_replay_step.py`` times each piece of the pack's step alone, back to back, where each
runs with its own code and data hot; on the H200 machines they add up to about four fifths of the
whole step (its log at b258b93, 8x4K+32d: 38.7-39.8 of 48.6-49.2 µs). This experiment times the
pack's step of ``lib/replay_step.py`` (``pack_step``: the first window group's main batch, the
scope of ``bench_replay_step.py`` before it timed the whole step; the 1x16K and 8x4K+32d steps)
and the same step with one part left out at a time, in interleaved rounds (host µs per step,
median of 9 rounds of 300 back-to-back steps, ``lib.timing.host_interleaved_us``): the
difference is what that part costs where it runs. The
same again with the kernel launch made a no-op gives the Python alone. Outputs are not checked
here (``bench_replay_step.py`` does that); parts left out leave their outputs unwritten.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

from lib import replay_step as rs, results, timing as tm  # noqa: E402
from lib.steps import BS, W  # noqa: E402
from swa_backends.common.types import INDEX_DTYPE  # noqa: E402
from swa_backends.integrations.vllm import runtime as rt  # noqa: E402
from swa_backends.kernels import prepare_replay_step as kp  # noqa: E402
from swa_backends.testing import vllm_kernels as vk  # noqa: E402

SHAPES = {"1x16K": (1, 16384, 0), "8x4K+32d": (8, 4096, 32)}


def step_fn(be, s, b, g, target, scratch, shims, *, predict=True, later=True, empty=True):
    """``lib.replay_step.pack_step`` with parts optionally left out: the model state's prediction (the
    target's split stays as last predicted), vLLM's later calls, vLLM's per-build ``torch.empty``
    of the gather lengths (a kept tensor instead)."""
    D, T = s.D, s.T
    swa, gls, pad = shims["swa_indices_and_lens"], shims["prefill_gather_lens"], shims["pad_replayed_slots"]
    kept_gl = torch.empty(s.P, dtype=INDEX_DTYPE, device=s.dev)

    def run():
        rt.begin_step()
        try:
            if s.replays:
                pad[(s.B,)](b["slots"], b["slots"].stride(0), s.cacheable, s.qsl, s.positions, s.R, W, vk.PAD_SLOT_ID,
                            NUM_GROUPS=s.cacheable.numel(), BLOCK=1024)
            rt.prepare_step(be, rs.predict(s, target) if predict else target, s.qsl, s.seq, s.positions, b["slots"],
                            s.R, s.B, T, scratch, gather=(s.plan, W, g))
            if later:
                if D:
                    swa(b["dec_idx"], b["dec_lens"], W, W, b["dec_lens"], b["dec_lens"], s.qsl, s.seq, s.t2r, s.valid,
                        s.table, BS, s.R, num_tokens=D, token_offset=0)
                if T > D:
                    swa(b["pre_idx"], b["pre_lens"], W, W, b["pre_lens"], b["pre_lens"], s.qsl, s.seq, s.t2r,
                        s.valid, s.table, BS, s.R, num_tokens=T - D, token_offset=D)
                if s.P:
                    b["gl"] = torch.empty(s.P, dtype=INDEX_DTYPE, device=s.dev) if empty else kept_gl
                    gls(b["gl"], s.seq, s.qsl, s.R, s.P, s.D, W)
                rt.gather_replay_batch(be, s.plan, s.qsl, s.seq, s.R, s.positions, b["slots"], W, g)
        finally:
            rt.end_step()
    return run


def _rounded(times: dict) -> dict:
    return {k: round(v, 1) for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    res: dict = {}
    with rs.on_this_gpu() as (dev, be, shims):
        for name, shape in SHAPES.items():
            s = rs.ServingStep(*shape, dev, np.random.default_rng(0))
            b = s.buffers()
            g, target, scratch = rs.gather_out_view(s, b), rs.window_target(b), rs.step_scratch(s)
            bf = s.buffers()
            fout = rs.fused_out(s, bf)
            fns = {"whole step": step_fn(be, s, b, g, target, scratch, shims),
                   "without the prediction": step_fn(be, s, b, g, target, scratch, shims, predict=False),
                   "without vLLM's later calls": step_fn(be, s, b, g, target, scratch, shims, later=False),
                   "without vLLM's torch.empty": step_fn(be, s, b, g, target, scratch, shims, empty=False),
                   "prepare_step alone": step_fn(be, s, b, g, target, scratch, shims, predict=False, later=False),
                   "prepare_replay_step alone": lambda s=s, bf=bf, fout=fout: rs.fused_step(be, s, bf, fout)}
            for f in fns.values():
                f()
            tm.host_interleaved_us(fns, calls=100, rounds=2)  # untimed
            res[name] = {"launching": _rounded(tm.host_interleaved_us(fns, calls=300, rounds=9))}
            real = kp._K
            kp._K = lambda key, grid, *args: None  # the Python alone
            try:
                res[name]["launch a no-op"] = _rounded(tm.host_interleaved_us(fns, calls=300, rounds=9))
            finally:
                kp._K = real
            for mode, row in res[name].items():
                print(name, mode, row, flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    results.write_json(a.out / "exp_replay_step_ablation.json", {"meta": results.machine(dev), **res})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
