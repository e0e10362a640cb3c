"""Every kernel the pack can launch on this CUDA device, once or twice each at small shapes,
checked against the reference: the program compute-sanitizer runs (tests/kernels/test_sanitize_gpu.py)::

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/kernels/sanitize_kernels.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 tests/kernels/sanitize_kernels.py

Small shapes keep the sanitizers' slowdown affordable; the cases cover what the kernels'
masks must get right: PAD anywhere, empty rows and requests, graph padding, strided slot
mappings, speculative-decode batches the device resized (validation off, one of them past the
sub-batch's buffers), split-K decode, ragged last tiles, a partial 64-head block, every sparse-MLA variant
that runs here (the tl kernel, both Gluon kernels (the ws one with both gather widths), FlashMLA
when it is importable). Then the huge-stride cases (tests/kernels/huge_strides.py: every kernel
on views whose elements lie 2**31 or more elements apart, after the small launches above have
compiled and cached each kernel) and each sparse-MLA variant over a KV cache whose last row
lies 2**31 elements in. Those allocate up to 16 GiB a case; run with
``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` so that memcheck sees each allocation's own bounds (an
overrun inside PyTorch's cached segment is invisible to it). ``--no-huge`` leaves them out,
``--no-huge-strides`` only the huge-stride cases (``--huge-only START:STOP`` runs a slice of
them alone: under memcheck each case's memory stays taken until the process ends); ``--kept-only``
runs only ``prepare_replay_step``'s decoder sub-batch cases (resized by the device, and with the
sub-batch's window builds), the window slots through short and empty block tables, and the value
reader's; ``--gated-only`` only the validated sparse-MLA call
gated behind its device check (both forms of the check: a contiguous index tensor and a strided view);
``--self-checked-only`` only the validated calls of the ops whose kernels test their own values
(``Variant.self_checked``), on valid calls and on calls with one value poisoned.
Exit 1 on a wrong result.
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import torch

import swa_backends as sb
from swa_backends.common.ops import OPS
from swa_backends.kernels import METADATA_KERNELS
from swa_backends.testing.conformance import (case_for, mismatch, repeated_scatter_mismatch, run_op, scatter_repeats,
                                              sparse_mla_case, to_device)


def _wide(ws):
    """The ws kernel with its wide gathers (chosen for caches larger than L2) on these small caches."""
    def call(*args, **kwargs):
        real = ws.wide_gathers
        ws.wide_gathers = lambda kv: True
        try:
            return ws.sparse_mla(*args, **kwargs)
        finally:
            ws.wide_gathers = real
    return call


def huge_kv_cases(variants: dict, dev, rng, sms: int) -> list[str]:
    """Each sparse-MLA variant on a prefill-sized call (every variant's scope: H 64, D 512)
    over a 5-row KV cache whose rows lie 2**29 elements apart: index 4 is element 2**31."""
    import huge_strides

    bad = []
    for name, fn in variants.items():
        args, kw = sparse_mla_case(rng, dev, T=sms, H=64, D=512, d_v=512, K=128, S=5, dtype=torch.bfloat16)
        args = list(args)
        args[2][:, 0] = 4
        args[3][:] = args[2].shape[1]
        want = OPS["sparse_mla"].reference(*to_device(args, "cpu"), **to_device(kw, "cpu"))
        args[1] = huge_strides.spread(args[1], 0)
        got = fn(*args, **kw)
        torch.cuda.synchronize()
        why = mismatch("sparse_mla", got, want)
        if why:
            bad.append(f"sparse_mla/{name} over far KV rows: {why}")
        print(f"ran sparse_mla/{name} over far KV rows", flush=True)
        del args, got
        torch.cuda.empty_cache()
    return bad


def adaptive_verification_cases(be, dev) -> list[str]:
    """The sub-batch gathers of a speculative-decode batch the device resized (SPEC §3.2), with
    validation off, as the serving path runs: the device's rows moved between decodes, one
    fewer, and two more than the plan's ``num_rows_padded`` (outside the contract: the issue's
    overrun, the kernels must drop the rows past the buffers), each through
    ``gather_replay_batch`` and ``prepare_replay_step`` into exactly sized buffers."""
    bad = []
    i32, i64 = torch.int32, torch.int64
    for device_qsl, T in (([0, 2, 2, 12], 12), ([0, 1, 1, 11], 12), ([0, 3, 4, 14], 14), ([0, 9, 12, 22], 22)):
        plan = sb.plan_replay_batch([0, 1, 2, 12], [False, False, True], [False] * 3, 4, trim_threshold=0)
        qsl = torch.tensor(device_qsl, dtype=i32)
        seq = torch.tensor([200, 300, 110], dtype=i32)
        R = torch.tensor([0, 0, 100], dtype=i32)
        positions = torch.arange(100, 100 + T, dtype=i64)
        slots = torch.stack([positions + 1000, positions + 2000])
        args = (plan, qsl, seq, R, positions, slots, 4)
        want = OPS["gather_replay_batch"].reference(*args)
        with sb.validation(False):
            got = be.gather_replay_batch(plan, *to_device(args[1:6], dev), 4)
            torch.cuda.synchronize() if dev.type == "cuda" else None
        why = mismatch("gather_replay_batch", got, want)
        if why:
            bad.append(f"gather_replay_batch resized {device_qsl}: {why}")
        step = (R, torch.arange(3, dtype=i32), torch.tensor([False, False, True]), qsl, seq, positions, slots.clone(),
                torch.tensor([0], dtype=i32), torch.arange(40, dtype=i32).view(1, 40).repeat(3, 1), 16, 4, 4)
        # the plain step, then vLLM's layout with the sub-batch's two builds (exactly sized buffers)
        for kw in ({}, dict(prefill_from=2, gather_lens_from=2, valid_group=1, kept_windows=2, kept_prefill_from=2,
                            kept_gather_lens_from=2)):
            want = OPS["prepare_replay_step"].reference(
                *[a.clone() if isinstance(a, torch.Tensor) else a for a in step], plan=plan, **kw)
            with sb.validation(False):
                got = be.prepare_replay_step(*to_device(step, dev), plan=plan, **kw)
                torch.cuda.synchronize() if dev.type == "cuda" else None
            why = mismatch("prepare_replay_step", got, want)
            if why:
                bad.append(f"prepare_replay_step resized {device_qsl} {sorted(kw)}: {why}")
        print(f"ran adaptive verification {device_qsl}", flush=True)
    return bad


def table_edge_cases(be, dev) -> list[str]:
    """Window slots through a block table with fewer columns than the window needs, and through
    one with no column at all (an empty tensor: no storage behind it), validation off: the
    kernels read the table's last column, an empty table as block 0 (the reference's result)."""
    bad = []
    i32 = torch.int32
    qsl, seq, R = torch.tensor([0, 1, 2], dtype=i32), torch.tensor([8, 8], dtype=i32), torch.zeros(2, dtype=i32)
    pos = torch.tensor([7, 7])
    tables = {"short": torch.tensor([[10, 11], [20, 21]], dtype=i32), "empty": torch.zeros(2, 0, dtype=i32)}
    for name, table in tables.items():
        want = OPS["swa_indices_and_lens"].reference(qsl, seq, table, 2, 8, R, num_tokens=2)
        with sb.validation(False):
            got = be.swa_indices_and_lens(*to_device((qsl, seq, table), dev), 2, 8, R.to(dev), num_tokens=2)
            torch.cuda.synchronize()
        why = mismatch("swa_indices_and_lens", got, want)
        if why:
            bad.append(f"swa_indices_and_lens, {name} table: {why}")
        step = (R, torch.arange(2, dtype=i32), torch.ones(2, dtype=torch.bool), qsl, seq, pos,
                torch.stack([pos + 100, pos + 200]), torch.zeros(0, dtype=i32), table, 2, 8, 4)
        want = OPS["prepare_replay_step"].reference(*[a.clone() if isinstance(a, torch.Tensor) else a for a in step])
        with sb.validation(False):
            got = be.prepare_replay_step(*to_device(step, dev))
            torch.cuda.synchronize()
        why = mismatch("prepare_replay_step", got, want)
        if why:
            bad.append(f"prepare_replay_step, {name} table: {why}")
    print("ran window slots through a short and an empty block table", flush=True)
    return bad


def kept_window_cases(be, dev, rng, n: int = 12) -> list[str]:
    """``prepare_replay_step`` with the sub-batch's window builds (``kept_windows``), ``n`` random
    steps (poisoned buffers longer than the step half the time) against the reference."""
    bad, done = [], 0
    while done < n:
        args, kwargs = case_for("prepare_replay_step", rng, "cpu", poison=bool(done % 2))
        if not kwargs.get("kept_windows"):
            continue
        got, want = run_op("prepare_replay_step", be.prepare_replay_step, args, kwargs, dev)
        why = mismatch("prepare_replay_step", got, want)
        if why:
            bad.append(f"prepare_replay_step kept_windows={kwargs['kept_windows']}: {why}")
        done += 1
    print(f"ran prepare_replay_step with the sub-batch's builds, {n} steps", flush=True)
    return bad


def huge_only(where: str, dev) -> int:
    """``--huge-only START:STOP``: the huge-stride cases ``[START, STOP)`` alone. Under memcheck
    with PyTorch's caching allocator off, the device memory of each case's views (up to 16 GiB)
    stays taken until the process ends, so the full set runs as several processes of a few
    cases each (each kernel compiles in each)."""
    import huge_strides

    start, stop = (int(x) for x in where.split(":"))
    names = list(huge_strides.names(str(dev)))[start:stop]
    bad = []
    for name in names:
        outcome, why = huge_strides.run_case(name, str(dev))
        if outcome != "ok":
            bad.append(f"huge strides {name}: {outcome}: {why}")
        print(f"ran huge strides {name}", flush=True)
    for b in bad:
        print("WRONG", b)
    print(f"huge-stride cases {len(names)} of slice {where}; wrong results: {len(bad)}")
    return 1 if bad else 0


def gated_cases(dev, rng, sms: int) -> list[str]:
    """The validated default call on gluon_ws-sized calls (sm90): the value check kernel, then the
    kernel gated on its flag; once on valid input (against the reference), then with an index,
    a length and a sink that fail the check, where the gated kernel must read and write nothing
    (the bad index lies 2**31 - 1 rows past the cache) and the call raises the host checks'
    ValueError. Each with the index tensor contiguous (the check's flat form) and as a strided view
    (its tiled form)."""
    checked = sb.select(str(dev))
    args, kw = sparse_mla_case(rng, dev, T=2 * sms, H=128, D=512, d_v=512, K=640, S=4096, dtype=torch.bfloat16)
    kw["sink"] = torch.randn(128, device=dev)
    if checked.variant_for("sparse_mla", *args, **kw) != "gluon_ws":
        return []  # the gated variant does not run here
    bad = []
    q, kv, idx, lens, scale, dv = args
    want = OPS["sparse_mla"].reference(*to_device(args, "cpu"), **to_device(kw, "cpu"))
    bad_idx, bad_lens, bad_sink = idx.clone(), lens.clone(), kw["sink"].clone()
    bad_idx[sms, 600] = 2**31 - 1
    bad_lens[7] = idx.shape[1] + 1
    bad_sink[5] = float("nan")

    def strided(t):  # rows padded to 64 more entries: unit column stride (gluon_ws's scope), not contiguous
        wide = torch.empty(t.shape[0], t.shape[1] + 64, dtype=t.dtype, device=t.device)
        wide[:, :t.shape[1]] = t
        return wide[:, :t.shape[1]]

    for form, view in (("flat", lambda t: t.contiguous()), ("strided", strided)):
        got = checked.sparse_mla(q, kv, view(idx), lens, scale, dv, **kw)
        torch.cuda.synchronize()
        why = mismatch("sparse_mla", got, want)
        if why:
            bad.append(f"sparse_mla/gated ({form}): {why}")
        for what, a, k in (("index", (q, kv, view(bad_idx), lens, scale, dv), kw),
                           ("length", (q, kv, view(idx), bad_lens, scale, dv), kw),
                           ("sink", (q, kv, view(idx), lens, scale, dv), {"sink": bad_sink})):
            try:
                checked.sparse_mla(*a, **k)
                bad.append(f"sparse_mla/gated ({form}): a bad {what} passed")
            except ValueError:
                pass
            torch.cuda.synchronize()
    print("ran sparse_mla/gated (valid, bad index, bad length, bad sink; flat and strided)", flush=True)
    return bad


def self_checked_cases(be, dev, rng) -> list[str]:
    """Validated calls of every op with a self-checked form: valid ones against the reference, and
    ones with one element of one integer argument set to an edge value, which must raise the
    validator's ValueError exactly when the validator (on the CPU) refuses the call."""
    from swa_backends.kernels import SELF_CHECKED

    edges = (-(2**40), -2, -1, 0, 1, 127, 128, 2**30, 2**30 + 1, 2**31 - 1)
    bad = []
    for op in SELF_CHECKED:
        for i in range(16):
            args, kwargs = case_for(op, rng, "cpu", poison=bool(i % 2))
            ints = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.numel()
                    and not v.is_floating_point() and v.dtype != torch.bool]
            if i % 3 and ints:
                t = ints[int(rng.integers(len(ints)))].view(-1)
                info = torch.iinfo(t.dtype)
                t[int(rng.integers(t.numel()))] = max(min(edges[i % len(edges)], info.max), info.min)
            try:
                OPS[op].validate(*args, **kwargs)
                refused = False
            except ValueError:
                refused = True
            if not refused and op == "scatter_rows" and scatter_repeats(args, kwargs):
                # a repeated row keeps one of its values: which one is unspecified
                got = getattr(be, op)(*to_device(args, dev), **to_device(kwargs, dev))
                why = repeated_scatter_mismatch(got, args, kwargs)
                if why:
                    bad.append(f"{op}/self-checked, rows repeated: {why}")
                continue
            if not refused:
                got, want = run_op(op, getattr(be, op), args, kwargs, dev)
                why = mismatch(op, got, want)
                if why:
                    bad.append(f"{op}/self-checked: {why}")
                continue
            try:
                getattr(be, op)(*to_device(args, dev), **to_device(kwargs, dev))
                bad.append(f"{op}/self-checked: a call the validator refuses passed")
            except ValueError:
                pass
            torch.cuda.synchronize()
        print(f"ran {op}/self-checked (16 calls, valid and poisoned)", flush=True)
    return bad


