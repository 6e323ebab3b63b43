"""The compiled Poisson bootstrap kernel against numpy: same counts from the same uniforms, right distribution."""
from __future__ import annotations

import math

import numpy as np

from rcdiag.analysis.metrics import bootstrap_kernels
from rcdiag.analysis.metrics.bootstrap import (
    COLUMNS,
    POISSON1_CDF,
    bootstrap,
    headline_functions,
    sequence_terms,
)


def test_poisson_totals_equal_the_numpy_weight_matrix_product():
    rng = np.random.default_rng(5)
    uniforms = rng.random((37, 2_000))
    matrix = rng.normal(size=(2_000, 14)) * 10.0 ** rng.integers(-6, 6, size=(2_000, 1))
    weights = np.searchsorted(POISSON1_CDF, uniforms, side="right").astype(np.float64)  # k = #{cdf ≤ u}
    np.testing.assert_allclose(bootstrap_kernels.poisson_totals(uniforms, matrix, POISSON1_CDF, True), weights @ matrix,
                               rtol=1e-9, atol=1e-9 * np.abs(matrix).sum())


def test_poisson_counts_follow_poisson_one():
    """The inverse-CDF draws (the kernel's, per the test above) have Poisson(1)'s frequencies, mean and variance."""
    uniforms = np.random.default_rng(2).random((1, 400_000))
    total = bootstrap_kernels.poisson_totals(uniforms, np.ones((uniforms.shape[1], 1)), POISSON1_CDF, True)[0, 0]
    draws = np.searchsorted(POISSON1_CDF, uniforms[0], side="right")
    assert total == draws.sum()
    freq = np.bincount(draws, minlength=8)[:8] / draws.size
    want = np.array([math.exp(-1) / math.factorial(k) for k in range(8)])
    assert np.abs(freq - want).max() < 4e-3
    assert abs(draws.mean() - 1.0) < 5e-3 and abs(draws.var() - 1.0) < 1e-2


def test_bootstrap_is_seeded_and_centred():
    rng = np.random.default_rng(0)
    sums = np.abs(rng.normal(size=(500, len(COLUMNS))))
    sums[:, 0] = rng.integers(1, 50, 500)
    one, two = bootstrap(sums, replicates=300, seed=4), bootstrap(sums, replicates=300, seed=4)
    assert one == two
    assert one != bootstrap(sums, replicates=300, seed=5)
    for ci in one.values():
        assert ci["low"] < ci["high"] and ci["se"] > 0


def test_poisson_totals_ignore_an_infinite_row_its_replicate_did_not_draw():
    """A sequence whose sum is inf (k3 without the clamp) adds inf only to the replicates that draw it (k ≥ 1):
    the branch-free form (acc += k · row) would make 0 · inf = NaN in every other replicate."""
    rng = np.random.default_rng(9)
    uniforms = rng.random((64, 300))
    matrix = rng.normal(size=(300, 3))
    matrix[17, 1] = np.inf
    got = bootstrap_kernels.poisson_totals(uniforms, matrix, POISSON1_CDF, bool(np.isfinite(matrix).all()))
    drawn = np.searchsorted(POISSON1_CDF, uniforms[:, 17], side="right") > 0
    assert drawn.any() and not drawn.all()
    assert np.isinf(got[drawn, 1]).all() and np.isfinite(got[~drawn, 1]).all()
    finite = matrix.copy()
    finite[17] = 0.0
    np.testing.assert_array_equal(got[~drawn], bootstrap_kernels.poisson_totals(uniforms, finite, POISSON1_CDF, True)[~drawn])


def test_bootstrap_does_not_depend_on_the_thread_count(monkeypatch):
    """Uniforms come from one seeded stream in chunk order whatever the pool: 1 thread and 3 give the same bits."""
    rng = np.random.default_rng(3)
    sums = np.abs(rng.normal(size=(20_000, len(COLUMNS))))
    sums[:, 0] = rng.integers(1, 50, sums.shape[0])
    monkeypatch.setattr("rcdiag.analysis.metrics.bootstrap.CHUNK_CELLS", 1 << 16)  # several chunks in flight
    monkeypatch.setenv("RCDIAG_THREADS", "1")
    one = bootstrap(sums, replicates=40, seed=1)
    monkeypatch.setenv("RCDIAG_THREADS", "3")
    assert bootstrap(sums, replicates=40, seed=1) == one
    # and the stream is default_rng(seed)'s, replicate after replicate, though each block draws its own part
    matrix = np.stack(list(sequence_terms(sums, "canonical").values()), axis=1)
    stream, block = np.random.default_rng(1), (1 << 16) // sums.shape[0]  # the kernel's blocks, drawn in turn
    totals = np.concatenate([bootstrap_kernels.poisson_totals(stream.random((min(block, 40 - start), sums.shape[0])), matrix,
                                                    POISSON1_CDF, True) for start in range(0, 40, block)])
    kl = dict(zip(sequence_terms(sums, "canonical"), totals.T, strict=True))
    kl = headline_functions("canonical")["kl"](kl)
    alpha = (1 - 0.95) / 2  # as bootstrap computes it (0.025000000000000022)
    lo, hi = np.quantile(kl, [alpha, 1 - alpha])
    assert (one["kl"]["low"], one["kl"]["high"], one["kl"]["se"]) == (lo, hi, kl.std(ddof=1))


def test_bootstrap_keeps_the_replicates_that_miss_an_infinite_sequence():
    """verl's unclamped k3 of one sequence is inf: the replicates that do not draw it (about e⁻¹ of them) still give
    a finite k3_kl, so its interval is a number — bootstrap tells the kernel the matrix is not finite."""
    rng = np.random.default_rng(1)
    sums = np.abs(rng.normal(size=(300, len(COLUMNS))))
    sums[:, 0] = rng.integers(1, 50, 300)
    sums[7, 8] = np.inf  # sum_k3_raw, the column verl's k3_kl reads
    ci = bootstrap(sums, "verl", replicates=200, seed=3)["k3_kl"]
    assert math.isfinite(ci["low"]) and math.isfinite(ci["high"]) and ci["low"] < ci["high"]
