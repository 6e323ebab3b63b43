"""Fused numba kernels: one pass per token chunk for validation, per-sequence sums and token-level IS weights.

Each kernel replaces a dozen numpy passes (and their temporaries) with one loop over the rows. Per-sequence sums
use Neumaier compensated summation, so a sequence's sum is (nearly) correctly rounded and depends only on that
sequence's values — never on how the rows were batched; callers feed these per-sequence values to the exact
accumulators of rcdiag.analysis.accum. Compiled on first use and cached on disk (`cache=True`).
"""
from __future__ import annotations

import math
import os

import numba
import numpy as np

_JIT = {"cache": True, "nogil": True}

# check_rows error codes (the caller re-runs the numpy checks to raise the exact InputError)
OK, BAD_KEY, BAD_VALUE = 0, 1, 2

SEQ_COLUMNS = ("T", "sum_a", "sum_b", "sum_l", "sum_abs", "max_abs", "sum_k3", "sum_k3_swift", "sum_k3_raw",
               "sum_chi2", "sum_lhat", "sum_sq", "max_k3", "w_sum", "w_sq", "ws_sum", "ws_sq")
"""THE per-sequence column table (sequence_table): sums over a sequence's kept rows (valid, finite log-probs) of
a = train, b = rollout, ℓ = a − b, |ℓ| (and its max), k3(ℓ̂) = expm1(ℓ̂) − ℓ̂ with ℓ̂ = clamp(ℓ, ±20) (also clamped
at 10, swift's, and of ℓ unclamped), ρ̂² − 1 = expm1(ℓ̂)(expm1(ℓ̂) + 2), ℓ̂, ℓ², the max of k3(ℓ̂), and the
token_truncate weights at the table's (C, L): w = clamp(ρ̂, L or 0, C), w², swift's ESS weight ws = clamp(ρ̂, 1/C, C)
and ws². T is the kept rows. Every metric, the bootstrap, the strata, verl's seq_* rejection statistics, the
sequence-level IS modes and the dashboard's sequence index read their per-sequence numbers from it."""
COLUMN = {name: j for j, name in enumerate(SEQ_COLUMNS)}
(C_T, C_A, C_B, C_L, C_ABS, C_MAX_ABS, C_K3, C_K3_SWIFT, C_K3_RAW, C_CHI2, C_LHAT, C_SQ, C_MAX_K3, C_W, C_W2, C_WS,
 C_WS2) = range(len(SEQ_COLUMNS))
SWIFT_K3_CLAMP = 10.0
"""ms-swift clamps each token's k3 at 10 (sum_k3_swift)."""

# token_mode's scalar output
TOKEN_MODE_FIELDS = ("n", "mean", "m2", "lo", "hi", "ess_mean", "ess_m2", "ess_lo", "ess_hi", "high", "low",
                     "clipped", "kept_tokens", "kept_seqs")


@numba.njit(**_JIT)
def check_rows(seq, pos, a, b, mask, has_prev, prev_seq, prev_pos):
    """One batch: OK when pos ≥ 0, (seq_id, pos) strictly increases (also after the previous batch's last key) and
    the log-probs a, b are finite on valid rows; else BAD_KEY or BAD_VALUE at the first failure.

    The clean case, nearly always, is one branch-free sweep (each row compared with the row before it, a failure
    OR-ed in: the processor vectorises it); only a batch that fails is walked again to name its first failure."""
    n = seq.size
    if n == 0:
        return OK
    bad = pos[0] < 0 or (has_prev and (seq[0] < prev_seq or (seq[0] == prev_seq and pos[0] <= prev_pos)))
    for i in range(1, n):
        bad |= (pos[i] < 0) | (seq[i] < seq[i - 1]) | ((seq[i] == seq[i - 1]) & (pos[i] <= pos[i - 1]))
    for i in range(n):  # x − x is 0 for a finite x, NaN for ±inf and NaN
        bad |= mask[i] & ((a[i] - a[i]) + (b[i] - b[i]) != 0.0)
    return _first_failure(seq, pos, a, b, mask, has_prev, prev_seq, prev_pos) if bad else OK


@numba.njit(inline="always")
def _first_failure(seq, pos, a, b, mask, has_prev, prev_seq, prev_pos):
    last_s, last_p, have = prev_seq, prev_pos, has_prev
    for i in range(seq.size):
        s, p = seq[i], np.int64(pos[i])
        if p < 0 or (have and (s < last_s or (s == last_s and p <= last_p))):
            return BAD_KEY
        last_s, last_p, have = s, p, True
        if mask[i] and not (math.isfinite(a[i]) and math.isfinite(b[i])):
            return BAD_VALUE
    return OK


@numba.njit(inline="always")
def _row(a, b, mask, i):
    """(a, b) of row i as float64, (0, 0) on a masked row."""
    if mask[i]:
        return np.float64(a[i]), np.float64(b[i])
    return 0.0, 0.0


@numba.njit(inline="always")
def _grow(partials, count, x):
    """Add one finite x to the non-overlapping partials[:count] (msum's inner loop, shared by grow_partials and
    grow_partials_rows). Returns (count, whether the sum overflowed: x is then dropped, the caller flags it and
    grows that sum no further: its partials then hold ±inf, every later value would add a NaN partial and run
    past the buffer's end)."""
    i = 0
    for j in range(count):
        y = partials[j]
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo != 0.0:
            partials[i] = lo
            i += 1
        x = hi
    overflow = not math.isfinite(x)
    partials[i] = 0.0 if overflow else x
    return i + 1, overflow


