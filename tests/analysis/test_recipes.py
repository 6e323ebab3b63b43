"""The recipes of docs/recipes.md, followed literally: each adds a toy thing in the one place the recipe names and
checks that it arrives everywhere it should (issue #33: "adding a metric or an IS mode is one obvious place")."""
from __future__ import annotations

import math

import numpy as np
import pytest

import rcdiag
from rcdiag.analysis import defaults
from rcdiag.analysis.metrics import metric_table
from rcdiag.analysis.metrics.bootstrap import SequenceSums, bootstrap, point_estimates
from rcdiag.analysis.metrics.metric_table import Metric
from tests.analysis import reference as ref
from tests.analysis.helpers import assert_close, make_tokens

TOY_METRIC = Metric("mean_sq_log_ratio", "token", lambda s, c: s.sum_sq, interval=True)
"""docs/recipes.md, "Add a metric": E[ℓ²] over valid tokens, from the table's Σℓ² column, with an interval."""


def _valid(tokens):
    return tokens[tokens["mask"]] if "mask" in tokens else tokens


def test_recipe_add_a_metric_is_one_table_row(monkeypatch):
    """One row in metric_table.METRICS: compute_metrics returns it, equal to a float64 reference, the bootstrap
    gives it a point estimate (the same number) and an interval — nothing else was edited. Fails if a consumer
    keeps its own copy of the metric list (review 3 found two formula sites and two name lists)."""
    monkeypatch.setattr(metric_table, "METRICS", (*metric_table.METRICS, TOY_METRIC))
    tokens = make_tokens(5, n_seq=40, max_len=30, scale=0.3)
    got = rcdiag.compute_metrics(tokens)
    seqs = ref.sequences(tokens)
    ells = [e for s in seqs for e in s.ells]
    want = math.fsum(e * e for e in ells) / len(ells)
    assert got["mean_sq_log_ratio"] == pytest.approx(want, rel=1e-12)
    assert_close(got, ref.metrics(seqs, "canonical"), what="[the table's other rows unchanged]")

    sums = SequenceSums()
    valid = _valid(tokens)
    sums.update(valid["seq_id"].to_numpy(np.int64), valid["train_logprob"].to_numpy(np.float64),
                valid["rollout_logprob"].to_numpy(np.float64))
    _, table = sums.table()
    assert point_estimates(table)["mean_sq_log_ratio"] == pytest.approx(want, rel=1e-12)
    interval = bootstrap(table, replicates=200)["mean_sq_log_ratio"]
    assert interval["low"] < want < interval["high"]


def test_recipe_add_an_is_mode_is_one_table_row(monkeypatch):
    """One row in defaults.IS_MODE_TABLE: a token mask whose lower bound is 1/C by default (IcePop-style two-sided
    masking). simulate and sweep know it by name, its numbers equal the float64 reference of token_mask on [1/C, C]
    and follow C in a sweep."""
    monkeypatch.setitem(defaults.IS_MODE_TABLE, "token_band_mask", ("token", "mask", "reciprocal"))
    tokens = make_tokens(9, n_seq=50, max_len=25, scale=0.8)
    got = rcdiag.simulate(tokens, "token_band_mask", 2.0)
    want = ref.is_metrics(ref.sequences(tokens), "canonical", "token_mask", 2.0, 0.5)
    assert_close(got, want, what="[token_band_mask at C = 2]")
    table = rcdiag.sweep(tokens, modes=("token_band_mask",), thresholds=(1.5, 3.0))
    for row in table.to_dict("records"):
        c = row["threshold"]
        assert row["mode"] == "token_band_mask"
        assert_close(row, ref.is_metrics(ref.sequences(tokens), "canonical", "token_mask", c, 1 / c),
                     what=f"[token_band_mask at C = {c}]")
