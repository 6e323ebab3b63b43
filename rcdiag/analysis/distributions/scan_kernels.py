"""The report scan's per-chunk work (tails, strata) as ONE compiled pass over the rows.

The numpy version made ~60 passes over each record batch (searchsorted per stratum and per histogram, bincounts,
clips, temporaries); `scan_chunk` visits each row once and adds to the accumulators' arrays in place. The per-row
transcendental terms (exp of both log-probs, ℓ̂ and expm1(ℓ̂), log10|ℓ|) come precomputed for the chunk by
numpy's vectorised loops (chunks.TokenChunk.terms, shared with the library's accumulators), ~1 ns a value where
libm called row by row took ~6; the strata of a sequence's own attributes come from the chunk's per-sequence table
(kernels.sequence_table, the one the metrics and the bootstrap read), so the scan sums nothing per sequence itself.
It computes the same quantities with the same bucket edges (rcdiag.analysis.distributions.tails / strata): counts, histograms,
maxima and worst tokens exactly, sums to rounding (added per row, or per sequence for the strata of a sequence's
own attributes, instead of pairwise); the strata order is fixed here and checked against STRATA at import. Compiled on first use, cached on disk, and the GIL is released (`nogil`), so token files can be scanned on
several threads at once.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from rcdiag.analysis.distributions import tails as tails_mod
from rcdiag.analysis.distributions.strata import (
    ENTROPY_EDGES,
    POW2_EDGES,
    PROB_EDGES,
    STRATA,
    StrataAccumulator,
)
from rcdiag.analysis.distributions.tails import TailAccumulator
from rcdiag.analysis.passes.chunks import TokenChunk
from rcdiag.analysis.passes.kernels import C_ABS, C_K3, C_L, C_MAX_ABS, C_SQ, C_T

_JIT = {"cache": True, "nogil": True}
STRATA_ORDER = ("position", "response_length", "rollout_prob", "entropy", "token_kind", "finish_reason", "reward")
"""The bucket rules `scan_batch` implements, in its output order; must equal STRATA's (checked below)."""
if tuple(s.name for s in STRATA) != STRATA_ORDER:  # a new stratum needs its rule in scan_batch too
    raise ImportError(f"scan_kernels implements strata {STRATA_ORDER}, STRATA has {tuple(s.name for s in STRATA)}")

_BAND_LOG_LO = np.log(np.array([lo for lo, _ in tails_mod.RATIO_BANDS]))
_BAND_LOG_HI = np.log(np.array([hi for _, hi in tails_mod.RATIO_BANDS]))


