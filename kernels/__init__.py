"""Portable Triton kernels, one op per module, registered by every platform that can run
them (``Platform.variants``: CUDA and ROCm register :data:`PORTABLE`, CUDA also the Hopper
Gluon kernels). This ``__init__`` only declares the variants (no Triton import): kernel modules
are imported when a variant is first called.

On a CPU the ``triton`` variants run in Triton's interpreter, only in a process started with
``TRITON_INTERPRET=1`` (Triton fixes compiled or interpreted when it decorates a kernel) and
only when asked for by name (``select("cpu", prefer="triton")``).
"""

from __future__ import annotations

import functools

import torch

from ..common.ops._records import KV_FORMATS
from ..common.registry import Variant, import_reason, load_attr, register_probe

# no ``platforms``: they run on the platforms that register them
_TRITON = dict(
    emulated_on=("cpu",),
    requires=("triton",),
    emulated_requires=("triton_interpreter",),
)

# op -> (module:function, what to know); every one graph-safe (see each module)
METADATA_KERNELS = {
    "batch_replay_start": ("batch_replay_start:batch_replay_start", "one lane per batch row"),
    "pad_replayed_slots": ("pad_replayed_slots:pad_replayed_slots",
                           "in place, one lane per token; stores only PAD into replayed cacheable slots"),
    "compressed_slot_mapping": ("compressed_slot_mapping:compressed_slot_mapping", "one lane per token (ratio 1: a copy)"),
    "swa_indices_and_lens": ("swa_indices_and_lens:swa_indices_and_lens",
                             "tokens x columns tiles; graph-safe when num_tokens (or valid) is given"),
    "prefill_gather_lens": ("prefill_gather_lens:prefill_gather_lens", "one lane per request"),
    "combined_indices": ("combined_indices:combined_indices", "tokens x columns tiles"),
    "mixed_indices": ("mixed_indices:mixed_indices", "tokens x columns tiles"),
    "plain_indices": ("plain_indices:plain_indices", "tokens x columns tiles"),
    "indices_to_csr": ("indices_to_csr:indices_to_csr", "three launches: counts, scan, compaction"),
    "gather_replay_batch": ("gather_replay_batch:gather_replay_batch",
                            "one launch; graph-safe once the plan's device copy exists (plan.device_dropped_before)"),
    "gather_rows": ("rows:gather_rows", "wide word copies, int64 offsets"),
    "scatter_rows": ("rows:scatter_rows", "memset + wide word copies, int64 offsets"),
    "prepare_replay_step": ("prepare_replay_step:prepare_replay_step",
                            "ONE launch: replay start, padding, window indices and the sub-batch"),
}

# op -> module:function of its validated form (``Variant.self_checked``): the kernel tests the
# values itself
SELF_CHECKED = {
    "batch_replay_start": "batch_replay_start:batch_replay_start_checked",
    "pad_replayed_slots": "pad_replayed_slots:pad_replayed_slots_checked",
    "prefill_gather_lens": "prefill_gather_lens:prefill_gather_lens_checked",
    "mixed_indices": "mixed_indices:mixed_indices_checked",
    "indices_to_csr": "indices_to_csr:indices_to_csr_checked",
    "compressed_slot_mapping": "compressed_slot_mapping:compressed_slot_mapping_checked",
    "swa_indices_and_lens": "swa_indices_and_lens:swa_indices_and_lens_checked",
    "combined_indices": "combined_indices:combined_indices_checked",
    "plain_indices": "plain_indices:plain_indices_checked",
    "gather_rows": "rows:gather_rows_checked",
    "gather_replay_batch": "gather_replay_batch:gather_replay_batch_checked",
    "prepare_replay_step": "prepare_replay_step:prepare_replay_step_checked",
    "scatter_rows": "rows:scatter_rows_checked",
}

#: The metadata ops' Triton kernels.
METADATA: tuple[Variant, ...] = tuple(
    Variant(op=op, name="triton", impl=f"swa_backends.kernels.{impl}", warmup="swa_backends.kernels.warmup:warmup",
            self_checked=f"swa_backends.kernels.{SELF_CHECKED[op]}" if op in SELF_CHECKED else None,
            description=f"portable Triton kernel ({what})", **_TRITON)
    for op, (impl, what) in METADATA_KERNELS.items()
)

# sparse_mla: three kernels, each its own variant. On sm90 the platform priority tries the two
# Gluon kernels first; their per-call check (kernels/sparse_mla_gluon.py:input_check) sends
# decode-sized calls and other head dims to the portable tl kernel, and so does their format:
# they read KV rows only, the tl kernel also every paged record format (both FP8 flavours).
_ATTENTION = dict(index_layout="plain", clamps_window=True)
_GLUON = dict(platforms=("cuda",), archs=("sm90",), min_capability=(9, 0), max_capability=(9, 0),
              dtypes=(torch.bfloat16, torch.float16), input_check="swa_backends.kernels.sparse_mla_gluon:input_check",
              kv_formats=("rows",), **_ATTENTION)