@numba.njit(**_JIT)
def grow_partials(partials, count, values, plain, special, flags):
    """Add `values` (float64 [m]) to an exact sum held as Shewchuk's non-overlapping partials (math.fsum's own
    algorithm, msum): `partials[:count]`, increasing magnitude, whose exact sum is the exact sum of every finite
    value added. Non-finite values go to `special` (IEEE sum: inf, or NaN for inf − inf), every finite value to
    `plain` as well (the IEEE fallback when an intermediate sum overflows). `flags`: bit 0 a non-finite value,
    bit 1 an overflow. Returns (count, plain, special, flags). ~3 ns a value where tolist + math.fsum took ~25."""
    for v in values:
        x = np.float64(v)
        if not math.isfinite(x):
            special += x
            flags |= 1
            continue
        plain += x
        if flags & 2:  # overflowed: value() is the IEEE `plain`; growing on would corrupt memory (see _grow)
            continue
        count, overflow = _grow(partials, count, x)
        if overflow:
            flags |= 2
    return count, plain, special, flags


@numba.njit(**_JIT)
def grow_partials_rows(partials, count, values, lengths, plain, special, flags, track_plain):
    """K exact sums at once (accum.ExactSums), in place: sum k (partials[k], count[k], plain[k], special[k],
    flags[k], as grow_partials's) takes values[k, :lengths[k]]. One call for a chunk's (K, m) values, where K
    ExactSum adds cost a Python call each (issue #32: the gate sweep's ~130 settings × 3 sums a chunk).
    `track_plain` False leaves `plain` alone (a merge adds the other side's partials, and its plain apart)."""
    for k in range(values.shape[0]):
        row = partials[k]
        c, p, s, f = count[k], plain[k], special[k], flags[k]
        for t in range(lengths[k]):
            x = np.float64(values[k, t])
            if not math.isfinite(x):
                s += x
                f |= 1
                continue
            if track_plain:
                p += x
            if f & 2:
                continue
            c, overflow = _grow(row, c, x)
            if overflow:
                f |= 2
        count[k], plain[k], special[k], flags[k] = c, p, s, f


GATE_COUNTS = ("valid", "kept", "high", "low", "seqs", "seqs_kept", "seqs_masked", "pos", "neg", "zero",
               "kept_pos", "kept_neg", "kept_zero")
"""gate_family's counts per setting, in order (analysis.gates.GateState.counts)."""
GATE_RULES = ("band", "dppo", "dppo_kl", "any_token")
"""gate_family's rule codes (analysis.gate_defs rules; `upper` is a band without a lower bound)."""
GATE_SEQ_COUNTS = ("kept", "high", "low", "low_neg", "high_pos", "drop_pos", "drop_neg")
"""gate_family's per-sequence counts per setting (`detail`), in order: valid rows kept, masked from above, from
below (as the rule flags them), from below with A < 0, from above with A > 0, masked with A > 0, with A < 0."""


@numba.njit(**_JIT)
def _whole_sequence(first, last, kw, hw, uw, lw, mask, rho, adv, flag, xs, ratio_weight, signed, detail, bins, sr,
                    sq, sx, n_b, w_b, lo_b, hi_b, flag_b, sign_b, bin_of):
    """gate_family's rows of one sequence that a gate of whole sequences places at (h, k, u, ls) = (hw, kw, uw,
    lw), k > 0: the generic loop's adds in its order (the same bits), each quantity in a register a row. Apart
    from gate_family's loop, so its code stays as it was for every other row (inlined, it slowed the token
    gates' loop by ~7 %). Returns (valid rows, with A > 0, with A < 0)."""
    J, m = w_b.size - 1, xs.shape[0]
    sk, sh, su, sls, hp, lnu, lns, dp, dn = bins[0], bins[1], bins[2], bins[3], bins[4], bins[5], bins[6], \
        bins[7], bins[8]
    cw = fw = spw = snw = szw = pw = gw = 0
    rw = qw = xw = 0.0
    ww, low, hiw = w_b[kw], lo_b[kw], hi_b[kw]
    for i in range(first, last):
        if not mask[i]:
            continue
        r, a_i = rho[i], adv[i]
        w = (r if ratio_weight else 1.0) if kw < J else 0.0
        cw += 1
        ww += w
        low, hiw = min(low, w), max(hiw, w)
        fw += flag[i]
        rw += r
        qw += r * r
        if signed:
            if a_i > 0:
                spw += 1
            elif a_i < 0:
                snw += 1
            else:
                szw += 1
        if detail:
            pw += a_i > 0
            gw += a_i < 0
            if m:
                xw += xs[0, i]
            for q in range(1, m):
                sx[q, kw] += xs[q, i]
        if ratio_weight:
            bin_of[i] = kw
    n_b[kw] += cw
    w_b[kw], lo_b[kw], hi_b[kw] = ww, low, hiw
    flag_b[kw] += fw
    sk[kw] += cw
    sr[kw] += rw
    sq[kw] += qw
    sh[hw] += cw
    if signed:
        sign_b[0, kw] += spw
        sign_b[1, kw] += snw
        sign_b[2, kw] += szw
    if detail:
        su[uw] += cw
        sls[lw] += cw
        hp[hw] += pw
        dp[kw] += pw
        lnu[uw] += gw
        lns[lw] += gw
        dn[kw] += gw
        if m:
            sx[0, kw] += xw
    return cw, pw, gw


