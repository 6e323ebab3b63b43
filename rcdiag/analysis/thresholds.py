"""Reading a threshold or bound the way a user means it, at every API entry point: numbers only, no booleans, and
verl's "L_U" strings read as verl reads them.

Why a module of its own: `simulate(run, "token_truncate", threshold=True)` used to run as C = 1.0 (a bool is an
int in Python), and `simulate(run, "token_mask", "1_5")` as C = 15 (Python's `float("1_5")` reads the underscore as
a digit separator) — verl reads the same string as IcePop's lower_upper band L = 1, C = 5
(`verl/trainer/ppo/rollout_corr_helper.py` @ 1dda039, `_parse_threshold`-style split on "_"). Every entry point
(simulate, sweep, analyze, logged_values, the gate simulator, CorrectionMode, Rejection) goes through here.
"""
from __future__ import annotations

import math
import numbers
import re
from typing import Any

from rcdiag.errors import ConfigError

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
"""A plain decimal number (no Python digit-grouping underscores: "1_5" is verl's band, not 15)."""


def as_number(value: Any, what: str) -> float:
    """`value` as a float: a real number (not a bool) or a plain numeric string; ConfigError naming `what`
    otherwise. NaN and ±inf pass (the caller's range check decides)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy.bool_ is not a numbers.Real either
        raise ConfigError(f"{what} must be a number, got the boolean {value!r}")
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if _NUMBER.match(text):
            return float(text)
        raise ConfigError(f"{what} must be a number, got the string {value!r}"
                          + (" (a verl-style 'L_U' band is read only where a lower bound is allowed)"
                             if "_" in text else ""))
    raise ConfigError(f"{what} must be a number, got {type(value).__name__} {value!r}")


def optional_number(value: Any, what: str) -> float | None:
    """None stays None; anything else as_number."""
    return None if value is None else as_number(value, what)


def split_band(threshold: Any, lower: Any, what: str = "threshold") -> tuple[float | None, float | None]:
    """(upper, lower) from a threshold that may be verl's "L_U" string (rollout_is_threshold / rollout_rs_threshold:
    lower bound L, upper bound U) and an explicit lower bound. A band string together with `lower` is ambiguous:
    ConfigError. Booleans and non-numeric strings: ConfigError."""
    if isinstance(threshold, str) and "_" in threshold.strip():
        parts = threshold.strip().split("_")
        if len(parts) != 2 or not all(_NUMBER.match(p.strip()) for p in parts):
            raise ConfigError(f"{what} {threshold!r}: a verl-style band is 'L_U' with two numbers, e.g. '0.5_2.0'")
        if lower is not None:
            raise ConfigError(f"{what} {threshold!r} is a verl 'L_U' band (L = {parts[0]}) and lower={lower!r} was "
                              "also given: give one of them")
        low, high = (float(p) for p in parts)
        return high, low
    return optional_number(threshold, what), optional_number(lower, "lower bound L")


def check_finite(value: float, what: str) -> float:
    """ConfigError unless finite."""
    if not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number, got {value!r}")
    return value
