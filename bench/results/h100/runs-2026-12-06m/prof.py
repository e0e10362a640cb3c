"""Where pad_replayed_slots' validated call goes, on the GPU host (scratch; not committed)."""
import sys, time, statistics, json, os
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import torch
import swa_backends as sb
from swa_backends import dispatch
from swa_backends.kernels import pad_replayed_slots as kp
from swa_backends.kernels._verdict import open_verdict
from swa_backends.common.ops.pad_replayed_slots import quick_check
from lib.steps import validation_cases

dev = torch.device("cuda", 0)
be = sb.select("cuda:0")
home = dispatch.home_device(be.device)
cap = dispatch.capture_query(be.device)
raw = torch._C._cuda_getCurrentRawStream
query = torch._C._cuda_isCurrentStreamCapturing
for op, args, kwargs in validation_cases(dev, False):
    if op == "pad_replayed_slots":
        break
fn = be.pad_replayed_slots
form = kp.pad_replayed_slots_checked
a = args
def form_wait():
    d = form(home, *a)
    d[1].failed()
def form_nowait():
    d = form(home, *a)
    return d
def on():
    fn(*a)
def off():
    fn(*a)
calls = {
  "empty": (lambda: None, None),
  "raw": (lambda: raw(-1), None),
  "query": (query, None),
  "cap": (cap, None),
  "getdev": (torch._C._cuda_getDevice, None),
  "curstream": (lambda: torch._C._cuda_getCurrentStream(-1), None),
  "quick": (lambda: quick_check(*a, None), None),
  "open_verdict": (lambda: open_verdict(dev), "verdict"),
  "plain": (lambda: kp.pad_replayed_slots(*a), None),
  "form_nowait": (form_nowait, "verdict"),
  "form_wait": (form_wait, None),
  "on": (on, True),
  "off": (off, False),
}
times = {k: [] for k in calls}
for k, (f, mode) in calls.items():  # warm
    if mode in (True, False): sb.set_validation(mode)
    r = f()
    if mode == "verdict":
        (r[1] if isinstance(r, tuple) else r).unread = False
torch.cuda.synchronize()
for rnd in range(401):
    for k, (f, mode) in calls.items():
        if mode in (True, False):
            sb.set_validation(mode)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = f()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        if mode == "verdict":
            v = r[1] if isinstance(r, tuple) else r
            v.unread = False
        times[k].append((t1 - t0) * 1e6)
med = {k: statistics.median(v) for k, v in times.items()}
for k, v in med.items():
    print(f"{k:14s} {v:7.2f} us")
print(f"ratio on/off {med['on']/med['off']:.3f}")
json.dump(med, open(os.path.join(os.environ.get("OUT", "."), f"prof_{sys.argv[1] if len(sys.argv) > 1 else 'x'}.json"), "w"))
