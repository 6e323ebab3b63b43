"""The whole report request with its defaults (ReportOptions), validated once when made; the CLI, the library and
the dashboard read them here.

Light (the defaults and conventions only, no kernels): `rcdiag report --help` imports it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rcdiag.analysis.conventions import CONVENTIONS as CONVENTION_TABLE
from rcdiag.analysis.defaults import (
    DEFAULT_LEVEL,
    DEFAULT_REPLICATES,
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLDS,
    IS_MODES,
)
from rcdiag.analysis.keys import check_keys, key_convention
from rcdiag.errors import ConfigError, did_you_mean

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


FAIL_ON = ("warning", "alarm")
"""The --fail-on levels (rcdiag.analysis.verdict.health: healthy < warning < alarm; n/a meets every level)."""


@dataclass(frozen=True)
class ReportOptions:
    """The whole report request — what to compute and what fails it — with every default, validated once here
    (a bad value raises ConfigError when the object is made: the CLI and the library see the same rules).

    `convention` None means the `keys` framework's own formulas (--keys verl reports verl's numbers under verl's
    names), else canonical. `fail_if` are `rcdiag.report.gate` conditions (their syntax and names are checked by
    gate.conditions, which the CLI runs before any work and make_report runs first); `fail_on` a verdict level;
    `fail_on_drift` makes a step change or a drift a failure; `baseline` a run every report is compared with."""

    convention: str | None = None
    threshold: float = DEFAULT_THRESHOLD
    lower: float | None = None
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    replicates: int = DEFAULT_REPLICATES
    level: float = DEFAULT_LEVEL
    seed: int = 0
    silent: bool = True
    keys: str = "canonical"
    """Key names in metrics.json: canonical or a framework (rcdiag.analysis.keys)."""
    fail_if: tuple[str, ...] = ()
    fail_on: str | None = None
    fail_on_drift: bool = False
    baseline: str | None = None

    def __post_init__(self) -> None:
        keys = check_keys(self.keys)
        given = None if self.convention is None else str(self.convention).strip().lower()  # case-insensitive
        if given is not None and given not in CONVENTIONS:
            raise ConfigError(f"unknown convention {given!r}; choose one of {', '.join(CONVENTIONS)}"
                              f"{did_you_mean(given, CONVENTIONS, n=1)}")
        convention = key_convention(keys, given)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "convention", convention)
        object.__setattr__(self, "thresholds", tuple(self.thresholds))
        object.__setattr__(self, "fail_if", tuple(self.fail_if))
        if self.baseline is not None:
            object.__setattr__(self, "baseline", str(self.baseline))
        bad = [c for c in (self.threshold, *self.thresholds)
               if isinstance(c, bool) or not isinstance(c, int | float) or not (math.isfinite(c) and c > 1)]
        if bad:
            raise ConfigError(f"thresholds must be finite numbers > 1, got {bad[0]!r}")
        smallest = min((self.threshold, *self.thresholds))
        if self.lower is not None and (isinstance(self.lower, bool) or not isinstance(self.lower, int | float)
                                       or not 0 < self.lower < smallest):
            raise ConfigError(f"--lower must lie in (0, {smallest:g}) (below every threshold), got {self.lower!r}")
        if self.lower is not None and not CONVENTION_TABLE[convention].allow_lower:
            raise ConfigError(f"convention {convention} has no lower bound L in any mode; leave --lower out or use "
                              "convention canonical, verl (its masks) or trl")
        if self.fail_on is not None and self.fail_on not in FAIL_ON:
            raise ConfigError(f"--fail-on {self.fail_on!r}: choose one of {', '.join(FAIL_ON)}"
                              f"{did_you_mean(str(self.fail_on), FAIL_ON, n=1)}")

    @property
    def grid(self) -> tuple[float, ...]:
        """The sweep's thresholds and the chosen C, each once, in order."""
        return tuple(dict.fromkeys((*self.thresholds, self.threshold)))
