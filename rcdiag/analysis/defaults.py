"""The IS defaults every part reads (report, checks, bootstrap, scan, dashboard, notebook): defined once, here.

A light module (no numba, no pandas) so that checks and the CLI can read them without loading the kernels.
"""
from __future__ import annotations

DEFAULT_THRESHOLD = 2.0
"""The IS threshold C: verl's `rollout_is_threshold`, TRL's and ms-swift's default cap (METRICS.md)."""
DEFAULT_THRESHOLDS = (1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
"""The thresholds of the report's sweep."""
