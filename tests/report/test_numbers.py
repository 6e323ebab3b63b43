"""Report numbers against the library (compute_metrics/simulate/sweep) and independent float64 references."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import rcdiag
from rcdiag.analysis.correction.rejection import REJECTION_OPTIONS, rejection_bound
from rcdiag.analysis.distributions.tails import BINS_PER_DECADE
from rcdiag.analysis.metrics.bootstrap import COLUMNS, SequenceSums, bootstrap, point_estimates
from rcdiag.report.build import build_report
from rcdiag.report.make import make_report
from rcdiag.report.options import MODES, ReportOptions
from rcdiag.report.scan import scan_run


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory):
    """A run with an MoE-like mismatch (tails reach past every ratio band), several shards, some empty rows."""
    tokens, sequences = _frames_with_empty()
    return rcdiag.write_run(tmp_path_factory.mktemp("noisy") / "run", tokens, sequences, shard_tokens=500)


def _frames_with_empty():
    from tests.fixtures.runs import SyntheticSpec, synthetic_frames

    tokens, sequences = synthetic_frames(SyntheticSpec(noise=0.4, n_seq=50, seed=3))
    tokens.loc[tokens.seq_id == 7, "mask"] = False  # an all-masked sequence
    empty = sequences.iloc[:2].copy()
    empty["seq_id"], empty["response_len"], empty["response_text"] = [1000, 1001], 0, ""
    return tokens, pd.concat([sequences, empty], ignore_index=True)


@pytest.fixture(scope="module")
def noisy_report(noisy_run, tmp_path_factory):
    return make_report([noisy_run], tmp_path_factory.mktemp("out") / "rep", ReportOptions(replicates=200))


def _reference(run):
    t = run.tokens()
    keep = t["mask"].to_numpy()
    a = t["train_logprob"].to_numpy(np.float64)[keep]
    b = t["rollout_logprob"].to_numpy(np.float64)[keep]
    return t[keep], a, b


def test_metrics_json_equals_library(noisy_run, noisy_report):
    """metrics.json holds exactly what compute_metrics / simulate / sweep return on the same run."""
    data = json.loads((noisy_report.out / "metrics.json").read_text())
    expected = rcdiag.compute_metrics(noisy_run)
    for name, value in data["metrics"].items():
        assert value == pytest.approx(expected[name], rel=1e-12, abs=1e-15), name
    assert data["counts"]["sequences"] == expected["sequences"] == 52
    assert data["counts"]["empty_sequences"] == expected["empty_sequences"] == 3
    for mode in MODES:
        got = data["is_modes"][mode]
        want = rcdiag.simulate(noisy_run, mode, threshold=2.0)
        for name, value in want.items():
            assert got[name] == pytest.approx(value, rel=1e-12, abs=1e-15, nan_ok=True), (mode, name)
    sweep = rcdiag.sweep(noisy_run, modes=MODES)
    got = pd.DataFrame(data["sweep"])
    np.testing.assert_allclose(got.drop(columns="mode").to_numpy(float), sweep.drop(columns="mode").to_numpy(float),
                               rtol=1e-12, atol=1e-15)
    for option in REJECTION_OPTIONS:
        want = rcdiag.simulate(noisy_run, "token_truncate", threshold=2.0, rejection=[rejection_bound(option, 2.0)])
        assert data["rejection"][option]["kept_token_frac"] == pytest.approx(want["kept_token_frac"], rel=1e-12)
        assert data["rejection"][option]["ess"] == pytest.approx(want["ess"], rel=1e-12)
    assert data["rejection"]["token_k1"]["kept_token_frac"] < 1.0, "the noisy run must exercise rejection"


@pytest.mark.parametrize("convention", ["canonical", "swift", "verl", "trl"])
def test_bootstrap_point_estimates_match_compute_metrics(noisy_run, convention):
    """The bootstrap's per-sequence formulas reproduce compute_metrics under every convention (and ESS simulate)."""
    scan = scan_run(noisy_run)
    _, sums = scan.sums.table(scan.info.seq_id)
    got = point_estimates(sums, convention)
    want = rcdiag.compute_metrics(noisy_run, convention=convention)
    for name in ("kl", "k3_kl", "log_ppl_diff", "log_ppl_abs_diff", "ppl_ratio", "chi2_token", "chi2_seq"):
        assert got[name] == pytest.approx(want[name], rel=1e-10, abs=1e-14), name
    ess = rcdiag.simulate(noisy_run, "token_truncate", threshold=2.0, convention=convention)["ess"]
    assert got["ess"] == pytest.approx(ess, rel=1e-9)