def value_read_cases(dev, rng) -> list[str]:
    """The reader of validated calls' value checks (kernels/value_read.py) on pieces of every kind
    at sizes whose last program is partly masked: strided and transposed views, a table read up
    to each row's limit, PAD substitution, floats with a NaN, more pieces than one launch takes;
    against torch (the metadata ops above ran validated: the reader read their checks too)."""
    from swa_backends.common.validation import Reduced, _host_values
    from swa_backends.kernels import value_read

    base = torch.from_numpy(rng.integers(-1, 10**6, (300, 77))).to(torch.int32).to(dev)
    f = torch.randn(4099, device=dev)
    f[4098] = float("nan")
    lim = torch.from_numpy(rng.integers(0, 77 * 16, 300)).to(torch.int32).to(dev)
    items = [base[:, ::3], Reduced(base.t()), Reduced(base, limit=lim, step=16), Reduced(base[1:, 1:], pad_as=5),
             Reduced(f), f[:1023], base[7], Reduced(base[:, 5].to(torch.int64))]
    got = value_read.read(items)
    torch.cuda.synchronize()
    bad = []
    for i, (g, it) in enumerate(zip(got, items)):
        want = _host_values((it.on_device() if isinstance(it, Reduced) else it).cpu())
        if not np.array_equal(g, want, equal_nan=True):
            bad.append(f"value_read piece {i}: {g.ravel()[:4]} != {want.ravel()[:4]}")
    print("ran value_read (8 pieces, two launches)", flush=True)
    return bad