@numba.njit(**_JIT)
def gate_family(rule, value, ell, his, los, mask, adv, signed, rho, ratio_weight, starts, xs, flag, detail, whole):
    """Every setting of one gate family on a chunk in one compiled pass, O(1) work a row for any number of settings
    (issue #32: it was decide's numpy masks, a reduction and the frameworks' numbers once per setting, ×130
    settings in the report's gate sweep). Setting j masks a valid row from above / below by its rule
    (analysis.gate_defs) with the bounds his[j], los[j]; `rule` indexes GATE_RULES, `value` is the gate's statistic
    per row (any_token: the clamped ℓ, a sequence masked from above when one of its valid rows has ℓ > his[j], from
    below when one has ℓ < los[j]); ℓ = a − b in float64 (dppo_kl's direction: its sign is exactly a − b's).

    The settings must be NESTED (analysis.gates.GateFamily orders them so): a row masked at setting j is masked
    at every j' < j, from above likewise. Each row is then placed by h (the settings that mask it from above are
    j < h) and k (those that mask it at all, j < k; it is kept at j ≥ k), found by comparing it with every bound
    in registers; the reductions add it to bin h or k only, and each setting's numbers are prefix (or suffix)
    sums over the bins: per sequence for the sums an ExactSum takes (bins in order, so a sequence's sum depends
    on its own rows only, never on the chunking), per chunk for the counts. The moments of w use the exact
    decomposition M2_j = Σ_b≤j [M2_b + n_b (mean_b − μ_j)²] + (masked rows) μ_j² of two-pass bin moments (no
    cancellation: every term is ≥ 0). `whole`: the gate keeps or masks whole sequences, placed once each: a band
    on a per-sequence statistic (rule 0: `value` is then per SEQUENCE, float64 [S]), or any_token.

    Returns, per setting j: counts [J, 13] (GATE_COUNTS; the sign counts 0 unless `signed`), per-sequence sums
    [3, J, S] of the weight w (ρ on kept rows, or 1 when not `ratio_weight`; 0 on masked valid rows) and of ρ and
    ρ² on kept rows, the moments of w over the valid rows (mean, M2), its min and max, the kept rows where `flag`
    holds [J]; and when `detail`, per-sequence counts [7, J, S] (GATE_SEQ_COUNTS) and the per-sequence sums
    [m, J, S] of each row value xs[q] over the kept rows and over the masked valid rows."""
    n_seq, n, J, m = starts.size, mask.size, his.size, xs.shape[0]
    B = J + 1
    D = J if detail else 0
    counts = np.zeros((J, len(GATE_COUNTS)), np.int64)
    sums = np.zeros((3, J, n_seq))  # one block: the caller adds it to its ExactSums in one call
    per_w, per_rho, per_rho2 = sums[0], sums[1], sums[2]
    sc = np.zeros((len(GATE_SEQ_COUNTS), D, n_seq), np.int64)
    x_kept = np.zeros((m, D, n_seq))
    x_drop = np.zeros((m, D, n_seq))
    # k per row, the first setting that keeps it (0, every setting, unless written): only the second pass of a
    # ratio weight's moments reads it
    bin_of = np.zeros(n if ratio_weight else 0, np.int32)
    n_b, w_b, lo_b, hi_b = np.zeros(B, np.int64), np.zeros(B), np.full(B, np.inf), np.full(B, -np.inf)
    flag_b = np.zeros(B, np.int64)
    sign_b = np.zeros((3, B), np.int64)  # rows by k: A > 0, A < 0, A = 0
    # per-sequence bins: by k (kept count, Σρ, Σρ², A > 0, A < 0, row values), by h (above; A > 0), by the raw
    # low interval [ls, u) (below as the rule flags it; A < 0)
    bins = np.zeros((9, B), np.int64)
    sk, sh, su, sls, hp, lnu, lns, dp, dn = bins[0], bins[1], bins[2], bins[3], bins[4], bins[5], bins[6], bins[7], \
        bins[8]
    sr, sq = np.zeros(B), np.zeros(B)
    sx = np.zeros((m, B))
    wb0, lo0, hi0 = 0.0, np.inf, -np.inf  # bin 0 of the chunk (the rows every setting keeps)
    hi0_, lo0_ = his[0], los[0]  # setting 0's bounds, in registers: a row it keeps is kept at every setting
    fb0 = sp0 = sn0 = sz0 = 0
    for k in range(n_seq):
        first, last = starts[k], starts[k + 1] if k + 1 < n_seq else n
        h3 = k3 = u3 = 0
        if rule == 3:  # any_token: a sequence is masked from above when its largest ℓ is (NaN is never above)
            top, bottom = -np.inf, np.inf
            for i in range(first, last):
                if mask[i]:
                    if value[i] > top:
                        top = value[i]
                    if value[i] < bottom:
                        bottom = value[i]
            for j in range(J):
                over_j, under_j = top > his[j], bottom < los[j]
                h3 += over_j
                k3 += over_j or under_j
                u3 += under_j
        bins[:] = 0
        sr[:] = 0.0
        sq[:] = 0.0
        sx[:] = 0.0
        valid = n_pos = n_neg = c0 = p0 = g0 = 0
        r0 = q0 = x0 = 0.0  # x0: bin 0's sum of xs[0] (the first row value, nearly always the only one)
        # a whole sequence's place (`whole`: the statistic is one value per sequence, or any_token's sequence
        # place) is found once: a sequence some setting masks then costs one register add a quantity a row, as a
        # kept one does, not a place and a dozen bin updates a row (issue #32: such gates mask most sequences of
        # a run with any drift, which made them the sweep's slowest families). The adds are the generic loop's,
        # in its order: the same bits.
        hw = kw = uw = 0
        if whole and rule == 3:
            hw, kw, uw = h3, k3, u3
        elif whole and rule == 0:  # `value` holds one value per sequence
            v = value[k]
            for j in range(J):
                hw += 0 if v <= his[j] else 1
                kw += 0 if v <= his[j] and v >= los[j] else 1
            uw = kw
        if kw > 0:
            valid, n_pos, n_neg = _whole_sequence(
                first, last, kw, hw, uw, 0 if rule == 3 else hw, mask, rho, adv, flag, xs, ratio_weight, signed,
                detail, bins, sr, sq, sx, n_b, w_b, lo_b, hi_b, flag_b, sign_b, bin_of)
        else:
            i = first
            while i < last:
                # The bounds nest (his rise, the low side tightens toward setting 0), so a row setting 0 keeps is
                # kept at every setting: two comparisons, not 2J, for nearly every row, and bin 0's sums in
                # registers (the same adds in the same order as in memory: a chain through memory cost 3×). In a
                # loop of their own, which runs until a row some setting masks: inside the loop that also places
                # such rows, the registers spilled (1.3-1.6× the time of every family).
                while i < last:
                    if mask[i]:
                        a_i = adv[i]
                        if rule == 0:  # band / upper: keep lo ≤ v ≤ hi (a whole sequence is here when kept)
                            keep = whole or (value[i] <= hi0_ and value[i] >= lo0_)
                        elif rule == 1:  # dppo: A > 0 keeps v ≤ hi, else v ≥ lo (lo = −δ_low here)
                            keep = value[i] <= hi0_ if a_i > 0 else value[i] >= lo0_
                        elif rule == 2:  # dppo_kl: the bound binds where p moved the way the advantage pushes
                            v = value[i]
                            keep = (v <= hi0_ or ell[i] <= 0) if a_i > 0 else (v <= lo0_ or ell[i] >= 0)
                        else:  # any_token: the sequence's place
                            keep = k3 == 0
                        if not keep:
                            break
                        valid += 1
                        r = rho[i]
                        w = r if ratio_weight else 1.0
                        c0 += 1
                        r0 += r
                        q0 += r * r
                        wb0 += w
                        lo0, hi0 = min(lo0, w), max(hi0, w)
                        fb0 += flag[i]
                        if signed:
                            sp0 += a_i > 0
                            sn0 += a_i < 0
                            sz0 += a_i == 0
                        if detail:  # n_pos / n_neg take p0 / g0 after the sequence
                            p0 += a_i > 0
                            g0 += a_i < 0
                            if m:
                                x0 += xs[0, i]
                            for q in range(1, m):
                                sx[q, 0] += xs[q, i]
                    i += 1
                if i == last:
                    break
                # row i is valid and masked at setting 0 (so k ≥ 1): its place (rules of analysis.gate_defs; NaN
                # masks), written out here, as an inlined function made this loop 3× slower
                valid += 1
                v, r, rose, a_i = value[i], rho[i], ell[i], adv[i]
                pos = a_i > 0
                h = kk = u = 0
                if rule == 0:  # band / upper: keep lo ≤ v ≤ hi
                    if not (v <= hi0_ and v >= lo0_):
                        for j in range(J):
                            hi = his[j]
                            h += 0 if v <= hi else 1
                            kk += 0 if v <= hi and v >= los[j] else 1
                elif rule == 1:  # dppo: A > 0 keeps v ≤ hi, else v ≥ lo (lo = −δ_low here)
                    if pos:
                        if not v <= hi0_:
                            for j in range(J):
                                h += 0 if v <= his[j] else 1
                    elif not v >= lo0_:
                        for j in range(J):
                            kk += 0 if v >= los[j] else 1
                    kk = max(h, kk)
                elif rule == 2:  # dppo_kl: the bound binds where p moved the way the advantage pushes
                    if pos:
                        if not (v <= hi0_ or rose <= 0):
                            for j in range(J):
                                h += 0 if v <= his[j] or rose <= 0 else 1
                    elif not (v <= lo0_ or rose >= 0):
                        for j in range(J):
                            kk += 0 if v <= los[j] or rose >= 0 else 1
                    kk = max(h, kk)
                else:  # any_token: the sequence's place
                    h, kk, u = h3, k3, u3
                if rule != 3:
                    u = kk
                ls = 0 if rule == 3 else h
                if ratio_weight:
                    bin_of[i] = kk
                w = (r if ratio_weight else 1.0) if kk < J else 0.0
                n_b[kk] += 1
                w_b[kk] += w
                lo_b[kk], hi_b[kk] = min(lo_b[kk], w), max(hi_b[kk], w)
                flag_b[kk] += flag[i]
                sk[kk] += 1
                sr[kk] += r
                sq[kk] += r * r
                sh[h] += 1
                if signed:
                    sign_b[0 if a_i > 0 else (1 if a_i < 0 else 2), kk] += 1
                if detail:
                    su[u] += 1
                    sls[ls] += 1
                    n_pos += pos
                    n_neg += a_i < 0
                    if pos:
                        hp[h] += 1
                        dp[kk] += 1
                    elif a_i < 0:
                        lnu[u] += 1
                        lns[ls] += 1
                        dn[kk] += 1
                    for q in range(m):
                        sx[q, kk] += xs[q, i]
                i += 1
        n_b[0] += c0
        n_pos += p0
        n_neg += g0
        if m:
            sx[0, 0] += x0  # 0 + x0: the bits of the adds in memory
        sk[0] += c0
        sr[0] += r0
        sq[0] += q0
        sh[0] += c0
        su[0] += c0
        sls[0] += c0
        hp[0] += p0
        dp[0] += p0
        lnu[0] += g0
        lns[0] += g0
        dn[0] += g0
        kept = c_h = c_u = c_ls = c_hp = c_lnu = c_lns = c_dp = c_dn = 0
        s_r = s_q = 0.0
        for j in range(J):  # setting j: the rows of bins b ≤ j are kept (by h: not masked from above)
            kept += sk[j]
            s_r += sr[j]
            s_q += sq[j]
            c_h += sh[j]
            per_rho[j, k], per_rho2[j, k] = s_r, s_q
            per_w[j, k] = s_r if ratio_weight else float(kept)
            high = valid - c_h
            counts[j, 0] += valid
            counts[j, 1] += kept
            counts[j, 2] += high
            counts[j, 3] += valid - kept - high
            counts[j, 4] += valid > 0
            counts[j, 5] += kept > 0
            counts[j, 6] += valid > 0 and kept < valid
            if detail:
                c_u += su[j]
                c_ls += sls[j]
                c_hp += hp[j]
                c_lnu += lnu[j]
                c_lns += lns[j]
                c_dp += dp[j]
                c_dn += dn[j]
                sc[0, j, k] = kept
                sc[1, j, k] = high
                sc[2, j, k] = c_ls - c_u
                sc[3, j, k] = c_lns - c_lnu
                sc[4, j, k] = n_pos - c_hp
                sc[5, j, k] = n_pos - c_dp
                sc[6, j, k] = n_neg - c_dn
        if detail and m:
            for q in range(m):
                s_k = 0.0
                for j in range(J):
                    s_k += sx[q, j]
                    x_kept[q, j, k] = s_k
                s_d = sx[q, J]
                for j in range(J - 1, -1, -1):
                    x_drop[q, j, k] = s_d
                    s_d += sx[q, j]
    w_b[0], lo_b[0], hi_b[0] = wb0, lo0, hi0
    flag_b[0] = fb0
    sign_b[0, 0], sign_b[1, 0], sign_b[2, 0] = sp0, sn0, sz0
    mean_b = np.zeros(B)
    m2_b = np.zeros(B)
    for b in range(J):
        mean_b[b] = w_b[b] / n_b[b] if n_b[b] else 0.0
    if ratio_weight:  # w = 1 on every kept row otherwise: each bin's M2 is exactly 0
        m0, mean0 = 0.0, mean_b[0]
        for i in range(n):
            b = bin_of[i]
            if mask[i]:
                if b == 0:
                    m0 += (rho[i] - mean0) * (rho[i] - mean0)
                elif b < J:
                    d = rho[i] - mean_b[b]
                    m2_b[b] += d * d
        m2_b[0] = m0
    mean = np.zeros(J)
    m2 = np.zeros(J)
    lo_w = np.full(J, np.inf)
    hi_w = np.full(J, -np.inf)
    lower = np.zeros(J, np.int64)
    lo, hi = np.inf, -np.inf
    c_flag = c_pos = c_neg = c_zero = 0
    for j in range(J):
        valid, kept = counts[j, 0], counts[j, 1]
        mu = per_w[j].sum() / valid if valid else 0.0
        mean[j] = mu
        total = (valid - kept) * mu * mu
        for b in range(j + 1):
            total += m2_b[b] + n_b[b] * (mean_b[b] - mu) * (mean_b[b] - mu)
        m2[j] = total
        lo, hi = min(lo, lo_b[j]), max(hi, hi_b[j])
        lo_w[j], hi_w[j] = (min(lo, 0.0), max(hi, 0.0)) if kept < valid else (lo, hi)
        c_flag += flag_b[j]
        lower[j] = c_flag
        if signed:
            c_pos += sign_b[0, j]
            c_neg += sign_b[1, j]
            c_zero += sign_b[2, j]
            counts[j, 7], counts[j, 8], counts[j, 9] = sign_b[0].sum(), sign_b[1].sum(), sign_b[2].sum()
            counts[j, 10], counts[j, 11], counts[j, 12] = c_pos, c_neg, c_zero
    return counts, sums, mean, m2, lo_w, hi_w, lower, sc, x_kept, x_drop


