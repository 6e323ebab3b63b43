"""The IS simulator's sweep chart: curves of one metric over the dense threshold grid for every mode, the slider's
setting (black diamond), the report's recommended setting (red ring), and a read-out panel that follows the mouse
— Vega scrubs it in the browser, no rerun — and shows the slider's setting while the mouse is elsewhere.

The Vega-Lite spec depends on the curve (its metric) and on whether the report recommends a setting, nothing else:
mode, lower bound, convention, threshold and the recommended point are rows of its named datasets. The browser
re-creates a Vega view only when the spec changes and otherwise swaps the changed datasets into the view it has
(Streamlit's chart element compares the spec), so a
threshold step, a mode or a convention redraws a few marks instead of compiling and laying out the whole chart
again (60–80 ms of the browser's main thread per control, measured). Written as JSON, not Altair (building and
validating it took 0.3–0.9 s per mode and curve); the datasets are cached per setting on small keys (hashing the
sweep frames for a cache key cost more than building them).
"""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import data
from app.simvalues import FRACTIONS, SHOWN

SCRUB = "scrub"
"""Name of the hover selection (empty while the mouse is off the curves: the read-out shows the slider's setting)."""
CURRENT = "current_setting"
"""Name of the diamond's dataset (the slider's threshold and its value), filled in by `place`."""
_SETTING = f"(length(data('{CURRENT}')) ? data('{CURRENT}')[0].threshold : null)"
_SHOWN_ROWS = (f"length(data('{SCRUB}_store')) ? vlSelectionTest('{SCRUB}_store', datum) "
               f": datum.threshold === {_SETTING}")
"""Vega expression: the hovered threshold's rows, else the slider's (vlSelectionTest is what Vega-Lite compiles a
param filter to; `data(name)` makes the filter follow that dataset)."""


def sweep_spec(metric: str, names: tuple[str, ...], ring: bool) -> dict[str, Any]:
    """The spec of the `metric` curve with the read-out listing `names` (SHOWN present in the sweep) and, if `ring`,
    the recommended point's layer (an empty layer makes Vega warn of an infinite extent), without data: `chart`
    fills its datasets. The x domain is the whole threshold grid (data.threshold_grid), the same for every mode and
    run."""
    grid = data.threshold_grid()
    x = {"field": "threshold", "type": "quantitative", "title": "threshold C (log scale)",
         "scale": {"type": "log", "nice": False, "domain": [min(grid), max(grid)]}}
    y = {"field": metric, "type": "quantitative"}
    shown = [{"filter": _SHOWN_ROWS}]
    layers: list[dict[str, Any]] = [
        {"data": {"name": "curves"}, "mark": {"type": "line"},
         "encoding": {"x": x, "y": {**y, "title": metric, "scale": {"zero": False}},
                      "color": {"field": "mode", "type": "nominal", "title": "mode", "legend": {"orient": "bottom"}},
                      "strokeDash": {"condition": {"test": "datum.chosen", "value": [1, 0]}, "value": [4, 3]}}},
        {"data": {"name": "mine"}, "mark": {"type": "point", "opacity": 0}, "name": "catcher",
         "params": [{"name": SCRUB, "select": {"type": "point", "fields": ["threshold"], "on": "pointerover",
                                               "nearest": True, "clear": "pointerout"}}],
         "encoding": {"x": x, "y": y}},
        {"data": {"name": "mine"}, "mark": {"type": "rule", "color": "#555"}, "transform": shown,
         "encoding": {"x": x}},
        {"data": {"name": CURRENT}, "mark": {"type": "point", "shape": "diamond", "size": 200, "filled": True,
                                             "color": "black"},
         "encoding": {"x": x, "y": y, "tooltip": [{"field": "threshold", "type": "quantitative"}, y]}}]
    if ring:
        layers.append({"data": {"name": "recommended"}, "encoding": {"x": x, "y": y, "tooltip": [
            {"field": "label", "type": "nominal"}, y]}, "mark": {
            "type": "point", "shape": "circle", "size": 420, "filled": False, "color": "#dc2626", "strokeWidth": 3}})
    num = ("(datum.value != 0 && (abs(datum.value) < 1e-3 || abs(datum.value) >= 1e5) ? format(datum.value, '.3e')"
           " : format(datum.value, '.4~g'))")  # rcdiag.numbers.fmt's rule (the cards'): 2.164e-7, never 0.0000
    line = ("datum.metric + ': ' + (datum.share ? format(100 * datum.value, '.2f') + ' %' : " + num + ") + '  (Δ ' + "
            "(datum.share ? format(100 * (datum.value - datum.base), '+.2f') + ' pp' : "
            "format(datum.value - datum.base, '+.4~g')) + ')'")
    panel = {"title": "At the hovered threshold (Δ vs no correction)", "vconcat": [
        {"data": {"name": "mine"}, "mark": {"type": "text", "align": "left", "fontSize": 13, "fontWeight": "bold"},
         "transform": [*shown, {"calculate": "datum.mode + ' at C = ' + format(datum.threshold, '.3~g')",
                                "as": "label"}],
         "encoding": {"text": {"field": "label", "type": "nominal"}}, "width": 300, "height": 20},
        {"data": {"name": "panel"}, "mark": {"type": "text", "align": "left", "fontSize": 12},
         "transform": [*shown, {"calculate": line, "as": "line"}],
         "encoding": {"y": {"field": "metric", "type": "nominal", "sort": list(names), "axis": None},
                      "text": {"field": "line", "type": "nominal"}}, "width": 300, "height": 280}]}
    return {"$schema": "https://vega.github.io/schema/vega-lite/v6.json",
            "hconcat": [{"layer": layers, "width": 500, "height": 320}, panel]}


