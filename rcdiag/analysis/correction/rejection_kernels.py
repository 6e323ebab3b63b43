"""verl's rejection options as views of the token modes: every option set in one compiled pass
(analysis.correction.rejection).
"""
from __future__ import annotations

import numba
import numpy as np

from rcdiag.analysis.correction.is_kernels import TOKEN_MODE_FIELDS, add_row
from rcdiag.analysis.passes.kernels import JIT, two_sum_total

REJECTION_STATISTICS = ("k1", "k2", "k3")
"""rejection_views' statistic codes (an option's row of `options`, column 0: the index here)."""
REJECTION_SCOPES = ("token", "seq_sum", "seq_mean", "seq_max")
"""rejection_views' scope codes (column 1)."""


@numba.njit(inline="always")
def _statistic(code, lh, rm1):
    """verl's rejection statistic of one row (ℓ̂ = lh, ρ − 1 = rm1) by REJECTION_STATISTICS code: k1 = −ℓ̂,
    k2 = ½ℓ̂², k3 = (ρ − 1) − ℓ̂, the operations of rcdiag.analysis.correction.rejection's numpy form (so the same bits)."""
    if code == 0:
        return -lh
    if code == 1:
        return 0.5 * lh * lh
    return rm1 - lh


@numba.njit(inline="always")
def _add_view(v, k, acc, scored, per_w, per_e, lo_w, hi_w, lo_e, hi_e, counts):
    """Sequence k's reduced rows (`acc`, `scored` rows) are view v's: its per-sequence sums, extrema and counts."""
    n_high, n_low, n_out, kept, s_w, c_w, lo_sw, hi_sw, s_e, c_e, lo_se, hi_se = acc
    per_w[v, k], per_e[v, k] = two_sum_total(s_w, c_w), two_sum_total(s_e, c_e)
    lo_w[v], hi_w[v] = min(lo_w[v], lo_sw), max(hi_w[v], hi_sw)
    lo_e[v], hi_e[v] = min(lo_e[v], lo_se), max(hi_e[v], hi_se)
    counts[0, v] += n_high
    counts[1, v] += n_low
    counts[2, v] += n_out
    counts[3, v] += kept
    counts[4, v] += kept > 0
    counts[5, v] += scored


