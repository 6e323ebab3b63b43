"""Health bands and the verdict on bands alone (no noise evidence): band edges, direction, checks before metrics,
--fail-on ordering."""
from __future__ import annotations

import math

import pytest

from rcdiag.analysis.verdict.health import (
    ALARM,
    BANDS,
    BY_METRIC,
    HEALTHY,
    UNKNOWN,
    WARNING,
    at_least,
    worst,
)
from rcdiag.analysis.verdict.judge import verdict


@pytest.mark.parametrize("metric,value,status", [
    ("chi2_token", 0.02, HEALTHY), ("chi2_token", 1.0, WARNING), ("chi2_token", 1.0001, ALARM),
    ("chi2_token", 5e12, ALARM), ("chi2_token", math.inf, ALARM),
    ("frac_outside_0.5_2", 0.001, HEALTHY), ("frac_outside_0.5_2", 0.019, ALARM),
    ("ess", 0.99, HEALTHY), ("ess", 0.3, WARNING), ("ess", 0.2999, ALARM),
    ("is_weight_mean", 0.5, WARNING), ("is_weight_mean", 2.01, ALARM),
    ("k3_kl", -0.2, ALARM), ("abs_log_ratio_max", 22.6, ALARM), ("kl", None, UNKNOWN),
])
def test_band_edges_and_direction(metric, value, status):
    assert BY_METRIC[metric].classify(value) == status


def test_every_band_says_where_it_comes_from():
    assert all(b.source for b in BANDS) and len({b.metric for b in BANDS}) == len(BANDS)
    assert "verl" in BY_METRIC["chi2_token"].describe() and "rcdiag" in BY_METRIC["abs_log_ratio_max"].source


def test_checks_come_first_and_set_the_floor():
    v = verdict({"kl": 1e-4}, [{"name": "ok_one", "severity": "ok", "message": ""},
                               {"name": "storage_precision", "severity": "warning", "message": "bf16"},
                               {"name": "temperature", "severity": "error", "message": "T differs"}])
    assert v.status == ALARM and v.first_check == "temperature" and v.cause.kind == "input_defect"
    assert not v.correct and v.headline() == ("ALARM: fix the failed input check temperature first: the two sides use "
                                         "different temperatures")
    assert v.reasons == ["check temperature: T differs", "warning: the log-probs were stored at a lower precision (input check "
                                                        "storage_precision)"]
    assert v.metric_status == {"kl": HEALTHY}


def test_metric_reasons_name_value_and_band():
    v = verdict({"chi2_token": 5.35e13, "kl": -0.04, "ess": 0.9999})
    assert v.status == ALARM and v.cause.kind == "bands"
    assert v.reasons[0].startswith("chi2_token = 5.35e+13 (alarm: outside value ≤ 1; verl warns")
    assert v.reasons[1].startswith("kl = -0.04 (warning: outside |value| ≤ 0.01")
    assert v.to_dict()["metric_status"]["ess"] == HEALTHY
    assert v.line().startswith("ALARM: the mismatch is outside the health bands — chi2_token")


def test_levels_order():
    assert worst([HEALTHY, UNKNOWN, WARNING]) == WARNING and worst([]) == HEALTHY
    assert at_least(ALARM, WARNING) and at_least(WARNING, WARNING) and not at_least(WARNING, ALARM)
    assert not at_least(HEALTHY, WARNING)
