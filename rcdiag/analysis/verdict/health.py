"""Health bands of the headline metrics: healthy / warning / alarm, one table for every reader (the verdict,
rcdiag.analysis.verdict.judge; the report's cards; the dashboard's Overview and Compare). Where each band comes from:

| metric | healthy | warning | alarm | source |
|---|---|---|---|---|
| `kl`, `k3_kl` (abs) | ≤ 0.01 | ≤ 0.1 | > 0.1 | alarm: verl's documented warning abs(kl) > 0.1 (docs/algo/rollout_corr.md); healthy: rcdiag's synthesis of published k3 levels (R3, arXiv 2510.11370: dense Qwen3-8B ≈ 6.4e-4, MoE Qwen3-30B-A3B ≈ 1.5e-3; third-party dense runs 4e-4…1e-2) |
| `log_ppl_abs_diff` | ≤ 0.01 | ≤ 0.1 | > 0.1 | rcdiag: the same scale as kl (a per-sequence mean of ℓ) |
| `chi2_token` | ≤ 0.02 | ≤ 1 | > 1 | alarm: verl's warning chi2_token > 1 ("severe distribution shift"); healthy: rcdiag, χ² ≈ 2·KL for small gaps |
| `abs_log_ratio_mean` | ≤ 0.02 | ≤ 0.34 | > 0.34 | rcdiag's synthesis: dense bf16 ≈ 0.005, MoE 0.14–0.34 (docs/metrics.md reference values) |
| `abs_log_ratio_max` | ≤ 2 | ≤ 6 | > 6 | rcdiag's synthesis: MoE worst token 2–6 nats (docs/metrics.md) |
| `frac_outside_0.5_2` | ≤ 0.1 % | ≤ 1 % | > 1 % | rcdiag's synthesis: R3 counts tokens with max(r, 1/r) > 2 as "extreme", an order of magnitude more in MoE |
| `ess` (TIS, C) | ≥ 0.99 | ≥ 0.3 | < 0.3 | alarm: verl's warning ESS < 0.3; healthy: rcdiag (dense ≈ 0.9996) |
| `is_weight_mean` (TIS, C) | 0.95–1.05 | 0.5–2 | outside 0.5–2 | alarm: verl's warning outside [0.5, 2]; healthy: rcdiag |

They are sanity ranges for the size of an effect, not its cause: the verdict (rcdiag.analysis.verdict.judge) names the
cause, and judges mean |ℓ| against the run's own noise floor (rcdiag.analysis.metrics.floor) instead of the fixed band.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rcdiag.analysis.defaults import DEFAULT_THRESHOLD

HEALTHY, WARNING, ALARM, UNKNOWN = "healthy", "warning", "alarm", "n/a"
STATUSES = (HEALTHY, WARNING, ALARM)
"""In increasing severity (UNKNOWN, a missing value, counts as healthy for the verdict)."""
COLOURS = {HEALTHY: "#1a7f37", WARNING: "#b7791f", ALARM: "#c62828", UNKNOWN: "#6b7280"}
INF = math.inf


@dataclass(frozen=True)
class Band:
    """`value` is healthy inside [healthy_lo, healthy_hi], a warning inside [warn_lo, warn_hi], else an alarm.

    `absolute`: compare abs(value) (for signed estimators such as kl).
    """

    metric: str
    label: str
    healthy_lo: float
    healthy_hi: float
    warn_lo: float
    warn_hi: float
    absolute: bool = False
    source: str = ""

    def classify(self, value: float | None) -> str:
        """HEALTHY, WARNING, ALARM, or UNKNOWN for a missing / NaN value."""
        if value is None or not isinstance(value, int | float) or math.isnan(value):
            return UNKNOWN
        v = abs(value) if self.absolute else value
        if self.healthy_lo <= v <= self.healthy_hi:
            return HEALTHY
        if self.warn_lo <= v <= self.warn_hi:
            return WARNING
        return ALARM

    def describe(self) -> str:
        """A one-line human description of the band's ranges and where they come from."""
        v = "|value|" if self.absolute else "value"
        return (f"healthy: {_range(self.healthy_lo, self.healthy_hi, v)}; warning: "
                f"{_range(self.warn_lo, self.warn_hi, v)}; alarm: otherwise ({self.source})")

    def limit(self, status: str) -> str:
        """The edge the value crossed to land in `status`, e.g. '> 0.1' (for reasons)."""
        v = "|value|" if self.absolute else "value"
        if status == HEALTHY:
            return _range(self.healthy_lo, self.healthy_hi, v)
        if status == WARNING:
            return "outside " + _range(self.healthy_lo, self.healthy_hi, v)
        return "outside " + _range(self.warn_lo, self.warn_hi, v)


