"""Run 30 (diagnosis, not shipped): the memory roofline of sparse MLA at H 64. The kernel reads,
per token, K random 1 KB rows (512 bf16) of a 1M-row cache; at H 64 every row feeds 2*64*1024
FLOP, so a gather bandwidth of B bytes/s caps the kernel at B * 128 FLOP/byte. Measured here in
one run on the shapes of the target cell (T 16K x K 640 = 10.5M rows): a device copy of the same
bytes, torch.index_select of the rows, and the pack's Triton gather_rows kernel; printed with
the TFLOP/s each bandwidth would allow at H 64 and H 128 (2x the FLOP per row at H 128). The gathers also write
their output; ``read_only_rows`` (a Triton kernel that reads the rows and keeps one sum per
program) reads only, as the attention kernel does."""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import bench_sparse_mla as B  # noqa: E402  (loads the pack from this checkout)
from swa_backends.kernels.rows import gather_rows  # noqa: E402


@triton.jit
def _read_rows(kv_ptr, idx_ptr, out_ptr, n, ROWS: tl.constexpr):
    """Reads ROWS random 1 KB rows per program and keeps one float: random reads only."""
    pid = tl.program_id(0)
    r = pid * ROWS + tl.arange(0, ROWS)
    rows = tl.load(idx_ptr + r, mask=r < n, other=0)
    x = tl.load(kv_ptr + rows[:, None] * 512 + tl.arange(0, 512)[None, :], mask=(r < n)[:, None])
    tl.store(out_ptr + pid, tl.sum(tl.sum(x.to(tl.float32), axis=1), axis=0))


def timed(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


kv = torch.randn(B.S_CACHE, 512, device="cuda", dtype=torch.float32).to(torch.bfloat16)
T, K = 16384, 640
n = T * K
idx = torch.randint(0, B.S_CACHE, (n,), device="cuda", dtype=torch.int64)
out = torch.empty(n, 512, device="cuda", dtype=torch.bfloat16)
src = torch.empty_like(out)
sums = torch.empty(triton.cdiv(n, 32), device="cuda", dtype=torch.float32)
nbytes = n * 1024
res = {"rows": n, "row_bytes": 1024}
for name, fn in (("copy", lambda: out.copy_(src)),
                 ("index_select", lambda: torch.index_select(kv, 0, idx, out=out)),
                 ("triton_gather_rows", lambda: gather_rows(kv, idx, out=out)),
                 ("read_only_rows", lambda: _read_rows[(triton.cdiv(n, 32),)](kv, idx, sums, n, ROWS=32))):
    s = timed(fn)
    bw = (2 if name == "copy" else 1) * nbytes / s  # copy: read + write; gathers: the rows read
    res[name] = {"s": s, "read_TBps": nbytes / s / 1e12, "bytes_moved_TBps": bw / 1e12,
                 "tflops_cap_h64": nbytes / s * 128 / 1e12, "tflops_cap_h128": nbytes / s * 256 / 1e12}
    print(f"{name}: {nbytes / s / 1e12:.2f} TB/s of rows read -> H 64 cap {res[name]['tflops_cap_h64']:.0f} "
          f"TFLOP/s, H 128 cap {res[name]['tflops_cap_h128']:.0f}", flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "gather_roofline.json"), "w"), indent=1)
