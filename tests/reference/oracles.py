"""Independent oracles: plain Python loops over tokens, written from SPEC.md alone.

The torch references are vectorised; these loops are the slow, obvious reading of the
spec they are checked against (tests only -- never on a hot path).
"""

from __future__ import annotations

import math

import numpy as np

PAD = -1


def lo(p: int, W: int, R: int) -> int:
    return max(p - W + 1, 0, R)


def requests(qsl):
    for b in range(len(qsl) - 1):
        yield b, int(qsl[b]), int(qsl[b + 1])


def live(R, seq, q) -> int:
    """A request's replay start, 0 when stale: above its first scheduled position seq - q (SPEC §0)."""
    return int(R) if int(R) <= int(seq) - q else 0


def batch_replay_start(R_per_request, idx_mapping, prefilling):
    """SPEC §2.1: a prefilling row carries its request's R, every other row 0."""
    return np.array([int(R_per_request[int(idx_mapping[b])]) if prefilling[b] else 0
                     for b in range(len(idx_mapping))], np.int64)


def pad_replayed_slots(slots, groups, qsl, positions, R, Wr):
    out = np.array(slots, dtype=np.int64, copy=True)
    for b, s, e in requests(qsl):
        if R[b] <= 0 or s >= e or R[b] > positions[s]:  # no replay, or a stale one (SPEC §0)
            continue
        for t in range(s, e):
            if R[b] <= positions[t] < R[b] + Wr:
                for g in groups:
                    out[g, t] = PAD
    return out


