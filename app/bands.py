"""The health bands now live in the library (rcdiag.analysis.verdict.health): the report, the CLI, metrics.json, the
notebook card and this dashboard read the same table. This module keeps the dashboard's names.

They are sanity ranges, not targets: a MoE run sits in "warning" by nature.
"""
from __future__ import annotations

from rcdiag.analysis.verdict.health import (
    ALARM,
    BANDS,
    COLOURS,
    HEALTHY,
    UNKNOWN,
    VERDICT_MODE,
    VERDICT_THRESHOLD,
    WARNING,
    Band,
    describe,
)

OVERVIEW_MODE, OVERVIEW_THRESHOLD = VERDICT_MODE, VERDICT_THRESHOLD
"""ess and is_weight_mean on the Overview come from this IS simulation (the verdict's)."""

__all__ = ["ALARM", "BANDS", "COLOURS", "HEALTHY", "OVERVIEW_MODE", "OVERVIEW_THRESHOLD", "UNKNOWN", "WARNING",
           "Band", "describe"]
