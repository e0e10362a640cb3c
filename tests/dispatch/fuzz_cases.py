"""Adversarial calls for the fuzz suite (tests/dispatch/test_fuzz.py): every public op and every
custom op, called as a careless caller or an attacker would.

A case is ``(op, mutation, args, kwargs, expect)``, made deterministically from a seed and an
index: a valid call from the conformance generators (``swa_backends.testing.conformance``),
then one mutation. ``expect`` says what the contract demands:

* ``"error"``: the input breaks the contract: a ``ValueError`` naming the op, before
  anything is written (every in-place argument and ``out=`` input unchanged);
* ``"either"``: the input may or may not be valid; the backend must then do what the
  reference does (both raise a ``ValueError``, or both return the same result).

:func:`run_case` runs one case on a backend and classifies the outcome. The worker
(``python tests/dispatch/fuzz_cases.py BACKEND SEED START COUNT``) runs cases in order and prints one
JSON line per finished case, so the parent sees which case a crashed process died on.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import sys

import numpy as np
import torch

import swa_backends as sb
from swa_backends.common.ops import OPS
from swa_backends.common.types import ReplayPlan
from swa_backends.testing.conformance import case_for, mismatch, random_batch

INT32_MAX = 2**31 - 1

# what the public API exposes beyond the Backend's device ops
HOST_CASES = ("plan_replay_batch", "admit_prefix_hit", "mark_prefix_replay", "replay_block_is_live",
              "replay_layer_ids", "pcp_partition", "compact_indices", "csr_to_plain", "mixed_to_plain")


# ---------------------------------------------------------------------------------------
# mutations
# ---------------------------------------------------------------------------------------


def _tensor_mutations(name: str, t: torch.Tensor):
    """(label, new value, expect) for one tensor argument."""
    out = [(f"{name}:not-a-tensor", t.tolist(), "error"),
           (f"{name}:extra-dim", t.unsqueeze(0), "error")]
    other = {torch.int32: torch.int64, torch.int64: torch.int32, torch.bool: torch.int32,
             torch.float32: torch.float64, torch.bfloat16: torch.float32, torch.float16: torch.float32}.get(t.dtype)
    if other is not None:  # some ops take both int32 and int64: the reference decides
        out.append((f"{name}:dtype-{other}".replace("torch.", ""), t.to(other), "either"))
    if t.dim() >= 1 and t.shape[0] > 0:
        out.append((f"{name}:one-short", t[:-1].clone(), "either"))
        out.append((f"{name}:one-long", torch.cat([t, t[-1:]]), "either"))
    if t.numel():
        if t.dtype in (torch.int32, torch.int64):
            for v in (-2, -(2**31), INT32_MAX, 2**40):
                if t.dtype == torch.int32 and v == 2**40:
                    continue
                m = t.clone()
                m.reshape(-1)[m.numel() // 2] = v
                out.append((f"{name}:value={v}", m, "either"))
        elif t.is_floating_point():
            for v in (float("nan"), float("inf"), float("-inf")):
                m = t.clone()
                m.reshape(-1)[m.numel() // 2] = v
                out.append((f"{name}:value={v}", m, "either"))
    if t.dim() == 2 and t.shape[0] > 1 and t.shape[1] > 1:
        out.append((f"{name}:strided", t.t().contiguous().t(), "either"))
    return out


def _scalar_mutations(name: str, v):
    out = [(f"{name}:=True", True, "error"), (f"{name}:=2.5", 2.5, "error"), (f"{name}:=None", None, "either"),
           (f"{name}:=-1", -1, "either"), (f"{name}:=0", 0, "either"), (f"{name}:=2**31", 2**31, "error"),
           (f"{name}:=2**62", 2**62, "error")]
    if isinstance(v, float):
        out = [(f"{name}:=nan", float("nan"), "error"), (f"{name}:=-1.0", -1.0, "error"),
               (f"{name}:=inf", float("inf"), "error"), (f"{name}:='x'", "x", "error")]
    return out


def _out_mutations(out, inputs: dict):
    """``out=`` aliased with an input, of the wrong dtype or shape, non-contiguous."""
    res = []
    first = out if isinstance(out, torch.Tensor) else (out[0] if isinstance(out, tuple) else next(iter(
        v for v in out.values() if isinstance(v, torch.Tensor))))
    for iname, x in inputs.items():
        if isinstance(x, torch.Tensor) and x.numel() >= first.numel() and x.dtype == first.dtype and first.numel():
            alias = x.reshape(-1)[: first.numel()].view(first.shape)
            res.append((f"out:aliases-{iname}", _replace_first(out, alias), "error"))
            break
    if first.numel():
        res.append(("out:wrong-dtype", _replace_first(out, first.to(torch.float64)), "error"))
        res.append(("out:too-small", _replace_first(out, first.reshape(-1)[:-1].clone()), "error"))
    if first.dim() == 2 and first.shape[0] > 1 and first.shape[1] > 1:
        res.append(("out:non-contiguous", _replace_first(out, first.t().contiguous().t()), "error"))
    if isinstance(out, tuple):
        res.append(("out:one-of-two", (out[0],), "error"))
        res.append(("out:same-buffer-twice", (out[0], out[0]) if out[0].shape == out[1].shape else out, "either"))
    return res


def _replace_first(out, new):
    if isinstance(out, torch.Tensor):
        return new
    if isinstance(out, tuple):
        return (new, *out[1:])
    key = next(k for k, v in out.items() if isinstance(v, torch.Tensor))
    return {**out, key: new}


def _plan_mutations(plan: ReplayPlan, rng):
    """Plans that disagree with the batch they are used on."""
    res = []
    bad = ReplayPlan(plan.kept, plan.trimmed, plan.dropped_before, plan.num_rows, max(0, plan.num_rows - 1),
                     plan.window)
    res.append(("plan:padded-below-rows", bad, "error"))
    res.append(("plan:more-rows", ReplayPlan(plan.kept, plan.trimmed, plan.dropped_before, plan.num_rows + 5,
                                             plan.num_rows_padded + 5, plan.window), "error"))
    kept = plan.kept.clone()
    if kept.numel():
        kept[0] += 7
        res.append(("plan:kept-off", ReplayPlan(kept, plan.trimmed, plan.dropped_before, plan.num_rows,
                                                plan.num_rows_padded, plan.window), "error"))
        d = plan.dropped_before.clone()
        d[1:] -= 3
        res.append(("plan:dropped-off", ReplayPlan(plan.kept, plan.trimmed, d, plan.num_rows, plan.num_rows_padded,
                                                   plan.window), "error"))
        res.append(("plan:negative", ReplayPlan(-plan.kept, plan.trimmed, plan.dropped_before, -1, -1, plan.window),
                    "error"))
    other = random_batch(rng, long_prefill=True)
    pre = other.prefilling
    p2 = sb.plan_replay_batch(other.qsl, pre, np.zeros(other.B, bool), other.W, trim_threshold=0)
    if p2 is not None:
        res.append(("plan:from-another-batch", p2, "error"))
    res.append(("plan:not-a-plan", "plan", "error"))
    return res


def _sparse_mla_keywords(bound: dict):
    """``kv_format`` / ``fp8`` / ``return_lse`` (strings and a bool: no generic mutation reaches
    them) and record caches that break the layout contract."""
    from swa_backends.common.ops import _records

    fmt = bound.get("kv_format", "rows")
    kv = bound.get("kv")
    res = [("kv_format:unknown", ("kw", "kv_format", "fp8_ds_mla"), "error"),
           ("kv_format:bytes-per-token", ("kw", "kv_format", 584), "error"),
           ("return_lse:not-a-bool", ("kw", "return_lse", "no"), "error"),
           ("return_lse:flipped", ("kw", "return_lse", not bound.get("return_lse", True)), "either")]
    if fmt == "rows":
        res += [("kv_format:records-of-rows", ("kw", "kv_format", "v4_fp8"), "error"),
                ("fp8:with-rows", ("kw", "fp8", "e4m3fn"), "error")]
        return res
    f = _records.FORMATS[fmt]
    other = next(n for n in _records.FORMATS if n != fmt)
    res += [("kv_format:rows-of-records", ("kw", "kv_format", "rows"), "error"),
            ("kv_format:another-record", ("kw", "kv_format", other), "error"),
            ("fp8:unknown", ("kw", "fp8", "e5m2"), "error")]
    if not f.fp8_fixed:
        res.append(("fp8:None", ("kw", "fp8", None), "error"))
        swap = next(x for x in f.fp8_flavours if x != bound.get("fp8"))
        res.append(("fp8:other-flavour", ("kw", "fp8", swap), "either"))  # valid: another meaning, same on both
    else:
        res.append(("fp8:fnuz-scales", ("kw", "fp8", "e4m3fnuz"), "error"))
    if isinstance(kv, torch.Tensor) and kv.dim() == 3 and kv.shape[0] > 1 and kv.shape[1] > 1:
        nb, bs, R = kv.shape
        res.append(("kv:overlapping-pages", kv.as_strided(kv.shape, (bs * R - 2, R, 1)), "error"))
        res.append(("kv:records-not-packed", kv.transpose(0, 1), "error"))
    return res


def _specific(op: str, bound: dict, rng):
    """Contract violations no generic mutation reaches."""
    res = []
    if op == "sparse_mla":
        res += _sparse_mla_keywords(bound)
    qsl = bound.get("query_start_loc")
    if isinstance(qsl, torch.Tensor) and qsl.numel() > 2:
        res.append(("query_start_loc:decreasing", qsl.flip(0), "error"))
        # prefill_gather_lens reads only query lengths: a shifted query_start_loc is a slice of a
        # larger batch's (SPEC 2.5), valid; everywhere else it points past the tokens
        res.append(("query_start_loc:past-the-tokens", qsl + 10_000,
                    "either" if op == "prefill_gather_lens" else "error"))
        res.append(("query_start_loc:below-zero", qsl - 10_000, "error"))
    R = bound.get("replay_start")
    if isinstance(R, torch.Tensor) and R.numel():
        # a replay start above the request's first position is stale (an in-place restart, SPEC 0):
        # valid, the request counts as not replaying
        res.append(("replay_start:stale", R + 1_000_000, "either"))
        res.append(("replay_start:negative", torch.full_like(R, -5), "error"))
    if op == "pad_replayed_slots" and isinstance(R, torch.Tensor) and bool((R > 0).any()):
        res.append(("any_replay:False-with-replay", ("kw", "any_replay", False), "error"))
    bt = bound.get("block_table")
    seq = bound.get("seq_lens")
    reads_table = isinstance(seq, torch.Tensor) and bool((seq > 0).any()) and bound.get("ratio", 2) != 1
    if isinstance(bt, torch.Tensor) and bt.numel() and reads_table:
        spb = bound["block_size"] // max(1, bound.get("ratio", 1))
        for v, label in ((-3, "negative"), (INT32_MAX // spb + 1, "slots-past-int32")):
            if v > INT32_MAX:  # one slot per block: every int32 block id is a valid slot
                continue
            m = bt.clone()
            m.fill_(v)
            res.append((f"block_table:{label}", m, "error"))
    return res


# ---------------------------------------------------------------------------------------
# families by class: aliasing by address, scalar ranges per dtype, every dtype x layout
# ---------------------------------------------------------------------------------------


class Shared:
    """Tensors that must share memory when a case runs, though a deep copy would give each its own
    storage (``torch.from_numpy`` of two slices of one array): ``make() -> {key: tensor}`` builds them
    afresh for every run; :class:`Part` stands for one of them among a case's arguments."""

    def __init__(self, make):
        self.make = make

    def __deepcopy__(self, memo):
        return self