@numba.njit(**_JIT)
def segment_starts(seq):
    """First row of each run of equal seq_id (int64 [S]); empty input → empty."""
    n = seq.size
    out = np.empty(n, np.int64)
    k = 0
    for i in range(n):
        if i == 0 or seq[i] != seq[i - 1]:
            out[k] = i
            k += 1
    return out[:k]


@numba.njit(inline="always")
def _two_sum(s, c, x):
    """(s + x, c + its rounding error): branch-free compensated step (Knuth's TwoSum)."""
    t = s + x
    z = t - s
    return t, c + ((s - (t - z)) + (x - z))


@numba.njit(inline="always")
def _total(s, c):
    """s + c, or s alone when s is ±inf/NaN (the compensation term is then NaN)."""
    return s + c if math.isfinite(s) else s


@numba.njit(**_JIT)
def segment_means(values, mask, starts, segments):
    """The gates' per-sequence / per-segment aggregates of a row value in one pass over the valid rows (they were
    numpy's masked copy, reduceat, a division and a repeat per call, issue #32): each sequence's sum of `values`
    over its valid rows, or (`segments`) each segment's mean (ROLL's segments: runs of consecutive valid rows
    within a sequence). Sums are compensated (Neumaier), so nearly correctly rounded; masked rows are never read.
    A sequence's mean is its sum / max(count, 1) (analysis.gate_stats.sequence_mean), so a gate that reads both
    sums once. Returns (per row [n] with `segments`, else [0]: a valid row's segment mean, 0 on masked rows; per
    sequence [S]: the sum, zeros with `segments`)."""
    n, n_seq = mask.size, starts.size
    rows = np.zeros(n if segments else 0)
    per_seq = np.zeros(n_seq)
    for k in range(n_seq):
        first, last = starts[k], starts[k + 1] if k + 1 < n_seq else n
        if segments:
            i = first
            while i < last:
                if not mask[i]:
                    i += 1
                    continue
                j, s, c = i, 0.0, 0.0
                while j < last and mask[j]:
                    s, c = _two_sum(s, c, np.float64(values[j]))
                    j += 1
                mean = _total(s, c) / (j - i)
                for t in range(i, j):
                    rows[t] = mean
                i = j
            continue
        s = c = 0.0
        for i in range(first, last):
            if mask[i]:
                s, c = _two_sum(s, c, np.float64(values[i]))
        per_seq[k] = _total(s, c)
    return rows, per_seq


