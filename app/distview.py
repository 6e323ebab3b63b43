"""The Distributions page's content for one filter, computed once per (run, filters) into one cache entry.

Token count, tail statistics, the five chart specs and the strata tables all come from one scan
(aggregates.distributions: the report's own pass when nothing is filtered). Keyed on the run and the filters,
small arguments whatever the run's size (hashing the aggregated frames as cache keys cost more than building the
specs), so the page reads everything with one lookup, and app.warm builds the unfiltered view before the page is
first opened (building the five specs took ~0.1 s).
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from app import aggregates, charts


@st.cache_data(max_entries=64, show_spinner=False)
def view(path: str, stamp: str, filters: aggregates.Filters | None) -> dict[str, Any]:
    """{"tokens": valid tokens scanned, "stats": rcdiag.analysis.tails statistics, "charts": {histogram, density,
    one per aggregates.SHOWN_STRATA: Vega-Lite spec}, "strata": {name: rcdiag.analysis.strata rows}} of the
    sequences passing `filters` (aggregates.distributions' argument); no charts when no token is valid."""
    result = aggregates.distributions(path, stamp, filters)
    tails = result["tails"]
    specs: dict[str, dict] = {}
    if tails.n:
        specs = {"histogram": charts.spec("histogram", aggregates.histogram(tails)),
                 "density": charts.spec("density", aggregates.density(tails))}
        for name in aggregates.SHOWN_STRATA:
            specs[name] = charts.spec("strata", result["strata"][name], title=aggregates.strata_title(name))
    return {"tokens": int(tails.n), "stats": result["tail_stats"], "charts": specs, "strata": result["strata"]}