def _rows_kernel(module: str, q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None,
                 return_lse=True):
    """A Gluon kernel (written before ``kv_format`` / ``fp8`` / ``return_lse``) with the op's
    signature: dispatch gives it rows only (``kv_formats``); its lse costs nothing extra (the
    kernel computes it for its own softmax), so ``return_lse=False`` only drops it."""
    out, lse = _kernel(module)(q, kv, indices, lens, sm_scale, d_v, sink=sink)
    return out, (lse if return_lse else None)


@functools.cache
def _kernel(module: str):
    return load_attr(f"swa_backends.kernels.{module}:sparse_mla")


def gluon_ws_sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None,
                        return_lse=True, gate=None):
    """Variant ``gluon_ws``: :mod:`swa_backends.kernels.sparse_mla_gluon_ws` (gated: ``gate`` the
    flag of :mod:`swa_backends.kernels.sparse_mla_check`)."""
    out, lse = _kernel("sparse_mla_gluon_ws")(q, kv, indices, lens, sm_scale, d_v, sink=sink, gate=gate)
    return out, (lse if return_lse else None)


def gluon_sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None,
                     return_lse=True):
    """Variant ``gluon``: :mod:`swa_backends.kernels.sparse_mla_gluon`."""
    return _rows_kernel("sparse_mla_gluon", q, kv, indices, lens, sm_scale, d_v, sink=sink, return_lse=return_lse)


#: The Hopper Gluon kernels (sm90: only CUDA registers them).
GLUON: tuple[Variant, ...] = (
    Variant(
        op="sparse_mla", name="gluon_ws", impl="swa_backends.kernels:gluon_ws_sparse_mla",
        requires=("triton", "gluon_ws"), warmup="swa_backends.kernels.sparse_mla_gluon_ws:warmup", gated=True,
        description="persistent warp-specialised Gluon kernel (Hopper wgmma + mbarriers; D 512, H >= 64, "
                    "prefill-sized calls)",
        **_GLUON,
    ),
    Variant(
        op="sparse_mla", name="gluon", impl="swa_backends.kernels:gluon_sparse_mla",
        requires=("triton", "gluon"),
        description="one-item-per-program Gluon kernel (Hopper wgmma, cp.async look-ahead; D 512, H >= 64, "
                    "prefill-sized calls)",
        **_GLUON,
    ),
)

#: The sparse-MLA Triton kernel.
ATTENTION: tuple[Variant, ...] = (
    Variant(
        op="sparse_mla", name="triton", impl="swa_backends.kernels.sparse_mla:sparse_mla",
        dtypes=(torch.bfloat16, torch.float16), warmup="swa_backends.kernels.sparse_mla:warmup",
        kv_formats=KV_FORMATS,  # every format and FP8 flavour (test_sparse_mla_records.py checks each)
        description="portable Triton sparse-MLA forward (plain layout: PAD anywhere skipped; fp32 softmax; "
                    "split-K decode); KV rows or paged V4 / V4.1 records dequantized in registers",
        **_ATTENTION, **_TRITON,
    ),
)

#: Every Triton kernel that runs wherever Triton compiles for the device (CUDA, ROCm).
PORTABLE: tuple[Variant, ...] = METADATA + ATTENTION
#: Every variant declared here, in the order tables list them.
VARIANTS: tuple[Variant, ...] = METADATA + GLUON + ATTENTION

#: How a validated call reads its value checks on a device that runs these kernels
#: (``Platform.value_reader``): one Triton pass and one copy.
VALUE_READER = "swa_backends.kernels.value_read:read"


def _gluon_probe(module: str) -> str | None:
    """The Gluon API a kernel module needs, asked of this Triton (imports Triton; only run
    when a CUDA device is assessed)."""
    why = import_reason("triton.experimental.gluon", what="Triton's Gluon dialect")
    if why:
        return why
    why = import_reason(module, attr="api_reason", what=module.rsplit(".", 1)[-1])
    return why or load_attr(f"{module}:api_reason")()


@register_probe("gluon")
def _probe_gluon() -> str | None:
    return _gluon_probe("swa_backends.kernels.sparse_mla_gluon")


@register_probe("gluon_ws")
def _probe_gluon_ws() -> str | None:
    return _gluon_probe("swa_backends.kernels.sparse_mla_gluon_ws")
