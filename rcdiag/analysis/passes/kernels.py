"""The pass engine's fused numba kernels: one pass per token chunk for validation, exact sums and per-sequence sums.

The wings keep their own kernels beside them (correction: is_kernels, rejection_kernels, gate_kernels; metrics:
bootstrap_kernels; distributions: scan_kernels, divergence_kernels) and share `JIT` and the compensated steps here.

Each kernel replaces a dozen numpy passes (and their temporaries) with one loop over the rows. Per-sequence sums
use Neumaier compensated summation, so a sequence's sum is (nearly) correctly rounded and depends only on that
sequence's values — never on how the rows were batched; callers feed these per-sequence values to the exact
accumulators of rcdiag.analysis.passes.accum. Compiled on first use and cached on disk (`cache=True`).
"""
from __future__ import annotations

import math
import os

import numba
import numpy as np

JIT = {"cache": True, "nogil": True}

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


@numba.njit(**JIT)
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


@numba.njit(**JIT)
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


@numba.njit(**JIT)
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

@numba.njit(**JIT)
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
def two_sum(s, c, x):
    """(s + x, c + its rounding error): branch-free compensated step (Knuth's TwoSum)."""
    t = s + x
    z = t - s
    return t, c + ((s - (t - z)) + (x - z))


@numba.njit(inline="always")
def two_sum_total(s, c):
    """s + c, or s alone when s is ±inf/NaN (the compensation term is then NaN)."""
    return s + c if math.isfinite(s) else s


@numba.njit(**JIT)
def segment_means(values, mask, starts, segments):
    """The gates' per-sequence / per-segment aggregates of a row value in one pass over the valid rows (they were
    numpy's masked copy, reduceat, a division and a repeat per call, issue #32): each sequence's sum of `values`
    over its valid rows, or (`segments`) each segment's mean (ROLL's segments: runs of consecutive valid rows
    within a sequence). Sums are compensated (Neumaier), so nearly correctly rounded; masked rows are never read.
    A sequence's mean is its sum / max(count, 1) (analysis.correction.gate_stats.sequence_mean), so a gate that reads both
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
                    s, c = two_sum(s, c, np.float64(values[j]))
                    j += 1
                mean = two_sum_total(s, c) / (j - i)
                for t in range(i, j):
                    rows[t] = mean
                i = j
            continue
        s = c = 0.0
        for i in range(first, last):
            if mask[i]:
                s, c = two_sum(s, c, np.float64(values[i]))
        per_seq[k] = two_sum_total(s, c)
    return rows, per_seq


@numba.njit(**JIT)
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
            s_ell, c_ell = two_sum(s_ell, c_ell, ell)
            s_chi, c_chi = two_sum(s_chi, c_chi, rm1 * (rm1 + 2.0))
            s_hat, c_hat = two_sum(s_hat, c_hat, h)
        out[C_T, k], out[C_A, k], out[C_B, k], out[C_L, k] = t, sa, sb, two_sum_total(s_ell, c_ell)
        out[C_ABS, k], out[C_MAX_ABS, k], out[C_K3, k], out[C_K3_SWIFT, k] = s_abs, top, k3, k3s
        out[C_K3_RAW, k], out[C_CHI2, k], out[C_LHAT, k], out[C_SQ, k] = k3r, two_sum_total(s_chi, c_chi), two_sum_total(
            s_hat, c_hat), sq
        out[C_MAX_K3, k], out[C_W, k], out[C_W2, k], out[C_WS, k], out[C_WS2, k] = top_k3, w1, w2, e1, e2
    return out


@numba.njit(**JIT)
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


@numba.njit(**JIT)
def ratio_rows(lh, em1):
    """ρ̂ = exp(ℓ̂) per row from em1 = expm1(ℓ̂) (numpy's SIMD loop): em1 + 1, exact to an ulp, where ℓ̂ > −log 2;
    exp(ℓ̂) below, where em1 + 1 would lose the relative precision of a small ρ̂ (few rows: one libm call each)."""
    n = lh.size
    rho = np.empty(n)
    for i in range(n):
        x = lh[i]
        rho[i] = em1[i] + 1.0 if x > -0.6931471805599453 else math.exp(x)
    return rho


@numba.njit(**JIT)
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

CORE_COLUMNS = ("T", "sum_a", "sum_b", "sum_l", "sum_k3", "sum_chi2")
"""The SEQ_COLUMNS most consumers read (the canonical metrics, the sequence-level IS modes): sequence_core's rows."""


@numba.njit(**JIT)
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
            s_ell, c_ell = two_sum(s_ell, c_ell, x - y)
            s_chi, c_chi = two_sum(s_chi, c_chi, rm1 * (rm1 + 2.0))
        out[0, k], out[1, k], out[2, k], out[3, k] = t, sa, sb, two_sum_total(s_ell, c_ell)
        out[4, k], out[5, k] = k3, two_sum_total(s_chi, c_chi)
    return out

FIRST_COMPILE = ("first pass with this install: compiling rcdiag's kernels for this machine (~20 s on 2 cores, "
                 "once; numba caches them for every later pass)")
"""What a pass says before it compiles: otherwise its bar sits at 0 % for those seconds and looks hung."""


def compiled_on_disk() -> bool:
    """Whether numba's on-disk cache holds kernels compiled from this source, judged by the one every pass runs
    (sequence_table's index file, not older than this file): False on a fresh install, whose first pass compiles
    ~50 functions (~20 s; the wings' kernels compile in that same pass). A cache numba does not expose as
    expected counts as present: no notice rather than a wrong one."""
    try:
        index = sequence_table._cache._cache_file._index_path
    except AttributeError:
        return True
    try:
        return os.stat(index).st_mtime >= os.stat(__file__).st_mtime
    except OSError:
        return False
