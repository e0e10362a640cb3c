"""Host time of the replay step's pieces on a GPU: where ``bench_replay_step.py``'s "pack as vLLM
calls it" column spends its host time (one 8x4K+32d step, validation off).

    . bench/gpu_env.sh && python3 bench/profile_replay_step.py [--vllm-kernels .vllm_kernels]

Prints, twice, host µs per call (back-to-back calls, no sync, median of 5 rounds:
``bench_triton_ops.host_us``) of the whole step through the pack's adapters, through vLLM's
kernels and through the fused path, of each adapter (``integrations/vllm/runtime.py``), of the
pack's ``pad_replayed_slots`` called directly, of vLLM's pad and decode-rows SWA kernels and of one
small torch op; then a cProfile of 300 adapter steps (by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import bench_replay_step as brs  # the sibling script (python puts the script's folder on sys.path)
import numpy as np
import torch

import swa_backends
from swa_backends.common.validation import set_validation
from swa_backends.integrations.vllm import runtime as rt
from swa_backends.testing import vllm_kernels as vk


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-kernels", default=None, help=f"as bench_replay_step.py (default: ${vk.ENV} or the installed vLLM)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    set_validation(False)
    dev = torch.device("cuda", torch.cuda.current_device())
    be = swa_backends.select(dev, prefer="triton", checked=False)  # as the integration selects it
    K, origin = vk.load(a.vllm_kernels)
    if K is None:
        print(f"vLLM's kernels: {origin}")
        return 2
    s = brs.ServingStep(8, 4096, 32, dev, np.random.default_rng(0))
    b, bv = s.buffers(), s.buffers()
    g = brs.gather_out_view(s, b)
    bf = s.buffers()
    fout = brs.fused_out(s, bf)
    D, W, BS = s.D, brs.W, brs.BS
    fns = {
        "pack_step": lambda: brs.pack_step(be, s, b, g),
        "vllm_step": lambda: brs.vllm_step(K, s, bv),
        "pack_fused": lambda: brs.fused_step(be, s, bf, fout),
        "rt.pad": lambda: rt.pad_replayed_slots(be, b["slots"], s.cacheable, s.qsl, s.positions, s.R, W, s.B),
        "rt.swa_dec": lambda: rt.swa_indices_and_lens(be, b["dec_idx"], b["dec_lens"], W, W, s.qsl, s.seq, s.valid,
                                                      s.table, BS, s.R, num_tokens=D, token_offset=0),
        "rt.pgl": lambda: rt.prefill_gather_lens(be, b["gather_lens"], s.seq, s.qsl, s.R, s.P, s.D, W),
        "rt.gather": lambda: rt.gather_replay_batch(be, s.plan, s.qsl, s.seq, s.R, s.positions, b["slots"], W, g),
        "be.pad": lambda: be.pad_replayed_slots(b["slots"], s.cacheable, s.qsl, s.positions, s.R, W),
        "vk.pad": lambda: vk.pad_replayed_slots(K, bv["slots"], s.cacheable, s.qsl, s.positions, s.R, W, s.B),
        "vk.swa_dec": lambda: vk.swa_indices_and_lens(K, bv["dec_idx"], bv["dec_lens"], W, W, s.qsl, s.seq, s.t2r,
                                                      s.valid, s.table, BS, s.R, num_tokens=D, token_offset=0),
        "torch.sub": lambda: torch.sub(s.qsl, 3),
    }
    for _ in range(2):
        print({k: round(brs.bto.host_us(f, calls=500), 1) for k, f in fns.items()})
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        brs.pack_step(be, s, b, g)
    pr.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(22)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
