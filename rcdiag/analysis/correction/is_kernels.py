"""Token-level IS modes: every mode of a sweep in one compiled pass over a chunk's rows (analysis.correction.isstats).

The one definition of a row's weight and of its contribution (weight, add_row) lives here; the rejection
kernels add rows through it too.
"""
from __future__ import annotations

import numba
import numpy as np

from rcdiag.analysis.passes.kernels import CORE_COLUMNS, JIT, two_sum, two_sum_total

# token_mode's scalar output
TOKEN_MODE_FIELDS = ("n", "mean", "m2", "lo", "hi", "ess_mean", "ess_m2", "ess_lo", "ess_hi", "high", "low",
                     "clipped", "kept_tokens", "kept_seqs")


@numba.njit(inline="always")
def weight(x, r, upper, lower, log_upper, log_lower, mask_action):
    """(w, out of [L, C]) of one row: ℓ̂ = x, ρ = r."""
    out_flag = x > log_upper or x < log_lower
    if mask_action:
        return (0.0 if out_flag else r), out_flag
    return max(min(r, upper), lower), out_flag


@numba.njit(inline="always")
def add_row(x, r, upper, lower, log_upper, log_lower, log_lo, mask_action, swift_ess, acc):
    """One scored row (ℓ̂ = x, ρ = r) of one mode added to its running state `acc` = (#high, #low, #out of
    [L, C], #kept, Σw and its compensation, min w, max w, Σw̃ and its compensation, min w̃, max w̃; w̃ the swift ESS
    weight): (w, the new state). The one definition of a row's contribution, for every kernel that adds rows."""
    n_high, n_low, n_out, kept, s_w, c_w, lo_w, hi_w, s_e, c_e, lo_e, hi_e = acc
    w, out_flag = weight(x, r, upper, lower, log_upper, log_lower, mask_action)
    n_high += x > log_upper
    n_low += x < log_lo
    n_out += out_flag
    kept += not (mask_action and out_flag)
    s_w, c_w = two_sum(s_w, c_w, w)
    lo_w, hi_w = min(lo_w, w), max(hi_w, w)
    if swift_ess:
        e = min(max(w, 1.0 / upper), upper)
        s_e, c_e = two_sum(s_e, c_e, e)
        lo_e, hi_e = min(lo_e, e), max(hi_e, e)
    return w, (n_high, n_low, n_out, kept, s_w, c_w, lo_w, hi_w, s_e, c_e, lo_e, hi_e)


@numba.njit(**JIT)
def token_modes(lr, rho, stat, starts, params, swift_ess, rows):
    """Token-level IS modes over the scored rows (`stat` True) of a chunk, all modes in one pass over the rows.

    `params` float64 [M, 6]: per mode C, L (0 for none), log C, log L (−inf for none), log of the "low" bound,
    mask (1) or truncate (0). Weight w = clamp(ρ, [L, C]) (truncate) or ρ·[L ≤ ρ ≤ C] (mask, compared in log
    space); swift's ESS weight w̃ = clamp(w, 1/C, C). Returns per-sequence Σw and Σw̃ (float64 [M, S], 0 for a
    sequence without scored rows), float64 [M, 14] TOKEN_MODE_FIELDS (n, chunk mean, two-pass M2 about it, min,
    max of w and of w̃, counts) and, when `rows`, w on every row (float64 [M, n], 0 on unscored rows; else
    [M, 0]).

    Most rows are usually "quiet": ℓ̂ and ρ inside every mode's bounds, so every mode weighs them ρ and counts
    nothing; a chunk with at least half its scored rows quiet takes the shared-sum path (_modes_sparse: a 14-mode
    sweep then costs a few modes, not 14), any other the mode-by-mode loop (_modes_dense). Both give
    bit-identical results.
    """
    n_modes, n_seq, n = params.shape[0], starts.size, lr.size
    per_w = np.zeros((n_modes, n_seq))
    per_e = np.zeros((n_modes, n_seq))
    w_rows = np.zeros((n_modes, n if rows else 0))
    out = np.zeros((n_modes, len(TOKEN_MODE_FIELDS)))
    if n_modes == 0:
        return per_w, per_e, out, w_rows
    quiet, count, sparse = _quiet_rows(lr, rho, stat, params, swift_ess)
    if sparse:
        _modes_sparse(lr, rho, stat, starts, params, swift_ess, rows, quiet, count, per_w, per_e, out, w_rows, lr,
                      lr, lr, np.zeros((0, 0)))
    else:
        _modes_dense(lr, rho, stat, starts, params, swift_ess, rows, count, per_w, per_e, out, w_rows)
    return per_w, per_e, out, w_rows


