"""The fused kernels against plain Python float64 references: compensated per-sequence sums, the row checks, the
token-mode reduction, and the lazily reduced ExactSum (rcdiag/kernels.py, rcdiag/accum.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rcdiag.analysis import kernels
from rcdiag.analysis.accum import ExactSum
from rcdiag.store.schema import check_keys


def _segments(rng: np.random.Generator, n_seq: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(1, max_len + 1, n_seq)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    return starts, lengths


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_seq_sums_match_fsum_per_sequence(dtype):
    """Cancelling ℓ (±1e3 next to 1e-9), |ℓ| > 20 and masked NaN rows: every column against math.fsum of the same
    terms."""
    rng = np.random.default_rng(3)
    starts, lengths = _segments(rng, 60, 300)
    lengths[0] = 3
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    n = int(lengths.sum())
    b = -rng.exponential(2.0, n)
    ell = np.where(rng.random(n) < 0.5, rng.normal(0, 1e3, n), rng.normal(0, 1e-9, n))
    b[:3], ell[:3] = 0.0, [1e8, 1e-3, -1e8]  # a plain left-to-right sum loses the 1e-3
    a, b = (b + ell).astype(dtype), b.astype(dtype)
    mask = rng.random(n) > 0.1
    a[~mask] = np.nan
    got, counts, max_abs, lr, rho = kernels.seq_sums(a, b, mask, starts, 20.0)
    x = np.where(mask, a.astype(np.float64), 0.0)
    y = np.where(mask, b.astype(np.float64), 0.0)
    for k, (lo, length) in enumerate(zip(starts, lengths, strict=True)):
        rows = range(lo, lo + length)
        e = [x[i] - y[i] for i in rows]
        eh = [min(max(v, -20.0), 20.0) for v in e]
        want = {"a": [x[i] for i in rows], "b": [y[i] for i in rows], "ell": e, "ell_hat": eh,
                "chi2": [math.expm1(v) * (math.expm1(v) + 2.0) for v in eh], "abs_ell": [abs(v) for v in e],
                "k3": [math.expm1(v) - v for v in eh]}
        for name, terms in want.items():
            value = got[kernels.SEQ_SUM_COLUMNS.index(name), k]
            exact = math.fsum(terms)
            scale = math.fsum(abs(t) for t in terms)
            # compensated sums: correctly rounded up to n·eps²·Σ|term|; one-sign sums (plain): n·eps of the sum
            if name in ("ell", "ell_hat", "chi2"):
                bound = 2.3e-16 * abs(exact) + 1.3e-32 * length * scale
            else:
                bound = 1.2e-16 * length * scale
            assert abs(value - exact) <= bound + 1e-300, (name, k, value, exact)
        assert counts[k] == int(mask[lo:lo + length].sum())
        valid = [abs(e[i - lo]) for i in rows if mask[i]]
        assert max_abs[k] == (max(valid) if valid else -math.inf)
    assert np.array_equal(lr, np.clip(x - y, -20, 20))
    np.testing.assert_allclose(rho, np.exp(np.clip(x - y, -20, 20)), rtol=1e-15, atol=0)


def test_check_rows_agrees_with_numpy_checks():
    """Negative pos, a repeated key, a key below the previous batch's last, NaN on a valid row (but not on a
    masked one): the kernel refuses exactly what schema.check_keys / the finiteness check refuse."""
    seq = np.array([0, 0, 1, 1, 2], dtype=np.int64)
    pos = np.array([0, 1, 0, 1, 0], dtype=np.int32)
    a = np.full(5, -1.0, np.float32)
    mask = np.ones(5, bool)
    ok = (seq, pos, a, a, mask, False, 0, 0)
    assert kernels.check_rows(*ok) == kernels.OK
    bad_pos = pos.copy()
    bad_pos[3] = -1
    assert kernels.check_rows(seq, bad_pos, a, a, mask, False, 0, 0) == kernels.BAD_KEY
    dup = pos.copy()
    dup[1] = 0
    assert kernels.check_rows(seq, dup, a, a, mask, False, 0, 0) == kernels.BAD_KEY
    with pytest.raises(ValueError):
        check_keys(seq, dup, source="t")
    assert kernels.check_rows(seq, pos, a, a, mask, True, 0, 5) == kernels.BAD_KEY  # (0, 0) after (0, 5)
    assert kernels.check_rows(seq, pos, a, a, mask, True, -1, 9) == kernels.OK
    nan = a.copy()
    nan[2] = np.nan
    assert kernels.check_rows(seq, pos, nan, a, mask, False, 0, 0) == kernels.BAD_VALUE
    masked = mask.copy()
    masked[2] = False
    assert kernels.check_rows(seq, pos, nan, a, masked, False, 0, 0) == kernels.OK
    assert kernels.check_rows(seq, pos, a, np.where(mask, np.inf, a), mask, False, 0, 0) == kernels.BAD_VALUE


@pytest.mark.parametrize("action", ["truncate", "mask"])
def test_token_modes_against_python_loop(action):
    """Several modes at once (with and without L, swift ESS weights) against a per-row Python loop."""
    rng = np.random.default_rng(5)
    starts, lengths = _segments(rng, 40, 30)
    n = int(lengths.sum())
    lr = np.clip(rng.normal(0, 0.8, n), -20, 20)
    rho = np.exp(lr)
    stat = rng.random(n) > 0.2
    bounds = [(2.0, None), (1.5, 0.5), (10.0, None)]
    params = np.array([[c, low or 0.0, math.log(c), math.log(low) if low else -math.inf,
                        math.log(low) if low else -math.log(c), float(action == "mask")] for c, low in bounds])
    per_w, per_e, out, w_rows = kernels.token_modes(lr, rho, stat, starts, params, True, True)
    f = [dict(zip(kernels.TOKEN_MODE_FIELDS, row, strict=True)) for row in out.tolist()]
    for j, (c, low) in enumerate(bounds):
        lo_b = low if low else 0.0
        ws = []
        for k, (first, length) in enumerate(zip(starts, lengths, strict=True)):
            seq_w = []
            for i in range(first, first + length):
                if not stat[i]:
                    assert w_rows[j, i] == 0.0
                    continue
                out_of = lr[i] > math.log(c) or (low is not None and lr[i] < math.log(low))
                w = (0.0 if out_of else rho[i]) if action == "mask" else max(min(rho[i], c), lo_b)
                assert w_rows[j, i] == w
                seq_w.append(w)
            assert per_w[j, k] == pytest.approx(math.fsum(seq_w), rel=1e-15, abs=1e-300)
            assert per_e[j, k] == pytest.approx(math.fsum(min(max(w, 1 / c), c) for w in seq_w), rel=1e-15)
            ws.extend(seq_w)
        mean = math.fsum(ws) / len(ws)
        assert f[j]["n"] == len(ws) and f[j]["mean"] == pytest.approx(mean, rel=1e-14)
        assert f[j]["m2"] == pytest.approx(math.fsum((w - mean) ** 2 for w in ws), rel=1e-12)
        assert (f[j]["lo"], f[j]["hi"]) == (min(ws), max(ws))
        scored = lr[stat]
        assert f[j]["high"] == int((scored > math.log(c)).sum())
        assert f[j]["kept_tokens"] == (sum(w > 0 for w in ws) if action == "mask" else len(ws))


@pytest.mark.parametrize("swift", [False, True])
@pytest.mark.parametrize("scale", [1.0, 0.01])
def test_token_modes_together_equal_each_mode_alone(swift, scale):
    """Modes never interact: every output of a 14-mode call (truncate and mask, with and without L, ρ at ±20,
    at the bounds, rows not scored) is bit-identical to that mode's own single-mode call. scale 1: most rows
    clipped somewhere (the mode-by-mode loop); scale 0.01: mostly quiet rows (the shared-sum path, which a
    single mode never takes)."""
    rng = np.random.default_rng(11)
    starts, lengths = _segments(rng, 80, 50)
    n = int(lengths.sum())
    lr = np.clip(scale * rng.standard_t(2, n), -20, 20)
    lr[:5] = [20.0, -20.0, 0.0, 1e-12, -1e-12]
    lr[rng.integers(0, n, 20)] = np.log(rng.choice([1.1, 1.5, 2.0, 0.5, 1 / 1.1], 20))
    rho = np.exp(lr)
    stat = rng.random(n) > 0.3
    stat[starts[1]:starts[2]] = False  # a sequence without scored rows
    params = np.array([[c, low or 0.0, math.log(c), math.log(low) if low else -math.inf,
                        math.log(low) if low else -math.log(c), action]
                       for action in (0.0, 1.0) for c in (1.1, 1.5, 2.0, 3.0, 10.0) for low in (None, 0.5)][:14])
    together = kernels.token_modes(lr, rho, stat, starts, params, swift, True)
    for j in range(params.shape[0]):
        alone = kernels.token_modes(lr, rho, stat, starts, params[j:j + 1], swift, True)
        for joint, single in zip(together, alone, strict=True):
            assert np.array_equal(joint[j:j + 1].view(np.uint64), single.view(np.uint64))


@pytest.mark.parametrize("swift", [False, True])
@pytest.mark.parametrize("action", [0.0, 1.0])
def test_token_mode_views_equal_each_row_set_alone(swift, action):
    """One mode on K row sets (each ⊆ the valid rows: single rows dropped, whole sequences dropped, nothing
    dropped, everything dropped) is bit-identical, output by output, to token_modes on each set alone. Guards
    the base rows' sums handed to the sets that score a sequence fully, and the second pass's per-set means."""
    rng = np.random.default_rng(13 + int(swift) + 2 * int(action))
    starts, lengths = _segments(rng, 90, 60)
    n = int(lengths.sum())
    lr = np.clip(0.05 * rng.standard_t(2, n), -20, 20)
    lr[rng.integers(0, n, 20)] = np.log(rng.choice([1.5, 2.0, 0.5], 20))  # ties at the bounds
    rho = np.exp(lr)
    base = rng.random(n) > 0.1
    stats = np.stack([base, base & (np.abs(lr) <= math.log(2.0)), base & (rng.random(n) > 0.01),
                      np.zeros(n, bool), base.copy()])
    for k in rng.choice(starts.size, 12, replace=False):
        stats[4, starts[k]:starts[k] + lengths[k]] = False  # whole sequences rejected (seq_* options)
    for c, low in ((2.0, None), (1.5, 0.5)):
        params = np.array([c, low or 0.0, math.log(c), math.log(low) if low else -math.inf,
                           math.log(low) if low else -math.log(c), action])
        got = kernels.token_mode_views(lr, rho, base, stats, starts, params, swift)
        for j in range(stats.shape[0]):
            alone = kernels.token_modes(lr, rho, stats[j], starts, params[None, :], swift, False)[:3]
            for joint, single in zip(got, alone, strict=True):
                assert np.array_equal(joint[j:j + 1].view(np.uint64), single.view(np.uint64)), (c, low, j)


def test_exact_sum_is_independent_of_how_values_arrive():
    """Many small arrays (kept, then reduced every ~8k values), one big array, scalars and merges: one value, the
    correctly rounded sum."""
    rng = np.random.default_rng(11)
    values = np.concatenate([rng.normal(0, 1e16, 5000), rng.normal(0, 1.0, 20000), -rng.normal(0, 1e16, 5000)])
    want = math.fsum(values.tolist())
    one = ExactSum()
    one.add(values)
    pieces = ExactSum()
    for part in np.array_split(values, 997):
        pieces.add(part)
    left, right = ExactSum(), ExactSum()
    left.add(values[:12345])
    for v in values[12345:20000].tolist():
        right.add_scalar(v)
    right.add(values[20000:])
    left.merge(right)
    assert one.value() == pieces.value() == left.value() == want
    empty = ExactSum()
    empty.add(np.zeros(0))
    assert empty.value() == 0.0
    inf = ExactSum()
    inf.add(np.array([1.0, math.inf]))
    assert inf.value() == math.inf


def test_bucket_index_is_clipped_searchsorted():
    """The scan's branch-free bucket rule equals clip(searchsorted(edges, v, 'right') − 1, 0, len − 2) on every
    strata edge set, at the edges themselves, between them, beyond both ends and at ±inf."""
    from rcdiag.analysis.scan_kernels import bucket_index
    from rcdiag.analysis.strata import ENTROPY_EDGES, POW2_EDGES, PROB_EDGES

    for edges in (POW2_EDGES, PROB_EDGES, ENTROPY_EDGES):
        finite = edges[np.isfinite(edges)].astype(np.float64)
        values = np.concatenate([finite, np.nextafter(finite, -np.inf), np.nextafter(finite, np.inf),
                                 (finite[:-1] + finite[1:]) / 2, [-1e300, -1.0, 0.0, 1e300, np.inf, -np.inf]])
        for v in values:
            expected = min(max(int(np.searchsorted(edges, v, side="right")) - 1, 0), edges.size - 2)
            assert bucket_index(v, edges) == expected, (edges, v)
    for p in (0, 1, 2, 3, 4, 7, 8, 1 << 20, (1 << 62) + 5):
        assert bucket_index(p, POW2_EDGES) == min(max(int(np.searchsorted(POW2_EDGES, p, "right")) - 1, 0),
                                                  POW2_EDGES.size - 2)
