"""The checks' compiled evidence pass (rcdiag.checks.evidence_kernel) against plain numpy references of the same
evidence, on batches full of placeholders (NaN, ±inf, 0.0, −0.0, ≤ −1e9, positive, float32 overflow, subnormal)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rcdiag.checks.evidence import GRIDS, HUGE_NEGATIVE, CheckAccumulator

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, -1e10, HUGE_NEGATIVE, 0.5, 1e-7, 3e38, -1e-45]


def _batch(rng: np.random.Generator, n: int, dtype: type) -> pa.RecordBatch:
    seq = np.sort(rng.integers(0, max(n // 20, 1), n))
    pos = np.zeros(n, np.int64)
    for i in range(1, n):
        pos[i] = pos[i - 1] + 1 if seq[i] == seq[i - 1] else 0
    pos[rng.random(n) < 0.02] += 1  # gaps: no shift pair across them
    a = -np.abs(rng.normal(0, 2, n))
    b = a + rng.normal(0, 0.05, n)
    for side in (a, b):
        hit = rng.integers(0, n, max(n // 30, 1))
        side[hit] = rng.choice(SPECIAL, hit.size)
    with np.errstate(over="ignore"):
        return pa.record_batch({"seq_id": seq, "pos": pos, "rollout_logprob": b.astype(dtype),
                                "train_logprob": a.astype(dtype), "mask": rng.random(n) < 0.9})


def _side_reference(v: np.ndarray, o: np.ndarray, valid: np.ndarray, pos: np.ndarray) -> dict:
    with np.errstate(invalid="ignore"):
        tests = {"nan": np.isnan(v), "pos_inf": v == np.inf, "neg_inf": v == -np.inf,
                 "huge_negative": np.isfinite(v) & (v <= HUGE_NEGATIVE),
                 "zero": (v == 0.0) & (np.abs(np.nan_to_num(o, nan=1.0)) > 1e-2),
                 "positive": np.isfinite(v) & (v > 1e-6)}
    hits = {k: t & valid for k, t in tests.items()}
    normal = valid & np.isfinite(v) & (v != 0.0) & (v > HUGE_NEGATIVE)
    with np.errstate(over="ignore"):
        bits = v[normal].astype(np.float32).view(np.uint32)
    return {"counts": {k: int(h.sum()) for k, h in hits.items()},
            "first_rows": {k: int(np.flatnonzero(h)[0]) for k, h in hits.items() if h.any()},
            "pos0": sum(int((h & (pos == 0)).sum()) for h in hits.values()), "checked": bits.size,
            "on_grid": {g.name: int(((bits & np.uint32((1 << g.low_bits) - 1)) == 0).sum()) for g in GRIDS},
            "exponents": np.bincount((bits >> 23) & 0xFF, minlength=256)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_evidence_matches_numpy_reference(dtype):
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 50, 4000):
        batch = _batch(rng, n, dtype)
        acc = CheckAccumulator()
        acc.update(batch, "tokens/x.parquet", 100)
        seq, pos = (np.asarray(batch.column(k), np.int64) for k in ("seq_id", "pos"))
        a, b = (np.asarray(batch.column(k), np.float64) for k in ("train_logprob", "rollout_logprob"))
        valid = np.asarray(batch.column("mask"))
        for name, v, o in (("train_logprob", a, b), ("rollout_logprob", b, a)):
            ref, side = _side_reference(v, o, valid, pos), acc.sides[name]
            assert side.counts == ref["counts"]
            assert {k: f["row"] - 100 for k, f in side.first.items()} == ref["first_rows"]
            assert all(f["seq_id"] == seq[f["row"] - 100] for f in side.first.values())
            assert (side.pos0, side.checked, side.on_grid) == (ref["pos0"], ref["checked"], ref["on_grid"])
            assert np.array_equal(side.exponents, ref["exponents"])
        with np.errstate(invalid="ignore"):
            clean = valid & np.isfinite(a) & np.isfinite(b) & (a < 0) & (b < 0) & (a > HUGE_NEGATIVE) \
                & (b > HUGE_NEGATIVE)
        x, y = a[clean], b[clean]
        d = y - x
        np.testing.assert_allclose(acc.fit, [x.size, x.sum(), y.sum(), (x * x).sum(), (x * y).sum(),
                                             (y * y).sum()], rtol=1e-12, atol=1e-12)
        with np.errstate(invalid="ignore"):
            one = valid & (b == 0) & np.isfinite(a) & (a < -1e-6) & (a > HUGE_NEGATIVE)  # one-token supports
        unsure = (x < np.log(0.5)) & (y < np.log(0.5))  # both sides give p < ½
        np.testing.assert_allclose(acc.offset, [d[d > 1e-6].sum(), (d > 1e-6).sum(), (d < -1e-6).sum(),
                                                (np.abs(d) <= 1e-6).sum(), -a[one].sum(), one.sum(),
                                                (d[unsure] > 1e-6).sum(), (d[unsure] < -1e-6).sum(), d.sum()],
                                   rtol=1e-12, atol=1e-12)
        same = (seq[1:] == seq[:-1]) & (pos[1:] == pos[:-1] + 1) & clean[1:] & clean[:-1]
        mid = same[1:] & same[:-1]
        ai = a[1:-1][mid]
        expected = [ai.size, np.abs(ai - b[:-2][mid]).sum(), np.abs(ai - b[1:-1][mid]).sum(),
                    np.abs(ai - b[2:][mid]).sum()] if n >= 3 else [0, 0, 0, 0]
        np.testing.assert_allclose(acc.shift, expected, rtol=1e-12, atol=1e-12)
        assert acc.tokens == n and acc.valid == int(valid.sum())

