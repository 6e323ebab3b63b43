"""The fused kernels against plain Python float64 references: compensated per-sequence sums, the row checks, the
token-mode reduction, and the lazily reduced ExactSum (rcdiag/kernels.py, rcdiag/accum.py)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from rcdiag.analysis.correction import gate_stats, is_kernels, rejection_kernels
from rcdiag.analysis.passes import kernels
from rcdiag.analysis.passes.accum import ExactSum
from rcdiag.store.schema import check_keys


def _segments(rng: np.random.Generator, n_seq: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(1, max_len + 1, n_seq)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    return starts, lengths


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sequence_table_matches_fsum_per_sequence(dtype):
    """THE per-sequence table (kernels.sequence_table, every metric's, the bootstrap's, the strata's and the
    rejection options' source): cancelling ℓ (±1e3 next to 1e-9), |ℓ| > 20, masked NaN rows and a sequence without
    a kept row — every column against math.fsum (or max) of the same terms, computed from numpy's own
    expm1/exp as the chunk's row terms are."""
    from rcdiag.analysis.passes.chunks import Chunker

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
    mask[starts[5]:starts[6]] = False
    a[~mask] = np.nan
    seq = np.repeat(np.arange(lengths.size), lengths)
    pos = np.concatenate([np.arange(k) for k in lengths])
    chunker = Chunker()
    chunks = chunker.push("t", pa.record_batch({"seq_id": seq, "pos": pos, "train_logprob": a,
                                                "rollout_logprob": b, "mask": mask}))
    got = np.concatenate([c.table(2.0, 0.5) for c in [*chunks, chunker.flush()]], axis=1)
    col = kernels.COLUMN
    x = np.where(mask, a.astype(np.float64), 0.0)
    y = np.where(mask, b.astype(np.float64), 0.0)
    for k, (lo, length) in enumerate(zip(starts, lengths, strict=True)):
        rows = [i for i in range(lo, lo + length) if mask[i]]
        e = [x[i] - y[i] for i in rows]
        eh = np.clip(np.array(e, dtype=np.float64), -20.0, 20.0)
        em1, rho = np.expm1(eh), np.exp(eh)
        w = np.clip(rho, 0.5, 2.0)
        ws = np.clip(rho, 0.5, 2.0)
        want = {"sum_a": [x[i] for i in rows], "sum_b": [y[i] for i in rows], "sum_l": e, "sum_lhat": eh.tolist(),
                "sum_chi2": (em1 * (em1 + 2.0)).tolist(), "sum_abs": [abs(v) for v in e],
                "sum_k3": (em1 - eh).tolist(), "sum_k3_swift": np.minimum(em1 - eh, 10.0).tolist(),
                "sum_k3_raw": [float(np.expm1(v)) - v if abs(v) > 20 else t for v, t in zip(e, (em1 - eh).tolist(), strict=True)],
                "sum_sq": [v * v for v in e], "w_sum": w.tolist(), "w_sq": (w * w).tolist(),
                "ws_sum": ws.tolist(), "ws_sq": (ws * ws).tolist()}
        for name, terms in want.items():
            value = got[col[name], k]
            if any(math.isinf(t) for t in terms):  # k3 of ℓ ≈ 1e3 without the clamp overflows, as it should
                assert value == math.inf, (name, k, value)
                continue
            exact = math.fsum(terms)
            scale = math.fsum(abs(t) for t in terms)
            # compensated sums: correctly rounded up to n·eps²·Σ|term|; one-sign sums (plain): n·eps of the sum
            if name in ("sum_l", "sum_lhat", "sum_chi2"):
                bound = 2.3e-16 * abs(exact) + 1.3e-32 * length * scale
            else:
                bound = 1.2e-16 * length * scale
            assert abs(value - exact) <= bound + 1e-300 or value == exact, (name, k, value, exact)
        assert got[col["T"], k] == len(rows)
        assert got[col["max_abs"], k] == (max(abs(v) for v in e) if e else 0.0)
        assert got[col["max_k3"], k] == (float((em1 - eh).max()) if e else 0.0)


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
    per_w, per_e, out, w_rows = is_kernels.token_modes(lr, rho, stat, starts, params, True, True)
    f = [dict(zip(is_kernels.TOKEN_MODE_FIELDS, row, strict=True)) for row in out.tolist()]
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
    together = is_kernels.token_modes(lr, rho, stat, starts, params, swift, True)
    for j in range(params.shape[0]):
        alone = is_kernels.token_modes(lr, rho, stat, starts, params[j:j + 1], swift, True)
        for joint, single in zip(together, alone, strict=True):
            assert np.array_equal(joint[j:j + 1].view(np.uint64), single.view(np.uint64))


def _rejection_chunks(rng: np.random.Generator) -> list:
    """Chunks of sequences of 1 … 1,000 rows (lengths around numpy's pairwise-sum blocks of 8 and 128), 10 % of
    rows masked and one sequence without a valid row, ℓ heavy-tailed with rows at exactly ±log 2 and ±20+."""
    import pyarrow as pa

    from rcdiag.analysis.passes.chunks import iter_chunks

    lengths = rng.choice([1, 2, 7, 8, 9, 127, 128, 129, 136, 300, 1000], 80)
    n = int(lengths.sum())
    b = -rng.exponential(1.5, n)
    ell = np.clip(0.3 * rng.standard_t(2, n), -30, 30)
    ell[rng.integers(0, n, 40)] = rng.choice([math.log(2.0), -math.log(2.0), 25.0, -25.0], 40)
    mask = rng.random(n) > 0.1
    mask[int(lengths[:3].sum()):int(lengths[:4].sum())] = False
    seq = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    pos = np.concatenate([np.arange(k) for k in lengths])
    table = pa.table({"seq_id": seq, "pos": pos, "train_logprob": b + ell, "rollout_logprob": b, "mask": mask})
    return list(iter_chunks(table, batch_rows=n // 3))


@pytest.mark.parametrize("swift", [False, True])
@pytest.mark.parametrize("action", [0.0, 1.0])
def test_rejection_views_equal_numpy_flags_then_each_set_alone(swift, action):
    """rejection_views decides verl's rejection flags itself (all 11 options, chained options, a set without any)
    and scores one mode on each set: output by output the bits of token_modes on the valid rows that
    rejection.keep_rows (numpy) keeps. The seq_* bounds are set to the per-sequence table's statistic of some
    sequences, so a sequence statistic the kernel took from anywhere else than the numpy form does flips their
    flag."""
    from rcdiag.analysis.conventions import LOG_RATIO_CLAMP
    from rcdiag.analysis.correction.rejection import OPTIONS, Rejection, keep_rows

    rng = np.random.default_rng(29 + int(swift) + 2 * int(action))
    for chunk in _rejection_chunks(rng):
        sets: list[tuple[Rejection, ...]] = [(), (Rejection("token_k1", 2.0), Rejection("seq_mean_k3", 0.05))]
        for option in OPTIONS:
            rejection = Rejection(option, 1.5 if option.endswith("k1") else 0.02)
            _, per_seq = rejection.statistic(chunk)
            sets.append((rejection,))
            if per_seq is not None:  # ties: the upper bound at numpy's (positive) statistic of some sequences
                ties = per_seq[per_seq > 0]
                if option.endswith("k1"):  # a ratio bound: only where log(exp(t)) gives t back
                    ties = ties[np.log(np.exp(ties)) == ties]
                for tie in rng.choice(ties, min(3, ties.size), replace=False):
                    sets.append((Rejection(option, float(np.exp(tie) if option.endswith("k1") else tie)),))
        options = np.array([r.kernel_row() for rs in sets for r in rs])
        option_view = np.array([j for j, rs in enumerate(sets) for _ in rs], dtype=np.int64)
        lh, rm1 = chunk.log_ratio(LOG_RATIO_CLAMP), chunk.ratio_m1(LOG_RATIO_CLAMP)
        rho = chunk.ratio(LOG_RATIO_CLAMP)
        params = np.array([2.0, 0.0, math.log(2.0), -math.inf, -math.log(2.0), action])
        flat = [r for rs in sets for r in rs]
        seq_stat = np.array([r.sequence_statistic(chunk) if r.scope != "token" else np.zeros(chunk.seq_ids.size)
                             for r in flat]).reshape(len(flat), chunk.seq_ids.size)
        got = rejection_kernels.rejection_views(lh, rho, lh, rm1, chunk.mask, chunk.starts, seq_stat, options,
                                      option_view, len(sets), np.zeros(chunk.n, np.int64), params, swift)
        dropped = 0
        for j, rejections in enumerate(sets):
            keep = keep_rows(rejections, chunk)
            stat = chunk.mask if keep is None else chunk.mask & keep
            dropped += int(np.count_nonzero(chunk.mask & ~stat))
            alone = is_kernels.token_modes(lh, rho, stat, chunk.starts, params[None, :], swift, False)[:3]
            for joint, single in zip(got, alone, strict=True):
                assert np.array_equal(joint[j:j + 1].view(np.uint64), single.view(np.uint64)), (j, rejections)
        assert dropped > 0  # the options did reject rows: the sets differ


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


def test_segment_means_match_fsum_per_group():
    """kernels.segment_means (the gates' sequence / ROLL-segment aggregates): each sequence's mean and sum over its
    valid rows, each segment's mean (a run of valid rows within a sequence), against math.fsum of the same values;
    masked rows (NaN here) never read, a sequence without a valid row 0."""
    rng = np.random.default_rng(14)
    starts, lengths = _segments(rng, 50, 40)
    n = int(lengths.sum())
    mask = rng.random(n) > 0.3
    mask[starts[3]:starts[4]] = False
    values = np.where(mask, rng.normal(0, 1e3, n) * rng.choice([1.0, 1e-9], n), np.nan)
    bounds = [*starts.tolist(), n]
    chunk = SimpleNamespace(mask=mask, starts=starts, memo=lambda key, make: make())  # what gate_stats reads
    sums = kernels.segment_means(values, mask, starts, False)[1]
    for name, per_seq in (("mean", gate_stats.sequence_mean(chunk, values)), ("sum", sums)):
        for k in range(starts.size):
            kept = values[bounds[k]:bounds[k + 1]][mask[bounds[k]:bounds[k + 1]]].tolist()
            want = math.fsum(kept) / (max(len(kept), 1) if name == "mean" else 1)
            assert per_seq[k] == pytest.approx(want, rel=1e-15, abs=1e-300), (name, k)
    rows = kernels.segment_means(values, mask, starts, True)[0]
    for k in range(starts.size):
        i, last = bounds[k], bounds[k + 1]
        while i < last:
            j = i
            while j < last and mask[j] == mask[i]:
                j += 1
            want = math.fsum(values[i:j].tolist()) / (j - i) if mask[i] else 0.0
            assert np.all(rows[i:j] == pytest.approx(want, rel=1e-15, abs=1e-300)), (k, i)
            i = j


def test_exact_sums_equal_one_exact_sum_each():
    """ExactSums (K sums, one compiled call per (K, m) add) gives each sum ExactSum's bits whatever the batching,
    merges included: the gate sweep's determinism across threads and file order rests on it; inf / NaN and an
    overflowing intermediate sum fall back as ExactSum does."""
    from rcdiag.analysis.passes.accum import ExactSums

    rng = np.random.default_rng(12)
    values = np.stack([rng.normal(0, 1e16, 3000), rng.normal(0, 1.0, 3000), rng.normal(0, 1e-300, 3000),
                       np.r_[rng.normal(0, 1.0, 2999), math.inf], np.r_[1e308, 1e308, -1e308, np.zeros(2997)]])
    singles = [ExactSum() for _ in values]
    for single, row in zip(singles, values, strict=True):
        single.add(row)
    whole, pieces, left, right = ExactSums(5), ExactSums(5), ExactSums(5), ExactSums(5)
    whole.add(values)
    for part in np.array_split(values, 97, axis=1):
        pieces.add(part)
    for column in values[:, :1234].T:
        left.add(column)  # one value per sum
    right.add(values[:, 1234:])
    left.merge(right)
    late, first = ExactSums(5), ExactSums(5)  # merged the other way round: sum 4 has no intermediate overflow
    late.add(values[:, 1:])
    first.add(values[:, :1])
    first.merge(late)
    assert first.value(4) == 1e308
    for k, single in enumerate(singles):
        want = single.value()
        for got in (whole, pieces, left) + ((first,) if k < 4 else ()):
            assert np.array_equal(got.value(k), want, equal_nan=True), k
    assert whole.value(0) == math.fsum(values[0].tolist()) and whole.value(3) == math.inf
    assert ExactSums(2).value(1) == 0.0


def test_moments_array_merges_as_moments():
    """MomentsArray's vectorised Chan merge gives each slot the bits of Moments.merge of the same batches (empty
    batches and slots included)."""
    from rcdiag.analysis.passes.accum import Moments, MomentsArray

    rng = np.random.default_rng(13)
    batches = [(rng.integers(0, 3, 4) * rng.integers(0, 50, 4), rng.normal(size=4), rng.random(4)) for _ in range(9)]
    vector, slots = MomentsArray(4), [Moments() for _ in range(4)]
    for n, mean, m2 in batches:
        m2 = np.where(n > 0, m2, 0.0)
        vector.add(n, mean, m2)
        for k, slot in enumerate(slots):
            slot.merge(Moments(int(n[k]), float(mean[k]), float(m2[k])))
    other = MomentsArray(4)
    other.add(np.array([0, 5, 7, 0]), np.array([0.0, 1.5, -2.0, 0.0]), np.array([0.0, 0.25, 3.0, 0.0]))
    vector.merge(other)
    for k, slot in enumerate(slots):
        slot.merge(Moments(int(other.n[k]), float(other.mean[k]), float(other.m2[k])))
        got = vector.slot(k)
        assert (got.n, got.mean, got.m2) == (slot.n, slot.mean, slot.m2), k


def test_bucket_index_is_clipped_searchsorted():
    """The scan's branch-free bucket rule equals clip(searchsorted(edges, v, 'right') − 1, 0, len − 2) on every
    strata edge set, at the edges themselves, between them, beyond both ends and at ±inf."""
    from rcdiag.analysis.distributions.scan_kernels import bucket_index
    from rcdiag.analysis.distributions.strata import ENTROPY_EDGES, POW2_EDGES, PROB_EDGES

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
