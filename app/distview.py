"""The Distributions page's content for one filter, computed once per (run, filters) into one cache entry.

Token count, tail statistics, the five chart specs and the strata tables all come from one scan
(aggregates.distributions: the report's own pass when nothing is filtered). Keyed on the run and the filters,
small arguments whatever the run's size (hashing the aggregated frames as cache keys cost more than building the
specs), so the page reads everything with one lookup, and app.warm builds the unfiltered view before the page is
first opened (building the five specs took ~0.1 s). The Overview draws only the whole run's histogram
(`run_histogram`): building the other four specs and the strata tables, and pickling the tails' accumulator into
the cache, was work its first view paid for charts it does not show (~20 ms on 10 M tokens, after the pass).
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from app import aggregates, charts, judged
from rcdiag.analysis.distributions.tails import TailAccumulator


@st.cache_data(max_entries=64, show_spinner=False)
def view(path: str, stamp: str, filters: aggregates.Filters | None) -> dict[str, Any]:
    """{"tokens": valid tokens scanned, "stats": rcdiag.analysis.distributions.tails statistics, "charts": {histogram, density,
    one per aggregates.SHOWN_STRATA: Vega-Lite spec}, "strata": {name: rcdiag.analysis.distributions.strata rows}} of the
    sequences passing `filters` (aggregates.distributions' argument); no charts when no token is valid."""
    result = aggregates.distributions(path, stamp, filters)
    tails = result["tails"]
    specs: dict[str, dict] = {}
    if tails.n:
        specs = {"histogram": histogram_spec(tails), "density": charts.spec("density", aggregates.density(tails))}
        for name in aggregates.SHOWN_STRATA:
            specs[name] = charts.spec("strata", result["strata"][name], title=aggregates.strata_title(name))
    return {"tokens": int(tails.n), "stats": result["tail_stats"], "charts": specs, "strata": result["strata"]}


@st.cache_data(max_entries=64, show_spinner=False)
def run_histogram(path: str, stamp: str) -> dict[str, Any] | None:
    """The whole run's ℓ histogram spec (the unfiltered `view`'s "histogram", built from the same scan: the report's
    pass, app.judged), or None when no token is valid: what the Overview draws, without the other charts."""
    tails = judged.report(path, stamp).scan.tails
    return histogram_spec(tails) if tails.n else None


def histogram_spec(tails: TailAccumulator) -> dict[str, Any]:
    """The Vega-Lite spec of the ℓ histogram of `tails` (aggregates.histogram's bins), for `view` and the Overview."""
    return charts.spec("histogram", aggregates.histogram(tails))
