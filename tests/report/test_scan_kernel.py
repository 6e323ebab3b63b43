"""The report's compiled scan (tails, strata, per-sequence sums in one pass) against the accumulators' numpy forms."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rcdiag.analysis.distributions.strata import SequenceInfo, StrataAccumulator, TokenView
from rcdiag.analysis.distributions.tails import EDGES, WORST_K, TailAccumulator, worst_rows
from rcdiag.analysis.metrics.bootstrap import SequenceSums
from rcdiag.report.scan import new_scan, update


def _batch(rng: np.random.Generator, n: int, n_seq: int) -> pa.RecordBatch:
    seq = np.sort(rng.integers(0, n_seq, n)).astype(np.int64)
    pos = np.zeros(n, np.int64)
    for i in range(1, n):  # positions that step, jump past power-of-two edges, restart per sequence
        pos[i] = 0 if seq[i] != seq[i - 1] else pos[i - 1] + int(rng.choice([1, 1, 1, 3, 1000]))
    pos[rng.integers(0, n, 3)] = -5
    pos[rng.integers(0, n, 2)] = 2**62 + 5
    b = -rng.exponential(1.5, n)
    ell = rng.normal(0.0, rng.choice([1e-12, 0.02, 3.0]), n)
    at = rng.integers(0, n, 40)  # |ℓ| exactly at, and one ulp around, the tails histogram's edges
    edge = rng.choice(EDGES[EDGES < 10], at.size)
    ell[at] = rng.choice([-1, 1], at.size) * np.where(rng.random(at.size) < 0.5, edge,
                                                      np.nextafter(edge, rng.choice([0.0, np.inf], at.size)))
    a = b + ell
    for side in (a, b):
        side[rng.integers(0, n, 4)] = rng.choice([np.nan, np.inf, -np.inf, -1e30], 4)
    entropy = rng.random(n)
    entropy[rng.integers(0, n, 5)] = np.nan
    return pa.RecordBatch.from_pydict({
        "seq_id": pa.array(seq), "pos": pa.array(pos.astype(np.int32) if n % 2 else pos),
        "token_id": pa.array(rng.integers(0, 100, n).astype(np.int32), mask=rng.random(n) < 0.05),
        "rollout_logprob": pa.array(b, mask=rng.random(n) < 0.02), "train_logprob": pa.array(a.astype(np.float32)),
        "train_entropy": pa.array(entropy.astype(np.float32), mask=rng.random(n) < 0.1),
        "mask": pa.array(rng.random(n) > 0.1)})


def _info(rng: np.random.Generator, n_seq: int) -> SequenceInfo:
    ids = np.arange(0, n_seq + 3, dtype=np.int64)[rng.random(n_seq + 3) > 0.1]  # some token rows have no row here
    return SequenceInfo.from_table(pa.table({
        "seq_id": ids, "response_len": pa.array(rng.integers(-1, 3000, ids.size)),
        "finish_reason": pa.array(rng.choice(["stop", "length", None], ids.size)),
        "reward": pa.array(rng.normal(size=ids.size), mask=rng.random(ids.size) < 0.3),
        "prompt_id": pa.array(ids.astype(str))}))


def _close(got: np.ndarray, want: np.ndarray, scale: np.ndarray, what: str) -> None:
    """Float sums to rounding: the kernel adds row by row (per sequence, then per stratum), numpy pairwise."""
    got, want = np.asarray(got, float), np.asarray(want, float)
    with np.errstate(invalid="ignore"):
        err = np.where(got == want, 0.0, np.abs(got - want))  # equal infinities (k3 of a −1e30 placeholder) agree
    bound = 1e-12 * np.maximum(scale, 1e-300) + 1e-300
    worst = np.unravel_index(np.argmax(err / bound), err.shape) if err.size else ()
    assert (err <= bound).all(), f"{what}: largest deviation {err[worst]} at {worst} (bound {bound[worst]})"


@pytest.mark.parametrize("seed", range(12))
def test_scan_kernel_against_the_numpy_accumulators(seed):
    """Placeholders (NaN, ±inf, −1e30), masked and null rows, positions that jump, go negative or past 2^62, |ℓ| at
    and next to every kind of histogram edge, unknown entropies and lengths, sequences without a sequences row:
    counts, histograms, the density, maxima and the worst tokens exactly; sums to rounding. Guards the bucket
    look-ups done once per sequence or per power-of-two range, the per-sequence strata and the numpy-computed
    exp/expm1/log10 terms."""
    rng = np.random.default_rng(seed)
    n_seq = int(rng.integers(1, 60))
    batch, info = _batch(rng, int(rng.integers(1, 4000)), n_seq), _info(rng, n_seq)
    scan = new_scan(info, 2.0, None)
    update(scan, batch, "tokens/part-00000.parquet", 0)

    seq = np.asarray(batch.column("seq_id"))
    pos = np.asarray(batch.column("pos")).astype(np.int64)
    a = np.asarray(batch.column("train_logprob"), dtype=np.float64)
    b = np.asarray(batch.column("rollout_logprob").fill_null(np.nan), dtype=np.float64)
    keep = np.asarray(batch.column("mask")) & np.isfinite(a) & np.isfinite(b)
    lr = a[keep] - b[keep]
    tails = TailAccumulator()
    token_id = np.asarray(batch.column("token_id").fill_null(-1), dtype=np.int64)
    tails.update(lr, a[keep], b[keep], {"seq_id": seq[keep], "pos": pos[keep], "token_id": token_id[keep]})
    got = scan.tails
    assert (got.n, got.underflow, got.max_abs) == (tails.n, tails.underflow, tails.max_abs)
    for name in ("hist_pos", "hist_neg", "outside", "density"):
        np.testing.assert_array_equal(getattr(got, name), getattr(tails, name), err_msg=name)
    for name in ("abs_log_ratio", "seq_id", "pos", "token_id"):
        np.testing.assert_array_equal(got.worst[name], tails.worst[name], err_msg=name)
    terms = np.abs(np.stack([lr, lr * lr, np.exp(a[keep]), np.exp(b[keep])]))
    _close(got.sums, tails.sums, np.array([terms[0].sum(), terms[1].sum(), terms[2].sum(), terms[3].sum(),
                                           (terms[2] ** 2).sum(), (terms[3] ** 2).sum(),
                                           (terms[2] * terms[3]).sum()]), "tail sums")

    seq_row = info.lookup(seq)
    raw_last = np.r_[seq[1:] != seq[:-1], True]  # the last row of the stream ends its sequence
    length = info.response_len[seq_row]
    last = raw_last | ((length >= 0) & (pos + 1 >= length))
    entropy = np.asarray(batch.column("train_entropy").fill_null(np.nan), dtype=np.float64)
    strata = StrataAccumulator(info)
    strata.update(TokenView(pos[keep], b[keep], entropy[keep], token_id[keep], last[keep], seq_row[keep], info),
                  lr)
    clamped = np.clip(lr, -20, 20)
    magnitude = np.abs(np.stack([np.ones_like(lr), lr, lr, lr * lr, np.expm1(clamped) - clamped])).sum(axis=1)
    for name, table in strata.sums.items():
        mine = scan.strata.sums[name]
        np.testing.assert_array_equal(mine[:, 0], table[:, 0], err_msg=f"{name} tokens")
        np.testing.assert_array_equal(mine[:, 5], table[:, 5], err_msg=f"{name} max |ℓ|")
        _close(mine[:, 1:5], table[:, 1:5], np.broadcast_to(magnitude[1:], table[:, 1:5].shape), name)

    sums = SequenceSums(2.0)
    sums.update(seq[keep].astype(np.int64), a[keep], b[keep])
    ids, rows = scan.sums.table()
    want_ids, want = sums.table()
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(rows[:, [0, 5]], want[:, [0, 5]])
    scale = np.abs(want).sum(axis=0) + np.abs(rows).sum(axis=0)
    _close(rows, want, np.broadcast_to(scale, want.shape), "per-sequence sums")


def test_worst_tokens_ties_at_the_cut_go_by_seq_id_then_pos():
    """More rows tied at the WORST_K-th |ℓ| than fit, in one batch or two of either order: the kept ones are the
    lowest (seq_id, pos) — the documented order rule, not whichever rows the partition left in front (before
    tails.worst_rows, an argpartition per batch kept the highest seq_ids here)."""
    n = 10 * WORST_K
    seq, pos = np.arange(n, dtype=np.int64)[::-1] // 2, np.arange(n, dtype=np.int64)[::-1] % 2
    lr = np.where(np.arange(n) % 7 == 0, -2.0, 1.0)  # 29 rows tied at |ℓ| = 2 for 20 places
    a = lr - 3.0
    want = sorted(zip(-np.abs(lr), seq, pos, strict=True))[:WORST_K]
    for parts in ((slice(0, n),), (slice(0, n // 2), slice(n // 2, n)), (slice(n // 2, n), slice(0, n // 2))):
        tails = TailAccumulator()
        for part in parts:
            tails.update(lr[part], a[part], a[part] - lr[part],
                         {"seq_id": seq[part], "pos": pos[part], "token_id": pos[part]})
        worst = tails.worst
        assert list(zip(-worst["abs_log_ratio"], worst["seq_id"], worst["pos"], strict=True)) == want
    assert worst_rows(np.array([3.0, 1.0, 3.0, np.nan, 3.0]), k=2).tolist() == [0, 2, 4]
