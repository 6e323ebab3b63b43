"""The input checks' per-batch evidence as ONE compiled pass over the rows (rcdiag.checks.evidence uses it).

The numpy form made ~40 passes over each record batch (a boolean mask per placeholder kind and side, the float32
bit tests per storage grid, the fit, offset and shift sums with their temporaries); `batch_evidence` visits each
row once for both sides, the fit, offset and shift sums and the per-sequence row counts. It replaced a kernel per
side, one for the pairs and numpy's unique (43 → 26 ns/row on the report's batches, same bits), and its offset
sums no longer branch on the sign of b − a, a coin flip mispredicted on every other row (23 → 18 ns/row, same
bits). Counts, first locations and the storage-grid evidence are the numpy form's exactly; the fit/offset/shift
sums are compensated (Neumaier), so they are at least as accurate as numpy's pairwise sums and differ from them
only in the last bits.
Compiled on first use, cached on disk, GIL released.
"""
from __future__ import annotations

import math

import numba
import numpy as np

_JIT = {"cache": True, "nogil": True}

KINDS = ("nan", "pos_inf", "neg_inf", "huge_negative", "zero", "positive")
"""Placeholder kinds, in the order of side_evidence's counts/first outputs (evidence._SideStats.KINDS)."""


@numba.njit(inline="always")
def _kind(v, o, huge_negative):
    """The placeholder kind index of value v (other side o), or −1 for an ordinary value."""
    if v != v:
        return 0
    if v == np.inf:
        return 1
    if v == -np.inf:
        return 2
    if v <= huge_negative:
        return 3
    if v == 0.0 and (o != o or abs(o) > 1e-2):  # exact 0.0 where the other side was not certain
        return 4
    if v > 1e-6:
        return 5
    return -1


@numba.njit(inline="always")
def _add(s, c, x):
    """Neumaier's compensated step: (s + x, c + its rounding error)."""
    t = s + x
    if abs(s) >= abs(x):
        c += (s - t) + x
    else:
        c += (x - t) + s
    return t, c


@numba.njit(inline="always")
def _plausible(v, huge_negative):
    return math.isfinite(v) and v < 0.0 and v > huge_negative