@numba.njit(**_JIT)
def sequence_table(a, b, kept, lh, em1, rho, starts, threshold, lower):
    """SEQ_COLUMNS per sequence of a chunk, one pass over its rows: float64 [len(SEQ_COLUMNS), S].

    a, b: log-probs [n] as stored, float32 or float64, widened per row (any value on rows not `kept`); lh = ℓ̂, em1 = expm1(ℓ̂), rho = exp(ℓ̂) per row,
    computed for the whole chunk by numpy's SIMD loops (chunks.TokenChunk.terms). The sums that cancel (Σℓ,
    Σ(ρ̂² − 1), Σℓ̂) are compensated (TwoSum), so a sequence's sum is nearly correctly rounded and depends only
    on its own rows; the others add terms of one sign (or Σa, Σb, whose terms share a sign). A sequence without
    kept rows has T = 0 and every column 0."""
    n_seq, n = starts.size, a.size
    out = np.zeros((len(SEQ_COLUMNS), n_seq), np.float64)
    inv = 1.0 / threshold
    for k in range(n_seq):
        sa = sb = s_abs = top = k3 = k3s = k3r = sq = top_k3 = w1 = w2 = e1 = e2 = 0.0
        s_ell = c_ell = s_chi = c_chi = s_hat = c_hat = 0.0
        t = 0
        for i in range(starts[k], starts[k + 1] if k + 1 < n_seq else n):
            if not kept[i]:
                continue
            x, y = np.float64(a[i]), np.float64(b[i])
            ell = x - y
            h = lh[i]
            rm1 = em1[i]
            r = rho[i]
            term = rm1 - h
            t += 1
            sa += x
            sb += y
            mag = abs(ell)
            s_abs += mag
            top = max(top, mag)
            k3 += term
            k3s += min(term, SWIFT_K3_CLAMP)
            k3r += term if h == ell else math.expm1(ell) - ell
            sq += ell * ell
            top_k3 = max(top_k3, term)
            w = min(max(r, lower), threshold)
            ws = min(max(r, inv), threshold)
            w1 += w
            w2 += w * w
            e1 += ws
            e2 += ws * ws
            s_ell, c_ell = _two_sum(s_ell, c_ell, ell)
            s_chi, c_chi = _two_sum(s_chi, c_chi, rm1 * (rm1 + 2.0))
            s_hat, c_hat = _two_sum(s_hat, c_hat, h)
        out[C_T, k], out[C_A, k], out[C_B, k], out[C_L, k] = t, sa, sb, _total(s_ell, c_ell)
        out[C_ABS, k], out[C_MAX_ABS, k], out[C_K3, k], out[C_K3_SWIFT, k] = s_abs, top, k3, k3s
        out[C_K3_RAW, k], out[C_CHI2, k], out[C_LHAT, k], out[C_SQ, k] = k3r, _total(s_chi, c_chi), _total(
            s_hat, c_hat), sq
        out[C_MAX_K3, k], out[C_W, k], out[C_W2, k], out[C_WS, k], out[C_WS2, k] = top_k3, w1, w2, e1, e2
    return out


