"""End-to-end: the DeepSeek-V4.1-shaped example stack runs both replay sides through the pack.

A cold prefill, then a request sharing its prefix: admission through ``admit_prefix_hit``,
replay of the last window with padded cacheable writes and clamped windows, chunked prefill
across the replayed range, decode after the hit; the decoder side trims the replay layers to
each prefill's last W rows. Every attention read is decoded back to positions
(``probe.ReadRecorder``) and window blocks are NaN-poisoned until written.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from swa_backends.examples.dsv41_stack import MAIN, Engine, Stack, StackConfig, sb
from swa_backends.examples.dsv41_stack.probe import ReadRecorder, drift_trial, rel_diff, run_prompt, summarize

W = 128
TOL = 1e-5  # fp32 on CPU: same math, different batch shapes


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # tiny shapes on a shared 2-core machine: a second thread only contends
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def stack():
    return Stack(StackConfig.small())


def rand_prompt(rng, n, vocab=512):
    return rng.integers(0, vocab, n).tolist()


def comp_snapshot(eng: Engine, blocks):
    """Bytes of every KV-source layer's compressed entries in ``blocks``."""
    bs_c = eng.cache.bs_c
    rows = torch.tensor([b * bs_c + i for b in blocks for i in range(bs_c)], dtype=torch.int64, device=eng.device)
    return [eng.cache.comp_rows(layer).index_select(0, rows).view(torch.int32).clone()
            for layer in range(eng.cfg.n_source)]


def test_engine_uses_select(stack):
    eng = Engine(stack, trim_threshold=0)
    assert eng.be.variants == sb.select("cpu").variants
    assert eng.replay_layers == list(range(stack.cfg.n_source, stack.cfg.n_layers))


@pytest.mark.parametrize("mode", ["off", "trim"])
@pytest.mark.parametrize("chunk", [48, 4096], ids=["chunk48", "whole"])
def test_prefix_hit_replays_window_and_keeps_cached_kv(stack, mode, chunk):
    rng = np.random.default_rng(7)
    prompt = rand_prompt(rng, 437)
    eng = Engine(stack, max_batched_tokens=chunk, decoder_trim=mode, max_tokens=4096, trim_threshold=0)
    eng.submit("cold", prompt, max_new_tokens=2)
    eng.run()
    bs = stack.cfg.block_size
    n_hit_blocks = (len(prompt) - 1) // bs
    shared = eng.cache.main.lookup(eng.done["cold"].keys)[:n_hit_blocks]
    assert len(shared) == n_hit_blocks
    before = comp_snapshot(eng, shared)

    rec = ReadRecorder(eng)
    req = eng.submit("hit", prompt + rand_prompt(rng, 5), max_new_tokens=4)
    eng.run()

    H = n_hit_blocks * bs
    assert req.admission.hit == H and req.replay_start == H - W and not req.admission.dropped
    assert req.main_blocks[:n_hit_blocks] == shared  # the hit shares the cached blocks
    assert req.scheduled_tokens == len(req.prompt) - (H - W) + 3  # replayed window + the rest + 3 decodes
    # cached prefix-cacheable KV is byte-identical after the replay (its writes were padded)
    after = comp_snapshot(eng, shared)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    # no window read below R, every window exact, nothing poisoned
    assert rec.violations == []
    mins = [r.min_window_pos_minus_start for r in rec.records if r.min_window_pos_minus_start is not None]
    assert min(mins) == 0  # the first replayed token reads exactly from R
    assert {r.kind for r in rec.records} == {"source", "replay"}
    assert any(r.comp_reads for r in rec.records)
    # decode after the hit sees a full window in every layer
    decodes = [n for r in rec.records for n in r.lens_of_decodes]
    assert decodes and set(decodes) == {W}
    assert torch.isfinite(req.prefill_hidden).all() and len(req.decode_hidden) == 3
    if chunk == 48:
        # chunks end inside the replayed range [R, H)
        assert any(r.rows == 48 and not r.sub_batch for r in rec.records)


