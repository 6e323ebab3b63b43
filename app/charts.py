"""The dashboard's charts as Vega-Lite specs, fed with small aggregated frames (app.aggregates, rcdiag.probe.summary).

Written as JSON directly, not with Altair: building and validating an Altair chart cost 0.1–0.3 s per chart, paid
again for every new frame (a filter, a run added to Compare) — most of a page's time. A page caches the specs it
draws on small keys (the run, its filters: Distributions, Compare), not here on the frames: st.cache_data hashes
every frame argument on every rerun, which cost more than building the spec. The data stays a DataFrame in the
spec as named datasets (`table`; Streamlit sends them as Arrow): no JSON records built here and parsed back into
a frame by Streamlit on every rerun.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

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


def draw(where: Any, chart: dict[str, Any], key: str) -> Any:
    """Draw the Vega-Lite spec `chart` (from `spec`, or any spec whose frames sit in its top-level `datasets`) at
    `where` (st or a column), as wide as its column. Returns the element."""
    return where.vega_lite_chart(chart, width="stretch", key=key)


def spec(kind: str, frame: pd.DataFrame, **options: Any) -> dict[str, Any]:
    """The Vega-Lite spec of chart `kind` (histogram, density, strata, budget) of `frame` with `options`;
    `runs=(names…)` colours by run (run_colours). Plain: cache it where its inputs have a small key."""
    return {"$schema": "https://vega.github.io/schema/vega-lite/v6.json", "config": VIEW,
            **KINDS[kind](frame, **options)}


TABLE = "table"
"""Name of a chart's dataset (`table`)."""


def table(frame: pd.DataFrame) -> dict[str, Any]:
    """A spec's data as the named dataset TABLE (spread it into the spec): the frame itself, which Streamlit sends
    as Arrow (NaN → null, which Vega skips) with a fresh RangeIndex (no index column travels). Named, because the
    browser compiles named datasets into the view it creates, while top-level inline data is inserted only after
    the view has run once without it: Vega then computed every scale twice and warned of infinite extents."""
    return {"data": {"name": TABLE}, "datasets": {TABLE: frame.reset_index(drop=True)}}


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
        return {**table(frame), "mark": {"type": "line", "interpolate": "step-after"},
                "encoding": {"x": x, "y": y, "tooltip": tooltip, "color": {
                    "field": colour, "type": "nominal", "title": colour, **({"scale": scale} if scale else {})}}}
    return {**table(frame.assign(base=LOG_FLOOR)), "mark": {"type": "rect", "color": "#2563eb"},
            "encoding": {"x": x, "x2": {"field": "hi"}, "y": y, "y2": {"field": "base"}, "tooltip": tooltip}}


def density(frame: pd.DataFrame) -> dict:
    """b-vs-a density heat map with log colour: frame (a_lo, a_hi, b_lo, b_hi, count), and the a = b diagonal over
    the occupied range. Both are named datasets: Streamlit sends only top-level data as Arrow (a layer's inline
    rows stay JSON in the spec), and a spec without data is the same for every filter, so applying one swaps the
    data into the browser's Vega view instead of re-creating it."""
    low = float(min(frame["a_lo"].min(), frame["b_lo"].min()))
    cells = {"data": {"name": "cells"}, "mark": {"type": "rect"}, "encoding": {
        "x": _q("a_lo", "training log-prob a"), "x2": {"field": "a_hi"},
        "y": _q("b_lo", "rollout log-prob b"), "y2": {"field": "b_hi"},
        "color": _q("count", "tokens", scale={"type": "log", "scheme": "viridis"}),
        "tooltip": [_q("a_lo"), _q("b_lo"), _q("count")]}}
    line = {"data": {"name": "diagonal"}, "mark": {"type": "line", "color": "red", "strokeDash": [4, 3]},
            "encoding": {"x": _q("v"), "y": _q("v")}}
    return {"datasets": {"cells": frame.reset_index(drop=True), "diagonal": pd.DataFrame({"v": [low, 0.0]})},
            "layer": [cells, line]}


def strata(frame: pd.DataFrame, title: str, colour: str | None = None, runs: tuple[str, ...] | None = None) -> dict:
    """Mean ℓ and mean |ℓ| per bucket, buckets in row order: frame (bucket, tokens, mean_log_ratio, mean_abs[, run])
    as rcdiag.analysis.distributions.strata rows. With `colour` (several runs) colour is the run (`runs`) and the dash the
    statistic (solid: mean ℓ, dashed: mean |ℓ|; STRATA_DASHES, said in words next to the chart — a second legend
    is clipped in a narrow column); alone, colour is the statistic. The bucket order is a column (`order`), not a
    list in the spec: the spec stays the same when a filter leaves fewer buckets."""
    rank = {bucket: i for i, bucket in enumerate(dict.fromkeys(frame["bucket"]))}
    long = frame.assign(order=frame["bucket"].map(rank)).melt(
        id_vars=[c for c in ("bucket", "order", "tokens", colour) if c], value_vars=["mean_log_ratio", "mean_abs"],
        var_name="statistic", value_name="value")
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
    return {**table(long), "mark": {"type": "line", "point": True}, "encoding": {
        "x": {"field": "bucket", "type": "nominal", "sort": {"field": "order", "op": "min"}, "title": title},
        "y": _q("value", "nats"), "tooltip": tooltip, **enc}}


def budget(frame: pd.DataFrame) -> dict:
    """The probe's mismatch budget as bars: frame rcdiag.probe.summary.budget_frame (factor, setting, baseline,
    side, mean_abs, k3_kl, share, share_k3), one bar per row in row order, share on a symlog axis (shares span
    decades and can be 0), coloured by side."""
    text = ("factor", "setting", "baseline", "side")
    tooltip = [{"field": c, "type": "nominal"} for c in text[:3]] + [_q(c) for c in ("mean_abs", "k3_kl", "share",
                                                                                      "share_k3")]
    return {**table(frame.assign(label=frame["factor"].astype(str) + ": " + frame["setting"].astype(str))),
            "mark": {"type": "bar"}, "encoding": {
                "x": _q("share", "share of the observed gap", scale={"type": "symlog", "constant": 1e-3}),
                "y": {"field": "label", "type": "nominal", "sort": None, "title": None,
                      "axis": {"labelLimit": 360}},  # factor: setting in full (Vega cuts at 180 px)
                "color": {"field": "side", "type": "nominal", "title": "side"}, "tooltip": tooltip}}


KINDS: dict[str, Callable[..., dict]] = {"histogram": histogram, "density": density, "strata": strata,
                                         "budget": budget}
"""The chart kinds `spec` knows."""
