"""Sparse-MLA inputs, baselines and checks shared by the benchmarks and experiments.

The grid the FlashMLA and validation benchmarks time (:data:`CELLS`: H 64 / 128 x K 640 / 1152 x
T 4K / 16K x a 1M-row and a 16K-row bf16 latent cache, ``D_qk = d_v = 512``), random inputs with
PAD patterns (:func:`make_inputs`), the torch-native baseline (:func:`torch_baseline`), the
check of any path against the fp32 reference (:func:`check`), the table's kernel columns
(:func:`build_kernels`), paged record caches (:func:`record_cache`) and a copy of a kernel
module loaded beside the pack's (:func:`load_module_copy`, for A/B runs of a kernel change).
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import importlib.util
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

import swa_backends
from swa_backends.common.ops import OPS
from swa_backends.dispatch import variant as declared_variant
from swa_backends.testing.conformance import mismatch

REF = OPS["sparse_mla"].reference
D = DV = 512
CELLS = [(H, K, T, S) for H in (64, 128) for K in (640, 1152) for T in (4096, 16384) for S in (1 << 20, 1 << 14)]
#: records runs: index width (SWA 128 + top-k 512), rows of the cache, records per page
RECORDS_K, RECORDS_S, RECORDS_BS = 640, 1 << 20, 64


def tflops(T, H, K, D, DV, ms) -> float:
    """2*T*H*K*(D_qk + d_v) / time."""
    return 2.0 * T * H * K * (D + DV) / (ms * 1e-3) / 1e12


def parse_cells(text: str) -> list[tuple[int, int, int, int]]:
    """``--cells``: ``"H:K:T:ROWS,..."`` -> ``[(H, K, T, ROWS), ...]`` (empty text: none), every value
    a positive integer, K at most ROWS (the indices are distinct rows of the cache)."""
    cells = []
    for part in filter(None, text.split(",")):
        values = part.split(":")
        if len(values) != 4 or not all(v.isdigit() and int(v) > 0 for v in values) or int(values[1]) > int(values[3]):
            raise ValueError(f"--cells: {part!r}; expected H:K:T:ROWS, four positive integers with K <= ROWS")
        cells.append(tuple(int(v) for v in values))
    return cells


def torch_baseline(q, kv, indices, lens, sm_scale, d_v, sink=None, max_bytes=2 << 30):
    """Torch-native sparse MLA: gather rows, bmm, fp32 softmax (+sink), bmm; chunked over
    tokens so the gathered rows stay under ``max_bytes``."""
    T, H, Dq = q.shape
    K = indices.shape[1]
    out = torch.empty(T, H, d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    chunk = max(1, max_bytes // (K * Dq * q.element_size()))
    j = torch.arange(K, device=q.device)
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        idx = indices[s:e].long()
        ok = (j[None, :] < lens[s:e, None]) & (idx >= 0)
        rows = kv[idx.clamp(min=0)]  # [t, K, D] gather
        sc = torch.bmm(q[s:e], rows.transpose(1, 2)).float() * sm_scale  # [t, H, K]
        sc.masked_fill_(~ok[:, None, :], float("-inf"))
        lse_ = torch.logsumexp(sc, dim=-1)
        den = lse_ if sink is None else torch.logaddexp(lse_, sink[None, :])
        p = torch.exp(sc - torch.where(torch.isfinite(den), den, 0.0)[..., None])
        out[s:e] = torch.bmm(p.to(q.dtype), rows[..., :d_v])
        lse[s:e] = lse_
    return out, lse


def make_inputs(T, H, K, D, *, kv, pads=False, seed=0, dev="cuda", dtype=torch.bfloat16):
    """Random q (never zeros), random valid indices into ``kv``, a sink; ``pads`` adds PAD
    inside the length, all-PAD rows, short and empty rows and whole PAD tiles."""
    g = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(T, H, D, generator=g, device=dev, dtype=torch.float32).to(dtype)
    idx = torch.randint(0, kv.shape[0], (T, K), generator=g, device=dev, dtype=torch.int32)
    lens = torch.full((T,), K, dtype=torch.int32, device=dev)
    if pads:
        hole = torch.rand(T, K, generator=g, device=dev) < 0.2
        idx = torch.where(hole, torch.full_like(idx, -1), idx)
        lens = torch.randint(0, K + 1, (T,), generator=g, device=dev, dtype=torch.int32)
        lens[::7] = K
        lens[3::11] = 0
        idx[5::13] = -1
        idx[6::17, 16:48] = -1  # whole tiles of PAD inside the length
    sink = torch.randn(H, generator=g, device=dev)
    return q, idx, lens, sink


def check(got, q, kv, idx, lens, scale, d_v, sink, n=None, want=None, **records) -> tuple[str | None, float]:
    """(``mismatch()`` of the first ``n`` tokens against the fp32 torch reference, relative error
    of the output); ``records``: ``kv_format`` / ``fp8`` of a record cache; ``want``: the
    reference's result for those tokens, when the caller computed it already."""
    n = q.shape[0] if n is None else min(n, q.shape[0])
    if want is None:
        want = REF(q[:n], kv, idx[:n], lens[:n], scale, d_v, sink=sink, **records)
    out = (got[0][:n], got[1][:n])
    why = mismatch("sparse_mla", out, want)
    o, w = out[0].float(), want[0].float()
    rel = float((o - w).norm() / w.norm().clamp_min(1e-6))
    return why, rel