@numba.njit(inline="always")
def _quiet_rows(lr, rho, stat, params, swift_ess):
    """(quiet bounds, scored rows, whether the chunk takes _modes_sparse) of token_modes' params [M, 6]."""
    n_modes, n = params.shape[0], lr.size
    upper = params[:, 0]
    # quiet rows: no mode clips, masks or counts them high/low (and swift's w̃ = w = ρ)
    quiet = (max(params[:, 3].max(), params[:, 4].max()), params[:, 2].min(),
             max(params[:, 1].max(), (1.0 / upper).max()) if swift_ess else params[:, 1].max(), upper.min())
    count = loud = 0
    if n_modes > 1:  # one visit counts the scored rows and those outside some mode's bounds
        for i in range(n):
            if stat[i]:
                count += 1
                loud += not _is_quiet(lr[i], rho[i], quiet)
    else:
        for i in range(n):
            count += stat[i]
    # measured break-even: ~60 % of the rows outside some mode's bounds
    return quiet, count, n_modes > 1 and loud * 2 < count


@numba.njit(inline="always")
def _is_quiet(x, r, quiet):
    """Row (ℓ̂ = x, ρ = r) inside every mode's bounds: quiet = (min log, max log, min ρ, max ρ)."""
    return quiet[0] <= x <= quiet[1] and quiet[2] <= r <= quiet[3]


@numba.njit(**JIT)
def _modes_dense(lr, rho, stat, starts, params, swift_ess, rows, count, per_w, per_e, out, w_rows):
    """token_modes mode by mode: modes outer, a sequence's rows inner (the accumulators stay in registers)."""
    n_modes, n_seq, n = params.shape[0], starts.size, lr.size
    for j in range(n_modes):
        upper, lower, log_upper, log_lower, log_lo = params[j, 0], params[j, 1], params[j, 2], params[j, 3], params[j, 4]
        mask_action = params[j, 5] > 0
        lo_w, hi_w, lo_e, hi_e = np.inf, -np.inf, np.inf, -np.inf
        n_high = n_low = n_out = kept_tok = kept_seq = 0
        for k in range(n_seq):
            acc = (n_high, n_low, n_out, 0, 0.0, 0.0, lo_w, hi_w, 0.0, 0.0, lo_e, hi_e)
            for i in range(starts[k], starts[k + 1] if k + 1 < n_seq else n):
                if stat[i]:
                    w, acc = add_row(lr[i], rho[i], upper, lower, log_upper, log_lower, log_lo, mask_action,
                                      swift_ess, acc)
                    if rows:
                        w_rows[j, i] = w
            n_high, n_low, n_out, kept, s_w, c_w, lo_w, hi_w, s_e, c_e, lo_e, hi_e = acc
            per_w[j, k] = two_sum_total(s_w, c_w)
            per_e[j, k] = two_sum_total(s_e, c_e)
            kept_tok += kept
            kept_seq += kept > 0
        out[j, 0] = count
        out[j, 3], out[j, 4], out[j, 7], out[j, 8] = lo_w, hi_w, lo_e, hi_e
        out[j, 9], out[j, 10], out[j, 11], out[j, 12], out[j, 13] = n_high, n_low, n_out, kept_tok, kept_seq
        if count:
            out[j, 1], out[j, 5] = per_w[j].sum() / count, per_e[j].sum() / count
            out[j, 2], out[j, 6] = _second_pass(lr, rho, stat, params[j], swift_ess, out[j, 1], out[j, 5])


