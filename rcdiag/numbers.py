"""The one number formatter for people (report, notebook, dashboard): a value reads the same everywhere.

Ground floor: imports nothing of rcdiag. Missing values (None, NaN) show as MISSING ("—") — never 'nan',
'NaN' or a healthy-looking blank; integers get thousands separators; floats 4 significant digits, switching to
3-digit e-notation when tiny (< 1e-3) or huge (≥ 1e5), so a KL of 3.6e-4 does not read as 0.0004 or 0.
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

MISSING = "—"
"""How a missing or undefined value (None, NaN) is shown."""


def fmt(value: Any) -> str:
    """`value` for display: None/NaN → '—', ints (Python or numpy) '1,234,567', floats '0.08277' / '3.590e-04'
    / '2.000e+06' / 'inf', booleans and anything else as str()."""
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, Real):
        return str(value)
    if isinstance(value, Integral):
        return f"{int(value):,}"
    value = float(value)
    if math.isnan(value):
        return MISSING
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4g}"