class Part:
    def __init__(self, shared: Shared, key: str):
        self.shared, self.key = shared, key

    def __deepcopy__(self, memo):
        return self


def _resolve(obj, made: dict):
    """``obj`` with every :class:`Part` replaced by its tensor (one ``make()`` per :class:`Shared`)."""
    if isinstance(obj, Part):
        if id(obj.shared) not in made:
            made[id(obj.shared)] = obj.shared.make()
        return made[id(obj.shared)][obj.key]
    if isinstance(obj, tuple):
        return tuple(_resolve(o, made) for o in obj)
    if isinstance(obj, list):
        return [_resolve(o, made) for o in obj]
    if isinstance(obj, dict):
        return {k: _resolve(v, made) for k, v in obj.items()}
    return obj


def _fresh(make) -> Part:
    """An argument made afresh for each run: a deep copy drops a tensor's lazy conjugate and
    negative bits."""
    return Part(Shared(lambda: {"v": make()}), "v")


def _numpy_pair(x: torch.Tensor, w: torch.Tensor, overlap: bool) -> Shared:
    """``x`` and ``w`` (their values) over one numpy byte array through two ``torch.from_numpy``
    calls, so two storages: ``w`` starts on ``x``'s last 8 bytes (``overlap``) or just past ``x``."""
    xb, wb = x.numel() * x.element_size(), w.numel() * w.element_size()

    def make():
        buf = np.zeros(xb + wb + 16, dtype=np.uint8)
        start = (xb - 1) // 8 * 8 if overlap else -(-xb // 8) * 8
        xs = torch.from_numpy(buf[:xb]).view(x.dtype).view(x.shape)
        ws = torch.from_numpy(buf[start:start + wb]).view(w.dtype).view(w.shape)
        ws.copy_(w)
        xs.copy_(x)  # last: the input's values stay valid, only the overlap is wrong
        return {"x": xs, "w": ws}

    return Shared(make)