@numba.njit(**_JIT)
def batch_evidence(seq, pos, a, b, valid, huge_negative, grid_low_bits):
    """Every check's evidence over one batch in ONE visit of the rows (a, b float64 [n]).

    Per side (a, then b; rows 0, 1 of each output): counts [2, 6] and first row [2, 6] (−1: none) per KINDS
    entry, hits at pos 0 [2] (all kinds), ordinary non-zero finite values checked [2], how many of them sit on each
    storage grid [2, G] (float32 bits whose low `grid_low_bits[g]` bits are 0) and their float32 exponent
    histogram [2, 256]. Over clean rows (valid, both sides plausible: finite, < 0, > −1e9): fit [6] (n, Σa, Σb, Σa²,
    Σab, Σb²), offset [6] (Σ(b−a) where b−a > 1e-6, #b−a > 1e-6, #b−a < −1e-6, #|b−a| ≤ 1e-6; then over valid rows
    with a plausible and b exactly 0.0 — a one-token top-p/top-k support, whose b − a = −log S = −a —: Σ(−a) where
    −a > 1e-6, and their count; then over clean rows where both sides give p < ½ — the unconfident tokens, where a
    temperature below the trainer's lowers b and a top-p/top-k renormalisation raises it —: #b−a > 1e-6, #b−a <
    −1e-6; then Σ(b−a) over every clean row, signed) and shift [4] (#rows
    with both neighbours clean, consecutive and in the same sequence, then Σ|a_t − b_{t−1}|, Σ|a_t − b_t|,
    Σ|a_t − b_{t+1}| over them); sums compensated (Neumaier). Per run of equal seq_id over all rows: its seq_id,
    rows and max pos (int64 [R] each). Counts and locations are exact; accumulators are locals, not array cells."""
    n = seq.size
    counts = np.zeros((2, len(KINDS)), np.int64)
    first = np.full((2, len(KINDS)), -1, np.int64)
    on_grid = np.zeros((2, grid_low_bits.size), np.int64)
    exponents = np.zeros((2, 256), np.int64)
    masks = np.empty(grid_low_bits.size, np.uint32)
    for g in range(grid_low_bits.size):
        masks[g] = np.uint32((1 << grid_low_bits[g]) - 1)
    box = np.empty(1, np.float32)
    bits = box.view(np.uint32)
    pos0 = np.zeros(2, np.int64)
    checked = np.zeros(2, np.int64)
    f_a = f_b = f_aa = f_ab = f_bb = c_a = c_b = c_aa = c_ab = c_bb = 0.0
    n_fit = 0
    d_sum = d_comp = 0.0
    d_hi = d_lo = d_eq = 0
    z_sum = z_comp = 0.0
    z_n = 0
    u_hi = u_lo = 0
    s_sum = s_comp = 0.0
    log_half = math.log(0.5)
    sh0 = sh1 = sh2 = ch0 = ch1 = ch2 = 0.0
    n_shift = 0
    clean_prev = clean_here = False
    run_ids = np.empty(n, np.int64)
    run_rows = np.empty(n, np.int64)
    run_max = np.empty(n, np.int64)
    r = -1
    for i in range(n):
        if r < 0 or seq[i] != run_ids[r]:
            r += 1
            run_ids[r], run_rows[r], run_max[r] = seq[i], 0, pos[i]
        run_rows[r] += 1
        run_max[r] = max(run_max[r], pos[i])
        x, y = a[i], b[i]
        clean = False
        if valid[i]:
            for side in range(2):  # a against b, then b against a (2-D indexing: no array views in the loop)
                v, o = (x, y) if side == 0 else (y, x)
                kind = _kind(v, o, huge_negative)
                if kind >= 0:
                    counts[side, kind] += 1
                    pos0[side] += pos[i] == 0
                    if first[side, kind] < 0:
                        first[side, kind] = i
                if math.isfinite(v) and v != 0.0 and v > huge_negative:
                    box[0] = np.float32(v)
                    word = bits[0]
                    checked[side] += 1
                    for g in range(masks.size):  # a branch, not an add of 0 or 1: a run's values are all on a
                        if (word & masks[g]) == 0:  # grid or (nearly) all off it, and the add chains through memory
                            on_grid[side, g] += 1
                    exponents[side, (word >> 23) & 0xFF] += 1
            clean = _plausible(x, huge_negative) and _plausible(y, huge_negative)
            if y == 0.0 and _plausible(x, huge_negative) and -x > 1e-6:
                z_sum, z_comp = _add(z_sum, z_comp, -x)
                z_n += 1
        if clean:
            n_fit += 1
            f_a, c_a = _add(f_a, c_a, x)
            f_b, c_b = _add(f_b, c_b, y)
            f_aa, c_aa = _add(f_aa, c_aa, x * x)
            f_ab, c_ab = _add(f_ab, c_ab, x * y)
            f_bb, c_bb = _add(f_bb, c_bb, y * y)
            d = y - x
            high = d > 1e-6  # the sign of b − a is a coin flip: counted and summed without a branch on it
            d_sum, d_comp = _add(d_sum, d_comp, d if high else 0.0)  # + 0.0 leaves the sum's bits as they are
            d_hi += high
            d_lo += d < -1e-6
            d_eq += abs(d) <= 1e-6
            s_sum, s_comp = _add(s_sum, s_comp, d)
            if x < log_half and y < log_half:
                u_hi += high
                u_lo += d < -1e-6
        # row i − 1 is a shift row when rows i − 2, i − 1, i are clean, consecutive and in one sequence
        if i >= 2 and clean and clean_here and clean_prev and seq[i] == seq[i - 1] == seq[i - 2] \
                and pos[i] == pos[i - 1] + 1 and pos[i - 1] == pos[i - 2] + 1:
            mid = a[i - 1]
            n_shift += 1
            sh0, ch0 = _add(sh0, ch0, abs(mid - b[i - 2]))
            sh1, ch1 = _add(sh1, ch1, abs(mid - b[i - 1]))
            sh2, ch2 = _add(sh2, ch2, abs(mid - y))
        clean_prev, clean_here = clean_here, clean
    fit = np.array([n_fit, f_a + c_a, f_b + c_b, f_aa + c_aa, f_ab + c_ab, f_bb + c_bb], np.float64)
    offset = np.array([d_sum + d_comp, d_hi, d_lo, d_eq, z_sum + z_comp, z_n, u_hi, u_lo, s_sum + s_comp],
                      np.float64)
    shift = np.array([n_shift, sh0 + ch0, sh1 + ch1, sh2 + ch2], np.float64)
    sides = (counts, first, pos0, checked, on_grid, exponents)
    # copies: a slice would keep the batch-sized buffers alive in the accumulator, batch after batch
    return sides, fit, offset, shift, run_ids[:r + 1].copy(), run_rows[:r + 1].copy(), run_max[:r + 1].copy()
