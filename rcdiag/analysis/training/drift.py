"""Changes across training: a step change (the mismatch jumps at one step and stays) told apart from a slow drift,
with statistics a heavy tail cannot hide.

Why not a mean's bootstrap error: a weight-sync bug shows up as a few extreme tokens per step, which inflate a step's
mean and its bootstrap interval alike, so a mean standardised by its own error never clears a threshold (k3 from
4e-5 to 8e4 read as "no drift"). Here every series is taken on a log scale, per step, from statistics the tail
cannot dominate, and compared across steps:
- `noise_sigma`, the step's noise scale (a median of |ℓ|/(1 − p): rcdiag.analysis.metrics.floor), the bulk;
- `abs_log_ratio_mean`, the step's mean |ℓ|, the number users read (its log tames a heavy tail);
- `noise_tail_share`, the share of the step's tokens beyond 10× its own noise scale, the tail (floored at
  TAIL_FLOOR so that empty steps compare).

**Step change** at step k: the median level of steps k… exceeds the median of the steps before by at least
MIN_JUMP[series]×, by Z_CHANGE times the series' step-to-step spread (a robust MAD of its differences, at least
SPREAD_FLOOR), the one step from k − 1 to k makes at least ABRUPT of the jump and both segments are plateaus
(neither half of a segment moves by more than half the jump: a jump between two levels, not a ramp). The split with the largest such z wins (a two-segment median test; Page 1954's CUSUM asks
the same question of means).
**Drift** (no step change): the best hinge y = c + β·max(0, s − s0) (flat, then a log-linear rise from s0) with a
rise β·(last − s0) ≥ log MIN_RISE and β at least Z_DRIFT standard errors from 0 (residuals floored at
SPREAD_FLOOR).
A run with fewer than MIN_STEPS judged steps has no verdict across training (said in words, never "no drift").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SERIES = (("abs_log_ratio_mean", "mean |ℓ|"), ("noise_sigma", "noise scale"), ("noise_tail_share", "outlier share"))
"""(trend column, name in words) of the per-step series, the headline one first."""
MIN_JUMP = {"abs_log_ratio_mean": 2.0, "noise_sigma": 2.0, "noise_tail_share": 10.0}
"""The smallest factor a step change must move each series by (rcdiag's choice: ×2 in the bulk is twice the
numerical noise; the outlier share moves by steps of 1/tokens, so it needs ×10)."""
TAIL_FLOOR = 1e-4
"""The outlier share's floor on the log scale (a step with none compares as 1e-4)."""
LEVEL_FLOOR = 1e-9
Z_CHANGE = 5.0
ABRUPT = 0.5
Z_DRIFT = 4.0
MIN_RISE = 1.5
SPREAD_FLOOR = math.log(1.15)
"""Step-to-step variation below ±15 % is sampling noise, whatever a flat series' MAD says."""
MIN_STEPS = 3
ADVICE = ("Compare the steps before and after it (dashboard, Trends page): a weight sync, an engine or kernel "
          "upgrade, a precision or sampling setting, or the policy sharpening.")
"""What to do about a drift (said once, after the drift)."""
CHANGE_ADVICE = ("Check what changed at that step before correcting anything: the weight sync to the engine (did "
                 "it load the new weights?), the policy version the engine sampled with, an engine/kernel or "
                 "precision change, the tokenizer and the alignment.")


@dataclass(frozen=True)
class StepChange:
    """The mismatch jumped at `step` (the first step of the new level; `previous_step` the last before it) by
    `ratio` in `series` (z: the jump in units of its step-to-step spread); `numbers` {column: (before, after)}
    medians of the headline columns over the two segments."""

    series: str
    step: int
    previous_step: int
    ratio: float
    z: float
    numbers: dict[str, tuple[float, float]]
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "numbers": {k: list(v) for k, v in self.numbers.items()}}


@dataclass(frozen=True)
class Drift:
    """A slow rise in `metric` (a trend column) from `start_step`: `rise` the factor from the flat level before it
    (`baseline`, over `baseline_steps`) to the last step's; `z` the fitted slope's significance."""

    metric: str
    detected: bool
    start_step: int | None
    baseline: float
    baseline_steps: tuple[int, ...]
    rise: float
    z: float
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "baseline_steps": list(self.baseline_steps)}