def _path_set(bound: dict, path: tuple, value) -> dict:
    """``bound`` with the entry at ``path`` (an argument, then keys / indices into it) replaced."""
    def put(node, keys):
        if not keys:
            return value
        k, rest = keys[0], keys[1:]
        if isinstance(node, tuple):
            return tuple(put(v, rest) if i == k else v for i, v in enumerate(node))
        return {**node, k: put(node[k], rest)}

    return {**bound, path[0]: put(bound[path[0]], path[1:])}


def _written(op: str, bound: dict) -> list[tuple[tuple, torch.Tensor]]:
    """``(path, tensor)`` of every buffer the call writes (``out=`` entries, in-place arguments)."""
    res = []

    def walk(path, v):
        if isinstance(v, torch.Tensor):
            res.append((path, v))
        elif isinstance(v, tuple):
            for i, x in enumerate(v):
                walk((*path, i), x)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk((*path, k), x)

    walk(("out",), bound.get("out"))
    for name in OPS[op].mutates if op in OPS else ():
        walk((name,), bound[name])
    return res


def alias_family(op: str, bound: dict) -> list[tuple]:
    """Aliasing by address: ``(label, changes {path: value}, expect)``. A written buffer that
    overlaps itself (expanded, as_strided rows), one that shares memory with an input through
    another storage (``from_numpy``) next to the same two tensors apart, and ``out=`` entries that
    are the plan's own tensors (its host copy, a device copy it holds)."""
    res = []
    written = _written(op, bound)
    for path, w in written:
        if path[0] == "out" or w.dim() != 2 or w.shape[0] < 2 or w.shape[1] < 2:
            continue
        G, n = w.shape
        base = w.reshape(-1).clone()
        res += [(f"alias:{path[0]}:rows-expanded", {path: w[:1].expand(G, n)}, "error"),
                (f"alias:{path[0]}:columns-expanded", {path: w[:, :1].expand(G, n)}, "error"),
                (f"alias:{path[0]}:rows-overlap", {path: base.as_strided((G, n), (max(1, n // 2), 1))}, "error")]
        apart = torch.full((G * (n + 3),), -5, dtype=w.dtype, device=w.device).as_strided((G, n), (n + 3, 1))
        apart.copy_(w)
        res.append((f"alias:{path[0]}:rows-apart", {path: apart}, "either"))
    inputs = [(n, v) for n, v in bound.items() if isinstance(v, torch.Tensor) and n != "out"
              and n not in (OPS[op].mutates if op in OPS else ()) and v.numel() and v.is_contiguous()]
    if written and inputs:
        path, w = next(((p, t) for p, t in written if t.numel()), written[0])
        iname, x = inputs[0]
        if w.numel():
            for overlap in (True, False):
                pair = _numpy_pair(x, w, overlap)
                res.append((f"alias:{path[0]}-{iname}:from-numpy-{'overlapping' if overlap else 'apart'}",
                            {(iname,): Part(pair, "x"), path: Part(pair, "w")}, "error" if overlap else "either"))
    plan = bound.get("plan")
    out = bound.get("out")
    if isinstance(plan, ReplayPlan) and isinstance(out, dict) and plan.num_reqs:
        key = ("out", "replay_batch") if "replay_batch" in out else ("out",)
        res.append(("alias:out-plan.dropped_before", {(*key, "query_start_loc"): plan.dropped_before}, "error"))
        res.append(("alias:out-plan.kept", {(*key, "kv_start"): plan.kept}, "error"))
        copy_ = plan.dropped_before.clone()
        own = ReplayPlan.from_kept(plan.kept.numpy(), np.concatenate([[0], np.cumsum(plan.kept.numpy())]) +
                                   plan.dropped_before.numpy(), plan.num_rows_padded, plan.window,
                                   device_dropped_before=copy_)
        res.append(("alias:out-plan-device-copy", {("plan",): own, (*key, "query_start_loc"): copy_}, "error"))
    return res


#: Offsets added to int32 slots or token indices: the largest int32 is in range, the kernels must
#: not wrap (the result is the reference's, or both refuse).
OFFSETS = ("token_offset", "topk_offset", "window_offset", "window_base", "compressed_base")


def scalar_family(op: str, bound: dict) -> list[tuple]:
    """Scalar ranges per dtype: floats the kernels hold in fp32, ints they hold in int32."""
    from swa_backends.common.ops.sparse_mla import SCALE_MAX, SCALE_MIN

    res = []
    if op == "sparse_mla":
        for label, v in (("1e39", 1e39), ("3e38", 3e38), ("1e-39", 1e-39), ("5e-324", 5e-324), ("-0.0", -0.0),
                         ("2**1024", 2**1024), ("10**400", 10**400), ("-inf", float("-inf"))):
            res.append((f"scalar:sm_scale={label}", {("sm_scale",): v}, "error"))
        # in range (the largest ones overflow fp32 scores for any q . k above 1: a result of the
        # values, unspecified, and so no case here)
        for v in (SCALE_MIN, 1, 1e6):
            res.append((f"scalar:sm_scale={v:.3g}", {("sm_scale",): v}, "either"))
        res.append(("scalar:sm_scale=above-max", {("sm_scale",): SCALE_MAX * 1.0001}, "error"))
    params = OPS[op].signature.parameters if op in OPS else inspect.signature(_public(op)).parameters
    for name in OFFSETS:
        if name in params:
            res.append((f"scalar:{name}=INT32_MAX", {(name,): INT32_MAX}, "either"))
    if op == "swa_indices_and_lens":
        out = bound.get("out")
        n = out[1].shape[0] if isinstance(out, tuple) else 5
        res.append(("scalar:token_offset+num_tokens=INT32_MAX", {("token_offset",): INT32_MAX - n,
                                                                 ("num_tokens",): n, ("valid",): None}, "either"))
        res.append(("scalar:token_offset+num_tokens=2**31", {("token_offset",): INT32_MAX - n + 1,
                                                             ("num_tokens",): n, ("valid",): None}, "either"))
    return res


#: Row dtypes SPEC §3.3 promises beyond the conformance generator's (any dtype moves bit for bit).
ROW_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64, torch.int16,
              torch.float64, torch.complex64, torch.complex128, torch.bool)


def _random_bits(shape, dtype, gen: torch.Generator) -> torch.Tensor:
    n = math.prod(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    size = torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=gen).view(dtype).view(shape)


def layout_family(op: str, bound: dict, backend_meta: bool = True) -> list[tuple]:
    """Every dtype x layout: each input tensor expanded (stride 0), strided (its elements apart),
    empty, in another dtype (float64 or uint8) and, if floating, with a lazy negative bit (values
    unchanged); every tensor on the meta device; sparse MLA in each dtype it takes; the rows ops'
    rows in every dtype and as a conjugate view. Expected: the reference's result, or a clear
    refusal (neg-bit tensors outside the rows ops, meta tensors)."""
    res = []
    written = {p[0] for p, _ in _written(op, bound)}
    rows_op = op in ("gather_rows", "scatter_rows")
    for name, t in bound.items():
        if not isinstance(t, torch.Tensor) or name in written or t.numel() == 0 or t.dim() > 2:
            continue
        if t.shape[0] > 1:
            res.append((f"layout:{name}:expanded", {(name,): t[:1].expand(t.shape)}, "either"))
        wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype)
        strided = wide[..., ::2]
        strided.copy_(t)
        res.append((f"layout:{name}:strided", {(name,): strided}, "either"))
        res.append((f"layout:{name}:zero-size", {(name,): t[:0]}, "either"))
        other = torch.float64 if t.is_floating_point() and t.dtype != torch.float64 else torch.uint8
        res.append((f"layout:{name}:dtype-{str(other)[6:]}", {(name,): t.to(other)}, "either"))
        if t.is_floating_point():
            res.append((f"layout:{name}:neg-bit", {(name,): _fresh(lambda t=t: torch._neg_view(-t))},
                        "either" if rows_op else "error"))
    if op == "sparse_mla" and bound.get("kv_format", "rows") == "rows":
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            changes = {("q",): bound["q"].to(dtype), ("kv",): bound["kv"].to(dtype)}
            res.append((f"layout:q,kv:dtype-{str(dtype)[6:]}", changes, "either"))
    if backend_meta:
        def meta(v):
            if isinstance(v, torch.Tensor):
                return v.to("meta")
            if isinstance(v, tuple):
                return tuple(meta(x) for x in v)
            if isinstance(v, dict):
                return {k: meta(x) for k, x in v.items()}
            return v

        if any(isinstance(v, torch.Tensor) and v.numel() for v in bound.values()):
            res.append(("layout:all-meta", {(n,): meta(v) for n, v in bound.items()
                                            if not isinstance(v, ReplayPlan)}, "error"))
    if rows_op:
        data = "x" if op == "gather_rows" else "y"
        x = bound[data]
        gen = torch.Generator().manual_seed(x.numel())
        for dtype in ROW_DTYPES:
            changes = {(data,): _random_bits(tuple(x.shape), dtype, gen)}
            if isinstance(bound.get("out"), torch.Tensor):
                changes[("out",)] = _random_bits(tuple(bound["out"].shape), dtype, gen)
            res.append((f"layout:{data}:dtype-{str(dtype)[6:]}", changes, "either"))
            if dtype.is_complex:
                conj = dict(changes)
                conj[(data,)] = _fresh(lambda v=changes[(data,)]: v.clone().conj())
                res.append((f"layout:{data}:conj-{str(dtype)[6:]}", conj, "either"))
                if "out" in bound and bound["out"] is not None:
                    conj_out = dict(changes)
                    conj_out[("out",)] = _fresh(lambda v=changes[("out",)]: v.clone().conj())
                    res.append((f"layout:out:conj-{str(dtype)[6:]}", conj_out, "error"))
    return res


# ---------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------


def host_case(op: str, rng: np.random.Generator):
    """A valid call of a public host function or index-layout converter."""
    b = random_batch(rng, long_prefill=True)
    t = b.tensors("cpu")
    if op == "plan_replay_batch":
        return (b.qsl.tolist(), b.prefilling, np.zeros(b.B, bool), b.W), {"pad_to": None}
    if op == "admit_prefix_hit":
        return (int(rng.integers(0, 300)), int(rng.integers(0, 300)), 32, 16), {}
    if op == "mark_prefix_replay":
        return (int(rng.integers(0, 300)), 32), {}
    if op == "replay_block_is_live":
        return (int(rng.integers(33, 300)), 32, 16), {}
    if op == "replay_layer_ids":
        return (8, [0, 1, 2, 3]), {}
    if op == "pcp_partition":
        q = [int(x) for x in b.q]
        return (q, [int(s - x) for s, x in zip(b.seq, b.q)], 2, 1), {"is_prefilling": b.prefilling.tolist()}
    idx, lens = OPS["swa_indices_and_lens"].reference(t["query_start_loc"], t["seq_lens"], t["block_table"],
                                                     b.block_size, b.W, t["replay_start"], num_tokens=b.T)
    T, K = idx.shape
    out = (torch.full((T, K), -7, dtype=torch.int32), torch.full((T,), -7, dtype=torch.int32))
    if op == "compact_indices":
        return (idx, lens), {"out": out}
    if op == "mixed_to_plain":
        return (idx, lens, K), {"window_offset": 3, "out": out}
    if op == "csr_to_plain":
        indptr, values = OPS["indices_to_csr"].reference(idx, lens)
        return (indptr, values, K), {"out": out}
    raise KeyError(op)


def _public(op: str):
    return getattr(sb, op)


def cases_for(op: str, rng: np.random.Generator, families: bool = False) -> list[tuple]:
    """Every mutation of one valid call of ``op``: ``(label, args, kwargs, expect)``; with
    ``families``, the class families' cases of that call too (aliasing, scalars, layouts)."""
    if op in OPS:
        args, kwargs = case_for(op, rng, "cpu", poison=True, exact_out=True)  # "out:too-small" cuts a row
        sig = OPS[op].signature
    else:
        args, kwargs = host_case(op, rng)
        sig = inspect.signature(_public(op))
    bound = sig.bind(*args, **kwargs).arguments
    names = list(bound)
    muts = []
    for name, v in bound.items():
        if name == "out":
            muts += [(label, "out", new, exp) for label, new, exp in _out_mutations(v, {n: bound[n] for n in names
                                                                                       if n != "out"})]
        elif isinstance(v, torch.Tensor):
            muts += [(label, name, new, exp) for label, new, exp in _tensor_mutations(name, v)]
        elif isinstance(v, ReplayPlan):
            muts += [(label, name, new, exp) for label, new, exp in _plan_mutations(v, rng)]
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            muts += [(label, name, new, exp) for label, new, exp in _scalar_mutations(name, v)]
        elif isinstance(v, (list, np.ndarray)) and len(v):  # host sequences
            arr = np.asarray(v)
            muts += [(f"{name}:negative", name, np.full_like(arr, -3).tolist(), "either"),
                     (f"{name}:huge", name, np.full(arr.shape, 2**40).tolist(), "either"),
                     (f"{name}:floats", name, (arr.astype(float) + 0.5).tolist(), "error"),
                     (f"{name}:2-D", name, [arr.tolist()], "error"),
                     (f"{name}:string", name, "abc", "error")]
    for label, new, exp in _specific(op, bound, rng):
        if isinstance(new, tuple) and new and new[0] == "kw":
            muts.append((label, new[1], new[2], exp))
        else:
            muts.append((label, label.split(":")[0], new, exp))
    if families:
        for label, changes, exp in (*alias_family(op, bound), *scalar_family(op, bound), *layout_family(op, bound)):
            muts.append((label, None, changes, exp))
    out = []
    for label, name, new, exp in muts:
        b = dict(bound)
        if name is None:  # a family's case: several entries changed, by path
            for path, value in new.items():
                b = _path_set(b, path, value) if len(path) > 1 else {**b, path[0]: value}
        else:
            b[name] = new  # a keyword the valid call left at its default is added (kv_format, fp8, ...)
        a = tuple(b[n] for n in b if sig.parameters[n].kind in (sig.parameters[n].POSITIONAL_ONLY,
                                                                sig.parameters[n].POSITIONAL_OR_KEYWORD))
        kw = {n: b[n] for n in b if sig.parameters[n].kind == sig.parameters[n].KEYWORD_ONLY}
        out.append((label, a, kw, exp))
    return out


def all_cases(seed: int, per_op: int) -> list[tuple]:
    """``per_op`` valid calls of every device op and public host function, each with every
    mutation (the first also with the class families'): ``(op, label, args, kwargs, expect)``,
    deterministic for a seed."""
    res = []
    for k, op in enumerate((*OPS, *HOST_CASES)):
        rng = np.random.default_rng([seed, k])
        for i in range(per_op):
            res += [(op, *c) for c in cases_for(op, rng, families=i == 0)]
    return res


# ---------------------------------------------------------------------------------------
# running one case
# ---------------------------------------------------------------------------------------


def _snapshot(obj):
    return copy.deepcopy(obj) if not isinstance(obj, ReplayPlan) else None


def _bits(t: torch.Tensor) -> torch.Tensor | None:
    """A tensor's values as bytes (any dtype, lazy bits applied; None on the meta device)."""
    if t.device.type == "meta":
        return None
    flat = t.detach().resolve_conj().resolve_neg().reshape(-1).clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8).cpu()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape):
            return False
        ba, bb = _bits(a), _bits(b)
        return ba is None or bb is None or torch.equal(ba, bb)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return True


def _call(fn, args, kwargs):
    """``(status, result or exception)``; status ``ok``, ``error`` (the contract's) or ``unclear``."""
    try:
        return "ok", fn(*args, **kwargs)
    except (ValueError, sb.SelectionError) as exc:
        return "error", exc
    except Exception as exc:  # noqa: BLE001 - classified, reported
        return "unclear", exc


def run_case(op: str, fn, args, kwargs, expect: str, reference) -> dict:
    """Outcome of one case: ``clear`` (the contract's ValueError, inputs untouched), ``ok``
    (a result that equals the reference's), or a failure: ``unclear`` (another exception),
    ``silent`` (a result where an error was due), ``wrong`` (a result unlike the
    reference's), ``disagree`` (one of backend and reference raised), ``touched`` (an error
    after writing an input)."""
    # one deepcopy: views of one tensor stay views of its copy (tensors over one numpy array are made afresh)
    a, kw = _resolve(copy.deepcopy((args, kwargs)), {})
    before = _snapshot((a, kw))
    status, res = _call(fn, a, kw)
    if status == "unclear":
        if isinstance(res, RuntimeError) and "Expected a value of type" in str(res):
            # a custom op's schema (torch's dispatcher): names the argument, value and type
            return {"outcome": "schema", "detail": str(res).splitlines()[0][:200]}
        return {"outcome": "unclear", "detail": f"{type(res).__name__}: {str(res)[:300]}"}
    if status == "error":
        if not str(res).startswith((op + ":", "select", f"{op}: no chosen variant", "pcp_partition:",
                                    "mark_prefix_replay:", "admit_prefix_hit:", "replay_block_is_live:")):
            return {"outcome": "unclear", "detail": f"error not naming {op}: {str(res)[:300]}"}
        if before is not None and not _same((a, kw), before):
            return {"outcome": "touched", "detail": str(res)[:300]}
        if expect == "either" and reference is not None and not isinstance(res, sb.SelectionError):
            # (a selection error: valid input the forced variant does not take, with its reasons)
            rstatus, _ = _call(reference, *_resolve(copy.deepcopy((args, kwargs)), {}))
            if rstatus == "ok":
                return {"outcome": "disagree", "detail": f"backend raised, reference returned: {str(res)[:200]}"}
        return {"outcome": "clear", "detail": str(res)[:200]}
    if expect == "error":
        return {"outcome": "silent", "detail": "returned where a ValueError was due"}
    if reference is not None:
        rstatus, want = _call(reference, *_resolve(copy.deepcopy((args, kwargs)), {}))
        if rstatus != "ok":
            return {"outcome": "disagree", "detail": f"backend returned, reference raised: {str(want)[:200]}"}
        if op == "sparse_mla":  # tokens that read a non-finite value are unspecified (SPEC 2.7)
            res, want = _finite_tokens(args, kwargs, res), _finite_tokens(args, kwargs, want)
        why = _nan_aware_mismatch(op, res, want)
        if why:
            return {"outcome": "wrong", "detail": why[:300]}
    return {"outcome": "ok", "detail": ""}


def _finite_tokens(args, kwargs, result):
    """``sparse_mla``'s result with every token that reads a non-finite q or kv value zeroed
    (a record cache: its records dequantized)."""
    q, kv, indices, lens = args[:4]
    out, lse = result
    fmt = kwargs.get("kv_format", "rows")
    if fmt != "rows":
        from swa_backends.common.ops import _records

        kv = _records.dequantize(kv, torch.arange(_records.num_slots(kv)), fmt, kwargs.get("fp8"))
    bad_rows = ~torch.isfinite(kv.float()).all(dim=1)
    j = torch.arange(indices.shape[1])
    read = (j[None, :] < lens[:, None]) & (indices >= 0)
    reads_bad = (read & bad_rows[indices.clamp(min=0).long()]).any(dim=1) if kv.shape[0] else torch.zeros(
        q.shape[0], dtype=torch.bool)
    bad = reads_bad | ~torch.isfinite(q.float()).all(dim=2).all(dim=1)
    return out.masked_fill(bad[:, None, None], 0), (lse.masked_fill(bad[:, None], 0) if lse is not None else None)


def _nan_aware_mismatch(op: str, got, want) -> str | None:
    """:func:`mismatch`, with NaN equal to NaN where both have it (NaN inputs give NaN
    outputs; what matters is that they land in the same places). The rows ops move bytes: their
    results compare bit for bit, whatever the dtype."""
    if op in ("gather_rows", "scatter_rows"):
        if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape:
            return mismatch(op, got, want)
        return None if _same(got, want) else "rows differ (bit for bit)"
    def split(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return torch.isnan(x.detach().float().cpu()), torch.nan_to_num(x, nan=0.0, posinf=1e30, neginf=-1e30)
        if isinstance(x, tuple):
            parts = [split(v) for v in x]
            return tuple(p[0] for p in parts), tuple(p[1] for p in parts)
        return None, x

    gm, g = split(got)
    wm, w = split(want)
    if not _same(gm, wm):
        return "NaN in different places"
    if op == "sparse_mla":  # inf, -inf and NaN are placeholders now: compare what is left exactly enough
        if (g[1] is None) != (w[1] is None):  # return_lse=False: lse is None on both sides
            return mismatch(op, g, w)
        return None if all(torch.allclose(a.float().cpu(), b.float().cpu(), rtol=2e-2, atol=2e-2, equal_nan=True)
                           for a, b in zip(g, w) if a is not None) else mismatch(op, g, w)
    return mismatch(op, g, w)


BACKENDS = ("reference", "triton", "torch_ops")

# Where the tensor-level custom op has a different (documented) form than the Python op, so a
# mutation there means something else: the op takes the plan's window as ``W`` (a changed W
# is a changed plan, not a mismatch; prepare_replay_step's ``_plan`` forms too), and ``_out``
# forms take T from their buffers.
TENSOR_FORM = {(op, f"W:={v}") for op in ("gather_replay_batch", "prepare_replay_step")
               for v in ("True", "-1", "0", "None")} | {("swa_indices_and_lens", "num_tokens:=None")}


#: Family cases that mean something else for a custom op: torch's dispatcher resolves a lazy
#: conjugate or negative bit before any custom op runs (and its fallback cannot hand an ``_out``
#: form's conjugate buffer back); a custom op's meta kernel is its fake kernel (shapes only);
#: the custom op takes a plan's host tensors, so a device copy held by the Python plan is none of
#: its inputs.
NOT_THE_TENSOR_FORMS = (":neg-bit", ":conj-", "layout:all-meta", "alias:out-plan-device-copy")


def _rebind(op: str, bound: dict) -> tuple[tuple, dict]:
    params = OPS[op].signature.parameters
    args = tuple(v for n, v in bound.items() if params[n].kind == params[n].POSITIONAL_OR_KEYWORD)
    return args, {n: v for n, v in bound.items() if params[n].kind == params[n].KEYWORD_ONLY}


def backend_fns(name: str):
    """``{op: (fn, reference fn or None)}`` for a backend under test (the host functions
    have one implementation: they run with the reference backend)."""
    ref = sb.select("cpu")
    if name == "reference":
        return {op: (getattr(ref, op), None) for op in OPS} | {op: (_public(op), None) for op in HOST_CASES}
    if name == "triton":
        be = sb.select("cpu", prefer="triton")
        return {op: (getattr(be, op), getattr(ref, op)) for op in OPS if "triton" in be.variants[op]}
    if name == "torch_ops":
        from swa_backends import torch_ops

        return {op: ((lambda *a, _op=op, **k: torch_ops.call(_op, *a, **k)), getattr(ref, op)) for op in OPS}
    raise ValueError(name)


def for_backend(backend: str, op: str, label: str, args, kwargs, expect: str):
    """``(args, kwargs, expect)`` of a case as ``backend`` takes it, or None when the case means
    something else there (the custom ops' schemas and fake kernels)."""
    if backend == "torch_ops":
        if (op, label) in TENSOR_FORM or any(part in label for part in NOT_THE_TENSOR_FORMS):
            return None
        if label.endswith(":=True"):
            # a custom op's schema turns a bool into an int, as torch does for every int argument
            expect = "either"
            name = label.split(":")[0]
            bound = OPS[op].signature.bind(*args, **kwargs).arguments
            bound[name] = 1
            args, kwargs = _rebind(op, bound)
    return args, kwargs, expect


def main(argv: list[str]) -> int:
    backend, seed, start, count, per_op = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    torch.set_num_threads(1)
    fns = backend_fns(backend)
    cases = [c for c in all_cases(seed, per_op) if c[0] in fns]
    for i in range(start, min(len(cases), start + count)):
        op, label, args, kwargs, expect = cases[i]
        fn, ref = fns[op]
        case = for_backend(backend, op, label, args, kwargs, expect)
        if case is None:
            continue
        res = run_case(op, fn, *case, ref)
        print(json.dumps({"i": i, "op": op, "label": label, "expect": expect, **res}), flush=True)
    print(json.dumps({"done": True, "total": len(cases)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