def test_the_checks_have_teeth(stack, monkeypatch):
    """Without the padding the cached KV changes; without the clamp reads go below R."""
    rng = np.random.default_rng(3)
    prompt = rand_prompt(rng, 300)
    bs = stack.cfg.block_size

    eng = Engine(stack, decoder_trim="off", max_tokens=2048)
    eng.submit("cold", prompt)
    eng.run()
    shared = eng.cache.main.lookup(eng.done["cold"].keys)[: (len(prompt) - 1) // bs]
    before = comp_snapshot(eng, shared)
    be = eng.be
    eng.be = type("NoPad", (), {"__getattr__": lambda self, n: getattr(be, n),
                                "pad_replayed_slots": lambda self, sm, *a, **k: sm})()
    eng.submit("hit", prompt)
    eng.run()
    assert not all(torch.equal(a, b) for a, b in zip(before, comp_snapshot(eng, shared)))

    eng = Engine(stack, decoder_trim="off", max_tokens=2048)
    eng.submit("cold", prompt)
    eng.run()
    real = eng.be.swa_indices_and_lens

    def unclamped(qsl, seq_lens, bt, block_size, W_, replay_start, **kw):
        return real(qsl, seq_lens, bt, block_size, W_, torch.zeros_like(replay_start), **kw)

    be = eng.be
    eng.be = type("NoClamp", (), {"__getattr__": lambda self, n: getattr(be, n),
                                  "swa_indices_and_lens": lambda self, *a, **k: unclamped(*a, **k)})()
    rec = ReadRecorder(eng)
    eng.submit("hit", prompt)
    eng.run()
    assert any("below its window start" in v for v in rec.violations)
    assert any("non-finite" in v for v in rec.violations)  # poisoned window blocks were read


@pytest.mark.parametrize("seed", range(4))
def test_trim_equals_untrimmed_with_the_same_clamped_windows(stack, seed):
    """The trim loses nothing beyond the clamp: the last row (and decodes) match a run of the
    replay layers over every row with the kept rows' windows clamped at kv_start."""
    rng = np.random.default_rng(100 + seed)
    prompt = rand_prompt(rng, int(rng.integers(150, 700)))
    warm = prompt[: int(rng.integers(W + 16, len(prompt)))] if seed % 2 else None
    chunk = int(rng.choice([64, 200, 4096]))
    forced = rand_prompt(rng, 4)
    got = {}
    for mode in ("trim", "clamp", "off"):
        req, eng, rec = run_prompt(stack, prompt, warm=warm, decoder_trim=mode, max_batched_tokens=chunk, forced=forced,
                                   max_new_tokens=4, recorder=True)
        assert rec.violations == []
        got[mode] = req
    assert rel_diff(got["trim"].prefill_hidden, got["clamp"].prefill_hidden) < TOL
    for a, b in zip(got["trim"].decode_hidden, got["clamp"].decode_hidden):
        assert rel_diff(a, b) < TOL
    # ...while the clamp itself changes the result (decoder replay is not bit-identical by design)
    assert rel_diff(got["trim"].prefill_hidden, got["off"].prefill_hidden) > 1e-4


def test_decoder_side_runs_each_prefills_last_window(stack):
    rng = np.random.default_rng(11)
    eng = Engine(stack, max_batched_tokens=1000, decoder_trim="trim", max_tokens=4096, trim_threshold=0)
    eng.submit("a", rand_prompt(rng, 300), max_new_tokens=3)
    eng.step()
    eng.submit("b", rand_prompt(rng, 90))  # shorter than W: keeps every row
    eng.submit("c", rand_prompt(rng, 500))
    eng.submit("d", rand_prompt(rng, 450), keep_all_rows=True)  # e.g. prompt logprobs
    info = eng.step()  # a decode, b, c and part of d
    assert info.rids == ["a", "b", "c", "d"]
    assert info.trimmed and info.num_tokens == 1 + 90 + 500 + 409
    assert info.replay_rows == 1 + 90 + W + 409


def test_small_steps_below_the_threshold_keep_every_row(stack):
    """Graph policy: a step under ``trim_threshold`` tokens (one a CUDA graph would run)
    keeps the replay layers on its whole batch."""
    rng = np.random.default_rng(12)
    eng = Engine(stack, max_batched_tokens=300, decoder_trim="trim", trim_threshold=301)
    eng.submit("a", rand_prompt(rng, 700))
    infos = eng.run()
    assert [i.num_tokens for i in infos] == [300, 300, 100]
    assert [i.replay_rows for i in infos] == [300, 300, 100] and not any(i.trimmed for i in infos)
    eng.trim_threshold = 300
    eng.submit("b", rand_prompt(rng, 700))
    assert [i.replay_rows for i in eng.run()] == [W, W, 100]


def test_keep_all_rows_and_batch_mates_match_running_alone(stack):
    """Batching changes nothing beyond fp noise: each request, cold or hit, trimmed or keeping
    its rows, gives the hidden states it gives alone."""
    rng = np.random.default_rng(5)
    base = rand_prompt(rng, 330)
    specs = {"hit": base[:260] + rand_prompt(rng, 70), "cold": rand_prompt(rng, 410), "keep": rand_prompt(rng, 280)}
    forced = rand_prompt(rng, 3)

    def run(names):
        eng = Engine(stack, max_batched_tokens=4096, decoder_trim="trim", max_tokens=8192, trim_threshold=0)
        eng.submit("warm", base)
        eng.run()
        reqs = {n: eng.submit(n, specs[n], max_new_tokens=3, forced_tokens=forced, keep_all_rows=(n == "keep"))
                for n in names}
        eng.run()
        return reqs

    together = run(list(specs))
    assert together["hit"].replay_start > 0 and together["cold"].replay_start == 0
    for n in specs:
        alone = run([n])[n]
        assert rel_diff(together[n].prefill_hidden, alone.prefill_hidden) < TOL
        for a, b in zip(together[n].decode_hidden, alone.decode_hidden):
            assert rel_diff(a, b) < TOL
    # keep_all_rows really is untrimmed: it equals the run without any trim
    off, _, _ = run_prompt(stack, specs["keep"], decoder_trim="off", max_batched_tokens=4096, forced=forced,
                           max_new_tokens=3)
    assert rel_diff(together["keep"].prefill_hidden, off.prefill_hidden) < TOL


def test_cold_and_replayed_prefill_do_not_depend_on_chunking(stack):
    """Chunk boundaries anywhere (inside the replayed range too) change nothing (trim off:
    with it, each chunk's kept rows are clamped at that chunk's own window)."""
    rng = np.random.default_rng(21)
    prompt = rand_prompt(rng, 520)
    res = {}
    for chunk in (40, 133, 4096):
        res[chunk] = (run_prompt(stack, prompt, decoder_trim="off", max_batched_tokens=chunk)[0],
                      run_prompt(stack, prompt, warm=prompt[:400], decoder_trim="off", max_batched_tokens=chunk)[0])
    assert res[40][1].replay_start == 400 - W and res[40][1].steps == 7  # ceil((520 - 272) / 40)
    for chunk in (40, 133):
        for i in (0, 1):
            assert rel_diff(res[chunk][i].prefill_hidden, res[4096][i].prefill_hidden) < TOL


def test_short_hit_is_dropped_and_recomputed(stack):
    rng = np.random.default_rng(9)
    prompt = rand_prompt(rng, 300)
    cold, _, _ = run_prompt(stack, prompt, decoder_trim="off")
    hit, eng, rec = run_prompt(stack, prompt, warm=prompt[:W + 10] + [1, 2], decoder_trim="off", recorder=True)
    assert hit.admission.dropped and hit.replay_start == 0 and hit.scheduled_tokens == len(prompt)
    assert rec.violations == []
    assert rel_diff(hit.prefill_hidden, cold.prefill_hidden) < TOL


def test_slot_padding_is_what_keeps_the_cache(stack):
    """The padded cacheable row covers exactly the replayed positions [R, R + W)."""
    rng = np.random.default_rng(13)
    prompt = rand_prompt(rng, 260)
    eng = Engine(stack, decoder_trim="off", max_tokens=2048)
    eng.submit("cold", prompt)
    eng.run()
    seen = []
    be = eng.be

    class Spy:
        def __getattr__(self, n):
            return getattr(be, n)

        def pad_replayed_slots(self, slot_mappings, groups, qsl, positions, replay_start, Wr, **kw):
            out = be.pad_replayed_slots(slot_mappings, groups, qsl, positions, replay_start, Wr, **kw)
            seen.append((positions.clone(), out.clone()))
            return out

    eng.be = Spy()
    req = eng.submit("hit", prompt)
    eng.run()
    (positions, slots), = seen
    R = req.replay_start
    padded = slots[MAIN] == -1
    assert torch.equal(padded, (positions >= R) & (positions < R + W))
    assert (slots[1] >= 0).all()  # the window group is rebuilt


def test_drift_over_random_prompts(stack):
    """Not bit-identical by design: the number users get (fp32, this toy stack; the table is
    ``python -m examples.dsv41_stack.probe``'s and bench_e2e's to print, not the test's)."""
    rng = np.random.default_rng(2024)
    trials = [drift_trial(stack, rng, min_len=2 * W + 1, max_len=6 * W, max_batched_tokens=256) for _ in range(12)]
    s = summarize(trials)
    assert s["trim_vs_clamp"]["max"] < TOL and s["noise_floor"]["max"] < TOL
    for k in ("hit_off", "cold_trim", "hit_trim"):
        assert s[k]["mean"] > 1e-4  # the clamp is real ...
        assert s[k]["max"] < 0.1  # ... and bounded


def test_stack_through_the_triton_sparse_mla_interpreted():
    """The whole stack with the portable Triton sparse_mla (interpreter on CPU, bf16, tiny):
    same reads, same hidden states as the reference within bf16 rounding."""
    from swa_backends.dispatch import all_variants  # after sb: resolves without an install too

    if "triton" not in all_variants().get("sparse_mla", {}):
        pytest.skip("no Triton sparse_mla variant declared in this checkout")
    try:
        tri = sb.select("cpu", prefer={"sparse_mla": "triton"})
    except sb.SelectionError as e:
        pytest.skip(f"Triton sparse_mla cannot run here: {e}")
    cfg = StackConfig.small(dtype="bfloat16", n_layers=2, n_source=1, window=16, block_size=8, top_k=4)
    st = Stack(cfg)
    rng = np.random.default_rng(0)
    prompt = rand_prompt(rng, 70)
    got = {}
    for name, be in (("triton", tri), ("reference", sb.select("cpu"))):
        req, _, rec = run_prompt(st, prompt, warm=prompt, decoder_trim="trim", max_batched_tokens=24, forced=[1, 2, 3],
                                 max_new_tokens=3, backend=be, recorder=True)
        assert rec.violations == [] and req.replay_start == 48
        got[name] = req
    assert rel_diff(got["triton"].prefill_hidden, got["reference"].prefill_hidden) < 3e-2
    for a, b in zip(got["triton"].decode_hidden, got["reference"].decode_hidden):
        assert rel_diff(a, b) < 3e-2


@pytest.mark.gpu
def test_e2e_on_gpu_with_the_selected_kernels():
    """The same invariants at realistic attention widths (64 heads, latent 512, bf16) with
    whatever ``select("cuda:0")`` picks (the Triton sparse_mla where it qualifies)."""
    dev = torch.device("cuda:0")
    cfg = StackConfig.h200(d_model=1024, d_ffn=2048, q_rank=512, n_layers=4, n_source=2, vocab=4096)
    st = Stack(cfg, dev)
    be = sb.select(dev)
    rng = np.random.default_rng(1)
    prompt = rand_prompt(rng, 3000, cfg.vocab)
    forced = rand_prompt(rng, 3, cfg.vocab)
    longer = prompt + rand_prompt(rng, 7, cfg.vocab)
    bs = cfg.block_size
    hidden = {}
    for mode in ("trim", "clamp", "off"):
        eng = Engine(st, backend=be, max_batched_tokens=1024, decoder_trim=mode, max_tokens=8192, trim_threshold=0)
        eng.submit("cold", prompt)
        eng.run()
        shared = eng.cache.main.lookup(eng.done["cold"].keys)[: (len(prompt) - 1) // bs]
        before = comp_snapshot(eng, shared)
        rec = ReadRecorder(eng)
        req = eng.submit("hit", longer, max_new_tokens=3, forced_tokens=forced)
        eng.run()
        assert req.replay_start == len(shared) * bs - W
        assert rec.violations == []
        assert all(torch.equal(a, b) for a, b in zip(before, comp_snapshot(eng, shared)))
        assert {n for r in rec.records for n in r.lens_of_decodes} == {W}
        hidden[mode] = req.prefill_hidden
    assert rel_diff(hidden["trim"], hidden["clamp"]) < 2e-2  # bf16, different GEMM shapes
    assert rel_diff(hidden["trim"], hidden["off"]) < 0.2  # the clamp's drift, bounded
