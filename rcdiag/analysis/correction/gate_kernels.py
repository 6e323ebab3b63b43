"""gate_family: every setting of one gate family on a chunk in one compiled pass (analysis.correction.gates).

Cached on disk by numba like every kernel (`cache=True`).
"""
from __future__ import annotations

import numba
import numpy as np

from rcdiag.analysis.passes.kernels import JIT

GATE_COUNTS = ("valid", "kept", "high", "low", "seqs", "seqs_kept", "seqs_masked", "pos", "neg", "zero",
               "kept_pos", "kept_neg", "kept_zero")
"""gate_family's counts per setting, in order (analysis.correction.gates.GateState.counts)."""
GATE_RULES = ("band", "dppo", "dppo_kl", "any_token")
"""gate_family's rule codes (analysis.correction.gate_defs rules; `upper` is a band without a lower bound)."""
GATE_SEQ_COUNTS = ("kept", "high", "low", "low_neg", "high_pos", "drop_pos", "drop_neg")
"""gate_family's per-sequence counts per setting (`detail`), in order: valid rows kept, masked from above, from
below (as the rule flags them), from below with A < 0, from above with A > 0, masked with A > 0, with A < 0."""


@numba.njit(**JIT)
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


@numba.njit(**JIT)
def gate_family(rule, value, ell, his, los, mask, adv, signed, rho, ratio_weight, starts, xs, flag, detail, whole):
    """Every setting of one gate family on a chunk in one compiled pass, O(1) work a row for any number of settings
    (issue #32: it was decide's numpy masks, a reduction and the frameworks' numbers once per setting, ×130
    settings in the report's gate sweep). Setting j masks a valid row from above / below by its rule
    (analysis.correction.gate_defs) with the bounds his[j], los[j]; `rule` indexes GATE_RULES, `value` is the gate's statistic
    per row (any_token: the clamped ℓ, a sequence masked from above when one of its valid rows has ℓ > his[j], from
    below when one has ℓ < los[j]); ℓ = a − b in float64 (dppo_kl's direction: its sign is exactly a − b's).

    The settings must be NESTED (analysis.correction.gates.GateFamily orders them so): a row masked at setting j is masked
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
                # row i is valid and masked at setting 0 (so k ≥ 1): its place (rules of analysis.correction.gate_defs; NaN
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
