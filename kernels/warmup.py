"""``Backend.warmup()`` for the Triton variants: compile everything the serving path launches.

Why real launches: Triton's compile-only warmup (``kernel.warmup(...)``) fills Triton's
compile cache, but neither loads the module onto the device (done on the first launch)
nor fills this pack's launch cache (``_launch.Kernel``), whose entries are made by a real
launch. So the hook runs each op of the backend whose chosen variant is ``triton`` -- the
calls the op declares beside its reference (``OpSpec.warmup``) -- on a small synthetic
serving step -- replaying prefills (``R > 0``, padded slots, clamped
windows), a decode, a cold prefill longer than ``W`` (so the decoder sub-batch trims) with
graph padding -- once for every specialisation the op's launcher can pick: the optional
inputs (``valid``, top-k), the index dtypes, the compression ratios, the hidden sizes and
dtypes of the row copies, and the fused step with and without padding and plan, in each
serving layout and launch tile. A backend that validates (``select(checked=True)``, the default)
runs them validated and unvalidated: its validated calls launch the kernels that test their own
values (``Variant.self_checked``), its calls with validation off the plain ones; ``validated=False``
(a caller that serves with validation off: ``sb.validation(False)``) or ``True`` warms up only
those. (``prepare_replay_step`` alone has 128 specialisations of each kind.)

The specialisation keys never depend on sizes (token and request counts, strides, W are
runtime arguments that Triton is told not to specialise on) but for one choice:
``prepare_replay_step``'s token tile follows the step's token count, and each tile is
launched here (forced on the small step: :data:`LAUNCH_SCOPES`). So after this a serving step of any size
compiles nothing new. Row copies are specialised on 16-byte alignment of the
hidden-state buffers: freshly allocated buffers are aligned, and so are serving buffers.
"""

from __future__ import annotations

import contextlib

import torch

from ..common.ops import OPS
from ..common.ops._steps import WarmupStep
from ..common.validation import validation

_VIA_TRITON = "triton"


def _tiles():
    """``prepare_replay_step``'s launch tile follows the step's token count: each tile forced in turn."""
    from .prepare_replay_step import TILES, forced_tile

    return [lambda tile=tile: forced_tile(tile) for tile in TILES]


#: Launch choices of a kernel that depend on the step's size rather than its inputs' kinds: the
#: op's warmup calls run once inside each (op -> the scopes, made when the kernel is warmed up).
LAUNCH_SCOPES = {"prepare_replay_step": _tiles}


def warmup(backend, *, W: int = 128, block_size: int = 64, num_groups: int = 5, index_width: int | None = None,
           compress_ratios=(4, 128), top_k: int = 512, hidden_sizes=(7168,), hidden_dtypes=(torch.bfloat16,),
           index_dtypes=(torch.int32, torch.int64), validated: bool | None = None, **_other) -> list[str]:
    """Launch every Triton kernel specialisation the serving path uses, through
    ``backend``'s own ops (so the variants it chose are the ones warmed up): the calls every op
    whose chosen chain has a ``triton`` variant declares (``OpSpec.warmup``) on a small
    serving step (``WarmupStep``), in ``OPS`` order.

    ``W``/``block_size``/``num_groups``/``index_width``: the model's window, KV block size,
    slot groups and window index width; ``compress_ratios``: compressed caches' ratios;
    ``top_k``: top-k width of the combined/mixed layouts; ``hidden_sizes``/``hidden_dtypes``:
    rows moved by gather/scatter; ``index_dtypes``: dtypes of the per-request replay starts
    and the batch->request mapping; ``validated``: on a validating backend, the validated calls
    only (True), the unvalidated ones only (False) or both (None). Unknown keyword arguments (other
    hooks') are ignored. Returns the ops it ran.
    """
    if not backend.device.runnable:
        return []
    dev = torch.device(backend.device.torch_device)
    step = WarmupStep(dev, W=W, block_size=block_size, num_groups=num_groups, index_width=index_width,
                      compress_ratios=compress_ratios, top_k=top_k, hidden_sizes=hidden_sizes,
                      hidden_dtypes=hidden_dtypes, index_dtypes=index_dtypes)
    ran: list[str] = []
    for op, spec in OPS.items():
        if spec.warmup is None or _VIA_TRITON not in backend.variants.get(op, ()):
            continue
        fn = getattr(backend, op)
        scopes = LAUNCH_SCOPES[op]() if op in LAUNCH_SCOPES else [contextlib.nullcontext]
        checks = (None,)
        if getattr(backend, "checked", False) and spec.quick_check is not None:
            checks = (True, False) if validated is None else (bool(validated),)
        for scope in scopes:
            for checked in checks:
                with scope(), (validation(checked) if checked is not None else contextlib.nullcontext()):
                    for args, kwargs in spec.warmup(step):
                        fn(*args, **kwargs)
                        if op not in ran:
                            ran.append(op)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return ran
