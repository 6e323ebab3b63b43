"""The one number formatter: the report, the notebook and the dashboard show a value (and a missing one) alike."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rcdiag import notebook
from rcdiag.numbers import MISSING, fmt
from rcdiag.report import render


@pytest.mark.parametrize(("value", "text"), [
    (None, "—"), (math.nan, "—"), (np.float32("nan"), "—"), (0.0, "0"), (0, "0"), (1234567, "1,234,567"),
    (np.int64(42000), "42,000"), (0.08277, "0.08277"), (3.59e-4, "3.590e-04"), (-0.5, "-0.5"), (1234.5, "1234"),
    (2e6, "2.000e+06"), (math.inf, "inf"), (-math.inf, "-inf"), (np.float64(1e-9), "1.000e-09"), (True, "True"),
    ("text", "text")])
def test_fmt(value, text):
    assert fmt(value) == text


def test_every_surface_uses_it():
    pytest.importorskip("streamlit")
    from app import ui

    assert render.fmt is fmt and notebook.fmt is fmt and ui.fmt is fmt
    assert MISSING in notebook.Result({"kl": math.nan})._repr_html_()
