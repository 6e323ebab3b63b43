"""Drift across training: a one-sided CUSUM on per-step values standardised by their bootstrap intervals.

Why CUSUM: the failure to catch is a mismatch that starts to grow at some step and keeps growing (policy sharpening,
a weight-sync or kernel change) — a sustained shift, not one noisy step. A cumulative sum of standardised excesses
over a baseline flags both a jump and a slow rise, and the step where the sum last left zero estimates where the
change began (Page 1954; the textbook change-point estimate of a CUSUM alarm).

How, per metric x (default DRIFT_METRICS, where larger is worse):
1. baseline = the first `baseline_steps` steps (default BASELINE_STEPS, fewer for short runs, never all): mean μ0,
   between-step variance v0 (ddof=1; 0 for one step).
2. each later step s: σ_s² = max(se_s², v0) + v0 / n0 + (REL_FLOOR·μ0)², where se_s is the step's bootstrap standard
   error (so a step with few sequences counts for less, and a baseline that already wanders raises the bar);
   z_s = (x_s − μ0) / σ_s.
3. S_s = max(0, S_{s−1} + z_s − K); an alarm when S_s > H. The drift starts at the first step after the last
   S = 0 before the alarm whose own z_s > Z_START (the first step clearly above the baseline by itself; without
   one, a slow rise, the step after the last zero) — so noise steps just before a jump, which lift S a little
   above zero, are not taken for its start. It is reported only if the mean over [start, alarm] exceeds μ0 by at least MIN_RISE·|μ0|
   (a statistically clear but tiny change on a huge run is not worth failing CI for).
K = 0.5 and H = 5 are the usual CUSUM choices (false alarm on stationary normal steps ≈ once per ~900 steps).
A drift that begins inside the baseline steps cannot be seen; a run with fewer than 3 steps has no drift verdict.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DRIFT_METRICS = ("k3_kl", "chi2_token", "abs_log_ratio_mean")
"""Per-step metrics checked for drift (all: larger = more mismatch); each needs NAME_se in the trend frame."""
BASELINE_STEPS = 3
K = 0.5
H = 5.0
REL_FLOOR = 0.05
MIN_RISE = 0.2
MIN_STEPS = 3
Z_START = 2.0
ADVICE = ("Something changed at the step where the drift starts — a weight sync, a kernel or engine upgrade, a "
          "precision or sampling setting, or the policy sharpening: compare the steps before and after it (dashboard, "
          "Trends page) and re-check the IS threshold against the later steps.")
"""What to do about a detected drift (said once, after the drifting metrics)."""


@dataclass(frozen=True)
class Drift:
    """The drift verdict of one metric: `start_step` where it begins, `alarm_step` where CUSUM crossed H (None when
    not detected), the baseline mean and steps, `rise` = mean over [start, alarm] / baseline, and `text` in words."""

    metric: str
    detected: bool
    start_step: int | None
    alarm_step: int | None
    baseline: float
    baseline_steps: tuple[int, ...]
    rise: float
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "baseline_steps": list(self.baseline_steps)}


def _no_verdict(metric: str, why: str) -> Drift:
    return Drift(metric, False, None, None, math.nan, (), math.nan, f"No drift verdict for {metric}: {why}.")


def cusum(values: np.ndarray, se: np.ndarray,
          baseline_steps: int = BASELINE_STEPS) -> tuple[np.ndarray, np.ndarray, float, int]:
    """(S [n] the CUSUM path — 0 on baseline steps, z [n] the standardised excesses — 0 on baseline and NaN steps,
    μ0, n0) of `values` with standard errors `se` (float64 [n], steps in order; NaN values are skipped: they
    neither add nor reset)."""
    n0 = min(baseline_steps, max(1, values.size - 1))
    base = values[:n0][np.isfinite(values[:n0])]
    mu0 = float(base.mean()) if base.size else math.nan
    v0 = float(base.var(ddof=1)) if base.size > 1 else 0.0
    path = np.zeros(values.size)
    zs = np.zeros(values.size)
    total = 0.0
    for i in range(n0, values.size):
        if not np.isfinite(values[i]):
            path[i] = total
            continue
        step_se = se[i] if np.isfinite(se[i]) else 0.0
        sigma = math.sqrt(max(step_se ** 2, v0) + v0 / max(base.size, 1) + (REL_FLOOR * mu0) ** 2)
        z = (values[i] - mu0) / sigma if sigma > 0 else (math.inf if values[i] > mu0 else 0.0)
        total = max(0.0, total + z - K)
        path[i] = total
        zs[i] = z
    return path, zs, mu0, n0


def detect_drift(frame: Any, metric: str = "k3_kl", baseline_steps: int = BASELINE_STEPS) -> Drift:
    """The CUSUM drift verdict of `metric` in a trend frame (rcdiag.analysis.trend.trend); see the module doc."""
    steps = frame["step"].to_numpy(dtype=np.int64)
    if steps.size < MIN_STEPS:
        return _no_verdict(metric, f"{steps.size} step(s); drift needs at least {MIN_STEPS}")
    values = frame[metric].to_numpy(dtype=np.float64)
    se = frame[f"{metric}_se"].to_numpy(dtype=np.float64) if f"{metric}_se" in frame else np.zeros(steps.size)
    path, zs, mu0, n0 = cusum(values, se, baseline_steps)
    label = _steps_label(steps[:n0])
    if not math.isfinite(mu0):
        return _no_verdict(metric, f"the baseline steps {label} have no value")
    alarms = np.flatnonzero(path > H)
    for alarm in alarms:
        zeros = np.flatnonzero(path[n0:alarm] == 0)
        start = n0 + (int(zeros[-1]) + 1 if zeros.size else 0)
        clear = np.flatnonzero(zs[start:alarm + 1] > Z_START)
        start += int(clear[0]) if clear.size else 0
        window = values[start:alarm + 1]
        mean = float(np.nanmean(window))
        if mean - mu0 >= MIN_RISE * abs(mu0):
            rise = mean / mu0 if mu0 > 0 else math.inf
            text = (f"{metric} drifts up from step {int(steps[start])} (CUSUM alarm at step {int(steps[alarm])}): "
                    f"{mean:.4g} on average since, {_ratio(rise)} the baseline {mu0:.4g} of steps {label}.")
            return Drift(metric, True, int(steps[start]), int(steps[alarm]), mu0, tuple(int(s) for s in steps[:n0]),
                         rise, text)
    text = (f"No drift in {metric} over steps {int(steps[n0])}–{int(steps[-1])}: no sustained rise above its "
            f"baseline {mu0:.4g} (steps {label}) beyond the bootstrap noise (CUSUM K={K}, H={H}).")
    return Drift(metric, False, None, None, mu0, tuple(int(s) for s in steps[:n0]), math.nan, text)


def drifts(frame: Any, metrics: tuple[str, ...] = DRIFT_METRICS,
           baseline_steps: int = BASELINE_STEPS) -> dict[str, Drift]:
    """detect_drift for each metric present in the frame."""
    return {m: detect_drift(frame, m, baseline_steps) for m in metrics if m in frame}


def _ratio(rise: float) -> str:
    return "well above" if not math.isfinite(rise) else f"{rise:.2g}×"


def _steps_label(steps: np.ndarray) -> str:
    return f"{int(steps[0])}" if steps.size == 1 else f"{int(steps[0])}–{int(steps[-1])}"