def main(argv: list[str]) -> int:
    skip = set(argv[argv.index("--skip") + 1].split(",")) if "--skip" in argv else set()
    dev = torch.device("cuda", torch.cuda.current_device())
    be = sb.select(str(dev))
    rng = np.random.default_rng(7)
    bad = []
    if "--huge-only" in argv:  # one slice of the huge-stride cases, alone (see huge_only)
        return huge_only(argv[argv.index("--huge-only") + 1], dev)
    if "--kept-only" in argv or "--gated-only" in argv or "--self-checked-only" in argv:  # (the module docstring)
        if "--self-checked-only" in argv:
            bad = self_checked_cases(be, dev, rng)
        elif "--gated-only" in argv:
            bad = gated_cases(dev, rng, torch.cuda.get_device_properties(dev).multi_processor_count)
        else:
            bad = (adaptive_verification_cases(be, dev) + kept_window_cases(be, dev, rng) + table_edge_cases(be, dev)
                   + value_read_cases(dev, rng))
        for b in bad:
            print("WRONG", b)
        print(f"wrong results: {len(bad)}")
        return 1 if bad else 0
    for op in METADATA_KERNELS:
        for i in range(2):
            args, kwargs = case_for(op, rng, "cpu", poison=bool(i))
            got, want = run_op(op, getattr(be, op), args, kwargs, dev)
            why = mismatch(op, got, want)
            if why:
                bad.append(f"{op}: {why}")
    bad += adaptive_verification_cases(be, dev)
    bad += kept_window_cases(be, dev, rng)
    bad += table_edge_cases(be, dev)
    bad += value_read_cases(dev, rng)
    # sparse MLA: each variant directly, at shapes it takes
    from swa_backends.kernels import sparse_mla as tl

    variants = {"triton": tl.sparse_mla}
    cap = torch.cuda.get_device_capability(dev)
    if cap == (9, 0):
        from swa_backends.kernels import sparse_mla_gluon, sparse_mla_gluon_ws

        variants |= {"gluon": sparse_mla_gluon.sparse_mla, "gluon_ws": sparse_mla_gluon_ws.sparse_mla,
                     "gluon_ws_wide": _wide(sparse_mla_gluon_ws)}
    from swa_backends.backends.cuda import flashmla, probes

    if probes.find_flashmla()[0] is not None:
        variants["flashmla"] = flashmla.sparse_mla
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    variants = {k: v for k, v in variants.items() if k not in skip}
    for name, fn in variants.items():
        # ragged, prefill-sized, prefill-sized with a partial head block (heads 96-127 masked) and a partial
        # last tile, decode
        shapes = [(3, 16, 512, 77), (sms, 64, 512, 200), (sms // 2 + 1, 96, 512, 136), (1, 64, 512, 640)]
        for T, H, D, K in shapes:
            if name.startswith("gluon") and (T * ((H + 63) // 64) < sms or H < 64):
                continue  # outside their scope (dispatch would not send it there)
            if name == "flashmla" and H not in (16, 64, 128):
                continue
            args, kw = sparse_mla_case(rng, dev, T=T, H=H, D=D, d_v=512, K=K, S=2048, dtype=torch.bfloat16)
            args[3][::3] = 0
            kw["sink"] = torch.randn(H, device=dev)
            got = fn(*args, **kw)
            torch.cuda.synchronize()
            want = OPS["sparse_mla"].reference(*to_device(args, "cpu"), **to_device(kw, "cpu"))
            why = mismatch("sparse_mla", got, want)
            if why:
                bad.append(f"sparse_mla/{name} T{T} H{H} K{K}: {why}")
            print(f"ran sparse_mla/{name} T {T} H {H} K {K}", flush=True)
    if cap == (9, 0) and "gluon_ws" in variants:
        bad += gated_cases(dev, rng, sms)
    torch.cuda.synchronize()
    huge = 0
    if "--no-huge" not in argv:
        import huge_strides

        for name in () if "--no-huge-strides" in argv else huge_strides.names(str(dev)):
            gc.collect()  # every earlier case's views freed (the allocator caches nothing here)
            outcome, why = huge_strides.run_case(name, str(dev))
            if outcome != "ok":
                bad.append(f"huge strides {name}: {outcome}: {why}")
            free, total = torch.cuda.mem_get_info(dev)
            print(f"ran huge strides {name} ({free / 2**30:.0f} of {total / 2**30:.0f} GiB free)", flush=True)
            torch.cuda.empty_cache()
            huge += 1
        bad += huge_kv_cases(variants, dev, rng, sms)
    for b in bad:
        print("WRONG", b)
    print(f"kernels run: {len(METADATA_KERNELS)} metadata ops x 2 cases, sparse_mla variants {sorted(variants)}, "
          f"huge-stride cases {huge}, far-KV sparse_mla {0 if '--no-huge' in argv else len(variants)}; "
          f"wrong results: {len(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