@numba.njit(**JIT)
def _modes_sparse(lr, rho, stat, starts, params, swift_ess, rows, quiet, count, per_w, per_e, out, w_rows, a, b,
                  em1, core):
    """token_modes on a mostly quiet chunk. Within a sequence the modes share ONE compensated sum of ρ until a
    row gives a mode another weight; that mode then continues on its own copy of the sum. Each mode's sum is
    thus the same sequence of operations as in _modes_dense (bit-identical; tests/analysis/test_kernels.py).
    Modes that never left the shared sum in the chunk have equal weights and means: one M2 pass for them all.
    `core` float64 [len(CORE_COLUMNS), S] (token_modes_core; [0, 0]: none): also sequence_core's sums of the
    scored rows (`stat` = the kept rows) from log-probs a, b and em1 = expm1(ℓ̂), in the same visit of the rows."""
    n_modes, n_seq, n = params.shape[0], starts.size, lr.size
    with_core = core.shape[1] > 0
    upper, lower, log_upper, log_lower, log_lo = params[:, 0], params[:, 1], params[:, 2], params[:, 3], params[:, 4]
    mask_action = params[:, 5] > 0
    quiet_min, quiet_max = np.inf, -np.inf
    lo_w, hi_w = np.full(n_modes, np.inf), np.full(n_modes, -np.inf)
    lo_e, hi_e = np.full(n_modes, np.inf), np.full(n_modes, -np.inf)
    counts = np.zeros((5, n_modes), np.int64)  # high, low, out of [L, C], kept tokens, kept sequences
    s_w, c_w = np.zeros(n_modes), np.zeros(n_modes)
    s_e, c_e = np.zeros(n_modes), np.zeros(n_modes)
    kept = np.zeros(n_modes, np.int64)
    own = np.zeros(n_modes, np.bool_)  # this sequence: the mode left the shared sum
    ever = np.zeros(n_modes, np.bool_)  # this chunk: the mode left the shared sum in some sequence
    own_list = np.empty(n_modes, np.int64)
    for k in range(n_seq):
        shared_s = shared_c = 0.0
        own[:] = False
        n_own = 0
        kept[:] = 0
        n_quiet = 0
        sa = sb = k3 = s_ell = c_ell = s_chi = c_chi = 0.0
        t_core = 0
        for i in range(starts[k], starts[k + 1] if k + 1 < n_seq else n):
            if not stat[i]:
                continue
            x, r = lr[i], rho[i]
            if with_core:  # sequence_core's operations, in its order
                xa, yb, rm1 = np.float64(a[i]), np.float64(b[i]), em1[i]
                t_core += 1
                sa += xa
                sb += yb
                k3 += rm1 - x
                s_ell, c_ell = two_sum(s_ell, c_ell, xa - yb)
                s_chi, c_chi = two_sum(s_chi, c_chi, rm1 * (rm1 + 2.0))
            if _is_quiet(x, r, quiet):
                n_quiet += 1
                quiet_min, quiet_max = min(quiet_min, r), max(quiet_max, r)
                for t in range(n_own):
                    j = own_list[t]
                    s_w[j], c_w[j] = two_sum(s_w[j], c_w[j], r)
                    if swift_ess:
                        s_e[j], c_e[j] = two_sum(s_e[j], c_e[j], r)
                if rows:
                    w_rows[:, i] = r
            else:
                for j in range(n_modes):
                    w, out_flag = weight(x, r, upper[j], lower[j], log_upper[j], log_lower[j], mask_action[j])
                    counts[0, j] += x > log_upper[j]
                    counts[1, j] += x < log_lo[j]
                    counts[2, j] += out_flag
                    kept[j] += not (mask_action[j] and out_flag)
                    if rows:
                        w_rows[j, i] = w
                    lo_w[j], hi_w[j] = min(lo_w[j], w), max(hi_w[j], w)
                    e = r
                    if swift_ess:
                        e = min(max(w, 1.0 / upper[j]), upper[j])
                        lo_e[j], hi_e[j] = min(lo_e[j], e), max(hi_e[j], e)
                    if not own[j]:
                        if w == r and e == r:
                            continue  # still weighs ρ: stays on the shared sum
                        own[j] = ever[j] = True
                        own_list[n_own] = j
                        n_own += 1
                        s_w[j], c_w[j] = shared_s, shared_c
                        s_e[j], c_e[j] = shared_s, shared_c
                    s_w[j], c_w[j] = two_sum(s_w[j], c_w[j], w)
                    if swift_ess:
                        s_e[j], c_e[j] = two_sum(s_e[j], c_e[j], e)
            shared_s, shared_c = two_sum(shared_s, shared_c, r)
        if with_core:
            core[0, k], core[1, k], core[2, k], core[3, k] = t_core, sa, sb, two_sum_total(s_ell, c_ell)
            core[4, k], core[5, k] = k3, two_sum_total(s_chi, c_chi)
        shared = two_sum_total(shared_s, shared_c)
        for j in range(n_modes):
            per_w[j, k] = two_sum_total(s_w[j], c_w[j]) if own[j] else shared
            if swift_ess:
                per_e[j, k] = two_sum_total(s_e[j], c_e[j]) if own[j] else shared
            counts[3, j] += kept[j] + n_quiet
            counts[4, j] += kept[j] + n_quiet > 0
    for j in range(n_modes):
        out[j, 0] = count
        out[j, 3], out[j, 4] = min(lo_w[j], quiet_min), max(hi_w[j], quiet_max)
        out[j, 7], out[j, 8] = (min(lo_e[j], quiet_min), max(hi_e[j], quiet_max)) if swift_ess else (lo_e[j], hi_e[j])
        for f in range(5):
            out[j, 9 + f] = counts[f, j]
        if count:
            out[j, 1], out[j, 5] = per_w[j].sum() / count, per_e[j].sum() / count
    if count:
        _second_pass_modes(lr, rho, stat, params, swift_ess, quiet, ever, out)