def slot_of(block_table, b, pos, bs):
    return int(block_table[b][pos // bs]) * bs + pos % bs


def compressed_slot_mapping(token_slots, qsl, seq, block_table, bs, ratio, null_block=0):
    T = len(token_slots)
    if ratio == 1:
        return np.array(token_slots, dtype=np.int64)
    out = np.full(T, PAD, np.int64)
    bs_c = bs // ratio
    for b, s, e in requests(qsl):
        q = e - s
        for t in range(s, e):
            p = int(seq[b]) - q + (t - s)
            cp = p // ratio
            block = int(block_table[b][cp // bs_c]) if (p + 1) % ratio == 0 else 0
            if (p + 1) % ratio == 0 and token_slots[t] != PAD and block != null_block:  # SPEC §2.3
                out[t] = block * bs_c + cp % bs_c
    return out


def swa_indices_and_lens(qsl, seq, block_table, bs, W, R, width, T, valid=None):
    idx = np.full((T, width), PAD, np.int64)
    lens = np.zeros(T, np.int64)
    for b, s, e in requests(qsl):
        q = e - s
        for t in range(s, e):
            if t >= T or (valid is not None and not valid[t]):
                continue
            p = int(seq[b]) - q + (t - s)
            first = lo(p, W, live(R[b], seq[b], q))
            lens[t] = p - first + 1
            for j in range(lens[t]):
                idx[t, j] = slot_of(block_table, b, first + j, bs)
    return idx, lens


def prefill_gather_lens(qsl, seq, R, W):
    out = []
    for b, s, e in requests(qsl):
        q = e - s
        prefix = int(seq[b]) - q
        out.append(q + min(max(prefix - live(R[b], seq[b], q), 0), W - 1))
    return np.array(out, np.int64)


def combined_indices(topk, qsl, seq, R, W, ratio, top_k, M, N, valid=None):
    T = len(topk)
    width = math.ceil((top_k + W) / 128) * 128
    idx = np.full((T, width), PAD, np.int64)
    lens = np.zeros(T, np.int64)
    gl = prefill_gather_lens(qsl, seq, R, W)
    for b, s, e in requests(qsl):
        q = e - s
        gather_start = int(seq[b]) - int(gl[b])
        for t in range(s, e):
            if valid is not None and not valid[t]:
                continue
            p = int(seq[b]) - q + (t - s)
            n_top = min((p + 1) // ratio, top_k) if ratio > 0 else 0
            col = 0
            for j in range(n_top):
                v = int(topk[t][j])
                idx[t, col] = b * M + v if 0 <= v < N else PAD
                col += 1
            first = lo(p, W, live(R[b], seq[b], q))
            for pos in range(first, p + 1):
                idx[t, col] = b * M + N + (pos - gather_start)
                col += 1
            lens[t] = col
    return idx, lens


def mixed_indices(swa, topk, topk_lens):
    T, SW = swa.shape
    K = topk.shape[1]
    width = SW + math.ceil(K / 4) * 4
    idx = np.full((T, width), PAD, np.int64)
    for t in range(T):
        idx[t, :SW] = swa[t]
        for j in range(int(topk_lens[t])):
            idx[t, SW + j] = topk[t, j]
    return idx, np.asarray(topk_lens, np.int64) + SW


def plain_indices(swa, swa_lens, topk=None, topk_lens=None, topk_offset=0, window_offset=0):
    T, SW = swa.shape
    K = 0 if topk is None else topk.shape[1]
    idx = np.full((T, K + SW), PAD, np.int64)
    lens = np.zeros(T, np.int64)
    for t in range(T):
        col = 0
        for j in range(0 if topk is None else int(topk_lens[t])):
            v = int(topk[t, j])
            idx[t, col] = PAD if v == PAD else v + topk_offset
            col += 1
        for j in range(int(swa_lens[t])):
            v = int(swa[t, j])
            idx[t, col] = PAD if v == PAD else v + window_offset
            col += 1
        lens[t] = col
    return idx, lens


def indices_to_csr(indices, lens):
    T, K = indices.shape
    indptr = [0]
    values = []
    for t in range(T):
        for j in range(int(lens[t])):
            if indices[t, j] != PAD:
                values.append(int(indices[t, j]))
        indptr.append(len(values))
    out = np.full(T * K, PAD, np.int64)
    out[: len(values)] = values
    return np.array(indptr, np.int64), out


def plan_and_gather(qsl_host, prefilling, keeps, W, qsl, seq, R, positions, slots, pad_to=None):
    """SPEC §3.1 + §3.2 with loops (the plan from the host ``qsl_host``, the gather on the
    device ``qsl``, which may resize decodes); returns None when nothing trims."""
    B = len(qsl_host) - 1
    kept = []
    for b in range(B):
        q = qsl_host[b + 1] - qsl_host[b]
        kept.append(min(q, W) if prefilling[b] and not keeps[b] else q)
    trimmed = [kept[b] < qsl_host[b + 1] - qsl_host[b] for b in range(B)]
    if not any(trimmed):
        return None
    n = sum(kept)
    n_pad = n if pad_to is None else pad_to
    rows, out_qsl, kv_start = [], [0], []
    for b, s, e in requests(qsl):
        dropped_inside = (qsl_host[b + 1] - qsl_host[b]) - kept[b]
        kept_dev = (e - s) - dropped_inside  # a decode keeps its device rows, a trimmed prefill kept[b]
        rows.extend(range(e - kept_dev, e))
        out_qsl.append(out_qsl[-1] + kept_dev)
        Rb = live(R[b], seq[b], e - s)
        kv_start.append(max(Rb, int(seq[b]) - W) if trimmed[b] else Rb)
    n_dev = len(rows)
    rows = (rows + [0] * max(0, n_pad - n_dev))[:n_pad]
    G = slots.shape[0]
    g_slots = np.full((G, n_pad), PAD, np.int64)
    for i, r in enumerate(rows[: min(n_dev, n_pad)]):
        g_slots[:, i] = slots[:, r]
    return {
        "rows": np.array(rows, np.int64),
        "query_start_loc": np.array(out_qsl, np.int64),
        "positions": np.array([positions[r] for r in rows], np.int64),
        "slot_mappings": g_slots,
        "kv_start": np.array(kv_start, np.int64),
        "num_rows": n,
    }


def prepare_replay_step(R_per_request, idx_mapping, prefilling, qsl, seq, positions, slots, groups, block_table, bs,
                        W, Wr, width, prefill_from=None, gather_lens_from=None, valid_group=None, plan_from=None,
                        kept_windows=0):
    """SPEC §3.6 with the loops above, step by step: the replay start, its stale rows counted
    as 0, the validity read before padding, the padding, the window rows of tokens [0, P) and
    [P, T), the gather lengths of requests [g, B), and with ``plan_from`` (``plan_and_gather``'s
    leading arguments ``(qsl_host, prefilling, keeps, W, pad_to)``) the sub-batch gathered on
    the padded slots, with ``kept_windows`` (1 or 2) its window builds (every sub-batch token
    and no gather lengths: the defaults), clamped at the sub-batch's kv_start and then at the
    replay start as §2.1 gives it."""
    raw = batch_replay_start(R_per_request, idx_mapping, prefilling)
    B, T = len(idx_mapping), len(positions)
    q = [int(qsl[b + 1]) - int(qsl[b]) for b in range(B)]
    R = np.array([live(raw[b], seq[b], q[b]) for b in range(B)], np.int64)
    stale = (R != raw).astype(np.int64)
    valid = None if valid_group is None else np.asarray(slots)[valid_group, :T] >= 0
    padded = pad_replayed_slots(slots, groups, qsl, positions, R, Wr)
    P = T if prefill_from is None else prefill_from
    idx, lens = swa_indices_and_lens(qsl, seq, block_table, bs, W, R, width, T, valid)
    out = {"replay_start": R, "stale_replay": stale, "slot_mappings": padded, "swa_indices": idx[:P],
           "swa_lens": lens[:P], "prefill_swa_indices": None if prefill_from is None else idx[P:],
           "prefill_swa_lens": None if prefill_from is None else lens[P:], "gather_lens": None, "replay_batch": None}
    if gather_lens_from is not None:
        g = gather_lens_from
        out["gather_lens"] = prefill_gather_lens(qsl[g:] - qsl[g], seq[g:], R[g:], W)
    if plan_from is not None:
        qsl_host, pre_host, keeps, plan_w, pad_to = plan_from
        batch = plan_and_gather(qsl_host, pre_host, keeps, plan_w, qsl, seq, R, positions, padded, pad_to)
        out["replay_batch"] = batch
        if batch is not None:
            n = batch["num_rows"]
            kq = batch["query_start_loc"]
            kvalid = None if valid_group is None else batch["slot_mappings"][valid_group, :n] >= 0
            for build, C in zip(("kept_windows", "kept_first_windows")[:kept_windows], (batch["kv_start"], raw)):
                out[build] = swa_indices_and_lens(kq, seq, block_table, bs, W, C, width, n, kvalid)
    return out


def sparse_mla(q, kv, indices, lens, sm_scale, d_v, sink=None):
    """float64, one token and head at a time."""
    q = np.asarray(q, np.float64)
    kv = np.asarray(kv, np.float64)
    T, H, _ = q.shape
    out = np.zeros((T, H, d_v))
    lse = np.full((T, H), -np.inf)
    for t in range(T):
        valid = [int(indices[t, j]) for j in range(int(lens[t])) if indices[t, j] != PAD]
        if not valid:
            continue
        rows = kv[valid]
        for h in range(H):
            s = rows @ q[t, h] * sm_scale
            m = s.max()
            w = np.exp(s - m)
            total = w.sum()
            lse[t, h] = m + math.log(total)
            denom = total + (math.exp(float(sink[h]) - m) if sink is not None else 0.0)
            out[t, h] = (w[:, None] * rows[:, :d_v]).sum(0) / denom
    return out, lse
