"""The IS simulator's sweep chart: curves of one metric over the dense threshold grid for every mode, the slider's
setting (black diamond), the report's recommended setting (red ring), and a read-out panel that follows the mouse
— Vega scrubs it in the browser, no rerun.

The chart's Vega-Lite spec depends on the run, mode, lower bound, convention and curve only; it is written as JSON
(no Altair: building and validating it took 0.3–0.9 s per mode and curve) and cached. The slider's threshold
enters afterwards (`place`): the diamond's one-row dataset and the read-out's initial position.
"""
from __future__ import annotations

import json
from typing import Any

import pandas as pd
import streamlit as st

from app import data
from app.simvalues import FRACTIONS, SHOWN

SCRUB = "scrub"
"""Name of the hover selection (its initial value is the slider's threshold)."""
CURRENT = "current_setting"
"""Name of the diamond's dataset (the slider's threshold and its value), filled in by `place`."""


@st.cache_data(max_entries=128, show_spinner=False)
def sweep_spec(rows: pd.DataFrame, others: pd.DataFrame, mode: str, metric: str,
               recommended: tuple[str, float] | None) -> dict[str, Any]:
    """The spec: `rows` the chosen mode's sweep (with its lower bound; the UNCORRECTED row is the panel's
    baseline), `others` every mode without a lower bound, `recommended` (mode, C) of the report or None.
    Written as Vega-Lite JSON directly: Altair took 0.3–0.9 s to build and validate it, once per mode and curve."""
    base = rows[rows["threshold"] == data.UNCORRECTED].iloc[0]
    grid = others[others["threshold"] < data.UNCORRECTED]
    mine = rows[rows["threshold"] < data.UNCORRECTED].reset_index(drop=True)
    names = [n for n in SHOWN if n in mine.columns]
    long = mine.melt(id_vars=["threshold"], value_vars=names, var_name="metric", value_name="value")
    long["base"] = long["metric"].map({n: float(base[n]) for n in names})
    long["share"] = long["metric"].isin(FRACTIONS)
    x = {"field": "threshold", "type": "quantitative", "title": "threshold C (log scale)",
         "scale": {"type": "log", "nice": False, "domain": [float(mine["threshold"].min()),
                                                            float(mine["threshold"].max())]}}
    y = {"field": metric, "type": "quantitative"}
    scrubbed = [{"filter": {"param": SCRUB}}]
    layers: list[dict[str, Any]] = [
        {"data": {"name": "curves"}, "mark": {"type": "line"},
         "encoding": {"x": x, "y": {**y, "title": metric, "scale": {"zero": False}},
                      "color": {"field": "mode", "type": "nominal", "title": "mode", "legend": {"orient": "bottom"}},
                      "strokeDash": {"condition": {"test": f"datum.mode === {json.dumps(mode)}", "value": [1, 0]},
                                     "value": [4, 3]}}},
        {"data": {"name": "mine"}, "mark": {"type": "point", "opacity": 0}, "name": "catcher",
         "params": [{"name": SCRUB, "value": [{"threshold": 2.0}], "select": {
             "type": "point", "fields": ["threshold"], "on": "pointerover", "nearest": True, "clear": False}}],
         "encoding": {"x": x, "y": y}},
        {"data": {"name": "mine"}, "mark": {"type": "rule", "color": "#555"}, "transform": scrubbed,
         "encoding": {"x": x}},
        {"data": {"name": CURRENT}, "mark": {"type": "point", "shape": "diamond", "size": 200, "filled": True,
                                             "color": "black"},
         "encoding": {"x": x, "y": y, "tooltip": [{"field": "threshold", "type": "quantitative"}, y]}}]
    datasets = {"curves": _records(grid), "mine": _records(mine), "panel": _records(long)}
    if recommended is not None:
        point = grid[(grid["mode"] == recommended[0]) & (grid["threshold"] == recommended[1])]
        if len(point):
            label = f"recommended: {recommended[0]} at C = {recommended[1]:g}"
            datasets["recommended"] = _records(point.assign(label=label))
            layers.append({"data": {"name": "recommended"}, "encoding": {
                "x": x, "y": y, "tooltip": [{"field": "label", "type": "nominal"}, y]}, "mark": {
                "type": "point", "shape": "circle", "size": 420, "filled": False, "color": "#dc2626",
                "strokeWidth": 3}})
    num = ("(datum.value != 0 && (abs(datum.value) < 1e-3 || abs(datum.value) >= 1e5) ? format(datum.value, '.3e')"
           " : format(datum.value, '.4~g'))")  # rcdiag.numbers.fmt's rule (the cards'): 2.164e-7, never 0.0000
    line = ("datum.metric + ': ' + (datum.share ? format(100 * datum.value, '.2f') + ' %' : " + num + ") + '  (Δ ' + "
            "(datum.share ? format(100 * (datum.value - datum.base), '+.2f') + ' pp' : "
            "format(datum.value - datum.base, '+.4~g')) + ')'")
    panel = {"title": "At the hovered threshold (Δ vs no correction)", "vconcat": [
        {"data": {"name": "mine"}, "mark": {"type": "text", "align": "left", "fontSize": 13, "fontWeight": "bold"},
         "transform": [*scrubbed, {"calculate": f"{json.dumps(mode + ' at C = ')} + format(datum.threshold, "
                                                "'.3~g')", "as": "label"}],
         "encoding": {"text": {"field": "label", "type": "nominal"}}, "width": 300, "height": 20},
        {"data": {"name": "panel"}, "mark": {"type": "text", "align": "left", "fontSize": 12},
         "transform": [*scrubbed, {"calculate": line, "as": "line"}],
         "encoding": {"y": {"field": "metric", "type": "nominal", "sort": names, "axis": None},
                      "text": {"field": "line", "type": "nominal"}}, "width": 300, "height": 280}]}
    return {"$schema": "https://vega.github.io/schema/vega-lite/v6.json", "datasets": datasets,
            "hconcat": [{"layer": layers, "width": 500, "height": 320}, panel]}


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-safe records (NaN → None, which Vega skips)."""
    return json.loads(frame.to_json(orient="records"))


def place(spec: dict[str, Any], threshold: float, value: float) -> dict[str, Any]:
    """`spec` (a fresh copy: st.cache_data returns one per call) with the slider's setting: the diamond at
    (threshold, value) and the read-out there."""
    metric = spec["hconcat"][0]["layer"][0]["encoding"]["y"]["field"]
    spec["datasets"][CURRENT] = [{"threshold": threshold, metric: value}]
    spec["hconcat"][0]["layer"][1]["params"][0]["value"] = [{"threshold": threshold}]
    return spec
