"""The Triton kernels compiled on a real GPU: conformance, CUDA-graph capture/replay,
launch-key completeness and warmup (``python -m pytest -m gpu tests/kernels/test_triton_gpu.py``).

The graph test captures each op once on static buffers, then for several new steps of the
same shapes copies the new inputs into those buffers, replays, and compares the outputs
(at their captured addresses) with the reference run on the new inputs. One CPU test runs
the same harness with the reference backend and an eager stand-in for the graph, so the
harness itself is checked everywhere.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from swa_backends import select
from swa_backends.testing.conformance import Batch, POISON_INT, case_for, mismatch, random_batch, run_op, to_device
from swa_backends.common.ops import OPS, plan_replay_batch
from swa_backends.common.ops.gather_replay_batch import allocate_out as gather_out
from swa_backends.common.ops.prepare_replay_step import allocate_out as prepare_out
from swa_backends.common.types import INDEX_DTYPE, PAD, SLOT_DTYPE, ReplayPlan
from swa_backends.common.validation import validation

KERNEL_OPS = ("batch_replay_start", "pad_replayed_slots", "compressed_slot_mapping", "swa_indices_and_lens",
              "prefill_gather_lens", "combined_indices", "mixed_indices", "plain_indices", "indices_to_csr",
              "gather_replay_batch", "gather_rows", "scatter_rows", "prepare_replay_step")


@pytest.fixture(scope="module")
def gb():
    backend = select(prefer="triton")
    assert backend.device.platform in ("cuda", "rocm"), backend.device
    return backend


def _dev(backend) -> torch.device:
    return torch.device(backend.device.torch_device)


# --------------------------------------------------------------------------- conformance


@pytest.mark.gpu
@pytest.mark.parametrize("op", KERNEL_OPS)
def test_conformance_on_gpu(gb, op):
    rng = np.random.default_rng(sum(map(ord, op)))
    dev = _dev(gb)
    fn = getattr(gb, op)
    for i in range(60):
        batch = None
        if i % 3 == 2 and op not in ("gather_rows", "scatter_rows", "indices_to_csr", "batch_replay_start"):
            # serving-sized: many requests, long prefills, W = 128, block 64
            batch = random_batch(rng, max_reqs=48, max_q=700, W=128, block_size=64, num_groups=5,
                                 long_prefill=op in ("gather_replay_batch", "prepare_replay_step"))
        args, kwargs = case_for(op, rng, "cpu", batch=batch)
        got, want = run_op(op, fn, args, kwargs, dev)
        why = mismatch(op, got, want)
        assert why is None, f"{op} case {i}: {why}"


@pytest.mark.gpu
def test_launch_keys_are_complete(gb, monkeypatch):
    """With key checking on, every launch also goes through Triton's own dispatch and the
    two must pick the same compiled kernel: the pack's keys miss no specialisation."""
    from swa_backends.kernels import _launch

    monkeypatch.setattr(_launch, "check_keys", True)
    rng = np.random.default_rng(17)
    for op in KERNEL_OPS:
        for _ in range(8):
            args, kwargs = case_for(op, rng, "cpu")
            got, want = run_op(op, getattr(gb, op), args, kwargs, _dev(gb))
            assert mismatch(op, got, want) is None


@pytest.mark.gpu
def test_compiled_launcher_and_tritons_launch_path_agree(gb, monkeypatch):
    """After a key's first launch the pack calls Triton's compiled launcher directly; with
    ``check_keys`` every launch goes through Triton's own path and a key that maps to two
    compiled kernels fails. Both give the reference result for every op, twice."""
    from swa_backends.kernels import _launch

    rng = np.random.default_rng(23)
    for op in KERNEL_OPS:
        args, kwargs = case_for(op, rng, "cpu")
        monkeypatch.setattr(_launch, "check_keys", True)
        slow, want = run_op(op, getattr(gb, op), args, kwargs, _dev(gb))
        monkeypatch.setattr(_launch, "check_keys", False)
        for _ in range(2):
            fast, _ = run_op(op, getattr(gb, op), args, kwargs, _dev(gb))
            assert mismatch(op, slow, want) is None and mismatch(op, fast, want) is None
    assert any(k._compiled for k in _launch.KERNELS.values())


