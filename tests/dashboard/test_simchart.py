"""The simulator's sweep chart (app.simchart): one spec per curve, the setting in its datasets, values from rcdiag."""
from __future__ import annotations

import json

import pytest

import rcdiag
from app import data, simchart
from rcdiag.analysis.correction.modes import MODES


def _spec_json(spec: dict) -> str:
    """What the browser compares to decide between re-creating the Vega view and swapping its datasets."""
    return json.dumps({k: v for k, v in spec.items() if k != "datasets"}, sort_keys=True)


def _chart(run, mode: str, lower: float | None, convention: str, metric: str, threshold: float,
           recommended: tuple[str, float] | None = None) -> dict:
    ref = data.open_ref(run.path)
    spec = simchart.chart(*ref.key, tuple(MODES), mode, lower, convention, metric, recommended)
    return simchart.place(spec, threshold, 0.5)


def test_the_spec_does_not_change_with_mode_convention_lower_or_threshold(noisy_run):
    """The bug it guards: with the mode's name in a stroke test, the threshold as the hover selection's initial
    value and the read-out's title, every control changed the spec, and the browser compiled and laid out the
    whole chart again (60-80 ms of its main thread per control). Only the curve may change it."""
    first = _chart(noisy_run, "token_truncate", None, "canonical", "ess", 2.0, ("token_mask", 2.0))
    other = _chart(noisy_run, "token_mask", 0.8, "verl", "ess", 1.5, ("token_mask", 2.0))
    assert _spec_json(first) == _spec_json(other)
    assert not first["datasets"]["mine"].equals(other["datasets"]["mine"])
    assert _spec_json(_chart(noisy_run, "token_mask", 0.8, "verl", "clipped_frac", 1.5)) != _spec_json(other)


@pytest.mark.parametrize("mode,lower,convention", [("token_mask", 0.8, "verl"), ("sequence_truncate", None, "swift")])
def test_the_datasets_hold_rcdiag_values_of_the_setting(noisy_run, mode, lower, convention):
    """The curve and read-out rows of the chosen setting are rcdiag.simulate's values; the curves dataset marks the
    chosen mode (drawn solid), the diamond sits at the slider's threshold, the recommended point is that mode's."""
    spec = _chart(noisy_run, mode, lower, convention, "ess", 1.5, ("token_mask", 2.0))
    sets = spec["datasets"]
    expected = rcdiag.simulate(noisy_run, mode, threshold=1.5, lower=lower, convention=convention)
    mine = sets["mine"].set_index("threshold")
    assert mine.loc[1.5, "ess"] == pytest.approx(float(expected["ess"]), rel=1e-12)
    assert set(mine["mode"]) == {mode}
    panel = sets["panel"][sets["panel"]["threshold"] == 1.5].set_index("metric")
    assert panel.loc["clipped_frac", "value"] == pytest.approx(float(expected["clipped_frac"]), rel=1e-12)
    raw = rcdiag.simulate(noisy_run, mode, threshold=data.UNCORRECTED, lower=lower, convention=convention)
    assert panel.loc["is_weight_mean", "base"] == pytest.approx(float(raw["is_weight_mean"]), rel=1e-12)
    curves = sets["curves"]
    assert set(curves["mode"]) == set(MODES)
    assert set(curves.loc[curves["chosen"], "mode"]) == {mode}
    assert sets[simchart.CURRENT].to_dict("records") == [{"threshold": 1.5, "ess": 0.5}]
    ring = sets["recommended"]
    assert ring["threshold"].tolist() == [2.0] and ring["label"].tolist() == ["recommended: token_mask at C = 2"]
    canonical = rcdiag.simulate(noisy_run, "token_mask", threshold=2.0, convention=convention)
    assert ring["ess"].iloc[0] == pytest.approx(float(canonical["ess"]), rel=1e-12)


def test_no_recommendation_no_ring_layer(noisy_run):
    """Without a recommended setting there is no ring layer (an empty one made Vega warn of an infinite extent)."""
    spec = _chart(noisy_run, "token_truncate", None, "canonical", "ess", 2.0, None)
    assert "recommended" not in spec["datasets"]
    assert all(layer["data"]["name"] != "recommended" for layer in spec["hconcat"][0]["layer"])
