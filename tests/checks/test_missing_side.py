"""A run that lacks a whole side (an import without trainer log-probs): the placeholder check's fix names the
rcdiag command that computes it, not vLLM's SamplingParams (the wrong side)."""
from __future__ import annotations

import numpy as np

import rcdiag
from rcdiag.checks.verdicts import run_checks
from tests.fixtures.runs import build_run, defect_frames


def _placeholders(run):
    return next(f for f in run_checks(run) if f.name == "placeholders")


def test_no_trainer_logprobs_fix_names_rcdiag_score(tmp_path):
    tokens, sequences = defect_frames("clean")
    tokens["train_logprob"] = np.nan
    run = rcdiag.write_run(tmp_path / "imported", tokens, sequences, manifest={"source": {"kind": "verl"}})
    finding = _placeholders(run)
    assert finding.severity == "error"
    assert "rcdiag score --rescore-only RUN" in finding.fix and "--rescore-both RUN" in finding.fix
    assert "SamplingParams" not in finding.fix


def test_both_sides_missing_fix_is_rescore_both(tmp_path):
    tokens, sequences = defect_frames("clean")
    tokens["train_logprob"] = np.nan
    tokens["rollout_logprob"] = np.nan
    run = rcdiag.write_run(tmp_path / "retok", tokens, sequences)
    assert "rcdiag score --rescore-both RUN --model MODEL" in _placeholders(run).fix


def test_scattered_placeholders_keep_the_engine_side_fix(tmp_path):
    run = build_run(tmp_path / "nan", "nan_placeholder")
    assert "SamplingParams(logprobs=0)" in _placeholders(run).fix
