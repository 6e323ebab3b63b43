"""Altair charts of the dashboard, fed with the small aggregated frames of app.aggregates, and drawn from cached
Vega-Lite specs.

Building an Altair chart and validating it (`to_dict`) costs 0.1–0.3 s per chart on every rerun — most of a page's
time. `draw` builds each (chart kind, data, options) once, keeps its validated Vega-Lite dict (st.cache_data), and
hands that dict to `st.vega_lite_chart`: a rerun then costs a hash of the small frame.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

STRATA_DASHES = "solid: mean ℓ, dashed: mean |ℓ|"
"""How the strata charts of several runs tell the two statistics apart."""
RUN_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
"""Colours of runs on the Compare page, in run order (colour means run in every chart there)."""


def run_colours(names: list[str] | tuple[str, ...]) -> alt.Scale:
    """One fixed colour per run (the same in every chart, so one legend reads for all)."""
    return alt.Scale(domain=list(names), range=[RUN_PALETTE[i % len(RUN_PALETTE)] for i in range(len(names))])


def draw(where: Any, kind: str, frame: pd.DataFrame, key: str, **options: Any) -> Any:
    """Draw chart `kind` (histogram, density, strata) of `frame` with `options` (hashable: str, tuples) at `where`
    (st or a column) from its cached spec; `runs=(names…)` colours by run (run_colours). Returns the element."""
    return where.vega_lite_chart(spec(kind, frame, tuple(sorted(options.items()))), width="stretch", key=key)


@st.cache_data(max_entries=512, show_spinner=False)
def spec(kind: str, frame: pd.DataFrame, options: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """The validated Vega-Lite dict of chart `kind` for (frame, options), built once."""
    kwargs = dict(options)
    runs = kwargs.pop("runs", None)
    if runs is not None:
        kwargs["scale"] = run_colours(runs)
    return KINDS[kind](frame, **kwargs).to_dict()


def histogram(frame: pd.DataFrame, colour: str | None = None, scale: alt.Scale | None = None) -> alt.Chart:
    """ℓ histogram with log counts: frame (lo, hi, count[, run]); one run as bars, several as overlaid steps
    coloured by `colour` (with `scale`)."""
    x = alt.X("lo:Q", title="ℓ = a − b (nats)")
    y = alt.Y("count:Q", scale=alt.Scale(type="log", domainMin=0.8), title="tokens (log scale)")
    tooltip = ["lo", "hi", "count"] + ([colour] if colour else [])
    if colour:
        return alt.Chart(frame).mark_line(interpolate="step-after").encode(
            x=x, y=y, color=alt.Color(f"{colour}:N", scale=scale or alt.Undefined, title=colour), tooltip=tooltip)
    bars = frame.assign(base=0.8)
    return alt.Chart(bars).mark_rect(color="#2563eb").encode(x=x, x2="hi:Q", y=y, y2="base:Q", tooltip=tooltip)


def density(frame: pd.DataFrame) -> alt.Chart:
    """b-vs-a density heat map with log colour: frame (a_lo, a_hi, b_lo, b_hi, count)."""
    diagonal = pd.DataFrame({"v": [float(min(frame["a_lo"].min(), frame["b_lo"].min())), 0.0]})
    cells = alt.Chart(frame).mark_rect().encode(
        x=alt.X("a_lo:Q", title="training log-prob a"), x2="a_hi:Q",
        y=alt.Y("b_lo:Q", title="rollout log-prob b"), y2="b_hi:Q",
        color=alt.Color("count:Q", scale=alt.Scale(type="log", scheme="viridis"), title="tokens"),
        tooltip=["a_lo", "b_lo", "count"])
    line = alt.Chart(diagonal).mark_line(color="red", strokeDash=[4, 3]).encode(x="v:Q", y="v:Q")
    return cells + line


def strata(frame: pd.DataFrame, title: str, colour: str | None = None, scale: alt.Scale | None = None) -> alt.Chart:
    """Mean ℓ and mean |ℓ| per bucket, buckets in row order: frame (bucket, tokens, mean_log_ratio, mean_abs[, run])
    as rcdiag.analysis.strata rows. With `colour` (several runs) colour is the run (`scale`) and the dash the
    statistic (solid: mean ℓ, dashed: mean |ℓ|; STRATA_DASHES, said in words next to the chart — a second legend
    is clipped in a narrow column); alone, colour is the statistic."""
    long = frame.melt(id_vars=[c for c in ("bucket", "tokens", colour) if c],
                      value_vars=["mean_log_ratio", "mean_abs"], var_name="statistic", value_name="value")
    order = list(dict.fromkeys(frame["bucket"]))
    legend = alt.Legend(orient="bottom", title=None)
    if colour:
        enc = {"color": alt.Color(f"{colour}:N", scale=scale or alt.Undefined, legend=legend),
               "strokeDash": alt.StrokeDash("statistic:N", legend=None, scale=alt.Scale(
                   domain=["mean_log_ratio", "mean_abs"], range=[[1, 0], [4, 3]]))}
    else:
        enc = {"color": alt.Color("statistic:N", legend=legend)}
    return alt.Chart(long).mark_line(point=True).encode(
        x=alt.X("bucket:N", sort=order, title=title), y=alt.Y("value:Q", title="nats"),
        tooltip=["bucket", "statistic", "value", "tokens"] + ([colour] if colour else []), **enc)


KINDS: dict[str, Callable[..., alt.TopLevelMixin]] = {"histogram": histogram, "density": density, "strata": strata}
"""The chart kinds `draw` knows."""