@numba.njit(**_JIT)
def clamped_log_ratio(a, b, kept, clamp):
    """(ℓ, ℓ̂) per row, float64 [n]: ℓ = a − b on kept rows and 0 elsewhere, ℓ̂ = clamp(ℓ, ±clamp); one pass (the
    numpy form took four: subtract, where, clip and their temporaries)."""
    n = a.size
    ell = np.empty(n)
    lh = np.empty(n)
    for i in range(n):
        x = np.float64(a[i]) - np.float64(b[i]) if kept[i] else 0.0
        ell[i] = x
        lh[i] = min(max(x, -clamp), clamp)
    return ell, lh


@numba.njit(**_JIT)
def ratio_rows(lh, em1):
    """ρ̂ = exp(ℓ̂) per row from em1 = expm1(ℓ̂) (numpy's SIMD loop): em1 + 1, exact to an ulp, where ℓ̂ > −log 2;
    exp(ℓ̂) below, where em1 + 1 would lose the relative precision of a small ρ̂ (few rows: one libm call each)."""
    n = lh.size
    rho = np.empty(n)
    for i in range(n):
        x = lh[i]
        rho[i] = em1[i] + 1.0 if x > -0.6931471805599453 else math.exp(x)
    return rho


@numba.njit(**_JIT)
def token_rows(a, b, mask, clamp):
    """Row arrays ℓ̂ = clamp(a − b, ±clamp) and ρ = exp(ℓ̂) (float64 [n]; 0 and 1 on masked rows; clamp = inf for
    none)."""
    n = a.size
    lr = np.empty(n, np.float64)
    rho = np.empty(n, np.float64)
    for i in range(n):
        x, y = _row(a, b, mask, i)
        lh = min(max(x - y, -clamp), clamp)
        lr[i] = lh
        rho[i] = math.exp(lh)
    return lr, rho


@numba.njit(inline="always")
def _weight(x, r, upper, lower, log_upper, log_lower, mask_action):
    """(w, out of [L, C]) of one row: ℓ̂ = x, ρ = r."""
    out_flag = x > log_upper or x < log_lower
    if mask_action:
        return (0.0 if out_flag else r), out_flag
    return max(min(r, upper), lower), out_flag


@numba.njit(inline="always")
def _add_row(x, r, upper, lower, log_upper, log_lower, log_lo, mask_action, swift_ess, acc):
    """One scored row (ℓ̂ = x, ρ = r) of one mode added to its running state `acc` = (#high, #low, #out of
    [L, C], #kept, Σw and its compensation, min w, max w, Σw̃ and its compensation, min w̃, max w̃; w̃ the swift ESS
    weight): (w, the new state). The one definition of a row's contribution, for every kernel that adds rows."""
    n_high, n_low, n_out, kept, s_w, c_w, lo_w, hi_w, s_e, c_e, lo_e, hi_e = acc
    w, out_flag = _weight(x, r, upper, lower, log_upper, log_lower, mask_action)
    n_high += x > log_upper
    n_low += x < log_lo
    n_out += out_flag
    kept += not (mask_action and out_flag)
    s_w, c_w = _two_sum(s_w, c_w, w)
    lo_w, hi_w = min(lo_w, w), max(hi_w, w)
    if swift_ess:
        e = min(max(w, 1.0 / upper), upper)
        s_e, c_e = _two_sum(s_e, c_e, e)
        lo_e, hi_e = min(lo_e, e), max(hi_e, e)
    return w, (n_high, n_low, n_out, kept, s_w, c_w, lo_w, hi_w, s_e, c_e, lo_e, hi_e)


@numba.njit(**_JIT)
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


