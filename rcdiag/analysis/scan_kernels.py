"""The report scan's per-batch work (tails, strata, per-sequence sums) as ONE compiled pass over the rows.

The numpy version made ~60 passes over each record batch (searchsorted per stratum and per histogram, bincounts,
clips, temporaries); `scan_batch` visits each row once and adds to the accumulators' arrays in place. The per-row
transcendental terms (exp of both log-probs, expm1 and exp of ℓ̂, log10|ℓ|) come precomputed for the batch by
numpy's vectorised loops (rcdiag.analysis.rows), ~1 ns a value where libm called row by row took ~6. It computes
the same quantities with the same bucket edges (rcdiag.analysis.tails / strata / bootstrap): counts, histograms,
maxima and worst tokens exactly, sums to rounding (added per row, or per run of a sequence's rows for the strata of
a sequence's own attributes, instead of pairwise); the strata order is fixed here and checked against STRATA at
import. Compiled on first use, cached on disk, and the GIL is released (`nogil`), so token files can be scanned on
several threads at once.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from rcdiag.analysis import tails as tails_mod
from rcdiag.analysis.bootstrap import SWIFT_K3_CLAMP, SequenceSums
from rcdiag.analysis.rows import BatchRows
from rcdiag.analysis.strata import ENTROPY_EDGES, POW2_EDGES, PROB_EDGES, STRATA, StrataAccumulator
from rcdiag.analysis.tails import TailAccumulator

_JIT = {"cache": True, "nogil": True}
STRATA_ORDER = ("position", "response_length", "rollout_prob", "entropy", "token_kind", "finish_reason", "reward")
"""The bucket rules `scan_batch` implements, in its output order; must equal STRATA's (checked below)."""
if tuple(s.name for s in STRATA) != STRATA_ORDER:  # a new stratum needs its rule in scan_batch too
    raise ImportError(f"scan_kernels implements strata {STRATA_ORDER}, STRATA has {tuple(s.name for s in STRATA)}")

_BAND_LOG_LO = np.log(np.array([lo for lo, _ in tails_mod.RATIO_BANDS]))
_BAND_LOG_HI = np.log(np.array([hi for _, hi in tails_mod.RATIO_BANDS]))


@numba.njit(inline="always")
def bucket_index(value, edges):
    """clip(searchsorted(edges, value, 'right') − 1, 0, len − 2), as rcdiag.analysis.strata, for a non-NaN value:
    counting the edges ≤ value over the (≤ 17) sorted edges has no data-dependent branch, where a binary search
    mispredicts on every random value (rollout probability, entropy)."""
    count = 0
    for j in range(edges.size):
        count += edges[j] <= value
    return min(max(count - 1, 0), edges.size - 2)


@numba.njit(inline="always")
def _fine_bin(x, log10_x, edges):
    """The tails histogram bin of |ℓ| = x ≥ edges[0]: searchsorted(EDGES, x, 'right') − 1 clipped, from the guess
    log10(x) gives (computed for the whole batch by numpy), corrected against the edges themselves (so it is
    exactly the searchsorted bin whatever the rounding of the logarithm)."""
    top = edges.size - 2
    guess = (log10_x - tails_mod.LOG10_MIN) * tails_mod.BINS_PER_DECADE
    g = 0 if not guess > 0.0 else (top if guess >= top else int(guess))  # NaN → 0, inf → top; corrected below
    while g > 0 and edges[g] > x:
        g -= 1
    while g < top and edges[g + 1] <= x:
        g += 1
    return g


@numba.njit(inline="always")
def _add_stratum(strata, row, n, s_l, s_abs, s_sq, s_k3, top):
    strata[row, 0] += n
    strata[row, 1] += s_l
    strata[row, 2] += s_abs
    strata[row, 3] += s_sq
    strata[row, 4] += s_k3
    strata[row, 5] = max(strata[row, 5], top)


