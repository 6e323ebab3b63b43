"""The CI gate of `rcdiag report --fail-if "kl>1e-3"`: parse conditions once, evaluate them on report values.

A condition is `NAME OP VALUE` with OP one of < <= > >= == !=. NAME is a metric (docs/metrics.md), a tail
statistic, a count, an IS metric of the default mode token_truncate at --threshold (`ess`), or `MODE.NAME` for
another mode or a rejection option (`sequence_mask.kept_seq_frac`). A NaN value fails its condition.
A VALUE ending in `x` (`k3_kl>2x`) compares the ratio to the same value of a baseline run (`--baseline`).
"""
from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rcdiag.analysis.correction.modes import IS_METRIC_NAMES as IS_NAMES
from rcdiag.analysis.correction.rejection import REJECTION_OPTIONS
from rcdiag.analysis.distributions.tails import TAIL_NAMES
from rcdiag.analysis.metrics.compute import COUNT_NAMES, METRIC_NAMES
from rcdiag.errors import ConfigError, did_you_mean
from rcdiag.report.options import MODES

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}
DEFAULT_IS_MODE = "token_truncate"
_PATTERN = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Condition:
    """One parsed --fail-if: the run fails when `name op value` holds."""

    text: str
    name: str
    op: str
    value: float
    relative: bool = False  # VALUE was "2x": compare value / baseline value

    def holds(self, actual: float) -> bool:
        return math.isnan(actual) or OPERATORS[self.op](actual, self.value)


def parse(text: str) -> Condition:
    """'kl>1e-3' → Condition; raises ConfigError on bad syntax (with an example)."""
    match = _PATTERN.match(text)
    if not match:
        raise ConfigError(f"--fail-if {text!r}: expected NAME OP VALUE with OP in {' '.join(OPERATORS)}, "
                          "e.g. --fail-if \"kl>1e-3\" --fail-if \"ess<0.9\"")
    name, op, raw = match.groups()
    relative = raw[-1:] in ("x", "X")
    try:
        value = float(raw[:-1] if relative else raw)
    except ValueError:
        raise ConfigError(f"--fail-if {text!r}: {raw!r} is not a number (or a ratio to --baseline such as 2x)"
                          ) from None
    if not math.isfinite(value):  # NaN compares false with everything: a gate that can never fire
        raise ConfigError(f"--fail-if {text!r}: the threshold must be a finite number, got {raw!r}")
    return Condition(text.strip(), name, op, value, relative)


def known_names() -> list[str]:
    """Every name a condition may use (known before any data is read, so a typo fails fast)."""
    plain = [*METRIC_NAMES, *TAIL_NAMES, *IS_NAMES, *COUNT_NAMES, "token_rows"]
    return plain + [f"{m}.{n}" for m in (*MODES, *REJECTION_OPTIONS) for n in IS_NAMES]


def conditions(texts: Iterable[str], baseline: bool) -> list[Condition]:
    """The --fail-if conditions, checked before any work (ConfigError): syntax, known names, and a baseline run
    for a ratio (`baseline`: one is given). make_report and the report command both check through here."""
    parsed = [parse(text) for text in texts]
    check_names(parsed)
    check_baseline(parsed, baseline)
    return parsed


def check_names(conditions: Iterable[Condition]) -> None:
    """Raise ConfigError naming the first condition whose metric is unknown, with the known names."""
    names = set(known_names())
    unknown = [c for c in conditions if c.name not in names]
    if unknown:
        plain = [k for k in known_names() if "." not in k]
        hint = did_you_mean(unknown[0].name, known_names(), n=3)
        raise ConfigError(f"--fail-if {unknown[0].text!r}: unknown metric {unknown[0].name!r}{hint}; known: "
                          f"{', '.join(plain)} (or MODE.NAME, e.g. sequence_mask.ess)")


def check_baseline(conditions: Iterable[Condition], baseline: bool) -> None:
    """Raise ConfigError when a condition is a ratio to a baseline run (k3_kl>2x) and there is none."""
    relative = [c.text for c in conditions if c.relative]
    if relative and not baseline:
        raise ConfigError(f"--fail-if {relative[0]!r} is a ratio to a baseline run: add --baseline OTHER_RUN")


def gate_values(report: Any) -> dict[str, float]:
    """Every known name → its value in one RunReport (NaN where it was not computed)."""
    values: dict[str, Any] = dict.fromkeys(known_names(), math.nan)
    values.update(report.tails)
    values.update(report.counts)
    values.update(report.metrics)
    for mode, numbers in {**report.is_modes, **report.rejection}.items():
        values.update({f"{mode}.{k}": v for k, v in numbers.items() if isinstance(v, int | float)})
    values.update({k: v for k, v in report.is_modes.get(DEFAULT_IS_MODE, {}).items() if isinstance(v, int | float)})
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float)}


def evaluate(conditions: Iterable[Condition], values: dict[str, float],
             baseline: dict[str, float] | None = None) -> list[str]:
    """The failing conditions as lines 'kl = 0.0123 (kl>1e-3)'; empty when the run passes. A relative condition
    uses value / baseline value (`baseline`: gate_values of the baseline run; 0/0 and x/0 are NaN and inf)."""
    out = []
    for c in conditions:
        if not c.relative:
            if c.holds(values[c.name]):
                out.append(f"{c.name} = {values[c.name]:.6g} ({c.text})")
            continue
        base = (baseline or {}).get(c.name, math.nan)
        ratio = values[c.name] / base if base else (math.nan if values[c.name] == 0 else math.inf)
        if c.holds(ratio):
            out.append(f"{c.name} = {ratio:.3g}× the baseline ({values[c.name]:.6g} vs {base:.6g}) ({c.text})")
    return out