# ---------------------------------------------------------------------------------------
# the kernel columns of a table
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Kernel:
    """One column of a table: ``call(q, kv, idx, lens, scale, d_v, sink) -> (out, lse)``;
    ``why_not`` says why it does not run here at all; ``per_call`` gives the reasons it
    would not take one call (None: it takes every call)."""

    name: str
    call: object = None
    why_not: str | None = None
    per_call: object = None
    jit_fns: tuple = ()
    label: object = None  # call args -> a label for the row (config, dispatched variant)
    backend: object = None  # "default": the Backend of select(device)


def build_kernels(device_info, tdev, wanted) -> dict[str, Kernel]:
    """The columns in ``wanted`` among ``torch`` (:func:`torch_baseline`), ``triton`` (the tl
    kernel with its table config), ``gluon`` / ``gluon_ws`` (the Gluon variants: not under
    Triton's interpreter), ``default`` (``select(device).sparse_mla`` with validation off, naming
    the variant it ran) and ``validated`` (the same call with validation on: the default a user
    gets), each with the reason it cannot run here where it cannot."""
    from swa_backends.kernels import sparse_mla as tl_mod

    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    out: dict[str, Kernel] = {}
    if "torch" in wanted:
        out["torch"] = Kernel("torch", call=lambda q, kv, i, l, s, dv, sink: torch_baseline(q, kv, i, l, s, dv, sink),
                              label=lambda *a: "gather + 2 bmm")
    if "triton" in wanted:
        v = declared_variant("sparse_mla", "triton")
        why = v.not_supported_reasons(device_info)

        def tl_cfg(q, kv, idx, *_):
            T, H, D = q.shape
            return tl_mod.pick_config(T, H, D, D, idx.shape[1], tdev)

        out["triton"] = Kernel(
            "triton", why_not="; ".join(why) or None,
            call=lambda q, kv, i, l, s, dv, sink: tl_mod.launch(q, kv, i, l, s, dv, sink, config=tl_cfg(q, kv, i)),
            jit_fns=(getattr(tl_mod, "_sparse_mla_fwd", None), getattr(tl_mod, "_sparse_mla_combine", None)),
            label=lambda *a: "table " + tl_cfg(*a).short())
    for name, module, fn in (("gluon", "sparse_mla_gluon", "_sparse_mla_gluon_fwd"),
                             ("gluon_ws", "sparse_mla_gluon_ws", "_sparse_mla_gluon_ws_fwd")):
        if name not in wanted:
            continue
        v = declared_variant("sparse_mla", name)
        if interpret:
            out[name] = Kernel(name, why_not="TRITON_INTERPRET=1: Gluon kernels do not run in Triton's interpreter")
            continue
        why = v.not_supported_reasons(device_info)
        if why:
            out[name] = Kernel(name, why_not="; ".join(why))
            continue
        try:
            impl = v.load()  # the variant: the Gluon kernel under the op's signature (kernels/__init__.py)
            mod = importlib.import_module(f"swa_backends.kernels.{module}")
        except Exception as exc:  # noqa: BLE001 - a variant that does not import is a reason, not a crash
            out[name] = Kernel(name, why_not=f"import failed: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        out[name] = Kernel(name, call=lambda q, kv, i, l, s, dv, sink, impl=impl: impl(q, kv, i, l, s, dv, sink=sink),
                           per_call=lambda q, kv, i, l, s, dv, sink, v=v: v.input_reasons((q, kv, i, l, s, dv),
                                                                                        {"sink": sink}),
                           jit_fns=(getattr(mod, fn, None),), label=lambda *a, name=name: name)
    if "default" in wanted:
        backend = swa_backends.select(device_info)
        out["default"] = Kernel(
            "default", call=lambda q, kv, i, l, s, dv, sink: backend.sparse_mla(q, kv, i, l, s, dv, sink=sink),
            label=lambda q, kv, i, l, s, dv, sink: backend.variant_for("sparse_mla", q, kv, i, l, s, dv, sink=sink),
            backend=backend)
    if "validated" in wanted:  # what a user timing the default call as it comes gets: validation on
        checked = swa_backends.select(device_info)

        def validated(q, kv, i, l, s, dv, sink):
            with swa_backends.validation(True):
                return checked.sparse_mla(q, kv, i, l, s, dv, sink=sink)

        out["validated"] = Kernel(
            "validated", call=validated, backend=checked,
            label=lambda q, kv, i, l, s, dv, sink: checked.variant_for("sparse_mla", q, kv, i, l, s, dv, sink=sink))
    return out


