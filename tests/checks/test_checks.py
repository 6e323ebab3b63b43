"""Each alignment/convention check fires on a run built to contain its defect, and stays silent on a clean run."""
from __future__ import annotations

import numpy as np
import pytest

import rcdiag
from rcdiag.checks.evidence import CheckAccumulator, Finding, accumulate, sequence_lengths
from rcdiag.checks.verdicts import findings, run_checks
from tests.fixtures.runs import DEFECTS, build_run, defect_frames, defect_manifest

EXPECTED = {
    "shift": {"alignment_shift": "error"},
    "zero_placeholder": {"placeholders": "error"},
    "nan_placeholder": {"placeholders": "error"},
    "neg_inf_placeholder": {"placeholders": "error"},
    "temperature": {"temperature": "error", "manifest_flags": "error"},
    "top_p": {"truncation_offset": "warning"},
    "bf16": {"storage_precision": "warning"},
    "count_mismatch": {"count_mismatch": "error"},
}
"""Defect → the checks that must fire on it (and no others may go above 'info')."""


def _by_name(found: list[Finding]) -> dict[str, Finding]:
    return {f.name: f for f in found}


@pytest.mark.parametrize("defect", DEFECTS)
def test_each_check_fires_only_on_its_defect(synthetic_runs, defect):
    """Guards against checks that cannot fail (always ok) and checks that cry wolf on clean or unrelated data."""
    found = _by_name(run_checks(synthetic_runs[defect]))
    fired = {name: f.severity for name, f in found.items() if f.severity in ("warning", "error")}
    assert fired == EXPECTED.get(defect, {}), {n: found[n].message for n in fired}


def test_clean_run_every_check_ok(clean_run):
    found = run_checks(clean_run, thresholds=(1.1, 1.25, 2.0))
    assert {f.severity for f in found} == {"ok"}, [f.message for f in found if f.severity != "ok"]
    assert len(found) == 8


def _clean_values(defect: str, **overrides):
    tokens, _ = defect_frames(defect, **overrides)
    a = tokens["train_logprob"].to_numpy(np.float64)
    b = tokens["rollout_logprob"].to_numpy(np.float64)
    keep = tokens["mask"].to_numpy() & (a < 0) & (b < 0)
    return a[keep], b[keep]


def test_temperature_slope_matches_float64_least_squares(synthetic_runs):
    """Sampling at T=0.7 with training log-probs at T=1 fires; the least-squares line kept as evidence equals
    polyfit's, and the decisive statistic says the engine is sharper (q > 0)."""
    f = _by_name(run_checks(synthetic_runs["temperature"]))["temperature"]
    a, b = _clean_values("temperature")
    slope, intercept = np.polyfit(a, b, 1)
    assert f.severity == "error"
    assert f.evidence["slope"] == pytest.approx(slope, rel=1e-9)
    assert f.evidence["intercept"] == pytest.approx(intercept, rel=1e-9, abs=1e-12)
    assert f.evidence["median_q"] > 0.2 and f.evidence["surprisal_exponent"] > 1.2
    assert "processed_logprobs" in f.fix and "temperature" in f.fix


def test_truncation_offset_evidence_matches_reference(synthetic_runs):
    """The mean offset −log S is over tokens with b > a and over the one-token supports (b exactly 0, S = exp(a)),
    which an estimate over b < 0 alone left out; the signs are judged on b < 0 tokens only."""
    f = _by_name(run_checks(synthetic_runs["top_p"]))["truncation_offset"]
    a, b = _clean_values("top_p")
    d = b - a
    tokens = synthetic_runs["top_p"].tokens()
    a_all = tokens["train_logprob"].to_numpy(np.float64)
    b_all = tokens["rollout_logprob"].to_numpy(np.float64)
    one = tokens["mask"].to_numpy() & (b_all == 0) & (a_all < -1e-6)
    assert one.any() and f.evidence["one_token_supports"] == one.sum()
    want = (d[d > 1e-6].sum() - a_all[one].sum()) / ((d > 1e-6).sum() + one.sum())
    assert f.evidence["mean_offset"] == pytest.approx(want, rel=1e-9)
    assert f.evidence["share_b_above_a"] == pytest.approx((d > 1e-6).mean(), rel=1e-12)
    assert 0.8 < f.evidence["implied_kept_mass"] < 1.0
    assert "top_p=1.0" in f.fix


