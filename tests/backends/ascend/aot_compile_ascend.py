"""Compile the triton-ascend kernels (``backends/ascend/kernels``) with Triton's real compiler
for the GPU targets the installed Triton has (``python tests/backends/ascend/aot_compile_ascend.py cuda:90``),
offline: no device, no launch.

triton-ascend itself is not installable next to Triton, so these kernels cannot be compiled
for an NPU here; compiling them for another backend still checks what the interpreter cannot
(loop-variable and scalar typing, constexpr use, nested @jit calls). Each launch of random
conformance cases is replaced by a compile of its exact specialisation. Prints one line per
kernel specialisation and ``compiled N``; exits non-zero on a compile error.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("aot_compile_ascend: TRITON_INTERPRET=1 is set; kernels must be decorated in compiled mode")

import swa_backends  # noqa: E402,F401  (the installed pack: pip install -e . in this environment)

import numpy as np  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from swa_backends.testing.conformance import case_for  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))  # the offline-compile steps, shared
import aot_compile  # noqa: E402

KERNELS = {"gather_rows": ("rows", "gather_rows"), "scatter_rows": ("rows", "scatter_rows"),
           "swa_indices_and_lens": ("swa_indices", "swa_indices_and_lens"),
           "pad_replayed_slots": ("pad_slots", "pad_replayed_slots")}


def main(argv: list[str]) -> int:
    targets = [aot_compile.parse_target(t, prog="aot_compile_ascend") for t in argv or ["cuda:90"]]
    done: dict[tuple, float] = {}

    def compile_only(self, *args, grid, warmup, **kwargs):
        for target in targets:
            spec = aot_compile.specialise(self, target, args, kwargs)
            signature, constexprs = spec[0], spec[1]
            # the row mover compiles once per direction: name both in the report
            name = self.__name__ + ({True: "[scatter]", False: "[gather]"}[kwargs["SCATTER"]] if "SCATTER" in kwargs else "")
            key = (target.arch, name, str(sorted(signature.items())), str(sorted(constexprs.items())))
            if key in done:
                continue
            _, done[key] = aot_compile.compile_specialised(self, target, spec)
            print(f"{target.backend}:{target.arch} {name} {done[key]:.2f}s", flush=True)

    JITFunction.run = compile_only

    rng = np.random.default_rng(0)
    for op, (module, attr) in KERNELS.items():
        fn = getattr(importlib.import_module(f"swa_backends.backends.ascend.kernels.{module}"), attr)
        for _ in range(6):
            args, kwargs = case_for(op, rng, "cpu")
            fn(*args, **kwargs)
    names = {k[1] for k in done}
    want = {"_move_kernel[gather]", "_zero_kernel", "_move_kernel[scatter]", "_swa_kernel", "_pad_kernel"}
    if want - names:
        print(f"never compiled: {sorted(want - names)}", file=sys.stderr)
        return 1
    print(f"compiled {len(done)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