def datasets(rows: pd.DataFrame, others: pd.DataFrame, mode: str, metric: str,
             recommended: tuple[str, float] | None) -> dict[str, pd.DataFrame]:
    """The datasets of `sweep_spec` but the slider's setting: `rows` the chosen mode's sweep (with its lower bound;
    the UNCORRECTED row is the read-out's baseline), `others` every mode without a lower bound, `recommended`
    (mode, C) of the report or None (then no "recommended" dataset). Only the columns the spec reads: each dataset
    travels as Arrow per rerun."""
    base = rows[rows["threshold"] == data.UNCORRECTED].iloc[0]
    grid = others[others["threshold"] < data.UNCORRECTED]
    mine = rows[rows["threshold"] < data.UNCORRECTED].reset_index(drop=True)
    names = [n for n in SHOWN if n in mine.columns]
    long = mine.melt(id_vars=["threshold"], value_vars=names, var_name="metric", value_name="value")
    long["base"] = long["metric"].map({n: float(base[n]) for n in names})
    long["share"] = long["metric"].isin(FRACTIONS)
    frames = {"curves": grid[["mode", "threshold", metric]].assign(chosen=grid["mode"] == mode),
              "mine": mine[["threshold", metric]].assign(mode=mode), "panel": long}
    if recommended is not None:
        point = grid[(grid["mode"] == recommended[0]) & (grid["threshold"] == recommended[1])]
        label = f"recommended: {recommended[0]} at C = {recommended[1]:g}"
        frames["recommended"] = point[["threshold", metric]].assign(label=label)
    return {name: frame.reset_index(drop=True) for name, frame in frames.items()}  # no index column in the Arrow


@st.cache_data(max_entries=256, show_spinner=False)
def chart(path: str, stamp: str, modes: tuple[str, ...], mode: str, lower: float | None, convention: str,
          metric: str, recommended: tuple[str, float] | None) -> dict[str, Any]:
    """The sweep chart of run (path, stamp) for one setting, without the slider's threshold (`place`): the spec of
    `metric` with its datasets, from the cached sweeps (data.sweep_grid: `modes` without a lower bound, and `mode`
    with `lower`). Keyed on these small arguments, never on frames."""
    others = data.sweep_grid(path, stamp, modes, None, convention)
    rows = (others[others["mode"] == mode].reset_index(drop=True) if lower is None
            else data.sweep_grid(path, stamp, (mode,), lower, convention))
    names = tuple(n for n in SHOWN if n in rows.columns)
    return {**sweep_spec(metric, names, recommended is not None),
            "datasets": datasets(rows, others, mode, metric, recommended)}


def place(spec: dict[str, Any], threshold: float, value: float) -> dict[str, Any]:
    """`spec` (a fresh copy: st.cache_data returns one per call) with the slider's setting: the diamond at
    (threshold, value), where the read-out stands while the mouse is off the curves."""
    metric = spec["hconcat"][0]["layer"][0]["encoding"]["y"]["field"]
    spec["datasets"][CURRENT] = pd.DataFrame({"threshold": [threshold], metric: [value]})
    return spec