@numba.njit(inline="always")
def _second_pass_modes(lr, rho, stat, params, swift_ess, quiet, ever, out):
    """_second_pass of every mode in ONE visit of the rows (out[:, 2] and out[:, 6] from the means out[:, 1] and
    out[:, 5]). On a quiet row every mode weighs ρ; a mode that never left the shared sum weighs ρ on every row;
    the others weigh _weight's value. Each mode's M2 thus adds the same terms in the same row order as
    _second_pass would: the same bits, without one pass over the chunk per mode (14 passes for the sweep)."""
    n_modes = params.shape[0]
    if n_modes <= 4:
        _second_pass_lanes(lr, rho, stat, params, swift_ess, quiet, ever, out)
        return
    m2 = np.zeros(n_modes)
    m2e = np.zeros(n_modes)
    mean_w = out[:, 1].copy()
    mean_e = out[:, 5].copy()
    upper, lower, log_upper, log_lower = params[:, 0], params[:, 1], params[:, 2], params[:, 3]
    mask_action = params[:, 5] > 0
    for i in range(lr.size):
        if not stat[i]:
            continue
        x, r = lr[i], rho[i]
        if _is_quiet(x, r, quiet):
            for j in range(n_modes):
                m2[j] += (r - mean_w[j]) * (r - mean_w[j])
            if swift_ess:
                for j in range(n_modes):
                    e = r - mean_e[j]
                    m2e[j] += e * e
            continue
        for j in range(n_modes):
            w = weight(x, r, upper[j], lower[j], log_upper[j], log_lower[j], mask_action[j])[0] if ever[j] else r
            m2[j] += (w - mean_w[j]) * (w - mean_w[j])
            if swift_ess:
                e = (min(max(w, 1.0 / upper[j]), upper[j]) if ever[j] else w) - mean_e[j]
                m2e[j] += e * e
    out[:, 2] = m2
    out[:, 6] = m2e