@numba.njit(**_JIT)
def scan_batch(seq, pos, a, b, mask, entropy, pa_rows, pb_rows, em1_rows, rho_rows, log10_rows, seq_row, p_len,
               p_finish, p_reward, stop_code, threshold, lower, edges, band_lo, band_hi, density_lo, density_scale,
               tail_sums, hist, outside, density, strata, strata_offsets):
    """One record batch: adds to the tails arrays (tail_sums [7], hist [2, bins] for ℓ > 0 and ℓ < 0, outside,
    density) and the stacked strata table [Σ buckets, 6] in place. Rows are kept when `mask` holds and both
    log-probs a, b (float64) are finite; exp(a), exp(b), expm1(ℓ̂), exp(ℓ̂) and log10|ℓ| per row come precomputed
    (rcdiag.analysis.rows).
    Returns (kept rows, max |ℓ|, underflow count, |ℓ| per row (−1 where not kept, for the worst tokens),
    per-sequence seq_ids [k], sums [k, 14] in bootstrap.COLUMNS order over runs of equal seq_id among kept rows).

    The strata of a sequence's own attributes (response length, finish reason, reward) are added once per run of
    a sequence's rows, from the run's sums; the position bucket is looked up, and its row added to, only when pos
    leaves the current power-of-two range, and ordinary tokens' row once per batch (adding to one table row row
    after row waits on the previous add through memory)."""
    n = seq.size
    absl_rows = np.full(n, -1.0)
    bins = density.shape[0]
    n_seg = 0
    have = False
    last_seq = 0
    for i in range(n):
        if mask[i] and math.isfinite(a[i]) and math.isfinite(b[i]):
            if not have or seq[i] != last_seq:
                n_seg += 1
            have, last_seq = True, seq[i]
    ids = np.empty(n_seg, np.int64)
    sums = np.zeros((n_seg, 14))
    k = -1
    s_abs = s_l2 = s_pa = s_pb = s_paa = s_pbb = s_pab = 0.0
    kept = underflow = 0
    top = 0.0
    q0 = q1 = q2 = q3 = q4 = q5 = q6 = q7 = q8 = q9 = q10 = q11 = q12 = q13 = q_sq = 0.0
    length_row = finish_row = reward_row = finish = 0
    stop_len = -1
    pos_lo, pos_hi, pos_bucket = 1, 0, 0  # an empty range: the first row looks its bucket up
    # running sums of the strata rows that stay the same row after row, added to the table when the row changes:
    # the position bucket (until pos leaves its power-of-two range) and ordinary tokens (not a stop's last token)
    p0 = p1 = p2 = p3 = p4 = p5 = t0 = t1 = t2 = t3 = t4 = t5 = 0.0
    o_pos, o_prob, o_entropy, o_kind = strata_offsets[0], strata_offsets[2], strata_offsets[3], strata_offsets[4]
    for i in range(n):
        x, y = a[i], b[i]
        if not (mask[i] and math.isfinite(x) and math.isfinite(y)):
            continue
        # ---- a new run of one sequence's rows: close the previous one, look the sequence's attributes up
        if k < 0 or seq[i] != ids[k]:
            if k >= 0:
                _store_sums(sums, k, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13)
                for row in (length_row, finish_row, reward_row):
                    _add_stratum(strata, row, q0, q3, q4, q_sq, q6, q5)
            k += 1
            ids[k] = seq[i]
            q0 = q1 = q2 = q3 = q4 = q5 = q6 = q7 = q8 = q9 = q10 = q11 = q12 = q13 = q_sq = 0.0
            r = seq_row[i]
            length = max(p_len[r], 1) if p_len.size else 1
            finish = p_finish[r] if p_finish.size else 0
            reward = p_reward[r] if p_reward.size else np.nan
            length_row = strata_offsets[1] + bucket_index(length, POW2_EDGES) - 1
            finish_row = strata_offsets[5] + finish
            reward_row = strata_offsets[6] + (2 if math.isnan(reward) else (0 if reward > 0 else 1))
            stop_len = p_len[r] if p_len.size > 0 and p_len[r] >= 0 else -1
        lr = x - y
        absl = abs(lr)
        absl_rows[i] = absl
        kept += 1
        # ---- tails
        pa_, pb_ = pa_rows[i], pb_rows[i]
        s_abs += absl
        s_l2 += lr * lr
        s_pa += pa_
        s_pb += pb_
        s_paa += pa_ * pa_
        s_pbb += pb_ * pb_
        s_pab += pa_ * pb_
        top = max(top, absl)
        if absl < edges[0]:
            underflow += 1
        else:  # the sign picks the row by index, not by a branch (ℓ's sign is a coin flip: mispredicted half the time)
            hist[int(lr < 0), _fine_bin(absl, log10_rows[i], edges)] += 1
        lc = min(max(lr, -tails_mod.CLAMP), tails_mod.CLAMP)
        for j in range(band_lo.size):
            if lc < band_lo[j] or lc > band_hi[j]:
                outside[j] += 1
        ia = min(max((x - density_lo) * density_scale, 0.0), bins - 1.0)
        ib = min(max((y - density_lo) * density_scale, 0.0), bins - 1.0)
        density[int(ia), int(ib)] += 1
        # ---- strata of the row's own attributes
        p = pos[i]
        if not (pos_lo <= p < pos_hi):
            bucket = bucket_index(p, POW2_EDGES)
            pos_lo, pos_hi = POW2_EDGES[bucket], POW2_EDGES[bucket + 1]  # (clipped values miss it)
            if bucket != pos_bucket:
                _add_stratum(strata, o_pos + pos_bucket, p0, p1, p2, p3, p4, p5)
                pos_bucket, p0, p1, p2, p3, p4, p5 = bucket, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        em1 = em1_rows[i]
        k3 = em1 - lc
        e = entropy[i]
        last = (i + 1 < n and seq[i + 1] != seq[i]) or (stop_len >= 0 and p + 1 >= stop_len)
        sq = lr * lr
        p0, p1, p2, p3, p4, p5 = p0 + 1.0, p1 + lr, p2 + absl, p3 + sq, p4 + k3, max(p5, absl)
        if last and finish == stop_code:
            _add_stratum(strata, o_kind + 1, 1.0, lr, absl, sq, k3, absl)
        else:
            t0, t1, t2, t3, t4, t5 = t0 + 1.0, t1 + lr, t2 + absl, t3 + sq, t4 + k3, max(t5, absl)
        for row in (o_prob + bucket_index(pb_, PROB_EDGES),
                    o_entropy + (bucket_index(e, ENTROPY_EDGES) if math.isfinite(e) else ENTROPY_EDGES.size - 1)):
            _add_stratum(strata, row, 1.0, lr, absl, sq, k3, absl)
        # ---- per-sequence sums (bootstrap.COLUMNS)
        rho = rho_rows[i]
        k3_raw = k3 if lc == lr else math.expm1(lr) - lr
        w = min(max(rho, lower), threshold)
        ws = min(max(rho, 1.0 / threshold), threshold)
        q0 += 1.0
        q1 += x
        q2 += y
        q3 += lr
        q4 += absl
        q5 = max(q5, absl)
        q6 += k3
        q7 += min(max(k3, -SWIFT_K3_CLAMP), SWIFT_K3_CLAMP)
        q8 += k3_raw
        q9 += rho * rho
        q10 += w
        q11 += w * w
        q12 += ws
        q13 += ws * ws
        q_sq += sq
    if k >= 0:
        _store_sums(sums, k, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13)
        for row in (length_row, finish_row, reward_row):
            _add_stratum(strata, row, q0, q3, q4, q_sq, q6, q5)
    _add_stratum(strata, o_pos + pos_bucket, p0, p1, p2, p3, p4, p5)
    _add_stratum(strata, o_kind, t0, t1, t2, t3, t4, t5)
    tail_sums[0] += s_abs
    tail_sums[1] += s_l2
    tail_sums[2] += s_pa
    tail_sums[3] += s_pb
    tail_sums[4] += s_paa
    tail_sums[5] += s_pbb
    tail_sums[6] += s_pab
    return kept, top, underflow, absl_rows, ids, sums


