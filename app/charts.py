"""The dashboard's charts as Vega-Lite specs, fed with the small aggregated frames of app.aggregates.

Written as JSON directly, not with Altair: building and validating an Altair chart cost 0.1–0.3 s per chart, paid
again for every new frame (a filter, a run added to Compare) — most of a page's time. `draw` keeps each (chart
kind, frame, options) spec in st.cache_data and hands it to `st.vega_lite_chart`.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

STRATA_DASHES = "solid: mean ℓ, dashed: mean |ℓ|"
"""How the strata charts of several runs tell the two statistics apart."""
RUN_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
"""Colours of runs on the Compare page, in run order (colour means run in every chart there)."""
LOG_FLOOR = 0.8
"""The log count axis starts here (an empty bin drawn at the floor instead of log 0 = −∞)."""
VIEW = {"view": {"continuousWidth": 300, "continuousHeight": 300}}
"""Altair's default view size, kept so the charts look as before."""


def run_colours(names: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """One fixed colour per run (the same in every chart, so one legend reads for all): a Vega-Lite scale."""
    return {"domain": list(names), "range": [RUN_PALETTE[i % len(RUN_PALETTE)] for i in range(len(names))]}


def draw(where: Any, kind: str, frame: pd.DataFrame, key: str, **options: Any) -> Any:
    """Draw chart `kind` (histogram, density, strata) of `frame` with `options` (hashable: str, tuples) at `where`
    (st or a column) from its cached spec; `runs=(names…)` colours by run (run_colours). Returns the element."""
    return where.vega_lite_chart(spec(kind, frame, tuple(sorted(options.items()))), width="stretch", key=key)


@st.cache_data(max_entries=512, show_spinner=False)
def spec(kind: str, frame: pd.DataFrame, options: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """The Vega-Lite spec of chart `kind` for (frame, options), built once."""
    return {"$schema": "https://vega.github.io/schema/vega-lite/v6.json", "config": VIEW,
            **KINDS[kind](frame, **dict(options))}


def records(frame: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """Inline data of a frame (NaN → null, which Vega skips)."""
    return {"values": json.loads(frame.to_json(orient="records"))}


def _q(field: str, title: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"field": field, "type": "quantitative", **({"title": title} if title is not None else {}), **extra}


def histogram(frame: pd.DataFrame, colour: str | None = None, runs: tuple[str, ...] | None = None) -> dict:
    """ℓ histogram with log counts: frame (lo, hi, count[, run]); one run as bars, several as overlaid steps
    coloured by `colour` (in `runs` order, run_colours)."""
    x = _q("lo", "ℓ = a − b (nats)")
    y = _q("count", "tokens (log scale)", scale={"type": "log", "domainMin": LOG_FLOOR})
    tooltip = [_q("lo"), _q("hi"), _q("count")] + ([{"field": colour, "type": "nominal"}] if colour else [])
    if colour:
        scale = run_colours(runs) if runs is not None else None
        return {"data": records(frame), "mark": {"type": "line", "interpolate": "step-after"},
                "encoding": {"x": x, "y": y, "tooltip": tooltip, "color": {
                    "field": colour, "type": "nominal", "title": colour, **({"scale": scale} if scale else {})}}}
    return {"data": records(frame.assign(base=LOG_FLOOR)), "mark": {"type": "rect", "color": "#2563eb"},
            "encoding": {"x": x, "x2": {"field": "hi"}, "y": y, "y2": {"field": "base"}, "tooltip": tooltip}}


def density(frame: pd.DataFrame) -> dict:
    """b-vs-a density heat map with log colour: frame (a_lo, a_hi, b_lo, b_hi, count), and the a = b diagonal."""
    low = float(min(frame["a_lo"].min(), frame["b_lo"].min()))
    cells = {"data": records(frame), "mark": {"type": "rect"}, "encoding": {
        "x": _q("a_lo", "training log-prob a"), "x2": {"field": "a_hi"},
        "y": _q("b_lo", "rollout log-prob b"), "y2": {"field": "b_hi"},
        "color": _q("count", "tokens", scale={"type": "log", "scheme": "viridis"}),
        "tooltip": [_q("a_lo"), _q("b_lo"), _q("count")]}}
    line = {"data": {"values": [{"v": low}, {"v": 0.0}]}, "mark": {"type": "line", "color": "red",
                                                                    "strokeDash": [4, 3]},
            "encoding": {"x": _q("v"), "y": _q("v")}}
    return {"layer": [cells, line]}


def strata(frame: pd.DataFrame, title: str, colour: str | None = None, runs: tuple[str, ...] | None = None) -> dict:
    """Mean ℓ and mean |ℓ| per bucket, buckets in row order: frame (bucket, tokens, mean_log_ratio, mean_abs[, run])
    as rcdiag.analysis.strata rows. With `colour` (several runs) colour is the run (`runs`) and the dash the
    statistic (solid: mean ℓ, dashed: mean |ℓ|; STRATA_DASHES, said in words next to the chart — a second legend
    is clipped in a narrow column); alone, colour is the statistic."""
    long = frame.melt(id_vars=[c for c in ("bucket", "tokens", colour) if c],
                      value_vars=["mean_log_ratio", "mean_abs"], var_name="statistic", value_name="value")
    order = list(dict.fromkeys(frame["bucket"]))
    legend = {"orient": "bottom", "title": None}
    if colour:
        scale = run_colours(runs) if runs is not None else None
        enc = {"color": {"field": colour, "type": "nominal", "legend": legend, **({"scale": scale} if scale else {})},
               "strokeDash": {"field": "statistic", "type": "nominal", "legend": None,
                              "scale": {"domain": ["mean_log_ratio", "mean_abs"], "range": [[1, 0], [4, 3]]}}}
    else:
        enc = {"color": {"field": "statistic", "type": "nominal", "legend": legend}}
    tooltip = [{"field": "bucket", "type": "nominal"}, {"field": "statistic", "type": "nominal"}, _q("value"),
               _q("tokens")] + ([{"field": colour, "type": "nominal"}] if colour else [])
    return {"data": records(long), "mark": {"type": "line", "point": True}, "encoding": {
        "x": {"field": "bucket", "type": "nominal", "sort": order, "title": title},
        "y": _q("value", "nats"), "tooltip": tooltip, **enc}}


KINDS: dict[str, Callable[..., dict]] = {"histogram": histogram, "density": density, "strata": strata}
"""The chart kinds `draw` knows."""
