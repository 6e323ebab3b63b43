"""The input checks' per-batch evidence as ONE compiled pass over the rows (rcdiag.checks.evidence uses it).

The numpy form made ~40 passes over each record batch (a boolean mask per placeholder kind and side, the float32
bit tests per storage grid, the fit, offset and shift sums with their temporaries); at 2 M tokens that was a fifth
of the report's passes. Counts, first locations and the storage-grid evidence are the numpy form's exactly; the
fit/offset/shift sums are compensated (Neumaier), so they are at least as accurate as numpy's pairwise sums and
differ from them only in the last bits. Compiled on first use, cached on disk, GIL released.
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


@numba.njit(**_JIT)
def side_evidence(values, other, valid, pos, huge_negative, grid_low_bits):
    """One side's evidence over a batch's valid rows: counts [6] and first row [6] (−1: none) per KINDS entry,
    hits at pos 0 (all kinds), the number of ordinary non-zero finite values checked, how many of them sit on each
    storage grid (float32 bits whose low `grid_low_bits[g]` bits are 0) and their float32 exponent histogram."""
    counts = np.zeros(len(KINDS), np.int64)
    first = np.full(len(KINDS), -1, np.int64)
    on_grid = np.zeros(grid_low_bits.size, np.int64)
    exponents = np.zeros(256, np.int64)
    masks = np.empty(grid_low_bits.size, np.uint32)
    for g in range(grid_low_bits.size):
        masks[g] = np.uint32((1 << grid_low_bits[g]) - 1)
    box = np.empty(1, np.float32)
    bits = box.view(np.uint32)
    pos0 = checked = 0
    for i in range(values.size):
        if not valid[i]:
            continue
        v = np.float64(values[i])
        kind = _kind(v, np.float64(other[i]), huge_negative)
        if kind >= 0:
            counts[kind] += 1
            pos0 += pos[i] == 0
            if first[kind] < 0:
                first[kind] = i
        if math.isfinite(v) and v != 0.0 and v > huge_negative:
            box[0] = np.float32(v)
            b = bits[0]
            checked += 1
            for g in range(masks.size):
                on_grid[g] += (b & masks[g]) == 0
            exponents[(b >> 23) & 0xFF] += 1
    return counts, first, pos0, checked, on_grid, exponents


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
def pair_evidence(seq, pos, a, b, valid, huge_negative):
    """The fit, offset and shift evidence over clean rows (valid, both sides plausible: finite, < 0, > −1e9).

    Returns fit [6] (n, Σa, Σb, Σa², Σab, Σb²), offset [4] (Σ(b−a) where b−a > 1e-6, #b−a > 1e-6, #b−a < −1e-6,
    #|b−a| ≤ 1e-6) and shift [4] (#rows with both neighbours clean, consecutive and in the same sequence, then
    Σ|a_t − b_{t−1}|, Σ|a_t − b_t|, Σ|a_t − b_{t+1}| over them)."""
    n = seq.size
    sums = np.zeros(5)
    comp = np.zeros(5)
    n_fit = 0
    d_sum = d_comp = 0.0
    d_hi = d_lo = d_eq = 0
    shift = np.zeros(3)
    shift_c = np.zeros(3)
    n_shift = 0
    clean_prev = clean_here = False
    for i in range(n):
        x, y = np.float64(a[i]), np.float64(b[i])
        clean = valid[i] and _plausible(x, huge_negative) and _plausible(y, huge_negative)
        if clean:
            n_fit += 1
            for k, term in enumerate((x, y, x * x, x * y, y * y)):
                sums[k], comp[k] = _add(sums[k], comp[k], term)
            d = y - x
            if d > 1e-6:
                d_sum, d_comp = _add(d_sum, d_comp, d)
                d_hi += 1
            elif d < -1e-6:
                d_lo += 1
            if abs(d) <= 1e-6:
                d_eq += 1
        # row i − 1 is a shift row when rows i − 2, i − 1, i are clean, consecutive and in one sequence
        if i >= 2 and clean and clean_here and clean_prev and seq[i] == seq[i - 1] == seq[i - 2] \
                and pos[i] == pos[i - 1] + 1 and pos[i - 1] == pos[i - 2] + 1:
            mid = np.float64(a[i - 1])
            n_shift += 1
            for k, other in enumerate((b[i - 2], b[i - 1], b[i])):
                shift[k], shift_c[k] = _add(shift[k], shift_c[k], abs(mid - np.float64(other)))
        clean_prev, clean_here = clean_here, clean
    fit = np.empty(6)
    fit[0] = n_fit
    fit[1:] = sums + comp
    offset = np.array([d_sum + d_comp, d_hi, d_lo, d_eq], np.float64)
    out_shift = np.empty(4)
    out_shift[0] = n_shift
    out_shift[1:] = shift + shift_c
    return fit, offset, out_shift
