"""Every report setting with its default (ReportOptions), validated once; the CLI and the dashboard read them here.

Light (the defaults and conventions only, no kernels): `rcdiag report --help` imports it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rcdiag.analysis.conventions import CONVENTIONS as CONVENTION_TABLE
from rcdiag.analysis.conventions import DEFAULT_CONVENTION
from rcdiag.analysis.defaults import (
    DEFAULT_LEVEL,
    DEFAULT_REPLICATES,
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLDS,
    IS_MODES,
)
from rcdiag.errors import ConfigError

MODES = IS_MODES
"""The four preset IS modes, in correction's order (token_truncate first)."""
ESS_TARGET = 0.9
"""The effective sample size (ESS/N) a recommended correction keeps."""
DEFAULT_COMPARISON_DIR = "rcdiag-report"
"""Where a comparison of several runs goes without --out (relative to the working directory)."""
WORST_SEQUENCES = 10
"""How many worst sequences and prompts the report lists."""
CONVENTIONS = tuple(CONVENTION_TABLE)
"""canonical, swift, verl, trl (rcdiag.analysis.conventions)."""


@dataclass(frozen=True)
class ReportOptions:
    """Every report setting, with its default (the CLI reads them from here)."""

    convention: str = DEFAULT_CONVENTION
    threshold: float = DEFAULT_THRESHOLD
    lower: float | None = None
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    replicates: int = DEFAULT_REPLICATES
    level: float = DEFAULT_LEVEL
    seed: int = 0
    silent: bool = True
    keys: str = "canonical"
    """Key names in metrics.json: canonical | verl | swift | trl (rcdiag.analysis.keys)."""

    def __post_init__(self) -> None:
        # one rule with analysis.conventions.get_convention: names are case-insensitive (--convention VERL)
        object.__setattr__(self, "convention", str(self.convention).strip().lower())


def validate(options: ReportOptions) -> None:
    """Raise ConfigError for an unknown convention, a threshold that is not a finite number > 1, or a lower bound
    outside (0, smallest threshold)."""
    if options.convention not in CONVENTIONS:
        raise ConfigError(f"unknown convention {options.convention!r}; choose one of {', '.join(CONVENTIONS)}")
    bad = [c for c in (options.threshold, *options.thresholds) if not (math.isfinite(c) and c > 1)]
    if bad:
        raise ConfigError(f"thresholds must be finite numbers > 1, got {bad[0]!r}")
    smallest = min((options.threshold, *options.thresholds))
    if options.lower is not None and not (0 < options.lower < smallest):
        raise ConfigError(f"--lower must lie in (0, {smallest:g}) (below every threshold), got {options.lower!r}")
    from rcdiag.analysis.keys import key_convention

    key_convention(options.keys, options.convention)