@dataclass(frozen=True)
class Timeline:
    """The run's verdict across training: at most one step change and, without one, at most one drift."""

    steps: tuple[int, ...]
    change: StepChange | None
    drift: Drift | None
    text: str

    @property
    def judged(self) -> bool:
        return len(self.steps) >= MIN_STEPS

    def to_dict(self) -> dict[str, Any]:
        return {"steps": len(self.steps), "change": self.change and self.change.to_dict(),
                "drift": self.drift and self.drift.to_dict(), "text": self.text}


def _levels(frame: Any, column: str) -> np.ndarray:
    values = frame[column].to_numpy(dtype=np.float64) if column in frame else np.full(len(frame), np.nan)
    floor = TAIL_FLOOR if column == "noise_tail_share" else LEVEL_FLOOR
    return np.where(np.isfinite(values), np.log(np.maximum(values, floor)), np.nan)


def spread(y: np.ndarray) -> float:
    """The series' step-to-step spread: 1.4826·MAD of its first differences / √2, at least SPREAD_FLOOR."""
    d = np.diff(y)
    if d.size < 2:
        return SPREAD_FLOOR
    mad = 1.4826 * float(np.median(np.abs(d - np.median(d))))
    return max(mad / math.sqrt(2), SPREAD_FLOOR)


def best_change(y: np.ndarray, min_jump: float) -> tuple[int, float, float] | None:
    """(k, Δ, z) of the best upward step change of `y` (first index of the new level), or None (see the module
    doc); `y` has no NaN."""
    n = y.size
    s = spread(y)
    best = None
    for k in range(1, n):
        before, after = y[:k], y[k:]
        base = float(np.median(before))
        delta = float(np.median(after)) - base
        if delta < math.log(min_jump):
            continue
        z = delta / (s * math.sqrt(1 / before.size + 1 / after.size))
        abrupt = y[k] - y[k - 1] >= ABRUPT * delta
        if z >= Z_CHANGE and abrupt and _flat(before, delta) and _flat(after, delta) \
                and (best is None or z > best[2]):
            best = (k, delta, z)
    return best


def _flat(segment: np.ndarray, delta: float) -> bool:
    """Whether a segment is a plateau: its second half's median is within half the jump of its first half's."""
    half = segment.size // 2
    return segment.size < 4 or abs(float(np.median(segment[half:]) - np.median(segment[:half]))) <= 0.5 * delta


def hinge(y: np.ndarray) -> tuple[int, float, float] | None:
    """(s0, β, z) of the best flat-then-rising fit y = c + β·max(0, i − s0) over indices i, or None."""
    n = y.size
    i = np.arange(n, dtype=np.float64)
    best = None
    for s0 in range(0, n - 2):
        x = np.maximum(0.0, i - s0)
        xc = x - x.mean()
        sxx = float((xc * xc).sum())
        if sxx <= 0:
            continue
        beta = float((xc * (y - y.mean())).sum() / sxx)
        resid = y - y.mean() - beta * xc
        sse = float((resid * resid).sum())
        sd = max(math.sqrt(sse / max(n - 2, 1)), SPREAD_FLOOR)
        z = beta / (sd / math.sqrt(sxx))
        if best is None or sse < best[3]:
            best = (s0, beta, z, sse)
    return None if best is None else best[:3]


def _median(frame: Any, column: str, rows: np.ndarray) -> float:
    if column not in frame:
        return math.nan
    values = frame[column].to_numpy(dtype=np.float64)[rows]
    values = values[np.isfinite(values)]
    return float(np.median(values)) if values.size else math.nan


def _span(steps: np.ndarray) -> str:
    return f"step {int(steps[0])}" if steps.size == 1 else f"steps {int(steps[0])}–{int(steps[-1])}"