REJECTION_STATISTICS = ("k1", "k2", "k3")
"""rejection_views' statistic codes (an option's row of `options`, column 0: the index here)."""
REJECTION_SCOPES = ("token", "seq_sum", "seq_mean", "seq_max")
"""rejection_views' scope codes (column 1)."""


@numba.njit(inline="always")
def _statistic(code, lh, rm1):
    """verl's rejection statistic of one row (ℓ̂ = lh, ρ − 1 = rm1) by REJECTION_STATISTICS code: k1 = −ℓ̂,
    k2 = ½ℓ̂², k3 = (ρ − 1) − ℓ̂, the operations of rcdiag.analysis.rejection's numpy form (so the same bits)."""
    if code == 0:
        return -lh
    if code == 1:
        return 0.5 * lh * lh
    return rm1 - lh


@numba.njit(inline="always")
def _add_view(v, k, acc, scored, per_w, per_e, lo_w, hi_w, lo_e, hi_e, counts):
    """Sequence k's reduced rows (`acc`, `scored` rows) are view v's: its per-sequence sums, extrema and counts."""
    n_high, n_low, n_out, kept, s_w, c_w, lo_sw, hi_sw, s_e, c_e, lo_se, hi_se = acc
    per_w[v, k], per_e[v, k] = _total(s_w, c_w), _total(s_e, c_e)
    lo_w[v], hi_w[v] = min(lo_w[v], lo_sw), max(hi_w[v], hi_sw)
    lo_e[v], hi_e[v] = min(lo_e[v], lo_se), max(hi_e[v], hi_se)
    counts[0, v] += n_high
    counts[1, v] += n_low
    counts[2, v] += n_out
    counts[3, v] += kept
    counts[4, v] += kept > 0
    counts[5, v] += scored


@numba.njit(**_JIT)
def rejection_views(lr, rho, stat_lr, stat_rm1, mask, starts, seq_stat, options, option_view, n_views, row_out,
                    params, swift_ess):
    """ONE token mode (`params` [6], a row of token_modes' params) scored on K row sets, each the valid rows
    (`mask`) that its verl rejection options keep — the report's rejection options, each over token_truncate —
    with the keep flags decided here, row by row and sequence by sequence, instead of as numpy arrays.

    `options` float64 [R, 4]: statistic code (REJECTION_STATISTICS), scope code (REJECTION_SCOPES), lo, hi: an
    option keeps a row (token scope) or a whole sequence (seq_*) when lo ≤ statistic ≤ hi; `option_view` int64 [R]
    the set it belongs to (a set's options are chained: all must keep; a set without options scores every valid
    row). A token option's statistic comes from ℓ̂ = `stat_lr` and ρ − 1 = `stat_rm1` per row; a seq_* option's
    is `seq_stat[r, k]`, computed once from the chunk's per-sequence table (rcdiag.analysis.rejection), as its
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
                w_rows[i], acc = _add_row(lr[i], rho[i], upper, lower, log_upper, log_lower, log_lo, mask_action,
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
                    _, own = _add_row(lr[i], rho[i], upper, lower, log_upper, log_lower, log_lo, mask_action,
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


@numba.njit(inline="always")
def _is_quiet(x, r, quiet):
    """Row (ℓ̂ = x, ρ = r) inside every mode's bounds: quiet = (min log, max log, min ρ, max ρ)."""
    return quiet[0] <= x <= quiet[1] and quiet[2] <= r <= quiet[3]


@numba.njit(**_JIT)
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
                    w, acc = _add_row(lr[i], rho[i], upper, lower, log_upper, log_lower, log_lo, mask_action,
                                      swift_ess, acc)
                    if rows:
                        w_rows[j, i] = w
            n_high, n_low, n_out, kept, s_w, c_w, lo_w, hi_w, s_e, c_e, lo_e, hi_e = acc
            per_w[j, k] = _total(s_w, c_w)
            per_e[j, k] = _total(s_e, c_e)
            kept_tok += kept
            kept_seq += kept > 0
        out[j, 0] = count
        out[j, 3], out[j, 4], out[j, 7], out[j, 8] = lo_w, hi_w, lo_e, hi_e
        out[j, 9], out[j, 10], out[j, 11], out[j, 12], out[j, 13] = n_high, n_low, n_out, kept_tok, kept_seq
        if count:
            out[j, 1], out[j, 5] = per_w[j].sum() / count, per_e[j].sum() / count
            out[j, 2], out[j, 6] = _second_pass(lr, rho, stat, params[j], swift_ess, out[j, 1], out[j, 5])


@numba.njit(**_JIT)
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
                s_ell, c_ell = _two_sum(s_ell, c_ell, xa - yb)
                s_chi, c_chi = _two_sum(s_chi, c_chi, rm1 * (rm1 + 2.0))
            if _is_quiet(x, r, quiet):
                n_quiet += 1
                quiet_min, quiet_max = min(quiet_min, r), max(quiet_max, r)
                for t in range(n_own):
                    j = own_list[t]
                    s_w[j], c_w[j] = _two_sum(s_w[j], c_w[j], r)
                    if swift_ess:
                        s_e[j], c_e[j] = _two_sum(s_e[j], c_e[j], r)
                if rows:
                    w_rows[:, i] = r
            else:
                for j in range(n_modes):
                    w, out_flag = _weight(x, r, upper[j], lower[j], log_upper[j], log_lower[j], mask_action[j])
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
                    s_w[j], c_w[j] = _two_sum(s_w[j], c_w[j], w)
                    if swift_ess:
                        s_e[j], c_e[j] = _two_sum(s_e[j], c_e[j], e)
            shared_s, shared_c = _two_sum(shared_s, shared_c, r)
        if with_core:
            core[0, k], core[1, k], core[2, k], core[3, k] = t_core, sa, sb, _total(s_ell, c_ell)
            core[4, k], core[5, k] = k3, _total(s_chi, c_chi)
        shared = _total(shared_s, shared_c)
        for j in range(n_modes):
            per_w[j, k] = _total(s_w[j], c_w[j]) if own[j] else shared
            if swift_ess:
                per_e[j, k] = _total(s_e[j], c_e[j]) if own[j] else shared
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
            w = _weight(x, r, upper[j], lower[j], log_upper[j], log_lower[j], mask_action[j])[0] if ever[j] else r
            m2[j] += (w - mean_w[j]) * (w - mean_w[j])
            if swift_ess:
                e = (min(max(w, 1.0 / upper[j]), upper[j]) if ever[j] else w) - mean_e[j]
                m2e[j] += e * e
    out[:, 2] = m2
    out[:, 6] = m2e


