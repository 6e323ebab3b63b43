"""Hand-built inputs where each quirk must show: empty and all-masked rows, length 1, |ℓ| > 20, tiny differences,
many sequences with few tokens, ties at the threshold, all weights zero, no data at all."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

import rcdiag
from tests.analysis import reference as ref
from tests.analysis.helpers import CONVENTIONS, MODES, assert_close


def frame(rows: list[tuple[int, int, float, float, bool]]) -> pd.DataFrame:
    """Token rows (seq_id, pos, train a, rollout b, mask) with float32 log-probs."""
    seq, pos, a, b, m = zip(*rows, strict=True) if rows else ((), (), (), (), ())
    return pd.DataFrame({"seq_id": np.array(seq, np.int64), "pos": np.array(pos, np.int32),
                         "rollout_logprob": np.array(b, np.float32), "train_logprob": np.array(a, np.float32),
                         "mask": np.array(m, bool)})


def check_all(tokens, universe=None, thresholds=(1.0, 2.0)) -> None:
    seqs = ref.sequences(tokens, universe)
    sequences = None if universe is None else pd.DataFrame({"seq_id": universe})
    for convention in CONVENTIONS:
        got = rcdiag.compute_metrics(tokens, convention, sequences=sequences)
        assert_close(got, ref.metrics(seqs, convention), what=f"[{convention}]")
        for mode in MODES:
            for c in thresholds:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    got = rcdiag.simulate(tokens, mode, c, convention=convention, sequences=sequences)
                assert_close(got, ref.is_metrics(seqs, convention, mode, c), rel=1e-10,
                             what=f"[{convention} {mode} C={c}]")


def test_empty_and_all_masked_rows_follow_each_convention():
    """Canonical excludes rows with T_i = 0 from sequence means; swift/verl score them as perfect (log-PPL 0,
    ratio 1). Guards the peer bug of reading empty responses as "no mismatch"."""
    tokens = frame([(1, 0, -1.0, -1.5, True), (1, 1, -2.0, -1.0, True), (2, 0, -3.0, -1.0, False),
                    (3, 0, -0.5, -0.25, True)])
    universe = [1, 2, 3, 4, 5]  # 4 and 5: empty responses with no token rows; 2: all masked
    canonical = rcdiag.compute_metrics(tokens, sequences=pd.DataFrame({"seq_id": universe}))
    assert (canonical["sequences"], canonical["empty_sequences"], canonical["tokens"]) == (5, 3, 3)
    swift = rcdiag.compute_metrics(tokens, "swift", sequences=pd.DataFrame({"seq_id": universe}))
    # seq 1: b̄ − ā = (−1.25) − (−1.5) = 0.25; seq 3: 0.25; empties: 0
    assert canonical["log_ppl_diff"] == pytest.approx(0.25, rel=1e-12)
    assert swift["log_ppl_diff"] == pytest.approx(0.5 / 5, rel=1e-12)
    assert swift["log_ppl_diff_min"] == 0.0 and canonical["log_ppl_diff_min"] == pytest.approx(0.25)
    check_all(tokens, universe)


def test_length_one_and_single_token():
    """One token: std 0 (N ≤ 1), min = max = mean; sequence ratio = token ratio."""
    tokens = frame([(0, 0, -1.0, -1.7, True)])
    got = rcdiag.simulate(tokens, "token_truncate", 3.0)
    assert got["is_weight_std"] == 0.0
    assert got["is_weight_min"] == got["is_weight_max"] == pytest.approx(math.exp(0.7), rel=1e-6)
    check_all(tokens)
    check_all(make_lengths_one())


def make_lengths_one(n: int = 2000) -> pd.DataFrame:
    """Huge sequence count, one token each (exercises per-sequence state, not per-token)."""
    rng = np.random.default_rng(1)
    b = -rng.exponential(1.0, n)
    a = b + rng.normal(0, 0.8, n)
    return frame([(i * 2, 0, float(x), float(y), bool(i % 7)) for i, (x, y) in enumerate(zip(a, b, strict=True))])


def test_huge_log_ratios_are_clamped_per_convention():
    """|ℓ| > 20: canonical/swift/verl clamp ℓ̂ at ±20, verl's k3 does not (overflows to inf past ~709 nats in
    float64), trl never clamps."""
    tokens = frame([(0, 0, -0.5, -30.5, True), (0, 1, -40.0, -1.0, True), (1, 0, -2.0, -2.0, True)])
    canonical = rcdiag.compute_metrics(tokens)
    verl = rcdiag.compute_metrics(tokens, "verl")
    assert canonical["k3_kl"] == pytest.approx((math.expm1(20) - 20 + math.expm1(-20) + 20) / 3, rel=1e-12)
    assert verl["k3_kl"] == pytest.approx((math.expm1(30) - 30 + math.expm1(-39) + 39) / 3, rel=1e-12)
    assert rcdiag.compute_metrics(tokens, "swift")["k3_kl"] == pytest.approx((10 + 10 + 0) / 3, rel=1e-12)
    check_all(tokens, thresholds=(1.5, 3.0))
    overflow = frame([(0, 0, -0.5, -800.0, True)])
    assert rcdiag.compute_metrics(overflow, "verl")["k3_kl"] == math.inf


def test_tiny_differences_keep_precision():
    """ℓ ≈ 1e-7: kl, k3 (≈ ℓ²/2 ≈ 5e-15) and chi2 must not drown in rounding (expm1, exact sums)."""
    rng = np.random.default_rng(5)
    b = (-rng.exponential(1.0, 400)).astype(np.float32)
    a = np.nextafter(b, np.float32(0))  # one float32 ulp above: ℓ ~ 1e-7 … 1e-8
    rows = [(i // 20, i % 20, float(x), float(y), True) for i, (x, y) in enumerate(zip(a, b, strict=True))]
    tokens = frame(rows)
    got = rcdiag.compute_metrics(tokens)
    assert 0 < got["k3_kl"] < 1e-13 and got["kl"] < 0
    check_all(tokens)


def test_ties_at_the_threshold():
    """ρ = C exactly (ℓ = 0, C = 1; and ℓ = log C for a C with exp/log round trip): a mask keeps w ≤ C, and
    "high"/"low" are strict."""
    tokens = frame([(0, 0, -1.0, -1.0, True), (0, 1, -2.0, -2.0, True), (1, 0, -1.0, -1.0, True)])
    for mode in ("token_mask", "sequence_mask"):
        got = rcdiag.simulate(tokens, mode, 1.0, lower=1.0)
        assert got["kept_token_frac"] == 1.0 and got["fraction_high"] == 0.0 and got["fraction_low"] == 0.0
    ell = float(np.float32(-1.0) - np.float32(-1.5))  # 0.5, exact in float32
    c = math.exp(ell)
    while math.log(c) != ell:
        c = math.nextafter(c, math.inf)
    tie = frame([(0, 0, -1.0, -1.5, True), (1, 0, -1.0, -1.0, True)])
    got = rcdiag.simulate(tie, "token_mask", c)
    assert got["kept_token_frac"] == 1.0 and got["clipped_frac"] == 0.0
    check_all(tie, thresholds=(c, math.nextafter(c, 0.0)))


def test_all_weights_zero_gives_nan_ess_with_warning():
    tokens = frame([(0, 0, -0.1, -3.0, True), (1, 0, -0.2, -4.0, True)])
    with pytest.warns(RuntimeWarning, match="ESS"):
        got = rcdiag.simulate(tokens, "token_mask", 2.0)
    assert math.isnan(got["ess"]) and got["is_weight_mean"] == 0.0 and got["kept_token_frac"] == 0.0
    with pytest.warns(RuntimeWarning, match="ESS"):
        assert math.isnan(rcdiag.simulate(tokens, "sequence_mask", 2.0, convention="verl")["ess"])


def test_no_valid_tokens_is_not_a_perfect_match():
    """Zero valid tokens: every metric NaN (never 0 mismatch), counts say 0, for every convention and mode —
    except the numbers a framework itself logs for such a batch under its convention: TRL v1.9.0 0.0 (token modes,
    logp differences) and 1.0 (sequence modes: every row's ratio is exp(0)); ms-swift v4.5.2 0 / −1 / 1 / 1e10
    (its max(N, 1) divisors); verl's training/rollout_probs_diff_valid = 0."""
    tokens = frame([(0, 0, -1.0, float("nan"), False), (1, 0, -1.0, -2.0, False)])
    swift_metrics = {**dict.fromkeys(("kl", "k3_kl", "training_log_ppl", "rollout_log_ppl", "log_ppl_diff",
                                      "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "chi2_seq"), 0.0),
                     "training_ppl": 1.0, "rollout_ppl": 1.0, "ppl_ratio": 1.0, "chi2_token": -1.0}
    logged = {"canonical": {}, "verl": {"probs_diff_valid": 0}, "swift": swift_metrics,
              "trl": {"abs_log_ratio_mean": 0.0, "abs_log_ratio_max": 0.0}}
    for convention in CONVENTIONS:
        got = rcdiag.compute_metrics(tokens, convention)
        assert got["tokens"] == 0 and got["sequences"] == 2 and got["empty_sequences"] == 2
        assert {k: got.pop(k) for k in logged[convention]} == logged[convention]
        assert all(math.isnan(got[k]) for k in got if k not in ("tokens", "sequences", "empty_sequences"))
        for mode in MODES:
            result = rcdiag.simulate(tokens, mode, convention=convention)
            value = 1.0 if mode.startswith("sequence") else 0.0
            want = {"trl": dict.fromkeys(("is_weight_mean", "is_weight_min", "is_weight_max"), value),
                    "swift": {"is_weight_mean": 0.0, "ess": 1e10, "clipped_frac": 0.0}}.get(convention, {})
            assert {k: result.pop(k) for k in want} == want
            assert all(math.isnan(v) for v in result.values()), (convention, mode, result)
    empty = frame([])
    got = rcdiag.compute_metrics(empty)
    assert got["tokens"] == 0 and got["sequences"] == 0 and math.isnan(got["kl"])
    assert rcdiag.sweep(empty).shape == (28, 12)


def test_sequence_stats_against_loops(tmp_path):
    tokens = frame([(1, 0, -1.0, -1.5, True), (1, 1, -2.0, -1.0, True), (1, 2, -9.0, -1.0, False),
                    (2, 0, -3.0, -1.0, False), (3, 0, -0.5, -0.25, True)])
    run = rcdiag.write_run(tmp_path / "r", tokens, sequences=pd.DataFrame({"seq_id": [1, 2, 3, 4]}))
    stats = rcdiag.sequence_stats(run).set_index("seq_id")
    assert list(stats.index) == [1, 2, 3, 4]
    assert stats.loc[[2, 4], "n_valid"].tolist() == [0, 0] and stats.loc[[2, 4], "log_ppl_diff"].isna().all()
    for s in ref.sequences(tokens):
        if not s.t:
            continue
        ells = s.ells
        row = stats.loc[s.seq_id]
        want = {"n_valid": s.t, "sum_log_ratio": math.fsum(ells), "mean_log_ratio": math.fsum(ells) / s.t,
                "mean_abs_log_ratio": math.fsum(abs(e) for e in ells) / s.t,
                "max_abs_log_ratio": max(abs(e) for e in ells), "training_log_ppl": -math.fsum(s.a) / s.t,
                "rollout_log_ppl": -math.fsum(s.b) / s.t, "log_ppl_diff": -math.fsum(ells) / s.t,
                "seq_ratio": math.exp(ref.clamp(math.fsum(ells) / s.t, -20, 20))}
        assert_close(row.to_dict(), want, what=f"[seq {s.seq_id}]")