def _change(frame: Any, steps: np.ndarray, rows: np.ndarray) -> StepChange | None:
    found = []
    for column, _ in SERIES:
        y = _levels(frame, column)[rows]
        ok = np.isfinite(y)
        if ok.sum() < MIN_STEPS:
            continue
        hit = best_change(y[ok], MIN_JUMP[column])
        if hit is not None:
            k, delta, z = hit
            found.append((z, column, np.flatnonzero(ok)[k], delta))
    if not found:
        return None
    z, column, k, delta = max(found)
    before, after = rows[:k], rows[k:]
    numbers = {c: (_median(frame, c, before), _median(frame, c, after))
               for c in ("abs_log_ratio_mean", "k3_kl", "noise_sigma", "noise_tail_share", "abs_log_ratio_max")}
    m0, m1 = numbers["abs_log_ratio_mean"]
    k0, k1 = numbers["k3_kl"]
    ratio = math.exp(delta)
    name = dict(SERIES)[column]
    text = (f"the mismatch jumped ×{_factor(m1 / m0 if m0 > 0 else ratio)} at step {int(steps[k])}: mean |ℓ| "
            f"{m0:.3g} → {m1:.3g}, k3 {k0:.3g} → {k1:.3g} (medians of {_span(steps[:k])} → {_span(steps[k:])}; "
            f"{name} ×{_factor(ratio)}, {z:.0f}× its step-to-step spread)")
    return StepChange(column, int(steps[k]), int(steps[k - 1]), ratio, z, numbers, text)


def _drift(frame: Any, steps: np.ndarray, rows: np.ndarray) -> Drift | None:
    column = SERIES[0][0]
    y = _levels(frame, column)[rows]
    ok = np.isfinite(y)
    if ok.sum() < MIN_STEPS:
        return None
    y, where = y[ok], steps[ok]
    fit = hinge(y)
    if fit is None:
        return None
    s0, beta, z = fit
    rise = math.exp(beta * (y.size - 1 - s0))
    if beta <= 0 or z < Z_DRIFT or rise < MIN_RISE:
        return None
    base_rows = np.arange(max(s0, 1))
    baseline = float(np.exp(np.median(y[base_rows])))
    start = int(where[s0 + 1]) if s0 + 1 < where.size else int(where[-1])
    last = float(np.exp(y[-1]))
    text = (f"the mismatch drifts up from step {start}: mean |ℓ| ×{_factor(last / baseline)} from {baseline:.3g} "
            f"({_span(where[base_rows])}) to {last:.3g} at step {int(where[-1])} (a steady log-linear rise, "
            f"{z:.0f} standard errors from flat)")
    return Drift(column, True, start, baseline, tuple(int(s) for s in where[base_rows]), last / baseline, z, text)


def timeline(frame: Any) -> Timeline:
    """The across-training verdict of a trend frame (rcdiag.analysis.training.trend.trend: one row per step, in order)."""
    steps = frame["step"].to_numpy(dtype=np.int64) if frame is not None and len(frame) else np.zeros(0, np.int64)
    tokens = frame["tokens"].to_numpy(dtype=np.float64) if steps.size and "tokens" in frame else np.zeros(0)
    rows = np.flatnonzero(tokens > 0) if tokens.size else np.zeros(0, np.int64)
    judged = tuple(int(s) for s in steps[rows])
    if rows.size < MIN_STEPS:
        return Timeline(judged, None, None, f"{rows.size} step(s) with tokens: at least {MIN_STEPS} are needed to "
                                            "judge changes across training.")
    change = _change(frame, steps[rows], rows)
    drift = None if change is not None else _drift(frame, steps[rows], rows)
    if change is not None:
        text = change.text[0].upper() + change.text[1:] + "."
    elif drift is not None:
        text = drift.text[0].upper() + drift.text[1:] + "."
    else:
        text = (f"Steady across training: no step change (×{MIN_JUMP['abs_log_ratio_mean']:g} or more) and no drift "
                f"in mean |ℓ|, the noise scale or the outlier share over {_span(steps[rows])}.")
    return Timeline(judged, change, drift, text)


def _factor(x: float) -> str:
    if not math.isfinite(x):
        return "∞"
    return f"{x:.2g}" if x < 100 else f"{x:,.0f}" if x < 1e6 else f"{x:.1e}"