@numba.njit(inline="always")
def _store_sums(sums, k, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13):
    sums[k, 0], sums[k, 1], sums[k, 2], sums[k, 3], sums[k, 4], sums[k, 5], sums[k, 6] = q0, q1, q2, q3, q4, q5, q6
    sums[k, 7], sums[k, 8], sums[k, 9], sums[k, 10], sums[k, 11], sums[k, 12], sums[k, 13] = (q7, q8, q9, q10, q11,
                                                                                           q12, q13)


@numba.njit(**_JIT)
def lookup_rows(info_ids, seq):
    """SequenceInfo.lookup (clip(searchsorted(info_ids, seq), 0, len − 1)) with one search per run of equal ids."""
    out = np.zeros(seq.size, np.int64)
    hi = max(info_ids.size - 1, 0)
    for i in range(seq.size):
        if i and seq[i] == seq[i - 1]:
            out[i] = out[i - 1]
        else:
            out[i] = min(np.searchsorted(info_ids, seq[i]), hi)
    return out



def scan_update(tails: TailAccumulator, strata: StrataAccumulator, sums: SequenceSums, rows: BatchRows) -> None:
    """Add one batch's kept rows (valid, finite log-probs) to the three accumulators (one compiled pass over the
    rows and their numpy-computed terms; the worst tokens by argpartition)."""
    info = strata.info
    seq, pos, a, b, terms = rows.seq, rows.pos, rows.a, rows.b, rows.terms
    seq_row = lookup_rows(info.seq_id, seq)
    offsets = np.cumsum([0] + [strata.sums[name].shape[0] for name in STRATA_ORDER[:-1]])
    stacked = np.zeros((int(offsets[-1]) + strata.sums[STRATA_ORDER[-1]].shape[0], 6))
    lo, hi = tails_mod.DENSITY_RANGE
    tail_sums = np.zeros(7)
    hist = np.zeros((2, tails.hist_pos.size), np.int64)
    kept, top, underflow, absl, ids, seq_sums = scan_batch(
        seq, pos, a, b, rows.mask, rows.entropy, terms.pa, terms.pb, terms.em1, terms.rho, terms.log10_abs,
        seq_row, info.response_len, info.finish, info.reward, _stop_code(info.finish_labels), float(sums.threshold),
        float(sums.lower or 0.0), tails_mod.EDGES, _BAND_LOG_LO, _BAND_LOG_HI, lo, tails_mod.DENSITY_BINS / (hi - lo),
        tail_sums, hist, tails.outside, tails.density, stacked, offsets)
    if kept:
        tails.n += kept
        tails.sums += tail_sums
        tails.max_abs = max(tails.max_abs, top)
        tails.underflow += underflow
        tails.hist_pos += hist[0]
        tails.hist_neg += hist[1]
        pick = np.argpartition(-absl, min(tails_mod.WORST_K, kept) - 1)[:min(tails_mod.WORST_K, kept)]
        tails.keep_worst({"abs_log_ratio": absl[pick], "log_ratio": a[pick] - b[pick], "train_logprob": a[pick],
                          "rollout_logprob": b[pick], "seq_id": np.asarray(seq[pick], np.int64),
                          "pos": np.asarray(pos[pick], np.int64), "token_id": rows.token_ids(pick)})
        for name, start in zip(STRATA_ORDER, offsets, strict=True):
            table = strata.sums[name]
            part = stacked[start:start + table.shape[0]]
            table[:, :5] += part[:, :5]
            table[:, 5] = np.maximum(table[:, 5], part[:, 5])
        sums.ids.append(ids)
        sums.rows.append(seq_sums)


def _stop_code(labels: list[str]) -> int:
    return labels.index("stop") if "stop" in labels else -1