def test_top_k_truncation_fires(tmp_path):
    run = build_run(tmp_path / "topk", "clean", top_k=5)
    assert _by_name(run_checks(run))["truncation_offset"].severity == "warning"


def test_large_genuine_noise_is_not_a_temperature_or_truncation(tmp_path):
    """An MoE-like mismatch (noise 0.3 on logits) is symmetric: neither convention check may fire."""
    found = _by_name(run_checks(build_run(tmp_path / "noisy", "clean", noise=0.3)))
    assert found["temperature"].severity == "ok"
    assert found["truncation_offset"].severity == "ok"
    assert found["alignment_shift"].severity == "ok"


def test_shift_in_the_other_direction(tmp_path):
    tokens, sequences = defect_frames("clean")
    prev = tokens.groupby("seq_id")["train_logprob"].shift(1)
    tokens["train_logprob"] = prev.fillna(tokens["train_logprob"]).astype(np.float32)
    run = rcdiag.write_run(tmp_path / "behind", tokens, sequences, manifest=defect_manifest("clean"))
    f = _by_name(run_checks(run))["alignment_shift"]
    assert f.severity == "error" and f.evidence["best_shift"] == -1
    means = f.evidence["mean_abs_diff"]
    assert means["-1"] < 0.5 * means["0"]


def test_placeholder_location_and_counts(synthetic_runs):
    """NaN/-inf on valid positions are reported with file, row, seq and pos — not raised (metrics would raise)."""
    for defect, kind in (("nan_placeholder", "nan"), ("neg_inf_placeholder", "neg_inf"), ("zero_placeholder", "zero")):
        run = synthetic_runs[defect]
        f = _by_name(run_checks(run))["placeholders"]
        tokens = run.tokens()
        b = tokens["rollout_logprob"].to_numpy()
        hit = {"nan": np.isnan(b), "neg_inf": b == -np.inf, "zero": b == 0.0}[kind] & tokens["mask"].to_numpy()
        assert f.evidence["counts"]["rollout_logprob"] == {kind: int(hit.sum())}
        first = f.evidence["first"]["rollout_logprob"][kind]
        row = int(np.flatnonzero(hit)[0])
        assert (first["seq_id"], first["pos"]) == (int(tokens.seq_id[row]), int(tokens.pos[row]))
        assert first["file"].startswith("tokens/part-")
        assert f.evidence["at_pos0"] == int(hit.sum())


def test_count_mismatch_evidence(synthetic_runs):
    f = _by_name(run_checks(synthetic_runs["count_mismatch"]))["count_mismatch"]
    assert f.evidence["mismatched"] == 12 and f.evidence["sequences"] == 60
    assert f.evidence["first"]["seq_id"] == 0
    assert f.evidence["first"]["response_len"] == f.evidence["first"]["token_rows"] + 1


def test_bf16_noise_floor_and_threshold_floor(tmp_path):
    """Large-magnitude bf16 log-probs (≈ −40) have a rounding step > log 1.1: threshold 1.1 is below the floor."""
    run = build_run(tmp_path / "bf16wide", "bf16", logit_scale=25.0)
    found = _by_name(run_checks(run, thresholds=(1.1, 2.0, 10.0)))
    floor = found["storage_precision"].evidence["noise_floor"]
    assert found["storage_precision"].evidence["grids"] == {"rollout_logprob": "bfloat16", "train_logprob": "bfloat16"}
    tokens = run.tokens()
    b = tokens["rollout_logprob"].to_numpy(np.float64)
    b = b[tokens["mask"].to_numpy() & (b < 0)]
    half_ulp = np.ldexp(1.0, np.frexp(b)[1] - 1 - 7) / 2
    assert floor["max_bound"] == pytest.approx(2 * half_ulp.max())
    assert found["threshold_floor"].severity == "warning"
    assert 1.1 in found["threshold_floor"].evidence["thresholds_below"]
    assert 10.0 not in found["threshold_floor"].evidence["thresholds_below"]


def test_fp16_storage_grid(tmp_path):
    tokens, sequences = defect_frames("clean")
    for column in ("rollout_logprob", "train_logprob"):
        tokens[column] = tokens[column].to_numpy().astype(np.float16).astype(np.float32)
    run = rcdiag.write_run(tmp_path / "fp16", tokens, sequences)
    f = _by_name(run_checks(run))["storage_precision"]
    assert f.severity == "warning" and set(f.evidence["grids"].values()) == {"float16"}