@numba.njit(**_JIT)  # compiled on its own: inlined into _second_pass_modes, its registers were not kept
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
    w = _weight(x, r, upper, params[j, 1], params[j, 2], params[j, 3], params[j, 5] > 0)[0]
    return w, min(max(w, 1.0 / upper), upper)


@numba.njit(inline="always")
def _second_pass(lr, rho, stat, p, swift_ess, mean_w, mean_e):
    """(M2 of w about mean_w, M2 of w̃ about mean_e) over the scored rows, for one mode's params row `p`."""
    m2 = m2e = 0.0
    upper, mask_action = p[0], p[5] > 0
    for i in range(lr.size):
        if stat[i]:
            w = _weight(lr[i], rho[i], upper, p[1], p[2], p[3], mask_action)[0]
            m2 += (w - mean_w) * (w - mean_w)
            if swift_ess:
                e = min(max(w, 1.0 / upper), upper) - mean_e
                m2e += e * e
    return m2, m2e


POISSON_FAST_STEPS = 8
"""CDF entries poisson_totals compares without a branch (P(K ≥ 8) ≈ 1e-5 walks on)."""


@numba.njit(inline="always")
def _poisson_count(u, cdf):
    """k with cdf[k − 1] ≤ u < cdf[k] (the inverse-CDF walk), counting the first POISSON_FAST_STEPS entries
    without a data-dependent branch: the walk mispredicted on about every random draw."""
    last = cdf.size - 1
    k = 0
    for j in range(min(POISSON_FAST_STEPS, last)):
        k += u >= cdf[j]
    while k < last and u >= cdf[k]:
        k += 1
    return k


@numba.njit(**_JIT)
def poisson_totals(uniforms, matrix, cdf, finite):
    """Σ_i k_ri · matrix[i] per replicate r, k_ri ~ Poisson(1) drawn from uniforms[r, i] by the inverse CDF `cdf`
    (float64 [K], P(k ≤ j), last entry 1): float64 [R, columns]. One pass, no weight matrix. `finite`: the matrix
    has no ±inf/NaN (the caller checks it once for all its calls); then every row takes the branch-free form
    (acc += k · row: adding 0.0 changes no total, 1.0 · x is x, so the bits are those of skipping k = 0), else
    k = 0 rows are skipped (0 · inf would be NaN)."""
    n_rep, n = uniforms.shape
    cols = matrix.shape[1]
    out = np.zeros((n_rep, cols))
    for r in range(n_rep):
        acc = np.zeros(cols)
        for i in range(n):
            k = _poisson_count(uniforms[r, i], cdf)
            if finite or k:
                w = np.float64(k)
                for j in range(cols):
                    acc[j] += w * matrix[i, j]
        out[r] = acc
    return out


CORE_COLUMNS = ("T", "sum_a", "sum_b", "sum_l", "sum_k3", "sum_chi2")
"""The SEQ_COLUMNS most consumers read (the canonical metrics, the sequence-level IS modes): sequence_core's rows."""


@numba.njit(**_JIT)
def sequence_core(a, b, kept, lh, em1, starts):
    """CORE_COLUMNS per sequence of a chunk, float64 [len(CORE_COLUMNS), S]: the same rows of sequence_table by the
    same operations in the same order (so the same bits), without its other eleven columns — a third of its work
    (chunks.TokenChunk.column reads them from here until some consumer asks for a column outside them)."""
    n_seq, n = starts.size, a.size
    out = np.zeros((len(CORE_COLUMNS), n_seq), np.float64)
    for k in range(n_seq):
        sa = sb = k3 = 0.0
        s_ell = c_ell = s_chi = c_chi = 0.0
        t = 0
        for i in range(starts[k], starts[k + 1] if k + 1 < n_seq else n):
            if not kept[i]:
                continue
            x, y = np.float64(a[i]), np.float64(b[i])
            rm1 = em1[i]
            t += 1
            sa += x
            sb += y
            k3 += rm1 - lh[i]
            s_ell, c_ell = _two_sum(s_ell, c_ell, x - y)
            s_chi, c_chi = _two_sum(s_chi, c_chi, rm1 * (rm1 + 2.0))
        out[0, k], out[1, k], out[2, k], out[3, k] = t, sa, sb, _total(s_ell, c_ell)
        out[4, k], out[5, k] = k3, _total(s_chi, c_chi)
    return out


@numba.njit(**_JIT)
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


FIRST_COMPILE = ("first pass with this install: compiling rcdiag's kernels for this machine (~20 s on 2 cores, "
                 "once; numba caches them for every later pass)")
"""What a pass says before it compiles: otherwise its bar sits at 0 % for those seconds and looks hung."""


def compiled_on_disk() -> bool:
    """Whether numba's on-disk cache holds kernels compiled from this source, judged by the largest one every
    report pass runs (gate_family's index file, not older than this file): False on a fresh install, whose first
    pass compiles ~50 functions (~20 s). A cache numba does not expose as expected counts as present: no notice
    rather than a wrong one."""
    try:
        index = gate_family._cache._cache_file._index_path
    except AttributeError:
        return True
    try:
        return os.stat(index).st_mtime >= os.stat(__file__).st_mtime
    except OSError:
        return False