# ---------------------------------------------------------------------------------------
# paged record caches
# ---------------------------------------------------------------------------------------


def random_rows(S: int, dev, seed: int = 11) -> torch.Tensor:
    """``[S, D]`` random bf16 rows: the cache the records runs quantize."""
    g = torch.Generator(device=dev).manual_seed(seed)
    return torch.randn(S, D, generator=g, device=dev).to(torch.bfloat16)


def records_setup(out: Path, time_note: str):
    """``(device, bf16 rows [RECORDS_S, D], result dict with its meta)`` of a records run on this
    GPU writing to ``out`` (created)."""
    from . import results

    dev = torch.device("cuda", torch.cuda.current_device())
    Path(out).mkdir(parents=True, exist_ok=True)
    meta = {**results.machine(dev), "K": RECORDS_K, "cache_slots": RECORDS_S, "page": RECORDS_BS, "time": time_note}
    return dev, random_rows(RECORDS_S, dev), {"meta": meta, "rows": []}


def record_cache(fmt: str, rows, dev, *, fp8: str = "e4m3fn", bs: int = RECORDS_BS):
    """``rows`` written into a new ``fmt`` record cache of ``bs`` records per page (the last
    page partly filled), in chunks that keep the torch writer's fp32 temporaries small."""
    from swa_backends.common.ops import _records as R

    n = rows.shape[0]
    kv = R.new_cache(-(-n // bs), bs, fmt, device=dev)
    for c in range(0, n, 1 << 15):
        e = min(n, c + (1 << 15))
        R.write(kv, rows[c:e], torch.arange(c, e, device=dev), fmt, fp8)
    return kv


def time_configs(configs, launch, want, timer, deadline: float = math.inf) -> dict:
    """``{short name: time}`` of ``launch(config)`` per config, each output first checked against
    ``want`` (bf16 tolerance): ``"wrong"`` or ``"error: <type>"`` instead of a time; configs
    reached past ``deadline`` (``time.time()``) are left out."""
    out = {}
    for cfg in configs:
        if time.time() > deadline:
            break
        try:
            got = launch(cfg)
            if not torch.allclose(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2):
                out[cfg.short()] = "wrong"
                continue
            out[cfg.short()] = timer(lambda: launch(cfg))
        except Exception as exc:  # noqa: BLE001 - a config that does not build is a finding
            out[cfg.short()] = f"error: {type(exc).__name__}"
    return out


# ---------------------------------------------------------------------------------------
# a kernel module's copy beside the pack's (A/B runs of a kernel change)
# ---------------------------------------------------------------------------------------


def before_after_args(doc: str, kernel_file: str, argv=None, **extra):
    """The arguments of a before/after experiment (``--before`` a copy of ``kernels/<kernel_file>``,
    ``--out``, ``extra``: ``{flag: default int}``), after its refusals: a ``--before`` that is no
    file (ValueError), a machine without a CUDA GPU (SystemExit). ``--out`` is made then."""
    import argparse

    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--before", type=Path, required=True, help=f"a copy of kernels/{kernel_file} to compare")
    p.add_argument("--out", type=Path, required=True)
    for flag, default in extra.items():
        p.add_argument(f"--{flag}", type=int, default=default)
    args = p.parse_args(argv)
    if not args.before.is_file():
        raise ValueError(f"--before: {str(args.before)!r} is not a file; expected a copy of kernels/{kernel_file}")
    if not torch.cuda.is_available():
        raise SystemExit(f"{Path(sys.argv[0]).stem}: needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def parse_copies(flag: str, items: list[str], what: str = "an existing file", taken=()) -> dict[str, Path]:
    """``LABEL=FILE`` items of ``flag`` (``--variant``, ``--extra``, ...) -> ``{label: file}``, checked
    before anything runs: ValueError naming the item when LABEL is no identifier, is given twice or is one
    of ``taken`` (the script's own paths), or FILE is not a file (``what`` says which). A ``.diff`` the
    kernel has moved away from is refused here, naming its hunk."""
    from .patch import patched

    files: dict[str, Path] = {}
    for item in items:
        label, _, file = item.partition("=")
        if not label.isidentifier() or label in files or label in taken or not Path(file).is_file():
            raise ValueError(f"{flag}: {item!r}; expected LABEL=FILE, LABEL an identifier not given before, FILE "
                             f"{what}")
        if file.endswith(".diff"):
            patched(Path(file))
        files[label] = Path(file)
    return files


def load_module_copy(name: str, path: Path):
    """The module in ``path`` (a copy of one of ``kernels/*.py``, e.g. ``git show
    <rev>:kernels/sparse_mla_gluon_ws.py``) imported as ``swa_backends.kernels.<name>``, a sibling
    of the pack's kernels (its relative imports resolve there) with compiled kernels of its own.
    A ``.diff`` (``bench/experiments/candidates/``) is applied strictly to the file it names
    (:func:`lib.patch.patched`), the result written to a directory of this user's own."""
    path = Path(path)
    if path.suffix == ".diff":
        from .patch import patched

        text = patched(path)  # refused here, naming the hunk, when the kernel has moved on
        folder = tempfile.mkdtemp(prefix="swa_copy_")  # mode 0700: nobody else writes it
        atexit.register(shutil.rmtree, folder, True)  # kept while the process runs: Triton reads the source
        path = Path(folder) / f"{path.stem}.py"
        path.write_text(text)
    full = f"swa_backends.kernels.{name}"
    spec = importlib.util.spec_from_file_location(full, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[full] = mod
    spec.loader.exec_module(mod)
    return mod