def test_bootstrap_interval_against_index_resampling(noisy_run):
    """Poisson bootstrap ≈ classic resampling of sequences (numpy reference): same centre, se within 25 %."""
    scan = scan_run(noisy_run)
    _, sums = scan.sums.table(scan.info.seq_id)
    ci = bootstrap(sums, replicates=2000, seed=1)["kl"]
    tokens, a, b = _reference(noisy_run)
    per_seq = pd.DataFrame({"seq": tokens["seq_id"].to_numpy(), "d": b - a}).groupby("seq")["d"].agg(["sum", "size"])
    rng = np.random.default_rng(2)
    idx = rng.integers(0, len(per_seq), size=(2000, len(per_seq)))
    draws = per_seq["sum"].to_numpy()[idx].sum(1) / per_seq["size"].to_numpy()[idx].sum(1)
    assert ci["se"] == pytest.approx(draws.std(ddof=1), rel=0.25)
    kl = rcdiag.compute_metrics(noisy_run)["kl"]
    assert ci["low"] < kl < ci["high"]
    assert ci["low"] == pytest.approx(np.quantile(draws, 0.025), abs=2 * ci["se"] / 3)


def test_bootstrap_degenerate_inputs():
    one = np.zeros((1, len(COLUMNS)))
    assert np.isnan(bootstrap(one)["kl"]["low"])
    assert np.isnan(point_estimates(np.zeros((0, len(COLUMNS))))["kl"])


def test_sequence_sums_split_invariant(noisy_run):
    """Per-sequence sums do not depend on how batches cut sequences."""
    tokens, a, b = _reference(noisy_run)
    seq = tokens["seq_id"].to_numpy()
    whole, parts = SequenceSums(), SequenceSums()
    whole.update(seq, a, b)
    for lo in range(0, seq.size, 37):
        parts.update(seq[lo:lo + 37], a[lo:lo + 37], b[lo:lo + 37])
    np.testing.assert_allclose(parts.table()[1], whole.table()[1], rtol=1e-12, atol=1e-12)


def test_tails_against_numpy(noisy_run, noisy_report):
    tokens, a, b = _reference(noisy_run)
    lr = a - b
    tails = noisy_report.reports[0].tails
    absl = np.abs(lr)
    assert tails["abs_log_ratio_mean"] == pytest.approx(absl.mean(), rel=1e-12)
    assert tails["abs_log_ratio_std"] == pytest.approx(absl.std(), rel=1e-9)
    assert tails["abs_log_ratio_max"] == absl.max()
    resolution = 10 ** (1 / BINS_PER_DECADE)
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        exact = np.quantile(absl, q)
        assert exact / resolution**2 <= tails[f"abs_log_ratio_{name}"] <= exact * resolution**2, name
    lc = np.clip(lr, -20, 20)
    for lo, hi in ((0.9, 1.1), (0.8, 1.25), (0.5, 2.0)):
        share = ((lc < np.log(lo)) | (lc > np.log(hi))).mean()
        assert tails[f"frac_outside_{lo:g}_{hi:g}"] == pytest.approx(share, rel=1e-12)
    assert tails["frac_outside_0.5_2"] > 0
    assert tails["prob_pearson_corr"] == pytest.approx(np.corrcoef(np.exp(a), np.exp(b))[0, 1], rel=1e-9)


def test_strata_against_pandas_groupby(noisy_run, noisy_report):
    tokens, a, b = _reference(noisy_run)
    lr = a - b
    strata = noisy_report.reports[0].strata
    seqs = noisy_run.sequences().set_index("seq_id")
    frame = pd.DataFrame({"pos": tokens["pos"].to_numpy(), "l": lr, "p": np.exp(b),
                          "finish": seqs.loc[tokens["seq_id"], "finish_reason"].to_numpy()})
    by_finish = frame.groupby("finish")["l"].agg(["size", "mean"])
    got = {r["bucket"]: r for r in strata["finish_reason"]}
    for finish, row in by_finish.iterrows():
        assert got[finish]["tokens"] == row["size"]
        assert got[finish]["mean_log_ratio"] == pytest.approx(row["mean"], rel=1e-10)
    early = frame[frame["pos"].between(4, 7)]
    row = next(r for r in strata["position"] if r["bucket"] == "4–7")
    assert row["tokens"] == len(early) and row["mean_abs"] == pytest.approx(early["l"].abs().mean(), rel=1e-10)
    assert row["max_abs"] == pytest.approx(early["l"].abs().max())
    edges = [0.0, 1e-3, 1e-2, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0 + 1e-9]
    counts = pd.cut(frame["p"], edges, right=False).value_counts(sort=False)
    got = [r["tokens"] for r in strata["rollout_prob"]]
    assert got == [int(c) for c in counts if c], "rollout-probability buckets"
    assert sum(r["tokens"] for r in strata["reward"]) == len(frame)
    kinds = {r["bucket"].split()[0]: r["tokens"] for r in strata["token_kind"]}
    every = noisy_run.tokens()  # the EOS is the last token row, valid or not
    last = (every.groupby("seq_id")["pos"].transform("max") == every["pos"]).to_numpy()[every["mask"].to_numpy()]
    stopped = seqs.loc[tokens["seq_id"], "finish_reason"].to_numpy() == "stop"
    assert kinds["EOS/stop"] == int((last & stopped).sum())


