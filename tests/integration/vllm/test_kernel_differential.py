"""The pack against vLLM's own replay-metadata kernels, launch for launch.

Each of vLLM 0.33's four kernels the integration replaces (slot padding, clamped window
indices and lengths, prefill gather lengths, the decoder sub-batch gather) is launched as
vLLM launches it, and the pack's adapter (``swa_backends.integrations.vllm.runtime``, the
code the patches and the model state call) runs on the same inputs and identically poisoned
output buffers; every written tensor must be bit-identical.

Where vLLM's kernels come from (``swa_backends.testing.vllm_kernels.load``): the installed vLLM, or -- on a GPU
machine without vLLM -- copies of its two source files named by ``SWA_VLLM_KERNELS_DIR``.
Without either the module is skipped. Runs on CUDA when there is a device (``SWA_DIFF_DEVICE``
overrides), else on the CPU with Triton's interpreter (``TRITON_INTERPRET=1``, and for an
installed vLLM ``CUDA_VISIBLE_DEVICES=`` so that vLLM keeps the real Triton).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import _cases
from swa_backends.testing import vllm_kernels as vk
from swa_backends import select
from swa_backends.integrations.vllm import runtime

KERNELS, ORIGIN = vk.load()
if KERNELS is None:
    pytest.skip(ORIGIN, allow_module_level=True)

DEVICE = os.environ.get("SWA_DIFF_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
# CPU: the torch reference (the default there) and the Triton kernels under the interpreter;
# GPU: the Triton kernels (the default there) and the torch reference.
VARIANTS = ("reference", "triton")


@pytest.fixture(scope="module", params=VARIANTS)
def be(request):
    return select(torch.device(DEVICE), prefer=request.param)


def _cases_list():
    out = []
    for seed in (0, 1):
        for name, _ in _cases.mixed_batches(seed, device="cpu"):
            out.append((seed, name))
    return out


def _batch(seed: int, name: str):
    return dict(_cases.mixed_batches(seed, device=DEVICE))[name]


def _poison(shape, dtype, seed=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-9999, 9999, shape, generator=g).to(dtype).to(DEVICE)


CASES = _cases_list()
IDS = [f"{name}-{seed}" for seed, name in CASES]


def test_kernels_come_from_where_the_environment_says():
    """The copies named by SWA_VLLM_KERNELS_DIR when it is set (the GPU machine), else the
    installed vLLM of the release the integration supports: never a silent mix."""
    from swa_backends.integrations import vllm as integration

    print("vLLM kernels from:", ORIGIN)
    source = os.environ.get(vk.ENV)
    if source:
        assert ORIGIN == f"source files under {Path(source)}"
    else:  # the installed vLLM, one of the supported releases (CI installs each)
        version = integration.vllm_version()
        assert ORIGIN == f"installed vllm {version}" and integration.supported(version)
    # vLLM's own kernels, never the pack's shims over them
    assert not any(hasattr(k, "_swa_original") for k in (KERNELS.pad, KERNELS.gather, KERNELS.swa, KERNELS.prefill))


@pytest.mark.parametrize("seed,name", CASES, ids=IDS)
def test_pad_replayed_slots(be, seed, name):
    b = _batch(seed, name)
    groups = torch.tensor(b.cacheable, dtype=torch.int32, device=DEVICE)
    want = b.slots.clone()
    vk.pad_replayed_slots(KERNELS, want, groups, b.qsl, b.positions, b.R_t, b.W, b.B_all)
    got = b.slots.clone()
    runtime.pad_replayed_slots(be, got, groups, b.qsl, b.positions, b.R_t, b.W, b.B_all)
    assert torch.equal(got, want)
    if b.R[: b.num_reqs].any():
        assert not torch.equal(want, b.slots), "the case pads nothing"


@pytest.mark.parametrize("seed,name", CASES, ids=IDS)
def test_swa_indices_and_lens(be, seed, name):
    b = _batch(seed, name)
    D, N = b.num_decode_tokens, b.T_pad
    g = 1  # the window group
    valid = b.slots[g] >= 0
    if b.T:  # a few invalid tokens inside the batch too (their rows must be all PAD)
        valid[torch.arange(0, b.T, 7, device=DEVICE)] = False
    t2r = vk.token_to_req_indices(b.qsl, N)
    for width in (b.W, b.W + 5):
        for token_offset, num_tokens in ((0, D), (D, N - D)):
            buf_w = _poison((N + 4, 1, width), torch.int32)
            lens_w = _poison((N + 4,), torch.int32, seed=8)
            buf_g, lens_g = buf_w.clone(), lens_w.clone()
            vk.swa_indices_and_lens(KERNELS, buf_w, lens_w, b.W, width, b.qsl,
                                    b.seq, t2r, valid, b.block_tables[g], b.block_size, b.R_t, num_tokens=num_tokens,
                                    token_offset=token_offset)
            assert runtime.swa_indices_and_lens(be, buf_g, lens_g, b.W, width, b.qsl, b.seq, valid, b.block_tables[g],
                                                b.block_size, b.R_t, num_tokens=num_tokens, token_offset=token_offset)
            assert torch.equal(lens_g, lens_w), (token_offset, width)
            assert torch.equal(buf_g, buf_w), (token_offset, width)


@pytest.mark.parametrize("seed,name", CASES, ids=IDS)
def test_prefill_gather_lens(be, seed, name):
    b = _batch(seed, name)
    nd, n_pre = b.num_decodes, b.B_all - b.num_decodes
    if n_pre == 0:
        pytest.skip("no prefill")
    want = _poison((n_pre,), torch.int32)
    got = want.clone()
    vk.prefill_gather_lens(KERNELS, want, b.seq, b.qsl, b.R_t, n_pre, nd, b.W)
    runtime.prefill_gather_lens(be, got, b.seq, b.qsl, b.R_t, n_pre, nd, b.W)
    assert torch.equal(got, want)


@pytest.mark.parametrize("pad_to", [0, 3])
@pytest.mark.parametrize("seed,name", CASES, ids=IDS)
def test_gather_replay_batch(be, seed, name, pad_to):
    b = _batch(seed, name)
    B = b.B_all
    kept = b.kept_lens
    n = int(kept.sum())
    n_pad = n + pad_to
    max_tokens = b.T_pad + 8
    G = b.slots.shape[0]
    dropped_np = runtime.dropped_before(kept, b.qsl_np)
    dropped = torch.tensor(dropped_np, device=DEVICE)
    # vLLM's persistent buffers, poisoned identically
    bufs = {"rows": _poison((max_tokens,), torch.int64), "qsl": _poison((B + 3,), torch.int32),
            "pos": _poison((max_tokens,), torch.int64), "slots": _poison((G, max_tokens), torch.int64),
            "kv": _poison((B + 3,), torch.int32)}
    mine = {k: v.clone() for k, v in bufs.items()}
    kept_w = vk.gather_replay_batch(KERNELS, b.qsl, dropped, b.seq, b.R_t, b.positions, b.slots, bufs["rows"],
                                    bufs["qsl"], bufs["pos"], bufs["slots"], bufs["kv"], b.W, B, n, n_pad)
    plan = runtime.replay_plan(kept, b.qsl_np, n_pad, b.W, dropped=dropped_np, device_dropped=dropped)
    assert plan.device_dropped_before(b.positions.device) is dropped  # no copy of the plan's own
    kept_g = mine["slots"][:, :n_pad]  # vLLM's own [:, :n_pad] view of its [G, max_tokens] buffer
    out = {"rows": mine["rows"][:n_pad], "query_start_loc": mine["qsl"][: B + 1], "positions": mine["pos"][:n_pad],
           "slot_mappings": kept_g, "kv_start": mine["kv"][:B]}
    runtime.gather_replay_batch(be, plan, b.qsl, b.seq, b.R_t, b.positions, b.slots, b.W, out)
    # what vLLM hands on: rows[:n], qsl[:B+1], positions[:n_pad], slots [G, n_pad], kv_start[:B]
    assert torch.equal(mine["rows"][:n], bufs["rows"][:n])
    assert torch.equal(mine["qsl"][: B + 1], bufs["qsl"][: B + 1])
    assert torch.equal(mine["pos"][:n], bufs["pos"][:n])
    assert torch.equal(kept_g, kept_w)
    assert torch.equal(mine["kv"][:B], bufs["kv"][:B])
    # untouched by both: past the batch
    assert torch.equal(mine["qsl"][B + 1:], bufs["qsl"][B + 1:]) and torch.equal(mine["kv"][B:], bufs["kv"][B:])
    # the one difference, by design: graph-padding rows. vLLM leaves rows/positions
    # [n, n_pad) as they were (stale); the pack writes row 0 and its position (SPEC §3.2).
    if pad_to:
        assert torch.equal(mine["rows"][n:n_pad], torch.zeros(pad_to, dtype=torch.int64, device=DEVICE))
        assert torch.equal(mine["pos"][n:n_pad], b.positions[:1].expand(pad_to))
        assert torch.equal(bufs["rows"][n:n_pad], _poison((max_tokens,), torch.int64)[n:n_pad])


def _resized_cases():
    """Speculative-decode batches whose decodes adaptive verification resized on the device:
    the host plan counts each decode at another length. ``same``: rows moved between decodes
    (the batch's total unchanged, as vLLM 0.33's verification does); ``fewer`` / ``more``: the
    device total one or two rows off, inside the sub-batch buffers."""
    out = []
    for seed in range(6):
        for how in ("same", "fewer", "more"):
            out.append((seed, how))
    return out


@pytest.mark.parametrize("validate", [True, False], ids=["checked", "unchecked"])
@pytest.mark.parametrize("seed,how", _resized_cases(), ids=[f"{h}-{s}" for s, h in _resized_cases()])
def test_gather_replay_batch_follows_device_resized_decodes(be, seed, how, validate):
    import numpy as np

    from swa_backends import validation

    rng = np.random.default_rng(100 + seed)
    b = _cases.make_batch(rng, W=16, block_size=8, spec=3, num_decodes=4, kinds=("replay", "long", "cold", "long"),
                          device=DEVICE)
    dev_q = b.q[: b.num_decodes]  # what the device verifies
    host_q = b.q.copy()
    host_q[: b.num_decodes] = rng.permutation(dev_q)
    while np.array_equal(host_q[: b.num_decodes], dev_q):  # resized, not merely the same
        host_q[: b.num_decodes] = rng.integers(1, 5, b.num_decodes)
        host_q[0] += int(dev_q.sum() - host_q[: b.num_decodes].sum())
        if host_q[0] < 1:
            host_q[: b.num_decodes] = dev_q[::-1] + np.arange(b.num_decodes) % 2
    if how == "fewer":  # the device verifies a row fewer than the host counted
        host_q[0] += 1
    elif how == "more":  # ... or a row more
        i = int(np.argmax(host_q[: b.num_decodes]))
        if host_q[i] < 2:
            pytest.skip("every decode counted at one row: none can be counted shorter")
        host_q[i] -= 1
    host_qsl = np.concatenate([[0], np.cumsum(host_q)]).astype(np.int32)
    kept = np.where(b.is_prefilling & ~b.keeps_rows, np.minimum(host_q, b.W), host_q)
    n_host = int(kept.sum())
    n_dev = n_host + int(dev_q.sum() - host_q[: b.num_decodes].sum())
    n_pad = max(n_host, n_dev) + 2
    B, G, max_tokens = b.B_all, b.slots.shape[0], b.T_pad + 16
    dropped_np = runtime.dropped_before(kept, host_qsl)
    dropped = torch.tensor(dropped_np, device=DEVICE)
    bufs = {"rows": _poison((max_tokens,), torch.int64), "qsl": _poison((B + 3,), torch.int32),
            "pos": _poison((max_tokens,), torch.int64), "slots": _poison((G, max_tokens), torch.int64),
            "kv": _poison((B + 3,), torch.int32)}
    mine = {k: v.clone() for k, v in bufs.items()}
    kept_w = vk.gather_replay_batch(KERNELS, b.qsl, dropped, b.seq, b.R_t, b.positions, b.slots, bufs["rows"],
                                    bufs["qsl"], bufs["pos"], bufs["slots"], bufs["kv"], b.W, B, n_host, n_pad)
    plan = runtime.replay_plan(kept, host_qsl, n_pad, b.W, dropped=dropped_np, device_dropped=dropped,
                               is_prefilling=b.is_prefilling)
    kept_g = mine["slots"][:, :n_pad]
    out = {"rows": mine["rows"][:n_pad], "query_start_loc": mine["qsl"][: B + 1], "positions": mine["pos"][:n_pad],
           "slot_mappings": kept_g, "kv_start": mine["kv"][:B]}
    with validation(validate):  # a resized batch is valid: no ValueError, the same rows checked or not
        runtime.gather_replay_batch(be, plan, b.qsl, b.seq, b.R_t, b.positions, b.slots, b.W, out)
    assert int(mine["qsl"][B]) == n_dev
    # the device's kept rows, as vLLM's kernel gathers them
    assert torch.equal(mine["qsl"][: B + 1], bufs["qsl"][: B + 1])
    assert torch.equal(mine["rows"][:n_dev], bufs["rows"][:n_dev])
    assert torch.equal(mine["pos"][:n_dev], bufs["pos"][:n_dev])
    assert torch.equal(kept_g[:, :n_dev], kept_w[:, :n_dev])
    assert torch.equal(mine["kv"][:B], bufs["kv"][:B])
    # past them, up to the sub-batch's size: padding (vLLM: PAD from its host count on, its
    # kernel's rows below; rows the device dropped stay stale there)
    assert kept_g[:, n_dev:].eq(-1).all() and mine["rows"][n_dev:n_pad].eq(0).all()
    if how == "same":
        assert torch.equal(kept_g, kept_w)
    # nothing written past the sub-batch's buffers
    assert torch.equal(mine["rows"][n_pad:], _poison((max_tokens,), torch.int64)[n_pad:])
    assert torch.equal(mine["slots"][:, n_pad:], _poison((G, max_tokens), torch.int64)[:, n_pad:])
