"""Scratch: where a validated metadata call's host time goes on the GPU machine (cProfile)."""
import sys, time, cProfile, pstats, io, statistics
from pathlib import Path
sys.path.insert(0, str(Path.cwd() / "bench"))
import torch
import swa_backends as sb
from swa_backends.common import validation as V
from lib.steps import validation_cases
dev = torch.device("cuda")
be = sb.select("cuda:0")
want = sys.argv[1:]
def clone(v): return v.clone() if isinstance(v, torch.Tensor) else v
for op, args, kwargs in validation_cases(dev):
    if want and op not in want: continue
    fn = getattr(be, op)
    def make(on):
        a = tuple(clone(x) for x in args); kw = {n: clone(x) for n, x in kwargs.items()}
        def call():
            with sb.validation(on):
                fn(*a, **kw)
        return call
    for on in (True, False):
        for _ in range(5): make(on)()
    res = {}
    for on in (False, True):
        ts = []
        for _ in range(40):
            c = make(on); torch.cuda.synchronize(); t = time.perf_counter(); c(); ts.append((time.perf_counter()-t)*1e6)
        res[on] = statistics.median(ts)
    # the same args each call
    c = make(True); c(); torch.cuda.synchronize()
    ts = []
    for _ in range(40):
        torch.cuda.synchronize(); t = time.perf_counter(); c(); ts.append((time.perf_counter()-t)*1e6)
    print(f"== {op}: off {res[False]:.1f} validated {res[True]:.1f} validated same args {statistics.median(ts):.1f} us", flush=True)
    pr = cProfile.Profile()
    calls = [make(True) for _ in range(40)]
    torch.cuda.synchronize()
    for c in calls:
        torch.cuda.synchronize()
        pr.enable(); c(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print(s.getvalue()[:4500], flush=True)
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(45); print(s.getvalue()[:7000], flush=True)
