"""The IS simulator's sweep chart: curves of one metric over the dense threshold grid for every mode, the slider's
setting (black diamond), the report's recommended setting (red ring), and a read-out panel that follows the mouse — Vega
scrubs it in the browser, no rerun.

The chart's Vega-Lite spec depends on the run, mode, lower bound, convention and curve only; it is built and
validated once (Altair costs ~0.3 s per build) and cached. The slider's threshold enters afterwards (`place`): the
diamond's one-row dataset and the read-out's initial position, so moving the slider re-draws without rebuilding.
"""
from __future__ import annotations

from typing import Any

import altair as alt
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
    """The validated spec: `rows` the chosen mode's sweep (with its lower bound; the UNCORRECTED row is the
    panel's baseline), `others` every mode without a lower bound, `recommended` (mode, C) of the report or None."""
    base = rows[rows["threshold"] == data.UNCORRECTED].iloc[0]
    grid = others[others["threshold"] < data.UNCORRECTED]
    mine = rows[rows["threshold"] < data.UNCORRECTED].reset_index(drop=True)
    hover = alt.selection_point(name=SCRUB, fields=["threshold"], on="pointerover", nearest=True, clear=False,
                                value=[{"threshold": 2.0}])
    x = alt.X("threshold:Q", scale=alt.Scale(type="log", domain=[min(mine["threshold"]), max(mine["threshold"])],
                                           nice=False), title="threshold C (log scale)")
    y = alt.Y(f"{metric}:Q", title=metric, scale=alt.Scale(zero=False))
    lines = alt.Chart(grid).mark_line().encode(
        x=x, y=y, color=alt.Color("mode:N", title="mode", legend=alt.Legend(orient="bottom")),
        strokeDash=alt.condition(alt.datum.mode == mode, alt.value([1, 0]), alt.value([4, 3])))
    catcher = alt.Chart(mine).mark_point(opacity=0).encode(x=x, y=f"{metric}:Q").add_params(hover)
    rule = alt.Chart(mine).mark_rule(color="#555").encode(x=x).transform_filter(hover)
    current = alt.Chart(alt.NamedData(name=CURRENT)).mark_point(
        size=200, shape="diamond", filled=True, color="black").encode(x=x, y=f"{metric}:Q",
                                                                      tooltip=["threshold:Q", f"{metric}:Q"])
    layers = [lines, catcher, rule, current]
    if recommended is not None:
        point = grid[(grid["mode"] == recommended[0]) & (grid["threshold"] == recommended[1])]
        if len(point):
            star = point.assign(label=f"recommended: {recommended[0]} at C = {recommended[1]:g}")
            layers.append(alt.Chart(star).mark_point(shape="circle", size=420, filled=False, color="#dc2626",
                                                     strokeWidth=3).encode(
                x=x, y=f"{metric}:Q", tooltip=["label:N", f"{metric}:Q"]))
    panel = _panel(mine, base, hover, mode)
    chart = alt.hconcat(alt.layer(*layers).properties(width=500, height=320), panel)
    return chart.to_dict()


def place(spec: dict[str, Any], threshold: float, value: float) -> dict[str, Any]:
    """`spec` with the slider's setting: the diamond at (threshold, value), the read-out there (a shallow copy:
    only the datasets and the top-level selection parameters — where Altair hoists them — are new)."""
    metric = spec["hconcat"][0]["layer"][0]["encoding"]["y"]["field"]
    params = [{**p, "value": [{"threshold": threshold}]} if p.get("name") == SCRUB else p
              for p in spec.get("params", [])]
    return {**spec, "datasets": {**spec.get("datasets", {}), CURRENT: [{"threshold": threshold, metric: value}]},
            "params": params}


def _panel(mine: pd.DataFrame, base: pd.Series, hover: alt.Parameter, mode: str) -> alt.Chart:
    names = [n for n in SHOWN if n in mine.columns]
    long = mine.melt(id_vars=["threshold"], value_vars=names, var_name="metric", value_name="value")
    long["base"] = long["metric"].map({n: float(base[n]) for n in names})
    long["share"] = long["metric"].isin(FRACTIONS)
    text = ("datum.metric + ': ' + (datum.share ? format(100 * datum.value, '.2f') + ' %' : format(datum.value, "
            "'.4f')) + '  (Δ ' + (datum.share ? format(100 * (datum.value - datum.base), '+.2f') + ' pp' : "
            "format(datum.value - datum.base, '+.4~g')) + ')'")
    head = alt.Chart(mine).mark_text(align="left", fontWeight="bold", fontSize=13).encode(
        text="label:N").transform_filter(hover).transform_calculate(
        label=f"'{mode} at C = ' + format(datum.threshold, '.3~g')").properties(height=20, width=300)
    body = alt.Chart(long).mark_text(align="left", fontSize=12).encode(
        y=alt.Y("metric:N", sort=names, axis=None), text="line:N").transform_filter(hover).transform_calculate(
        line=text).properties(height=280, width=300)
    return alt.vconcat(head, body).properties(title="At the hovered threshold (Δ vs no correction)")
