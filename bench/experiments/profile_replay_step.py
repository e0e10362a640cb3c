"""Host time of the replay step's pieces on a GPU: where the pack's one-launch step
(``lib/replay_step.py``'s ``pack_step``, the first window group's main batch) spends its host time
(one 8x4K+32d step, validation off).

    . bench/gpu_env.sh && python3 bench/experiments/profile_replay_step.py [--vllm-kernels .vllm_kernels]

Prints, twice, host µs per call (back-to-back calls, no sync, median of 5 rounds:
``lib.timing.host_us``) of the whole step through the pack's adapters, through vLLM's
kernels, through ``prepare_replay_step`` alone and through the pack's ops one per vLLM call
site; of the step's pieces (the model state's prediction, ``prepare_step``, an empty open
step, a held pad call, ``prepare_step`` plus vLLM's four later calls answered, the same
lookups unanswered, ten answered window-row calls through the patch's shim and ten of their
answer lookups alone, vLLM's per-build ``torch.empty``), of vLLM's decode-rows SWA kernel, of
one small torch op and of the fused launch without its wrapper (``_launch_pieces``); then a
cProfile of 300 adapter steps (by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared library (lib/)

from lib import replay_step as rs, timing as tm  # noqa: E402
from lib.steps import BS, W  # noqa: E402
from swa_backends.integrations.vllm import runtime as rt  # noqa: E402
from swa_backends.testing import vllm_kernels as vk  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-kernels", default=None, help=f"as bench_replay_step.py (default: ${vk.ENV} or the installed vLLM)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    with rs.on_this_gpu() as (dev, be, shims):
        return _profile(dev, be, shims, a)


def _profile(dev, be, shims, a) -> int:
    K, origin = vk.load(a.vllm_kernels)
    if K is None:
        print(f"vLLM's kernels: {origin}")
        return 2
    s = rs.ServingStep(8, 4096, 32, dev, np.random.default_rng(0))
    b, bv = s.buffers(), s.buffers()
    g = rs.gather_out_view(s, b)
    target, scratch = rs.window_target(b), rs.step_scratch(s)
    plan = s.plan
    rs.predict(s, target)
    bf = s.buffers()
    fout = rs.fused_out(s, bf)
    br = s.buffers()
    gr = rs.gather_out_view(s, br)
    D = s.D

    def step_open(fn):
        def run():
            rt.begin_step()
            try:
                fn()
            finally:
                rt.end_step()
        return run

    swa_shim = shims["swa_indices_and_lens"]

    def answered(prepared: bool):
        """vLLM's four later calls of the step through the patches' shims (two window-row calls,
        the gather lengths with vLLM's per-build torch.empty) and the model state's runtime call
        (the sub-batch) after prepare_step answered them; without it, the same lookups failing
        (no launch: the calls are not made)."""
        if prepared:
            rt.prepare_step(be, target, s.qsl, s.seq, s.positions, b["slots"], s.R, s.B, s.T, scratch,
                            gather=(plan, W, g))
        else:
            rt.answered_swa(b["dec_idx"], s.qsl, s.R, s.table, D, 0)
            rt.answered_swa(b["pre_idx"], s.qsl, s.R, s.table, s.T - D, D)
            rt.answered_gather_lens(torch.empty(s.P, dtype=torch.int32, device=dev), s.qsl, s.R, s.P, D, W)
            return
        swa_shim(b["dec_idx"], b["dec_lens"], W, W, b["dec_lens"], b["dec_lens"], s.qsl, s.seq, s.t2r, s.valid,
                 s.table, BS, s.R, num_tokens=D, token_offset=0)
        swa_shim(b["pre_idx"], b["pre_lens"], W, W, b["pre_lens"], b["pre_lens"], s.qsl, s.seq, s.t2r, s.valid,
                 s.table, BS, s.R, num_tokens=s.T - D, token_offset=D)
        shims["prefill_gather_lens"](torch.empty(s.P, dtype=torch.int32, device=dev), s.seq, s.qsl, s.R, s.P, D, W)
        rt.gather_replay_batch(be, plan, s.qsl, s.seq, s.R, s.positions, b["slots"], W, g)

    fns = {
        "pack_step": lambda: rs.pack_step(be, s, b, g, target, scratch, shims),
        "vllm_step": lambda: rs.vllm_step(K, s, bv),
        "pack_fused": lambda: rs.fused_step(be, s, bf, fout),
        "per_call_site": lambda: rs.ref_step(be, s, br, gr),  # the pack's ops one per vLLM call site
        "predict": lambda: rs.predict(s, target),
        "prepare_step": step_open(lambda: rt.prepare_step(be, target, s.qsl, s.seq, s.positions, b["slots"], s.R, s.B,
                                                          s.T, scratch, gather=(plan, W, g))),
        "empty_step": step_open(lambda: None),
        "held_pad": step_open(lambda: rt.pad_replayed_slots(be, b["slots"], s.cacheable, s.qsl, s.positions, s.R, W,
                                                            s.B) or rt._local.step.__setattr__("pad", None)),
        "answered_calls": step_open(lambda: answered(prepared=True)),
        "unanswered_lookups": step_open(lambda: answered(prepared=False)),
        "torch.empty": lambda: torch.empty(s.P, dtype=torch.int32, device=dev),
        "vk.swa_dec": lambda: vk.swa_indices_and_lens(K, bv["dec_idx"], bv["dec_lens"], W, W, s.qsl, s.seq, s.t2r,
                                                      s.valid, s.table, BS, s.R, num_tokens=D, token_offset=0),
        "torch.sub": lambda: torch.sub(s.qsl, 3),
    }
    fns["shim_answered_swa"] = step_open(lambda: (rt.prepare_step(be, target, s.qsl, s.seq, s.positions, b["slots"],
                                                                  s.R, s.B, s.T, scratch),
                                                  [swa_shim(b["dec_idx"], b["dec_lens"], W, W, b["dec_lens"],
                                                            b["dec_lens"], s.qsl, s.seq, s.t2r, s.valid, s.table, BS,
                                                            s.R, num_tokens=D, token_offset=0) for _ in range(10)]))
    fns["lookup_answered_swa"] = step_open(lambda: (rt.prepare_step(be, target, s.qsl, s.seq, s.positions,
                                                                    b["slots"], s.R, s.B, s.T, scratch),
                                                    [rt.answered_swa(b["dec_idx"], s.qsl, s.R, s.table, D, 0)
                                                     for _ in range(10)]))
    fns.update(_launch_pieces(be, s, bf, fout))
    for _ in range(2):
        print({k: round(tm.host_us(f, calls=500), 1) for k, f in fns.items()})
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        rs.pack_step(be, s, b, g, target, scratch, shims)
    pr.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())
    return 0


def _launch_pieces(be, s, bf, fout) -> dict:
    """``prepare_replay_step``'s launch without its wrapper: the pack's launcher (``Kernel``)
    with the wrapper's arguments, the same with every tensor passed as its address (Triton's
    launcher then skips its per-pointer driver query), and Triton's compiled launcher called
    directly (no ``Kernel`` around it)."""
    from swa_backends.kernels import prepare_replay_step as kp

    real, seen = kp._K, {}

    def capture(key, grid, *args):
        seen["call"] = (key, grid, args)
        real(key, grid, *args)

    kp._K = capture
    try:
        rs.fused_step(be, s, bf, fout)
    finally:
        kp._K = real
    key, grid, args = seen["call"]
    ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
    ck = real._compiled[(torch.cuda.current_device(), key)]
    stream = torch.cuda.current_stream().cuda_stream
    return {"launch_kernel": lambda: real(key, grid, *args), "launch_kernel_ints": lambda: real(key, grid, *ints),
            "launch_compiled": lambda: ck.run(grid[0], grid[1], grid[2], stream, ck.function, ck.packed_metadata,
                                              None, None, None, *args)}


if __name__ == "__main__":
    raise SystemExit(main())
