"""Compiled row passes of the exact divergences (rcdiag.analysis.distributions.divergence): selection of a row's largest entries
and the fused sums, so a `[n, V]` chunk is read a few times instead of ~25 numpy passes with a temporary each.

At a real vocabulary (49,152 for SmolLM2, 152k for Qwen) the numpy version spent most of its time in temporaries
and in sorts: `argpartition` of the negated row for the top-20 ids (~0.6 ms a row at 49k, twice), and a full
stable argsort of each row for the top-p kept set (~5 ms a row). Here:

- `top_ids` keeps a row's k largest entries in a small sorted buffer, one compare per entry for nearly all of
  them; ties go to the smaller token id (the earlier one is never displaced by an equal later one), the order a
  stable descending sort gives.
- `kept_mask` finds the top-k-then-top-p kept set without sorting the row: top-k from the buffer of its k
  entries; top-p from the few entries a mass histogram says can be kept (see the function), sorted stably. The
  result is the full stable sort's in every case, ties included.
- `divergence_sums` adds KL(μ‖π), KL(π‖μ), Σ|μ − π| and the JS terms per row in one pass (0·log 0 = 0).

The transcendental functions stay in numpy (its vectorised exp/log, ~1 ns a value) and enter as arrays. Sums are
sequential in float64 per row: deterministic, and within ~n·ε of the pairwise sums (≤ 1e-11 relative at 152k).
"""
from __future__ import annotations

import numba
import numpy as np

_JIT = {"cache": True, "nogil": True}
SORT_ABOVE = 1024
"""Above this top-k `kept_mask` sorts the row instead of keeping a buffer of the k largest."""
BINS_PER_NAT = 8.0
HIST_BINS = 8 * 64 + 1
"""The top-p histogram: bins of 1/8 nat below a row's top over 64 nats (mass e⁻⁶⁴ ≈ 1.6e-28 a token), the rest in
the last bin."""
MASS_MARGIN = 1e-9
"""The candidate bins must hold top_p + this of the mass: sums in bin order and in rank order differ by rounding
(~1e-16), so the kept prefix (mass < top_p before its last token) surely ends inside them."""


@numba.njit(**_JIT)
def _largest(row, k, ids, vals):
    """The k largest entries of `row` into ids[:k]/vals[:k], largest first, ties by smaller id."""
    count = 0
    for j in range(row.shape[0]):
        v = row[j]
        if count < k:
            p = count
            count += 1
        elif v > vals[k - 1]:
            p = k - 1
        else:
            continue
        while p > 0 and vals[p - 1] < v:
            vals[p] = vals[p - 1]
            ids[p] = ids[p - 1]
            p -= 1
        vals[p] = v
        ids[p] = j


@numba.njit(**_JIT)
def top_ids(x, k):
    """`[n, k]` ids of each row's k largest entries, largest first, ties by smaller id (k ≤ V)."""
    n = x.shape[0]
    out = np.empty((n, k), np.int64)
    vals = np.empty(k, np.float64)
    for r in range(n):
        _largest(x[r], k, out[r], vals)
    return out


@numba.njit(**_JIT)
def _fill(row, m, ids, vals):
    """The m largest entries of `row` (ties by id) into ids/vals: the buffer for a few, a stable sort for many
    (the buffer's insertions cost up to m per entry)."""
    if m <= SORT_ABOVE:
        _largest(row, m, ids, vals)
        return
    order = np.argsort(-row, kind="mergesort")  # stable: equal entries stay in id order
    for i in range(m):
        ids[i] = order[i]
        vals[i] = row[order[i]]


@numba.njit(**_JIT)
def _prefix(vals, top, total, top_p, m):
    """How many of m candidates in descending order are kept: each whose predecessors' mass is below top_p (top-p
    ≥ 1 is off), the first always; `vals` log-probs, mass exp(v − top) / total."""
    if top_p >= 1.0:
        return m
    before = 0.0
    for i in range(m):
        if i > 0 and before >= top_p:
            return i
        before += np.exp(vals[i] - top) / total
    return m


@numba.njit(**_JIT)
def kept_mask(shifted, probs, top_p, top_k):
    """bool `[n, V]`: per row, the tokens the engine may sample under top-k (`top_k` ≤ 0: none) then top-p: in
    descending order (ties by id) of the top-k renormalised probabilities, every token whose predecessors' mass is
    below `top_p`, at least one. `shifted`: log-probs minus each row's max (≤ 0); `probs`: exp(shifted), from
    numpy's vectorised exp. Call it only when something is truncated.

    Top-k: its k entries (the buffer), renormalised over them. Top-p alone: a histogram of the rows' mass by
    distance from the top (BINS_PER_NAT bins a nat) finds the first bin whose cumulative mass exceeds top_p (with
    a margin far above rounding): every kept token lies at or above it (a token below has predecessors of mass ≥
    top_p), so only those candidates are sorted — tens of tokens on a peaked row, not the vocabulary."""
    n, vocab = shifted.shape
    limit = vocab if top_k <= 0 or top_k >= vocab else top_k
    keep = np.zeros((n, vocab), np.bool_)
    ids = np.empty(vocab, np.int64)
    vals = np.empty(vocab, np.float64)
    bins = np.empty(HIST_BINS, np.float64)
    last_bin = HIST_BINS - 1
    for r in range(n):
        row, mass = shifted[r], probs[r]
        if limit < vocab:
            _fill(row, limit, ids, vals)
            total = 0.0
            for i in range(limit):
                total += np.exp(vals[i])
            for i in range(_prefix(vals, 0.0, total, top_p, limit)):
                keep[r, ids[i]] = True
            continue
        bins[:] = 0.0
        total = 0.0
        for j in range(vocab):
            total += mass[j]
            d = -row[j] * BINS_PER_NAT
            bins[int(d) if d < last_bin else last_bin] += mass[j]
        cut, cum = last_bin, 0.0
        for b in range(HIST_BINS):
            cum += bins[b]
            if cum >= (top_p + MASS_MARGIN) * total:
                cut = b
                break
        m = 0
        for j in range(vocab):  # the candidates in id order, so the stable sort breaks ties by id
            d = -row[j] * BINS_PER_NAT
            if (int(d) if d < last_bin else last_bin) <= cut:
                ids[m] = j
                vals[m] = row[j]
                m += 1
        order = np.argsort(-vals[:m], kind="mergesort")
        ranked = vals[:m][order]
        for i in range(_prefix(ranked, 0.0, total, top_p, m)):
            keep[r, ids[order[i]]] = True
    return keep


@numba.njit(**_JIT)
def divergence_sums(lmu, lpi, mu, pi, lmid):
    """Per row: Σ μ(log μ − log π), Σ π(log π − log μ), Σ |μ − π|, Σ μ(log μ − log m) + π(log π − log m), with
    0·log 0 = 0 (a zero probability never multiplies an infinite log). `[n, 4]` float64."""
    n, vocab = lmu.shape
    out = np.zeros((n, 4), np.float64)
    for r in range(n):
        a = b = tv = js = 0.0
        for j in range(vocab):
            p, q = mu[r, j], pi[r, j]
            if p > 0.0:
                a += p * (lmu[r, j] - lpi[r, j])
                js += p * (lmu[r, j] - lmid[r, j])
            if q > 0.0:
                b += q * (lpi[r, j] - lmu[r, j])
                js += q * (lpi[r, j] - lmid[r, j])
            tv += abs(p - q)
        out[r, 0], out[r, 1], out[r, 2], out[r, 3] = a, b, tv, js
    return out