@numba.njit(**JIT)  # compiled on its own: inlined into _second_pass_modes, its registers were not kept
def _second_pass_lanes(lr, rho, stat, params, swift_ess, quiet, ever, out):
    """_second_pass_modes of at most four modes (the same terms in the same row order: the same bits), their running
    M2s scalars (registers). As array elements each row's addition waits on the previous row's store: with few
    modes nothing hides that wait, which made the pass half of analyze's token-mode time (issue #32); with many,
    their independent additions do, and one visit of the rows for all of them beats a visit per four."""
    n_modes = params.shape[0]
    for j0 in range(0, n_modes, 4):
        mu0, nu0 = _lane_means(out, j0)
        mu1, nu1 = _lane_means(out, j0 + 1)
        mu2, nu2 = _lane_means(out, j0 + 2)
        mu3, nu3 = _lane_means(out, j0 + 3)
        m0 = m1 = m2 = m3 = e0 = e1 = e2 = e3 = 0.0
        for i in range(lr.size):
            if not stat[i]:
                continue
            x, r = lr[i], rho[i]
            w0 = w1 = w2 = w3 = f0 = f1 = f2 = f3 = r
            if not _is_quiet(x, r, quiet):
                w0, f0 = _lane_weights(j0, x, r, params, ever)
                w1, f1 = _lane_weights(j0 + 1, x, r, params, ever)
                w2, f2 = _lane_weights(j0 + 2, x, r, params, ever)
                w3, f3 = _lane_weights(j0 + 3, x, r, params, ever)
            m0 += (w0 - mu0) * (w0 - mu0)
            m1 += (w1 - mu1) * (w1 - mu1)
            m2 += (w2 - mu2) * (w2 - mu2)
            m3 += (w3 - mu3) * (w3 - mu3)
            if swift_ess:
                d0, d1, d2, d3 = f0 - nu0, f1 - nu1, f2 - nu2, f3 - nu3
                e0 += d0 * d0
                e1 += d1 * d1
                e2 += d2 * d2
                e3 += d3 * d3
        for lane, m, e in ((0, m0, e0), (1, m1, e1), (2, m2, e2), (3, m3, e3)):
            if j0 + lane < n_modes:
                out[j0 + lane, 2], out[j0 + lane, 6] = m, e


@numba.njit(inline="always")
def _lane_means(out, j):
    """(mean of w, mean of w̃) of mode j (0, 0 past the last mode: a lane _second_pass_modes discards)."""
    return (out[j, 1], out[j, 5]) if j < out.shape[0] else (0.0, 0.0)


@numba.njit(inline="always")
def _lane_weights(j, x, r, params, ever):
    """(w, w̃) of mode j on a scored row that is not quiet (ℓ̂ = x, ρ = r) in _second_pass_modes: ρ for a mode that
    never left the shared sum and past the last mode; else _weight's w and w̃ = clamp(w, 1/C, C)."""
    if j >= params.shape[0] or not ever[j]:
        return r, r
    upper = params[j, 0]
    w = weight(x, r, upper, params[j, 1], params[j, 2], params[j, 3], params[j, 5] > 0)[0]
    return w, min(max(w, 1.0 / upper), upper)


@numba.njit(inline="always")
def _second_pass(lr, rho, stat, p, swift_ess, mean_w, mean_e):
    """(M2 of w about mean_w, M2 of w̃ about mean_e) over the scored rows, for one mode's params row `p`."""
    m2 = m2e = 0.0
    upper, mask_action = p[0], p[5] > 0
    for i in range(lr.size):
        if stat[i]:
            w = weight(lr[i], rho[i], upper, p[1], p[2], p[3], mask_action)[0]
            m2 += (w - mean_w) * (w - mean_w)
            if swift_ess:
                e = min(max(w, 1.0 / upper), upper) - mean_e
                m2e += e * e
    return m2, m2e


@numba.njit(**JIT)
def token_modes_core(a, b, kept, lh, em1, rho, starts, params, swift_ess):
    """token_modes(lh, rho, kept, starts, params, swift_ess, False), and on a chunk that takes _modes_sparse also
    sequence_core(a, b, kept, lh, em1, starts), its sums riding in that visit of the rows (analyze's chunks: one
    pass where there were two, their latency chains overlapped): (per_w, per_e, out, core), the same bits as the
    two calls; core is [0, 0] on any other chunk (the mode-by-mode loop visits the rows once per mode: nothing to
    share, and the chunk computes the columns itself if a consumer asks)."""
    n_modes, n_seq = params.shape[0], starts.size
    per_w = np.zeros((n_modes, n_seq))
    per_e = np.zeros((n_modes, n_seq))
    out = np.zeros((n_modes, len(TOKEN_MODE_FIELDS)))
    w_rows = np.zeros((n_modes, 0))
    core = np.zeros((0, 0))
    if n_modes == 0:
        return per_w, per_e, out, core
    quiet, count, sparse = _quiet_rows(lh, rho, kept, params, swift_ess)
    if sparse:
        core = np.zeros((len(CORE_COLUMNS), n_seq), np.float64)
        _modes_sparse(lh, rho, kept, starts, params, swift_ess, False, quiet, count, per_w, per_e, out, w_rows, a, b,
                      em1, core)
    else:
        _modes_dense(lh, rho, kept, starts, params, swift_ess, False, count, per_w, per_e, out, w_rows)
    return per_w, per_e, out, core