@pytest.mark.gpu
def test_tritons_36_c_launcher_is_called_directly(gb, monkeypatch):
    """On Triton 3.6 (the H200 machine: its launcher body's hash is pinned in
    ``_launch.DIRECT_LAUNCHERS``) every compiled key of the pack's kernels is launched through
    the kernel's C launcher after its first launch, and gives the reference's result."""
    import triton

    from swa_backends.kernels import _launch

    if not triton.__version__.startswith("3.6."):
        pytest.skip(f"Triton {triton.__version__}: its launcher body is not one the pack calls past")
    monkeypatch.setattr(_launch, "check_keys", False)
    rng = np.random.default_rng(31)
    for op in KERNEL_OPS:
        args, kwargs = case_for(op, rng, "cpu")
        for _ in range(2):
            got, want = run_op(op, getattr(gb, op), args, kwargs, _dev(gb))
            assert mismatch(op, got, want) is None
    for name, k in _launch.KERNELS.items():
        assert set(k._direct) == set(k._compiled), f"{name}: compiled keys not launched directly"
    assert any(k._direct for k in _launch.KERNELS.values())


@pytest.mark.gpu
def test_launch_from_a_fresh_thread(gb):
    """A launch from a thread that has made no CUDA call yet, of a key whose compiled kernel
    exists: the compiled launcher on that thread gives the reference's result."""
    import threading

    rng = np.random.default_rng(29)
    op = "gather_replay_batch"
    args, kwargs = case_for(op, rng, "cpu")
    run_op(op, gb.gather_replay_batch, args, kwargs, _dev(gb))  # the key's entry exists
    result = {}

    def worker():
        try:
            result["got"] = run_op(op, gb.gather_replay_batch, args, kwargs, _dev(gb))
        except Exception as exc:  # noqa: BLE001 -- reported below
            result["err"] = exc

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert "err" not in result, result.get("err")
    got, want = result["got"]
    assert mismatch(op, got, want) is None


@pytest.mark.gpu
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("op", ["gather_replay_batch", "prepare_replay_step"])
def test_sub_batch_long_kept_runs_and_many_groups_on_gpu(gb, op, strided):
    """Requests keeping thousands of rows (several programs per request) and more slot
    groups than one tile holds, on serving sizes; ``strided``: slot mappings whose token
    stride is not 1 (the kernels' general path; unit stride is a launch-key specialisation)."""
    rng = np.random.default_rng(31)
    dev = _dev(gb)
    for i in range(6):
        b = random_batch(rng, max_reqs=24, max_q=3000, W=128, block_size=64, num_groups=int(rng.choice([5, 11])),
                         long_prefill=True)
        long = np.flatnonzero(b.prefilling & (b.q > b.W))
        keeps = np.zeros(b.B, bool)
        keeps[long[1:]] = True
        plan = plan_replay_batch(b.qsl, b.prefilling, keeps, b.W, pad_to=int(b.T) + 64, trim_threshold=0)
        t = b.tensors("cpu")
        if op == "gather_replay_batch":
            args, kwargs = (plan, t["query_start_loc"], t["seq_lens"], t["replay_start"], t["positions"],
                            t["slot_mappings"], b.W), {}
        else:
            args, kwargs = case_for(op, rng, "cpu", batch=b, poison=False)
            kwargs["plan"] = plan
        if strided:
            k = 5 if op == "gather_replay_batch" else 6
            args = args[:k] + (args[k].t().contiguous().t(),) + args[k + 1:]
        got, want = run_op(op, getattr(gb, op), args, kwargs, dev)
        assert mismatch(op, got, want) is None, f"{op} case {i}"


# --------------------------------------------------------------------------- graphs