def test_manifest_flags(tmp_path):
    run = build_run(tmp_path / "raw", "clean", manifest={
        "engine": {"logprobs_mode": "raw_logprobs", "sampling": {"temperature": 1.0}},
        "source": {"kind": "imported:trl", "retokenized": True}})
    f = _by_name(run_checks(run))["manifest_flags"]
    assert f.severity == "error"
    assert "raw" in f.message and "re-tokenized" in f.message and "processed_logprobs" in f.fix


def test_batch_split_does_not_change_findings(synthetic_runs):
    """Evidence is a mergeable sum: tiny batches (sequences split across batches) give the same verdicts."""
    run = synthetic_runs["temperature"]
    whole = accumulate(run)
    small = accumulate(run, batch_size=37)
    merged = CheckAccumulator()
    for file, batch in run.iter_batches(("seq_id", "pos", "rollout_logprob", "train_logprob", "mask"), 101):
        merged.merge(_one(batch, file))
    for acc in (small, merged):
        np.testing.assert_allclose(acc.fit, whole.fit, rtol=1e-12)
        assert np.array_equal(acc.per_sequence()[1], whole.per_sequence()[1])
        got = findings(acc, sequence_lengths(run), run.manifest)
        assert [(f.name, f.severity) for f in got] == [(f.name, f.severity) for f in run_checks(run)]


def _one(batch, file):
    acc = CheckAccumulator()
    acc.update(batch, file)
    return acc


def test_empty_run_reports_info_not_crash(tmp_path):
    import pandas as pd

    tokens = pd.DataFrame({"seq_id": np.array([], np.int64), "pos": np.array([], np.int32),
                           "rollout_logprob": np.array([], np.float32)})
    run = rcdiag.write_run(tmp_path / "empty", tokens, pd.DataFrame({"seq_id": [0, 1]}))
    found = _by_name(run_checks(run))
    assert found["alignment_shift"].severity == "info"
    assert found["count_mismatch"].severity == "ok"


def test_finding_rejects_unknown_severity():
    with pytest.raises(ValueError, match="severity"):
        Finding("x", "fatal", "m")
    assert Finding("x", "ok", "m", {"v": 1.5}, "fix").to_dict() == {
        "name": "x", "severity": "ok", "message": "m", "evidence": {"v": 1.5}, "fix": "fix"}


def test_identical_stacks_and_certain_tokens_stay_silent(tmp_path):
    """a == b everywhere, with some tokens certain on both sides (exact 0.0 twice): nothing may fire."""
    tokens, sequences = defect_frames("clean")
    tokens["train_logprob"] = tokens["rollout_logprob"]
    certain = tokens.index % 11 == 0
    tokens.loc[certain, ["train_logprob", "rollout_logprob"]] = np.float32(0.0)
    run = rcdiag.write_run(tmp_path / "same", tokens, sequences, manifest=defect_manifest("clean"))
    found = run_checks(run, thresholds=(1.1, 2.0))
    assert {f.severity for f in found} <= {"ok", "info"}, [f.message for f in found if f.severity != "ok"]


def test_scan_is_batch_invariant(synthetic_runs):
    """Tails, strata and per-sequence sums do not depend on the record-batch size (sequences cut by batches)."""
    from rcdiag.report.scan import scan_run

    run = synthetic_runs["top_p"]
    whole, small = scan_run(run), scan_run(run, batch_size=53)
    for name, value in whole.tails.finish().items():
        assert small.tails.finish()[name] == pytest.approx(value, rel=1e-12, nan_ok=True), name
    for stratum, rows in whole.strata.finish().items():
        other = small.strata.finish()[stratum]
        assert [r["bucket"] for r in rows] == [r["bucket"] for r in other]
        for r, o in zip(rows, other, strict=True):
            assert r["tokens"] == o["tokens"] and r["max_abs"] == o["max_abs"]
            assert r["mean_abs"] == pytest.approx(o["mean_abs"], rel=1e-12)
    np.testing.assert_allclose(small.sums.table()[1], whole.sums.table()[1], rtol=1e-12, atol=1e-15)
    assert whole.tails.worst_tokens() == small.tails.worst_tokens()
    assert np.array_equal(whole.tails.density, small.tails.density)
