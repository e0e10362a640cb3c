"""``sparse_mla`` through vLLM's bundled FlashMLA sparse prefill (SM90 / SM100 family).

Vendor call (vLLM 0.33 ``vllm/third_party/flashmla/flash_mla_interface.py``, the FlashMLA
build with DeepSeek-V4 features)::

    flash_mla_sparse_fwd(q [s_q, h_q, d_qk] bf16, kv [s_kv, h_kv=1, d_qk] bf16,
                         indices [s_q, h_kv=1, topk] int32, sm_scale, d_v=512,
                         attn_sink [h_q] fp32 | None, topk_length [s_q] int32 | None, out=None)
        -> (out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32)

Facts the wrapper relies on (the interface's documentation, FlashMLA ``tests/ref.py``):
``d_qk`` in {512, 576}, ``d_v`` = 512, bf16 only; ``h_q`` in {8, 16, 32, 64, 128} on SM90 and
{64, 128} on SM100 (other counts padded); an index is invalid when -1 or >= s_kv, and entries
at ``j >= topk_length[i]`` are ignored; ``topk`` a multiple of the kernel's tile (128 covers
every build); the sink scales the output by ``exp(lse) / (exp(lse) + exp(sink))`` and does not
enter ``lse`` (-inf: no effect); a query with no valid index gets a zero output and
``lse = +inf``.

Adaptation, the reference semantics with no pass over the output:
* kv ``[S, D]`` -> ``[S, 1, D]`` and indices ``[T, K]`` -> ``[T, 1, K']`` (views), with
  ``K' = round_up(K, 128)`` (-1 PAD appended only when needed: the combined layout is a
  multiple of 128 already); ``lens`` is passed as ``topk_length``;
* a head count the build does not serve is zero-padded to the next one it does (its rows are
  sliced off after the call); a served count passes through without a copy;
* FlashMLA's zero output for an empty token is the pack's; its ``lse = +inf`` there becomes
  the pack's ``-inf`` in place on the ``[T, H]`` lse (the only touch-up).
"""

from __future__ import annotations

import functools

import torch

from ..adapters import no_tokens, pad_heads, round_up
from ...common.device import cuda_index, current_device, l2_bytes_of
from ...common.types import PAD, head_block_items
from .probes import find_flashmla

# Head counts each FlashMLA build serves without padding (vLLM 0.33's interface).
HEADS = {9: (8, 16, 32, 64, 128), 10: (64, 128)}
D_QK = (512, 576)
D_V = 512
WIDTH_MULTIPLE = 128  # covers the top-k tile of every build (SM90: 64; SM100: 64 or 128)
DTYPES = (torch.bfloat16,)


@functools.lru_cache(maxsize=None)
def _heads_for(index: int) -> tuple[int, ...]:
    return HEADS.get(torch.cuda.get_device_capability(index)[0], HEADS[10])


def _served_heads(q: torch.Tensor) -> tuple[int, ...]:
    """The head counts the FlashMLA build of ``q``'s device serves (host tensors: the device
    the pack is told it runs on, e.g. an emulated one)."""
    if q.is_cuda:
        return _heads_for(cuda_index(q))
    cap = current_device().capability or (10, 0)
    return HEADS.get(cap[0], HEADS[10])


def input_check(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None,
                return_lse=True) -> list[str]:
    """Per-call reasons this kernel cannot take the call (dispatch falls through)."""
    why = []
    if q.shape[2] not in D_QK:
        why.append(f"FlashMLA sparse prefill needs D_qk in {D_QK}, got {q.shape[2]}")
    if d_v != D_V:
        why.append(f"FlashMLA sparse prefill needs d_v={D_V}, got {d_v}")
    if q.shape[1] > 128:
        why.append(f"FlashMLA sparse prefill serves at most 128 heads (padded to the next count it serves), "
                   f"got {q.shape[1]}")
    return why


#: Where FlashMLA runs before the pack's gluon_ws (the ``AHEAD`` rule of the CUDA backend), chosen
#: from a K sweep (bench/results/h200/bench_flashmla_ksweep.json; bench/README.md, "FlashMLA three
#: ways", where the two cross over): over a cache larger than L2 at 128 heads gluon_ws leads at small
#: K and the lead shrinks as K grows; from K 1536 the two are within the run-to-run spread and
#: FlashMLA ahead at both ends of the range, so FlashMLA goes first there (at K 1152 gluon_ws stayed
#: ahead on average over several runs). At 64 heads the sweeps disagreed within that spread: no rule.
AHEAD_MIN_HEADS = 128
AHEAD_MIN_K = 1536


