"""Host time of the pack's Python launch path, on any machine (no GPU needed).

    python bench/profile_host_path.py [--calls N] [--json PATH]

Times a ``Backend`` call of ``gather_replay_batch`` (``out=`` given, validation off: the
serving setting) and of the fused ``prepare_replay_step`` on serving-like steps, with
everything real except the last step: the backend is selected for a fake ``cuda:sm90``
device, the kernels are the compiled-mode Triton functions, and each kernel's first launch
(where Triton would compile) instead installs a fast entry whose launcher is a no-op. So
what is timed is the whole Python path a GPU call takes -- the ``Backend`` wrapper, the
op's launcher, the per-plan cache, the pack's ``Kernel`` shortcut with its pointer
conversion -- up to, not including, Triton's compiled launcher (its argument parsing, its
pointer checks, the driver's launch). Reported with pointers passed as integers (the
default) and as tensors, and with the layers peeled off one by one.

CPU time (``time.process_time``), best of many short rounds: other processes on the
machine inflate wall-clock medians, not this.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


from _pack import load_pack as _import_pack  # noqa: E402  (one loader for every bench script)


swa_backends = _import_pack()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from swa_backends.common.ops import plan_replay_batch  # noqa: E402
from swa_backends.common.ops.gather_replay_batch import allocate_out as gather_out  # noqa: E402
from swa_backends.common.ops.prepare_replay_step import allocate_out as prepare_out  # noqa: E402
from swa_backends.common.validation import set_validation  # noqa: E402

W, BS, G = 128, 64, 5


class _NoLaunch:
    """Stands in for Triton's compiled kernel: ``run`` does nothing."""

    function = 0
    packed_metadata = (4, 1, 0)

    @staticmethod
    def run(*args) -> None:
        return None

    def launch_metadata(self, *args):
        return None


def install_stub() -> list:
    """Make every pack kernel's first launch install a no-op fast entry (no compile, no
    device); returns the stub's recorded launcher calls (the last one per kernel)."""
    import triton.knobs as knobs

    from swa_backends.kernels import _launch

    seen: list = []

    def slow(self, key, grid, args):
        _launch.LAUNCHED.add((self.name, key))
        self._hooks = knobs.runtime
        self._get_device = int  # int() == 0: device 0
        self._get_stream = lambda dev: 0
        names = [p.name for p in self.fn.params]
        ck = _NoLaunch()
        ints = _launch.PTR_INTS and _launch._pointers_follow_convention(names, args)
        launch = None
        if ints and _launch.C_LAUNCH:  # the pack's C launcher, its driver call a recording stub
            launch = recording_launcher(self.fn.params, args)
        if launch is None and ints:
            launch = _launch.fast_launcher(ck, names, args)
        self._fast[(0, key)] = (launch, ck)
        seen.append((self.name, key, ints))

    _launch.Kernel._slow = slow
    return seen


def recording_launcher(params, args):
    """The pack's C launcher for a kernel with these ``params`` as Triton would type them
    for ``args`` (pointers, int32 scalars, constexprs), whose driver call is the module's
    recording function: everything of a real C launch but ``cuLaunchKernel``."""
    from swa_backends.kernels import _claunch

    module = _claunch.load()
    if module is None:
        return None
    sig = {p.name: "constexpr" if p.is_constexpr or (p.name.endswith("_ptr") and a is None)
           else "*i64" if p.name.endswith("_ptr") else "i32" if -2**31 <= a < 2**31 else "i64"
           for p, a in zip(params, args)}
    kinds = _claunch.kinds(sig, [p.name for p in params], args)
    record, ctx, _ = module.test_doubles()
    return module.Launcher(0, record, ctx, 128, 0, kinds, 2)


def per_call_us(fn, calls: int, rounds: int = 40) -> float:
    """Best of ``rounds`` rounds of ``calls`` calls, CPU time per call in us."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - t0) / calls * 1e6)
    return best


def step(prefills: int, q: int, decodes: int):
    qs = [q] * prefills + [1] * decodes
    B = len(qs)
    qsl_h = np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)
    pre = np.array([True] * prefills + [False] * decodes)
    plan = plan_replay_batch(qsl_h, pre, np.zeros(B, bool), W)
    T = int(qsl_h[-1])
    seq = np.array(qs, np.int32) + 200
    blocks = int(seq.max()) // BS + 2
    return dict(plan=plan, B=B, T=T, qsl=torch.tensor(qsl_h), seq=torch.tensor(seq),
                R=torch.zeros(B, dtype=torch.int32), positions=torch.arange(T, dtype=torch.int64),
                slots=torch.zeros(G, T, dtype=torch.int64), cacheable=torch.tensor([0, 2, 4], dtype=torch.int32),
                block_table=torch.zeros(B, blocks, dtype=torch.int32), idx=torch.arange(B, dtype=torch.int32),
                prefilling=torch.tensor(pre))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per timing round")
    ap.add_argument("--json", help="also write the numbers here")
    a = ap.parse_args(argv)
    seen = install_stub()
    from swa_backends.kernels import _launch

    set_validation(False)
    backend = swa_backends.select("cuda:sm90", prefer="triton")  # a fake device: compiled-mode kernels
    res: dict = {"python": sys.version.split()[0], "torch": torch.__version__, "calls": a.calls, "rows": []}
    import triton

    res["triton"] = triton.__version__
    for name, (p, q, d) in {"1x1K": (1, 1024, 0), "16x1K+240d": (16, 1024, 240)}.items():
        s = step(p, q, d)
        gargs = (s["plan"], s["qsl"], s["seq"], s["R"], s["positions"], s["slots"], W)
        gout = gather_out(s["plan"], G, "cpu")
        pargs = (s["R"], s["idx"], s["prefilling"], s["qsl"], s["seq"], s["positions"], s["slots"], s["cacheable"],
                 s["block_table"], BS, W, W)
        pout = prepare_out(s["B"], s["T"], W, "cpu", s["plan"], G)
        from swa_backends.kernels.gather_replay_batch import gather_replay_batch as gather_fn

        row = {"step": name}
        for ints, c in ((True, True), (True, False), (False, False)):
            _launch.set_pointer_ints(ints)
            _launch.set_c_launch(c)
            tag = "c_launcher" if c else "int_ptrs" if ints else "tensor_ptrs"
            row[f"gather_backend_{tag}"] = per_call_us(lambda: backend.gather_replay_batch(*gargs, out=gout), a.calls)
            row[f"gather_op_{tag}"] = per_call_us(lambda: gather_fn(*gargs, out=gout), a.calls)
            row[f"prepare_backend_{tag}"] = per_call_us(
                lambda: backend.prepare_replay_step(*pargs, index_width=W, plan=s["plan"], out=pout), a.calls)
        _launch.set_pointer_ints(True)
        _launch.set_c_launch(True)
        res["rows"].append(row)
    res["kernels_stubbed"] = sorted({(n, str(k), i) for n, k, i in seen})
    print(f"Python launch path per call (us, CPU time, launcher stubbed; Python {res['python']}, "
          f"torch {res['torch']}, triton {res['triton']})")
    cols = [k for k in res["rows"][0] if k != "step"]
    print(f"{'step':>12} " + " ".join(f"{c:>{max(8, len(c))}}" for c in cols))
    for r in res["rows"]:
        print(f"{r['step']:>12} " + " ".join(f"{r[c]:>{max(8, len(c))}.2f}" for c in cols))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
