"""Healthy / warning / alarm bands of the headline metrics, from METRICS.md's reference values.

| metric | healthy | warning | alarm | source |
|---|---|---|---|---|
| `kl`, `k3_kl` (abs) | ≤ 0.01 | ≤ 0.1 | > 0.1 | dense bf16 KL 4e-4…1e-2; verl warns at abs(kl) > 0.1 |
| `log_ppl_abs_diff` | ≤ 0.01 | ≤ 0.1 | > 0.1 | same scale as kl (a per-sequence mean of ℓ) |
| `chi2_token` | ≤ 0.02 | ≤ 1 | > 1 | χ² ≈ 2·KL for small gaps; verl warns above 1 |
| `abs_log_ratio_mean` | ≤ 0.02 | ≤ 0.34 | > 0.34 | dense ≈ 0.005; MoE 0.14–0.34 |
| `abs_log_ratio_max` | ≤ 2 | ≤ 6 | > 6 | MoE worst token 2–6 |
| `ess` (TIS, C = 2) | ≥ 0.99 | ≥ 0.3 | < 0.3 | dense ≈ 0.9996; verl warns below 0.3 |
| `is_weight_mean` (TIS, C = 2) | 0.95–1.05 | 0.5–2 | outside 0.5–2 | verl warns outside [0.5, 2] |

They are sanity ranges, not targets: a MoE run sits in "warning" by nature.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rcdiag.analysis.correction import DEFAULT_THRESHOLD

HEALTHY, WARNING, ALARM, UNKNOWN = "healthy", "warning", "alarm", "n/a"
COLOURS = {HEALTHY: "#1a7f37", WARNING: "#b7791f", ALARM: "#c62828", UNKNOWN: "#6b7280"}


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
        if value is None or not math.isfinite(value):
            return UNKNOWN
        v = abs(value) if self.absolute else value
        if self.healthy_lo <= v <= self.healthy_hi:
            return HEALTHY
        if self.warn_lo <= v <= self.warn_hi:
            return WARNING
        return ALARM


INF = math.inf
BANDS: tuple[Band, ...] = (
    Band("kl", "KL(rollout‖train)", 0, 0.01, 0, 0.1, True, "dense bf16 4e-4…1e-2; verl warns at |kl| > 0.1"),
    Band("k3_kl", "k3 KL", 0, 0.01, 0, 0.1, True, "as kl"),
    Band("log_ppl_abs_diff", "mean |log-PPL diff|", 0, 0.01, 0, 0.1, True, "as kl"),
    Band("chi2_token", "χ² (token)", -INF, 0.02, -INF, 1.0, False, "verl warns at chi2_token > 1"),
    Band("abs_log_ratio_mean", "mean |ℓ|", 0, 0.02, 0, 0.34, False, "dense ≈ 0.005; MoE 0.14–0.34"),
    Band("abs_log_ratio_max", "max |ℓ|", 0, 2.0, 0, 6.0, False, "MoE worst token 2–6"),
    Band("ess", "ESS (TIS, C=2)", 0.99, INF, 0.3, INF, False, "dense ≈ 0.9996; verl warns at ESS < 0.3"),
    Band("is_weight_mean", "IS weight mean (TIS, C=2)", 0.95, 1.05, 0.5, 2.0, False,
         "verl warns outside [0.5, 2]"),
)
"""The Overview cards, in display order."""
OVERVIEW_MODE, OVERVIEW_THRESHOLD = "token_truncate", DEFAULT_THRESHOLD
"""ess and is_weight_mean on the Overview come from this IS simulation."""


def describe(band: Band) -> str:
    """A one-line human description of the band's ranges."""
    v = "|value|" if band.absolute else "value"
    return (f"healthy: {_range(band.healthy_lo, band.healthy_hi, v)}; warning: {_range(band.warn_lo, band.warn_hi, v)}; "
            f"alarm: otherwise ({band.source})")


def _range(lo: float, hi: float, v: str) -> str:
    if lo == -INF or (lo == 0 and v == "|value|"):
        return f"{v} ≤ {hi:g}"
    if hi == INF:
        return f"{v} ≥ {lo:g}"
    return f"{lo:g} ≤ {v} ≤ {hi:g}"