@numba.njit(inline="always")
def bucket_index(value, edges):
    """clip(searchsorted(edges, value, 'right') − 1, 0, len − 2), as rcdiag.analysis.distributions.strata, for a non-NaN value:
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
def scan_chunk(starts, pos, a, b, kept, entropy, lh, em1, pa_rows, pb_rows, log10_rows, table, seq_row, p_len,
               p_finish, p_reward, stop_code, edges, band_lo, band_hi, density_lo, density_scale, tail_sums, hist,
               outside, density, strata, strata_offsets):
    """One chunk of whole sequences: adds to the tails arrays (tail_sums [7], hist [2, bins] for ℓ > 0 and ℓ < 0,
    outside, density) and the stacked strata table [Σ buckets, 6] in place, over the `kept` rows (valid, finite
    log-probs). exp(a), exp(b), ℓ̂, expm1(ℓ̂) and log10|ℓ| per row come precomputed (numpy); each sequence's
    own strata (response length, finish reason, reward) are added once from its column of the chunk's
    per-sequence table (kernels.SEQ_COLUMNS), `seq_row` [S] its row of the sequence attributes.
    Returns (kept rows, max |ℓ|, underflow count, |ℓ| per row (−1 where not kept, for the worst tokens)).

    The position bucket is looked up, and its row added to, only when pos leaves the current power-of-two range,
    and ordinary tokens' row once per chunk (adding to one table row row after row waits on the previous add
    through memory)."""
    n_seq, n = starts.size, a.size
    absl_rows = np.full(n, -1.0)
    bins = density.shape[0]
    s_abs = s_l2 = s_pa = s_pb = s_paa = s_pbb = s_pab = 0.0
    kept_rows = underflow = 0
    top = 0.0
    pos_lo, pos_hi, pos_bucket = 1, 0, 0  # an empty range: the first row looks its bucket up
    # running sums of the strata rows that stay the same row after row, added to the table when the row changes:
    # the position bucket (until pos leaves its power-of-two range) and ordinary tokens (not a stop's last token)
    p0 = p1 = p2 = p3 = p4 = p5 = t0 = t1 = t2 = t3 = t4 = t5 = 0.0
    o_pos, o_prob, o_entropy, o_kind = strata_offsets[0], strata_offsets[2], strata_offsets[3], strata_offsets[4]
    for k in range(n_seq):
        if table[C_T, k] == 0:
            continue
        first, end = starts[k], starts[k + 1] if k + 1 < n_seq else n
        r = seq_row[k]
        length = max(p_len[r], 1) if p_len.size else 1
        finish = p_finish[r] if p_finish.size else 0
        reward = p_reward[r] if p_reward.size else np.nan
        stop_len = p_len[r] if p_len.size > 0 and p_len[r] >= 0 else -1
        for row in (strata_offsets[1] + bucket_index(length, POW2_EDGES) - 1, strata_offsets[5] + finish,
                    strata_offsets[6] + (2 if math.isnan(reward) else (0 if reward > 0 else 1))):
            _add_stratum(strata, row, table[C_T, k], table[C_L, k], table[C_ABS, k], table[C_SQ, k],
                         table[C_K3, k], table[C_MAX_ABS, k])
        for i in range(first, end):
            if not kept[i]:
                continue
            x, y = np.float64(a[i]), np.float64(b[i])
            lr = x - y
            absl = abs(lr)
            absl_rows[i] = absl
            kept_rows += 1
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
            else:  # the sign picks the row by index, not by a branch (ℓ's sign is a coin flip)
                hist[int(lr < 0), _fine_bin(absl, log10_rows[i], edges)] += 1
            lc = lh[i]
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
            k3 = em1[i] - lc
            e = entropy[i]
            last = i + 1 == end or (stop_len >= 0 and p + 1 >= stop_len)
            sq = lr * lr
            p0, p1, p2, p3, p4, p5 = p0 + 1.0, p1 + lr, p2 + absl, p3 + sq, p4 + k3, max(p5, absl)
            if last and finish == stop_code:
                _add_stratum(strata, o_kind + 1, 1.0, lr, absl, sq, k3, absl)
            else:
                t0, t1, t2, t3, t4, t5 = t0 + 1.0, t1 + lr, t2 + absl, t3 + sq, t4 + k3, max(t5, absl)
            for row in (o_prob + bucket_index(pb_, PROB_EDGES),
                        o_entropy + (bucket_index(e, ENTROPY_EDGES) if math.isfinite(e) else ENTROPY_EDGES.size - 1)):
                _add_stratum(strata, row, 1.0, lr, absl, sq, k3, absl)
    _add_stratum(strata, o_pos + pos_bucket, p0, p1, p2, p3, p4, p5)
    _add_stratum(strata, o_kind, t0, t1, t2, t3, t4, t5)
    tail_sums[0] += s_abs
    tail_sums[1] += s_l2
    tail_sums[2] += s_pa
    tail_sums[3] += s_pb
    tail_sums[4] += s_paa
    tail_sums[5] += s_pbb
    tail_sums[6] += s_pab
    return kept_rows, top, underflow, absl_rows


def scan_update(tails: TailAccumulator, strata: StrataAccumulator, chunk: TokenChunk, table: np.ndarray) -> None:
    """Add one chunk's kept rows (valid, finite log-probs) to the tails and strata (one compiled pass over the
    rows, their numpy-computed terms and the chunk's per-sequence `table`; the worst tokens by tails.worst_rows)."""
    info = strata.info
    t = chunk.terms
    with np.errstate(all="ignore"):  # rows not kept hold placeholders: skipped by the kernel
        pa_rows = chunk.memo(("exp_a",), lambda: np.exp(t.a, dtype=np.float64))
        pb_rows = chunk.memo(("exp_b",), lambda: np.exp(t.b, dtype=np.float64))
        log10_rows = np.log10(np.abs(t.ell))
    entropy = chunk.extra.get("entropy")
    if entropy is None:
        entropy = np.full(chunk.n, np.nan)
    offsets = np.cumsum([0] + [strata.sums[name].shape[0] for name in STRATA_ORDER[:-1]])
    stacked = np.zeros((int(offsets[-1]) + strata.sums[STRATA_ORDER[-1]].shape[0], 6))
    lo, hi = tails_mod.DENSITY_RANGE
    tail_sums = np.zeros(7)
    hist = np.zeros((2, tails.hist_pos.size), np.int64)
    kept, top, underflow, absl = scan_chunk(
        chunk.starts, chunk.pos, t.a, t.b, chunk.kept, entropy, t.lh, t.em1, pa_rows, pb_rows, log10_rows, table,
        info.lookup(chunk.seq_ids), info.response_len, info.finish, info.reward, _stop_code(info.finish_labels),
        tails_mod.EDGES, _BAND_LOG_LO, _BAND_LOG_HI, lo, tails_mod.DENSITY_BINS / (hi - lo), tail_sums, hist,
        tails.outside, tails.density, stacked, offsets)
    if not kept:
        return
    tails.n += kept
    tails.sums += tail_sums
    tails.max_abs = max(tails.max_abs, top)
    tails.underflow += underflow
    tails.hist_pos += hist[0]
    tails.hist_neg += hist[1]
    pick = tails_mod.worst_rows(absl, max(tails.worst_floor(), 0.0))  # ≥ 0: not the −1 of rows not kept
    token_id = chunk.extra.get("token_id")
    a_pick, b_pick = t.a[pick].astype(np.float64), t.b[pick].astype(np.float64)
    tails.keep_worst({"abs_log_ratio": absl[pick], "log_ratio": a_pick - b_pick, "train_logprob": a_pick,
                      "rollout_logprob": b_pick,
                      "seq_id": chunk.seq_ids[np.searchsorted(chunk.starts, pick, side="right") - 1],
                      "pos": np.asarray(chunk.pos[pick], np.int64),
                      "token_id": (np.full(pick.size, -1, np.int64) if token_id is None
                                   else np.asarray(token_id[pick], np.int64))})
    for name, start in zip(STRATA_ORDER, offsets, strict=True):
        part = stacked[start:start + strata.sums[name].shape[0]]
        strata.sums[name][:, :5] += part[:, :5]
        strata.sums[name][:, 5] = np.maximum(strata.sums[name][:, 5], part[:, 5])


def _stop_code(labels: list[str]) -> int:
    return labels.index("stop") if "stop" in labels else -1
