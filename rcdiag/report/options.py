"""The whole report request with its defaults (ReportOptions), validated once when made; the CLI, the library and
the dashboard read them here.

Light (the defaults and conventions only, no kernels): `rcdiag report --help` imports it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from rcdiag.analysis.conventions import CONVENTIONS as CONVENTION_TABLE
from rcdiag.analysis.correction.trainer_defaults import TrainerSetting, choose_correction
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
    names), else canonical. `threshold` / `lower` None: the run's own trainer's (`for_run`: its recorded
    `trainer.correction`), else the `keys` framework's defaults, else DEFAULT_THRESHOLD — a report of a TRL run
    then reads TRL's C=3 (rcdiag.analysis.correction.trainer_defaults); a given value always wins. `fail_if` are
    `rcdiag.report.gate` conditions (their syntax and names are checked by gate.conditions, which the CLI runs
    before any work and make_report runs first); `fail_on` a verdict level; `fail_on_drift` makes a step change or
    a drift a failure; `baseline` a run every report is compared with. `setting`: the IS setting `for_run` chose
    and why (None before)."""

    convention: str | None = None
    threshold: float | None = None
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
    setting: TrainerSetting | None = None
    threshold_given: bool = field(init=False, default=False)
    """Whether `threshold` was given (not the trainer's / framework's default)."""
    lower_given: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold_given", self.threshold is not None)
        object.__setattr__(self, "lower_given", self.lower is not None)
        keys = check_keys(self.keys)
        given = None if self.convention is None else str(self.convention).strip().lower()  # case-insensitive
        if given is not None and given not in CONVENTIONS:
            raise ConfigError(f"unknown convention {given!r}; choose one of {', '.join(CONVENTIONS)}"
                              f"{did_you_mean(given, CONVENTIONS, n=1)}")
        convention = key_convention(keys, given)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "convention", convention)
        if self.threshold is None:  # until for_run reads the run's trainer: the keys framework's, else rcdiag's
            default = choose_correction(None, keys, convention=convention)
            object.__setattr__(self, "threshold", default.threshold or DEFAULT_THRESHOLD)
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

    def for_run(self, info: Any) -> ReportOptions:
        """These options for one run (a Run, its manifest or typed manifest): a threshold and lower bound not
        given become the run's recorded trainer settings, else the keys framework's defaults, else rcdiag's;
        `setting` says which and why. Given values stay (and are said to be given)."""
        chosen = choose_correction(info, self.keys, threshold=self.threshold if self.threshold_given else None,
                                   lower=self.lower if self.lower_given else None, convention=self.convention)
        threshold = self.threshold if self.threshold_given or chosen.threshold is None else chosen.threshold
        lower = self.lower if self.lower_given else chosen.lower
        if lower is not None and not 0 < lower < min((threshold, *self.thresholds)):
            lower = self.lower  # a recorded bound the sweep cannot take (above a grid threshold) is left out
        resolved = replace(self, threshold=threshold, lower=lower, setting=chosen)
        object.__setattr__(resolved, "threshold_given", self.threshold_given)
        object.__setattr__(resolved, "lower_given", self.lower_given)
        return resolved

    @property
    def grid(self) -> tuple[float, ...]:
        """The sweep's thresholds and the chosen C, each once, in order."""
        return tuple(dict.fromkeys((*self.thresholds, self.threshold)))
