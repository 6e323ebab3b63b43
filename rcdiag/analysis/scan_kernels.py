"""The report scan's per-batch work (tails, strata, per-sequence sums) as ONE compiled pass over the rows.

The numpy version made ~60 passes over each record batch (searchsorted per stratum and per histogram, bincounts,
clips, temporaries); `scan_batch` visits each row once and adds to the accumulators' arrays in place. It computes
the same quantities with the same bucket edges (rcdiag.analysis.tails / strata / bootstrap), so the numbers agree
with the numpy forms to rounding (sums are added row by row instead of pairwise); the strata order is fixed here
and checked against STRATA at import. Compiled on first use, cached on disk, and the GIL is released (`nogil`), so
token files can be scanned on several threads at once.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from rcdiag.analysis import tails as tails_mod
from rcdiag.analysis.bootstrap import SWIFT_K3_CLAMP, SequenceSums
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
def _fine_bin(x, edges):
    """The tails histogram bin of |ℓ| = x ≥ edges[0]: searchsorted(EDGES, x, 'right') − 1 clipped, from a log10
    guess corrected against the edges themselves (so it is exactly the searchsorted bin)."""
    top = edges.size - 2
    guess = (math.log10(x) - tails_mod.LOG10_MIN) * tails_mod.BINS_PER_DECADE
    g = int(min(max(guess, 0.0), float(top)))
    while g > 0 and edges[g] > x:
        g -= 1
    while g < top and edges[g + 1] <= x:
        g += 1
    return g


@numba.njit(**_JIT)
def scan_batch(seq, pos, a, b, keep, entropy, seq_row, p_len, p_finish, p_reward, stop_code, threshold, lower,
               edges, band_lo, band_hi, density_lo, density_scale, tail_sums, hist_pos, hist_neg, outside,
               density, strata, strata_offsets):
    """One record batch: adds to the tails arrays (tail_sums [7], hist_pos/neg, outside, density) and the stacked
    strata table [Σ buckets, 6] in place. Rows with keep False are skipped. Returns (kept rows, max |ℓ|, underflow
    count, |ℓ| per row (−1 where not kept, for the worst tokens), per-sequence seq_ids [k], sums [k, 14] in
    bootstrap.COLUMNS order over runs of equal seq_id among kept rows)."""
    n = seq.size
    absl_rows = np.full(n, -1.0)
    bins = density.shape[0]
    # per-sequence segments over kept rows
    n_seg = 0
    have = False
    last_seq = 0
    for i in range(n):
        if keep[i]:
            if not have or seq[i] != last_seq:
                n_seg += 1
            have, last_seq = True, seq[i]
    ids = np.empty(n_seg, np.int64)
    sums = np.zeros((n_seg, 14))
    k = -1
    have = False
    s_abs = s_l2 = s_pa = s_pb = s_paa = s_pbb = s_pab = 0.0
    kept = underflow = 0
    top = 0.0
    for i in range(n):
        if not keep[i]:
            continue
        x, y = np.float64(a[i]), np.float64(b[i])
        lr = x - y
        absl = abs(lr)
        absl_rows[i] = absl
        kept += 1
        # ---- tails
        pa_, pb_ = math.exp(x), math.exp(y)
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
        elif lr > 0:
            hist_pos[_fine_bin(absl, edges)] += 1
        else:
            hist_neg[_fine_bin(absl, edges)] += 1
        lc = min(max(lr, -tails_mod.CLAMP), tails_mod.CLAMP)
        for j in range(band_lo.size):
            if lc < band_lo[j] or lc > band_hi[j]:
                outside[j] += 1
        ia = min(max((x - density_lo) * density_scale, 0.0), bins - 1.0)
        ib = min(max((y - density_lo) * density_scale, 0.0), bins - 1.0)
        density[int(ia), int(ib)] += 1
        # ---- strata
        r = seq_row[i]
        em1 = math.expm1(lc)
        k3 = em1 - lc
        length = max(p_len[r], 1) if p_len.size else 1
        finish = p_finish[r] if p_finish.size else 0
        reward = p_reward[r] if p_reward.size else np.nan
        e = entropy[i]
        last = (i + 1 < n and seq[i + 1] != seq[i]) or (p_len.size > 0 and p_len[r] >= 0 and pos[i] + 1 >= p_len[r])
        buckets = (
            bucket_index(pos[i], POW2_EDGES),
            bucket_index(length, POW2_EDGES) - 1,
            bucket_index(pb_, PROB_EDGES),
            bucket_index(e, ENTROPY_EDGES) if math.isfinite(e) else ENTROPY_EDGES.size - 1,
            1 if last and finish == stop_code else 0,
            finish,
            2 if math.isnan(reward) else (0 if reward > 0 else 1),
        )
        for s in range(7):
            row = strata_offsets[s] + buckets[s]
            strata[row, 0] += 1.0
            strata[row, 1] += lr
            strata[row, 2] += absl
            strata[row, 3] += lr * lr
            strata[row, 4] += k3
            strata[row, 5] = max(strata[row, 5], absl)
        # ---- per-sequence sums (bootstrap.COLUMNS)
        if not have or seq[i] != ids[k]:
            k += 1
            ids[k] = seq[i]
            sums[k, 5] = absl
            have = True
        rho = math.exp(lc)
        k3_raw = k3 if lc == lr else math.expm1(lr) - lr
        w = min(max(rho, lower), threshold)
        ws = min(max(rho, 1.0 / threshold), threshold)
        sums[k, 0] += 1.0
        sums[k, 1] += x
        sums[k, 2] += y
        sums[k, 3] += lr
        sums[k, 4] += absl
        sums[k, 5] = max(sums[k, 5], absl)
        sums[k, 6] += k3
        sums[k, 7] += min(max(k3, -SWIFT_K3_CLAMP), SWIFT_K3_CLAMP)
        sums[k, 8] += k3_raw
        sums[k, 9] += rho * rho
        sums[k, 10] += w
        sums[k, 11] += w * w
        sums[k, 12] += ws
        sums[k, 13] += ws * ws
    tail_sums[0] += s_abs
    tail_sums[1] += s_l2
    tail_sums[2] += s_pa
    tail_sums[3] += s_pb
    tail_sums[4] += s_paa
    tail_sums[5] += s_pbb
    tail_sums[6] += s_pab
    return kept, top, underflow, absl_rows, ids, sums


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



def scan_update(tails: TailAccumulator, strata: StrataAccumulator, sums: SequenceSums, rows: dict[str, np.ndarray],
                keep: np.ndarray) -> None:
    """Add one batch's kept rows to the three accumulators (one compiled pass; the worst tokens by argpartition).

    rows: seq_id, pos, token_id (int64), train_logprob, rollout_logprob (float32/64), train_entropy (float64,
    NaN unknown), all [n]; keep: bool [n], the valid rows with finite log-probs.
    """
    info = strata.info
    seq, a, b = rows["seq_id"], rows["train_logprob"], rows["rollout_logprob"]
    seq_row = lookup_rows(info.seq_id, seq)
    offsets = np.cumsum([0] + [strata.sums[name].shape[0] for name in STRATA_ORDER[:-1]])
    stacked = np.zeros((int(offsets[-1]) + strata.sums[STRATA_ORDER[-1]].shape[0], 6))
    lo, hi = tails_mod.DENSITY_RANGE
    tail_sums = np.zeros(7)
    kept, top, underflow, absl, ids, seq_sums = scan_batch(
        seq, rows["pos"], a, b, keep, rows["train_entropy"], seq_row, info.response_len, info.finish, info.reward,
        _stop_code(info.finish_labels), float(sums.threshold), float(sums.lower or 0.0), tails_mod.EDGES,
        _BAND_LOG_LO, _BAND_LOG_HI, lo, tails_mod.DENSITY_BINS / (hi - lo), tail_sums, tails.hist_pos,
        tails.hist_neg, tails.outside, tails.density, stacked, offsets)
    if kept:
        tails.n += kept
        tails.sums += tail_sums
        tails.max_abs = max(tails.max_abs, top)
        tails.underflow += underflow
        pick = np.argpartition(-absl, min(tails_mod.WORST_K, kept) - 1)[:min(tails_mod.WORST_K, kept)]
        x, y = np.asarray(a[pick], np.float64), np.asarray(b[pick], np.float64)
        tails.keep_worst({"abs_log_ratio": absl[pick], "log_ratio": x - y, "train_logprob": x,
                          "rollout_logprob": y, "seq_id": seq[pick], "pos": rows["pos"][pick],
                          "token_id": rows["token_id"][pick]})
        for name, start in zip(STRATA_ORDER, offsets, strict=True):
            table = strata.sums[name]
            part = stacked[start:start + table.shape[0]]
            table[:, :5] += part[:, :5]
            table[:, 5] = np.maximum(table[:, 5], part[:, 5])
        sums.ids.append(ids)
        sums.rows.append(seq_sums)


def _stop_code(labels: list[str]) -> int:
    return labels.index("stop") if "stop" in labels else -1