def test_worst_tokens_and_sequences(noisy_run, noisy_report):
    tokens, a, b = _reference(noisy_run)
    lr = a - b
    rep = noisy_report.reports[0]
    top = np.sort(np.abs(lr))[::-1][:20]
    np.testing.assert_allclose([w["abs_log_ratio"] for w in rep.worst_tokens], top)
    first = rep.worst_tokens[0]
    row = tokens.iloc[int(np.argmax(np.abs(lr)))]
    assert (first["seq_id"], first["pos"]) == (row["seq_id"], row["pos"])
    means = pd.Series(lr).groupby(tokens["seq_id"].to_numpy()).mean()
    worst = means.abs().sort_values(ascending=False)
    assert rep.worst_sequences[0]["seq_id"] == worst.index[0]
    assert rep.worst_sequences[0]["response_text"] == f"response {worst.index[0]}"


def test_nan_run_still_reports(synthetic_runs, tmp_path):
    """NaN on valid positions: the metrics refuse the run, the report says why and keeps the checks."""
    rep = build_report(synthetic_runs["nan_placeholder"], ReportOptions(replicates=50))
    assert rep.metrics == {} and "rollout_logprob" in rep.metrics_error
    assert rep.checks[0].name == "placeholders" and rep.checks[0].severity == "error"
    assert "No recommendation" in rep.recommendation.text
    assert np.isfinite(rep.tails["abs_log_ratio_mean"])


def test_recommendation_is_an_acceptable_setting_and_says_why(noisy_report):
    """A noisy (non-healthy) run: the chosen setting meets the ESS target, adds a bias ≤ 5 %, zeroes ≤ 10 % of
    tokens, and the text names it; its numbers are the sweep's row."""
    rep = noisy_report.reports[0]
    rec = rep.recommendation.to_dict()
    assert rep.verdict.status != "healthy" and rec["kind"] in ("correct", "none")
    row = rep.sweep[(rep.sweep["mode"] == rec["mode"]) & (rep.sweep["threshold"] == rec["threshold"])].iloc[0]
    assert rec["ess"] == row["ess"] >= 0.9 and rec["clipped_frac"] == row["clipped_frac"]
    assert abs(row["is_weight_mean"] - 1) <= 0.05 and row["kept_token_frac"] >= 0.9
    assert f"C={rec['threshold']:g}" in rec["text"] and rec["mode"] in rec["text"]


def test_recommendation_when_nothing_meets_the_target(tmp_path):
    """A quarter of the tokens with ratio > 2: every setting either misses the tail, adds > 5 % bias or clips
    > 10 %: fix the source."""
    from tests.report.verdict_runs import heavy_tailed_run

    rep = build_report(heavy_tailed_run(tmp_path / "bad", share=0.25), ReportOptions(replicates=20))
    assert all(c["severity"] in ("ok", "info") for c in map(vars, rep.checks))
    assert rep.recommendation.meets_target is False and rep.recommendation.kind == "fix_source"
    assert rep.recommendation.text.startswith("Reweighting cannot absorb this mismatch")


def test_prompts_ranked_by_mean_abs(noisy_run, noisy_report):
    tokens, a, b = _reference(noisy_run)
    prompt = noisy_run.sequences().set_index("seq_id").loc[tokens["seq_id"], "prompt_id"].to_numpy()
    frame = pd.DataFrame({"prompt": prompt, "abs": np.abs(a - b), "d": b - a})
    want = frame.groupby("prompt").agg(mean_abs=("abs", "mean"), kl=("d", "mean"), tokens=("abs", "size"))
    want = want.sort_values("mean_abs", ascending=False).head(10)
    got = noisy_report.reports[0].prompts
    assert [p["prompt_id"] for p in got] == list(want.index)
    np.testing.assert_allclose([p["mean_abs"] for p in got], want["mean_abs"], rtol=1e-10)
    np.testing.assert_allclose([p["kl"] for p in got], want["kl"], rtol=1e-9)
    assert [p["tokens"] for p in got] == list(want["tokens"])


def test_run_without_valid_tokens_reports_no_data_not_no_mismatch(tmp_path):
    """Zero valid tokens must read as 'no data' (NaN, no recommendation, gates fail), never as 'no mismatch'."""
    tokens = pd.DataFrame({"seq_id": [0, 0], "pos": [0, 1], "rollout_logprob": [-1.0, -2.0],
                           "train_logprob": [-1.5, -2.5], "mask": [False, False]})
    run = rcdiag.write_run(tmp_path / "masked", tokens, pd.DataFrame({"seq_id": [0, 1]}))
    result = make_report([run], tmp_path / "rep", ReportOptions(replicates=20, fail_if=("kl>1", "ess<0.5")))
    rep = result.reports[0]
    assert np.isnan(rep.metrics["kl"]) and np.isnan(rep.tails["abs_log_ratio_mean"])
    assert rep.recommendation.mode is None and "no valid tokens" in rep.recommendation.text
    assert result.failures == ["masked: kl = nan (kl>1)", "masked: ess = nan (ess<0.5)"]
    data = json.loads((result.out / "metrics.json").read_text())
    assert data["metrics"]["kl"] is None and data["counts"]["tokens"] == 0 and data["counts"]["token_rows"] == 2
