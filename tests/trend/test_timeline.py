"""The timeline across training (rcdiag.analysis.training.drift): a step change told apart from a drift on per-step series
built by hand, robust to the heavy tail that hid a ×10⁹ jump from the old CUSUM (user review 3, §1)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rcdiag.analysis.training.drift import MIN_STEPS, best_change, hinge, spread, timeline


def frame(values, *, sigma=None, tail=None, k3=None, tokens=1000) -> pd.DataFrame:
    """A trend frame with the columns the timeline reads: mean |ℓ| (`values`), the noise scale (default: the same
    series, so the bulk moves with it), the outlier share and k3 (default: mean |ℓ|²)."""
    values = np.asarray(values, dtype=float)
    return pd.DataFrame({"step": np.arange(values.size) * 10, "tokens": tokens, "abs_log_ratio_mean": values,
                         "noise_sigma": values * 2 if sigma is None else sigma,
                         "noise_tail_share": np.zeros(values.size) if tail is None else tail,
                         "k3_kl": values**2 if k3 is None else k3})


def test_heavy_tailed_jump_is_a_step_change_not_no_drift():
    """The user review's run: steps 0–40 at mean |ℓ| 0.0035 and k3 4e-5, then 0.12 and 8e4 from step 50. The old
    CUSUM, scaled by each step's bootstrap error (inflated by the extreme tokens), said 'No drift'."""
    mean = [0.0035, 0.0036, 0.0034, 0.0035, 0.0035, 0.12, 0.11, 0.125]
    k3 = [4e-5, 4.2e-5, 3.9e-5, 4.1e-5, 4e-5, 8.2e4, 9.0, 0.43]
    found = timeline(frame(mean, k3=k3))
    assert found.change is not None and found.change.step == 50 and found.change.previous_step == 40
    assert found.drift is None
    assert "jumped ×34 at step 50" in found.text and "no drift" not in found.text.lower()
    assert found.change.numbers["k3_kl"][0] == pytest.approx(4e-5)


def test_tail_only_change_is_found_by_the_outlier_share():
    """Routing replay switched off at step 30: the bulk stays, 2 % of tokens become outliers."""
    mean = np.full(8, 0.01)
    tail = np.array([0, 0, 0, 0.02, 0.021, 0.019, 0.02, 0.02])
    found = timeline(frame(mean, sigma=np.full(8, 0.03), tail=tail))
    assert found.change is not None and found.change.series == "noise_tail_share" and found.change.step == 30


def test_slow_sustained_rise_is_a_drift_from_where_it_starts():
    """A rise of 15 % a step from step 4, each step alone within noise of the last, is a drift, not a change."""
    steps = np.arange(12)
    found = timeline(frame(np.where(steps < 4, 1.0, 1.15 ** (steps - 3))))
    assert found.change is None and found.drift is not None and found.drift.start_step == 40, found.text
    assert found.drift.rise == pytest.approx(1.15 ** 8, rel=0.01)


def test_noise_just_before_a_jump_is_not_its_start():
    """Two steps 10 % above the baseline before a ×3 jump: the change is at the jump."""
    found = timeline(frame([1.0, 1.02, 0.98, 1.0, 1.1, 1.1, 3.0, 3.2]))
    assert found.change is not None and found.change.step == 60


@pytest.mark.parametrize("seed", range(5))
def test_flat_noisy_series_is_steady(seed):
    """±10 % step-to-step noise and one outlier step (×3, not sustained) is no change and no drift."""
    rng = np.random.default_rng(seed)
    values = 0.01 * np.exp(rng.normal(0, 0.1, 20))
    values[7] *= 3
    found = timeline(frame(values))
    assert found.change is None and found.drift is None and found.text.startswith("Steady"), found.text


def test_too_few_steps_says_so():
    found = timeline(frame([1.0, 9.0]))
    assert not found.judged and found.change is None and f"at least {MIN_STEPS}" in found.text


def test_steps_without_tokens_are_not_judged():
    values = frame([0.01, 0.01, math.nan, 0.01, 0.05, 0.05, 0.05], tokens=[10, 10, 0, 10, 10, 10, 10])
    found = timeline(values)
    assert 20 not in found.steps and found.change is not None and found.change.step == 40


def test_helpers_on_known_series():
    """The building blocks on series with known answers: the spread's floor, the best split, the hinge."""
    flat = np.zeros(10)
    assert spread(flat) == pytest.approx(math.log(1.15))
    y = np.log(np.r_[np.full(5, 0.01), np.full(5, 0.1)])
    k, delta, z = best_change(y, 2.0)
    assert k == 5 and delta == pytest.approx(math.log(10)) and z > 5
    ramp = np.r_[np.zeros(4), 0.2 * np.arange(1, 9)]
    s0, beta, _ = hinge(ramp)
    assert s0 == 3 and beta == pytest.approx(0.2)