def fixed_batch(rng, *, kinds=("decode", "prefill", "decode", "prefill", "prefill"), T=800, W=128, bs=64, G=5,
                n_cacheable=3, n_padded=6) -> Batch:
    """A serving-like step whose every tensor shape is fixed by the arguments (so new steps
    can be copied into a captured graph's buffers), and whose sub-batch has a fixed size:
    prefills are longer than W (each keeps W rows), decodes keep their one row."""
    B = len(kinds)
    pre = np.array([k == "prefill" for k in kinds])
    n_pre = int(pre.sum())
    spare = T - (B - n_pre) - n_pre * (W + 1)
    assert spare >= 0
    extra = rng.multinomial(spare, [1 / n_pre] * n_pre) if n_pre else np.zeros(0, int)
    q = np.ones(B, np.int64)
    q[pre] = W + 1 + extra
    prefix = np.where(pre, rng.integers(0, 2 * W + 1, B), rng.integers(W, 3 * W + 1, B))
    R = np.zeros(B, np.int64)
    replays = pre & (prefix > 0) & (rng.random(B) < 0.6)
    R[replays] = [int(rng.integers(1, p + 1)) for p in prefix[replays]]
    seq = prefix + q
    max_blocks = math.ceil((3 * W + T) / bs) + 1
    pool = rng.permutation(B * max_blocks + 8)[: B * max_blocks].reshape(B, max_blocks)
    positions = np.concatenate([np.arange(s - a, s) for a, s in zip(q, seq)])
    req = np.repeat(np.arange(B), q)
    slots = np.full((G, T + n_padded), PAD, np.int64)
    for g in range(G):
        slots[g, :T] = (pool[req, positions // bs].astype(np.int64) * bs + positions % bs) * (g + 1) + g
    cacheable = np.sort(rng.choice(G, size=n_cacheable, replace=False)).astype(np.int32)
    return Batch(q, seq, R, pre, W, W, bs, n_padded, G, cacheable, pool.astype(np.int32), slots)


def graph_case(op: str, rng, dev, hidden: int = 7168):
    """(args, kwargs) for ``op`` with shapes that depend only on ``op``; out= buffers given."""
    b = fixed_batch(rng)
    t = b.tensors(dev)
    T, B, W = b.T, b.B, b.W
    T_pad = T + b.num_padded
    i32 = dict(dtype=INDEX_DTYPE, device=dev)
    ri = lambda lo, hi, shape: torch.tensor(rng.integers(lo, hi, size=shape), **i32)  # noqa: E731
    if op == "batch_replay_start":
        R_all = ri(0, 900, B + 2)
        idx = torch.tensor(rng.permutation(B + 2)[:B], **i32)
        return (R_all, idx, t["is_prefilling"]), {"out": torch.empty(B, **i32)}
    if op == "pad_replayed_slots":
        return (t["slot_mappings"], t["cacheable_groups"], t["query_start_loc"], t["positions"][:T].clone(),
                t["replay_start"], b.Wr), {}
    if op == "compressed_slot_mapping":
        tok = t["slot_mappings"][0, :T].clone()
        tok[torch.tensor(rng.random(T) < 0.2, device=dev)] = PAD
        return (tok, t["query_start_loc"], t["seq_lens"], t["block_table"], b.block_size, 4), \
            {"out": torch.empty(T, dtype=SLOT_DTYPE, device=dev)}
    if op == "swa_indices_and_lens":
        width = W + 2
        return (t["query_start_loc"], t["seq_lens"], t["block_table"], b.block_size, W, t["replay_start"]), \
            {"index_width": width, "num_tokens": T_pad, "valid": torch.tensor(rng.random(T_pad) < 0.9, device=dev),
             "out": (torch.empty(T_pad, width, **i32), torch.empty(T_pad, **i32))}
    if op == "prefill_gather_lens":
        return (t["query_start_loc"], t["seq_lens"], t["replay_start"], W), {"out": torch.empty(B, **i32)}
    if op == "combined_indices":
        top_k, N = 512, 300
        from swa_backends.common.ops.combined_indices import combined_width

        w = combined_width(top_k, W)
        return (ri(-1, N + 6, (T, top_k)), t["query_start_loc"], t["seq_lens"], t["replay_start"], W, 4, top_k,
                N + T + W, N), {"valid": torch.tensor(rng.random(T) < 0.9, device=dev),
                                "out": (torch.empty(T, w, **i32), torch.empty(T, **i32))}
    if op == "mixed_indices":
        K = 18
        from swa_backends.common.ops.mixed_indices import mixed_width

        return (ri(-1, 10**6, (T, W)), ri(-1, 10**6, (T, K)), ri(0, K + 1, T)), \
            {"out": (torch.empty(T, mixed_width(W, K), **i32), torch.empty(T, **i32))}
    if op == "plain_indices":
        K = 16
        return (ri(-1, 10**6, (T, W)), ri(0, W + 1, T), ri(-1, 10**6, (T, K)), ri(0, K + 1, T)), \
            {"topk_offset": 7, "window_offset": 1000, "out": (torch.empty(T, K + W, **i32), torch.empty(T, **i32))}
    if op == "indices_to_csr":
        K = 640
        idx = ri(-1, 10**6, (T, K))
        return (idx, ri(0, K + 1, T)), {"out": (torch.empty(T + 1, **i32), torch.empty(T * K, **i32))}
    if op in ("gather_replay_batch", "prepare_replay_step"):
        plan = plan_replay_batch(b.qsl, b.prefilling, np.zeros(B, bool), W, pad_to=int(b.prefilling.sum()) * W + 8, trim_threshold=0)
        if op == "gather_replay_batch":
            return (plan, t["query_start_loc"], t["seq_lens"], t["replay_start"], t["positions"], t["slot_mappings"],
                    W), {"out": gather_out(plan, b.num_groups, dev)}
        idx = rng.permutation(B + 2)[:B]
        R_all = rng.integers(0, 900, B + 2)
        R_all[idx] = np.where(b.prefilling, b.R, R_all[idx])
        return (torch.tensor(R_all, **i32), torch.tensor(idx, **i32), t["is_prefilling"], t["query_start_loc"],
                t["seq_lens"], t["positions"], t["slot_mappings"], t["cacheable_groups"], t["block_table"],
                b.block_size, W, W), {"index_width": W, "plan": plan,
                                      "out": prepare_out(B, T_pad, W, dev, plan, b.num_groups)}
    if op in ("gather_rows", "scatter_rows"):
        N, n = 1000, 300
        rows = torch.tensor(np.sort(rng.permutation(N)[:n]), dtype=SLOT_DTYPE, device=dev)
        if op == "gather_rows":
            x = torch.randn(N, hidden, device=dev).to(torch.bfloat16)
            return (x, rows), {"out": torch.empty(n, hidden, dtype=torch.bfloat16, device=dev)}
        y = torch.randn(n, hidden, device=dev).to(torch.bfloat16)
        return (y, rows, N), {"out": torch.empty(N, hidden, dtype=torch.bfloat16, device=dev)}
    raise KeyError(op)


def copy_into(dst, src) -> None:
    """Write the values of a new case into the captured case's buffers (same shapes)."""
    if isinstance(dst, torch.Tensor):
        assert dst.shape == src.shape and dst.dtype == src.dtype
        dst.copy_(src)
    elif isinstance(dst, ReplayPlan):
        assert (dst.num_rows, dst.num_rows_padded, dst.num_reqs) == (src.num_rows, src.num_rows_padded, src.num_reqs)
        dst.device_dropped_before(dst_device(dst)).copy_(src.dropped_before)
    elif isinstance(dst, (tuple, list)):
        for d, s in zip(dst, src):
            copy_into(d, s)
    elif isinstance(dst, dict):
        for k in dst:
            if k != "out":
                copy_into(dst[k], src[k])
    else:
        assert dst == src, (dst, src)


def dst_device(plan: ReplayPlan) -> torch.device:
    (key,) = [k for k in plan._device_cache if k != "cpu"] or ["cpu"]
    return torch.device(key)


def graph_roundtrip(op: str, fn, dev, capture, *, trials: int = 3, seed: int = 0) -> None:
    """Capture ``fn`` once on a case's buffers (``capture(callable) -> replay``), then
    replay it on ``trials`` new cases copied into the same buffers."""
    rng = np.random.default_rng(seed)
    args, kwargs = graph_case(op, rng, dev)
    fn(*args, **kwargs)  # eager: compiles, makes the plan's device copy
    result = {}
    replay = capture(lambda: result.__setitem__("r", fn(*args, **kwargs)))
    for trial in range(trials):
        new_args, new_kwargs = graph_case(op, rng, dev)
        want = OPS[op].reference(*to_device(new_args, "cpu"), **to_device(new_kwargs, "cpu"))
        copy_into(args, new_args)
        copy_into(kwargs, new_kwargs)
        if "out" in kwargs:  # poison the captured outputs: the replay must rewrite them
            poison(kwargs["out"])
        replay()
        why = mismatch(op, result["r"], want)
        assert why is None, f"{op} replay {trial}: {why}"


def poison(out) -> None:
    if isinstance(out, torch.Tensor):
        out.fill_(POISON_INT if not out.dtype.is_floating_point else 77.0)
    elif isinstance(out, (tuple, list)):
        for o in out:
            poison(o)
    elif isinstance(out, dict):
        for o in out.values():
            poison(o)


def cuda_graph_capture(dev):
    def capture(body):
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            body()  # warm-up on the side stream, as torch recommends before capture
        torch.cuda.current_stream(dev).wait_stream(stream)
        torch.cuda.synchronize(dev)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()

        def replay():
            graph.replay()
            torch.cuda.synchronize(dev)

        return replay

    return capture


@pytest.mark.gpu
@pytest.mark.parametrize("op", KERNEL_OPS)
def test_cuda_graph_capture_and_replay(gb, op):
    from swa_backends.dispatch import all_variants

    assert all_variants()[op]["triton"].graph_safe
    with validation(True):  # value checks are skipped during capture by themselves
        graph_roundtrip(op, getattr(gb, op), _dev(gb), cuda_graph_capture(_dev(gb)))


@pytest.mark.parametrize("op", KERNEL_OPS)
def test_graph_harness_on_cpu_reference(op):
    """The harness above, with the CPU reference and an eager stand-in for the graph."""
    ref = select("cpu")

    def capture(body):
        body()
        return body

    graph_roundtrip(op, getattr(ref, op), torch.device("cpu"), capture, trials=2)


# --------------------------------------------------------------------------- warmup


@pytest.mark.gpu
@pytest.mark.parametrize("validated", [False, True], ids=["unvalidated", "validated"])
def test_warmup_then_serving_compiles_nothing(gb, validated):
    """After ``Backend.warmup()``, serving-like steps of many sizes (replaying, trimming,
    graph-padded, every op) neither compile a Triton kernel nor miss the launch cache: the
    calls with validation off after a warmup of the plain kernels, the validated calls after
    one of the self-checked forms. The warmup is limited to the ops served here and to one
    form a test (all of it, the sparse-MLA kernels and both forms of ``prepare_replay_step``'s
    128 specialisations, did not end within a 400 s GPU command)."""
    from swa_backends.kernels import _launch

    gb.warmup(ops=KERNEL_OPS, W=128, block_size=64, num_groups=5, hidden_sizes=(7168,),
              hidden_dtypes=(torch.bfloat16,), top_k=512, validated=validated)
    compiled = _launch.total_compiled()
    fast_keys = {name: set(k._compiled) for name, k in _launch.KERNELS.items()}
    warmed = set(_launch.LAUNCHED)
    dev = _dev(gb)
    rng = np.random.default_rng(5)
    with validation(validated):
        for step in range(6):
            b = random_batch(rng, max_reqs=int(rng.integers(1, 40)), max_q=int(rng.integers(2, 900)), W=128,
                             block_size=64, num_groups=5, long_prefill=True)
            for op in KERNEL_OPS:
                if op in ("gather_rows", "scatter_rows"):
                    N = int(rng.integers(200, 3000))
                    n = int(rng.integers(1, min(N, 1024)))
                    rows = torch.tensor(np.sort(rng.permutation(N)[:n]), dtype=SLOT_DTYPE, device=dev)
                    x = torch.randn(N, 7168, device=dev).to(torch.bfloat16)
                    y = gb.gather_rows(x, rows)
                    gb.scatter_rows(y, rows, N)
                    continue
                args, kwargs = case_for(op, rng, "cpu", batch=b)
                if op in ("batch_replay_start", "indices_to_csr", "mixed_indices", "plain_indices"):
                    args, kwargs = case_for(op, rng, "cpu")
                getattr(gb, op)(*to_device(args, dev), **to_device(kwargs, dev))
    torch.cuda.synchronize(dev)
    now = _launch.total_compiled()
    # what a failure names: the kernels that compiled, and every launch key the warmup did not make
    grew = {name: (compiled.get(name, 0), n) for name, n in now.items() if n != compiled.get(name, 0)}
    new = sorted(map(str, set(_launch.LAUNCHED) - warmed))
    assert not grew and not new, f"serving-like calls compiled {grew}; launch keys the warmup missed: {new}"
    for name, k in _launch.KERNELS.items():
        assert set(k._compiled) == fast_keys.get(name, set()), f"{name}: launch-cache miss after warmup"