BANDS: tuple[Band, ...] = (
    Band("kl", "KL(rollout‖train)", 0, 0.01, 0, 0.1, True,
         "verl warns at |kl| > 0.1; dense bf16 ≈ 4e-4…1e-2, MoE ≈ 1.5e-3 (the R3 paper, arXiv 2510.11370)"),
    Band("k3_kl", "k3 KL", 0, 0.01, 0, 0.1, True, "as kl"),
    Band("log_ppl_abs_diff", "mean |log-PPL diff|", 0, 0.01, 0, 0.1, True, "as kl (rcdiag)"),
    Band("chi2_token", "χ² (token)", -INF, 0.02, -INF, 1.0, False, "verl warns at chi2_token > 1"),
    Band("abs_log_ratio_mean", "mean |ℓ|", 0, 0.02, 0, 0.34, False, "rcdiag: dense ≈ 0.005; MoE 0.14–0.34"),
    Band("abs_log_ratio_max", "max |ℓ|", 0, 2.0, 0, 6.0, False, "rcdiag: MoE worst token 2–6"),
    Band("frac_outside_0.5_2", "tokens with ratio outside [½, 2]", 0, 1e-3, 0, 1e-2, False,
         "rcdiag, after the R3 paper's 'extreme tokens' (ratio > 2; arXiv 2510.11370)"),
    Band("ess", "ESS (TIS)", 0.99, INF, 0.3, INF, False, "dense ≈ 0.9996; verl warns at ESS < 0.3"),
    Band("is_weight_mean", "IS weight mean (TIS)", 0.95, 1.05, 0.5, 2.0, False, "verl warns outside [0.5, 2]"),
)
"""The bands, in display order (the dashboard's Overview cards)."""
BY_METRIC = {b.metric: b for b in BANDS}
VERDICT_MODE, VERDICT_THRESHOLD = "token_truncate", DEFAULT_THRESHOLD
"""ess and is_weight_mean are judged on this IS simulation (TIS at verl's default C)."""


def _range(lo: float, hi: float, v: str) -> str:
    if lo == -INF or (lo == 0 and v == "|value|"):
        return f"{v} ≤ {hi:g}"
    if hi == INF:
        return f"{v} ≥ {lo:g}"
    return f"{lo:g} ≤ {v} ≤ {hi:g}"


def describe(band: Band) -> str:
    """Band.describe, as a function (the dashboard's card tooltips)."""
    return band.describe()


def worst(statuses: Iterable[str]) -> str:
    """The most severe of `statuses` (UNKNOWN ignored; HEALTHY when empty)."""
    ranks = [STATUSES.index(s) for s in statuses if s in STATUSES]
    return STATUSES[max(ranks, default=0)]


def at_least(status: str, level: str) -> bool:
    """Whether `status` is `level` or more severe (for --fail-on). UNKNOWN (nothing could be judged: no valid
    token) meets every level: a CI gate must not pass a run it could not measure."""
    return status == UNKNOWN or STATUSES.index(status) >= STATUSES.index(level)


def statuses(values: Mapping[str, Any]) -> dict[str, str]:
    """{metric: status} for every band whose metric is in `values`."""
    return {b.metric: b.classify(values.get(b.metric)) for b in BANDS if b.metric in values}


def num(value: float) -> str:
    """A metric value in a reason: 3 significant digits below 1e-3 or from 1e5, else 4."""
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3g}"
    return f"{value:.4g}"