@numba.njit(**JIT)
def rejection_views(lr, rho, stat_lr, stat_rm1, mask, starts, seq_stat, options, option_view, n_views, row_out,
                    params, swift_ess):
    """ONE token mode (`params` [6], a row of token_modes' params) scored on K row sets, each the valid rows
    (`mask`) that its verl rejection options keep — the report's rejection options, each over token_truncate —
    with the keep flags decided here, row by row and sequence by sequence, instead of as numpy arrays.

    `options` float64 [R, 4]: statistic code (REJECTION_STATISTICS), scope code (REJECTION_SCOPES), lo, hi: an
    option keeps a row (token scope) or a whole sequence (seq_*) when lo ≤ statistic ≤ hi; `option_view` int64 [R]
    the set it belongs to (a set's options are chained: all must keep; a set without options scores every valid
    row). A token option's statistic comes from ℓ̂ = `stat_lr` and ρ − 1 = `stat_rm1` per row; a seq_* option's
    is `seq_stat[r, k]`, computed once from the chunk's per-sequence table (rcdiag.analysis.correction.rejection), as its
    numpy form reads it. `row_out` (zeros, unsigned [n], at least K bits) is scratch: bit j marks a row a token
    option of set j drops. Returns per_w, per_e [K, S] and out [K, 14]: what token_modes gives for each row set
    alone, bit for bit.

    A sequence a set keeps whole takes the valid rows' sums, counts and extrema, reduced once for all such sets;
    a set its seq_* option drops scores nothing there; only a set whose token option drops some of its rows sums
    it on its own. Every set's second pass (M2 about its mean) is one visit of the rows for all sets."""
    n_seq, n, n_options = starts.size, lr.size, options.shape[0]
    upper, lower, log_upper, log_lower, log_lo = params[0], params[1], params[2], params[3], params[4]
    mask_action = params[5] > 0
    per_w = np.zeros((n_views, n_seq))
    per_e = np.zeros((n_views, n_seq))
    out = np.zeros((n_views, len(TOKEN_MODE_FIELDS)))
    lo_w, hi_w = np.full(n_views, np.inf), np.full(n_views, -np.inf)
    lo_e, hi_e = np.full(n_views, np.inf), np.full(n_views, -np.inf)
    counts = np.zeros((6, n_views), np.int64)  # high, low, out of [L, C], kept tokens, kept sequences, scored
    dropped = np.zeros((n_views, n_seq), np.bool_)  # a seq_* option of the set drops the sequence
    partial = np.zeros(n_views, np.bool_)  # this sequence: a token option of the set drops some of its rows
    w_rows = np.empty(n)  # each valid row's weight (one mode: the same in every set), for the second pass
    for k in range(n_seq):
        first, end = starts[k], starts[k + 1] if k + 1 < n_seq else n
        partial[:] = False
        for r in range(n_options):
            code, scope, lo, hi, v = int(options[r, 0]), int(options[r, 1]), options[r, 2], options[r, 3], option_view[r]
            if scope == 0:
                for i in range(first, end):
                    if mask[i]:
                        s = _statistic(code, stat_lr[i], stat_rm1[i])
                        if not (s >= lo and s <= hi):
                            row_out[i] |= 1 << v
                            partial[v] = True
            else:
                s = seq_stat[r, k]
                dropped[v, k] |= not (s >= lo and s <= hi)
        acc = (0, 0, 0, 0, 0.0, 0.0, np.inf, -np.inf, 0.0, 0.0, np.inf, -np.inf)
        scored = 0
        for i in range(first, end):
            if mask[i]:
                w_rows[i], acc = add_row(lr[i], rho[i], upper, lower, log_upper, log_lower, log_lo, mask_action,
                                          swift_ess, acc)
                scored += 1
        for v in range(n_views):
            if dropped[v, k]:
                continue
            if not partial[v]:
                _add_view(v, k, acc, scored, per_w, per_e, lo_w, hi_w, lo_e, hi_e, counts)
                continue
            own = (0, 0, 0, 0, 0.0, 0.0, np.inf, -np.inf, 0.0, 0.0, np.inf, -np.inf)
            own_scored = 0
            for i in range(first, end):
                if mask[i] and not (row_out[i] >> v) & 1:
                    _, own = add_row(lr[i], rho[i], upper, lower, log_upper, log_lower, log_lo, mask_action,
                                      swift_ess, own)
                    own_scored += 1
            _add_view(v, k, own, own_scored, per_w, per_e, lo_w, hi_w, lo_e, hi_e, counts)
    for j in range(n_views):
        out[j, 0] = counts[5, j]
        out[j, 3], out[j, 4], out[j, 7], out[j, 8] = lo_w[j], hi_w[j], lo_e[j], hi_e[j]
        for f in range(5):
            out[j, 9 + f] = counts[f, j]
        if counts[5, j]:
            out[j, 1], out[j, 5] = per_w[j].sum() / counts[5, j], per_e[j].sum() / counts[5, j]
    _views_second_pass(w_rows, mask, starts, dropped, row_out, upper, swift_ess, out)
    return per_w, per_e, out


@numba.njit(inline="always")
def _views_second_pass(w_rows, mask, starts, dropped, row_out, upper, swift_ess, out):
    """M2 of each row set about its mean (out[:, 2] from out[:, 1], out[:, 6] from out[:, 5]): ONE visit of the
    rows for every set, each set's terms added in row order (as token_modes' second pass adds them)."""
    n_views, n_seq, n = out.shape[0], starts.size, w_rows.size
    m2 = np.zeros(n_views)
    m2e = np.zeros(n_views)
    mean_w = out[:, 1].copy()
    mean_e = out[:, 5].copy()
    for k in range(n_seq):
        for i in range(starts[k], starts[k + 1] if k + 1 < n_seq else n):
            if not mask[i]:
                continue
            w = w_rows[i]
            e0 = min(max(w, 1.0 / upper), upper)
            for j in range(n_views):
                if dropped[j, k] or (row_out[i] >> j) & 1:
                    continue
                m2[j] += (w - mean_w[j]) * (w - mean_w[j])
                if swift_ess:
                    e = e0 - mean_e[j]
                    m2e[j] += e * e
    for j in range(n_views):
        if out[j, 0]:
            out[j, 2], out[j, 6] = m2[j], m2e[j]