def ahead_of_gluon_ws(q, kv, indices, lens, sm_scale, d_v, **_kw) -> str | None:
    """Per call, why FlashMLA runs before gluon_ws (None: it does not): at least 128 heads, at
    least 1536 indices per token and a cache spanning more bytes than the device's L2, where
    FlashMLA measured faster on the H200. Shapes and the device's L2 size only: no device work."""
    H, K = q.shape[1], indices.shape[-1]
    if H < AHEAD_MIN_HEADS or K < AHEAD_MIN_K or kv.dim() != 2:
        return None
    l2 = l2_bytes_of(kv)
    size = kv.shape[0] * kv.stride(0) * kv.element_size()
    if l2 is None or size <= l2:
        return None
    return (f"H {H} >= {AHEAD_MIN_HEADS}, K {K} >= {AHEAD_MIN_K} and a {size >> 20} MiB cache > L2 "
            f"({l2 >> 20} MiB): FlashMLA measured faster there (H200)")


#: Where the pack's portable tl kernel (variant ``triton``) runs before FlashMLA (the CUDA backend's
#: second ``AHEAD`` rule): calls of a few tokens, which gluon_ws and gluon decline and FlashMLA would
#: take. Chosen from decode-sized calls in CUDA graphs at K 640 over a 1M-row cache
#: (bench/results/h200/bench_sparse_mla_decode.json; bench/README.md, "Decode sizes: the tl kernel
#: or FlashMLA"): FlashMLA's sparse prefill kernel costs about the same from T 1 to T 32 (one program
#: per token and 64-head block, below one wave), while the tl kernel's split-K grows with the (token,
#: 64-head) items: faster than FlashMLA up to 12 items, slower from 16. Only that K was measured.
TRITON_AHEAD_MAX_ITEMS = 12
TRITON_AHEAD_MAX_K = 640


def triton_ahead_of_flashmla(q, kv, indices, lens, sm_scale, d_v, **_kw) -> str | None:
    """Per call, why the tl kernel runs before FlashMLA (None: it does not): at least 64 heads, at
    most 12 (token, 64-head) items and at most 640 indices per token, where it measured faster on
    the H200. Shapes only: no device work."""
    H, K = q.shape[1], indices.shape[-1]
    items = head_block_items(q.shape[0], H)
    if H < 64 or items > TRITON_AHEAD_MAX_ITEMS or K > TRITON_AHEAD_MAX_K:
        return None
    return (f"{items} (token, 64-head) items <= {TRITON_AHEAD_MAX_ITEMS} and K {K} <= {TRITON_AHEAD_MAX_K}: the "
            "tl kernel's split-K measured faster than FlashMLA there (H200)")


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, *, sink=None, kv_format="rows", fp8=None, return_lse=True):
    """The reference's ``(out, lse)`` computed by FlashMLA's sparse prefill kernel (KV rows
    only: the variant declares ``kv_format="rows"``, dispatch sends records elsewhere)."""
    T, H, D = q.shape
    if T == 0:
        return no_tokens(q, d_v, return_lse)
    mod, why = find_flashmla()
    if mod is None:
        raise RuntimeError(why)
    heads = next(h for h in _served_heads(q) if H <= h)
    qp, sp = pad_heads(q, sink, heads)
    K = indices.shape[1]
    width = max(WIDTH_MULTIPLE, round_up(K, WIDTH_MULTIPLE))
    idx = indices if width == K else torch.nn.functional.pad(indices, (0, width - K), value=PAD)
    out, _max_logits, lse = mod.flash_mla_sparse_fwd(
        qp, kv.unsqueeze(1), idx.unsqueeze(1), float(sm_scale), d_v, attn_sink=sp,
        topk_length=lens.contiguous())  # the vendor reads it flat; validation allows a strided view (no copy if flat)
    if heads != H:
        out = out[:, :H].contiguous()
    if not return_lse:  # FlashMLA computes it anyway: nothing to save but the touch-up
        return out, None
    if heads != H:
        lse = lse[:, :H].contiguous()
    lse.masked_fill_(lse == float("inf"), float("-inf"))  # nothing to read: the pack's -inf
    return out, lse
