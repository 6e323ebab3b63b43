"""The bootstrap's Poisson replicate counts, in one compiled pass (analysis.metrics.bootstrap)."""
from __future__ import annotations

import numba
import numpy as np

from rcdiag.analysis.passes.kernels import JIT

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


@numba.njit(**JIT)
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
