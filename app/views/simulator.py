"""IS simulator page: pick mode, convention, lower bound and threshold; see the IS metrics against "no correction"
and the threshold sweep, which the mouse scrubs in the browser (no rerun).

One cached pass sweeps every threshold of `data.threshold_grid()` (log-spaced, finer near 1) plus the uncorrected
row, so the threshold slider and the hover panel only look rows up. Combinations a convention cannot express
(a lower bound L under swift, or under verl for truncation) are disabled with the reason instead of failing.
"""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from app import data, state, ui
from app.simvalues import CURVES, FRACTIONS, MEANING, SHOWN, lower_refusal, shown
from rcdiag.analysis.conventions import CONVENTIONS
from rcdiag.analysis.correction import DEFAULT_THRESHOLD, MODES


def render(ref: data.RunRef) -> None:
    _controls(ref)


@st.fragment
def _controls(ref: data.RunRef) -> None:
    """Controls, cards and chart as one fragment: a change reruns this, not the page."""
    grid = data.threshold_grid()
    state.bind("sim_mode", "mode", str, MODES.__contains__)
    state.bind("sim_convention", "convention", str, CONVENTIONS.__contains__)
    state.bind("sim_threshold", "threshold", float, grid.__contains__)
    state.bind("sim_lower", "lower", float, lambda v: 0 < v <= 1)
    if st.session_state.get("sim_lower") is not None and "sim_use_lower" not in st.session_state:
        st.session_state["sim_use_lower"] = "lower" in st.query_params
    st.session_state.setdefault("sim_threshold", DEFAULT_THRESHOLD)
    st.session_state.setdefault("sim_lower", 0.5)
    left, mid, right = st.columns([1, 2, 1])
    mode = left.selectbox("Mode", list(MODES), key="sim_mode")
    convention = left.selectbox("Convention", list(CONVENTIONS), key="sim_convention",
                                help="canonical = METRICS.md; the others reproduce each framework's own numbers")
    threshold = mid.select_slider("Threshold C (log scale)", options=grid, key="sim_threshold",
                                  format_func=lambda c: f"{c:g}",
                                  help="Ratios above C are truncated to C (truncate) or dropped (mask).")
    refusal = lower_refusal(mode, convention)
    use_lower = right.checkbox("Lower bound L", key="sim_use_lower", disabled=refusal is not None,
                               help=refusal or "Ratios below L are raised to L (truncate) or dropped (mask).")
    use_lower = use_lower and refusal is None
    lower = right.number_input("L", min_value=0.01, max_value=1.0, step=0.01, key="sim_lower",
                               disabled=not use_lower)
    if refusal:
        right.caption(f"Lower bound unavailable: {refusal}.")
    lower_value = float(lower) if use_lower else None
    for name, value in (("mode", mode), ("convention", convention), ("threshold", f"{threshold:g}"),
                        ("lower", lower_value)):
        state.publish(name, value)
    rows = data.sweep_grid(*ref.key, (mode,), lower_value, convention)
    at = rows[rows["threshold"] == float(threshold)].iloc[0]
    base = rows[rows["threshold"] == data.UNCORRECTED].iloc[0]
    _cards(at, base)
    st.subheader("Threshold sweep")
    others = data.sweep_grid(*ref.key, tuple(MODES), None, convention)
    _sweep_chart(rows, others, mode, float(threshold), base)


def _cards(at: pd.Series, base: pd.Series) -> None:
    st.caption("Each value with its change against no correction (the raw ratios as weights).")
    columns = st.columns(5)
    for i, name in enumerate(n for n in SHOWN if n in at.index):
        value, before = float(at[name]), float(base[name])
        delta = value - before
        change = (f"{100 * delta:+.2f} pp" if name in FRACTIONS else f"{delta:+.4g}") if delta == delta else None
        columns[i % 5].metric(name, shown(name, value), change if delta else "no change", delta_color="off",
                              delta_arrow="auto" if delta else "off", help=MEANING.get(name))


def _sweep_chart(rows: pd.DataFrame, others: pd.DataFrame, mode: str, threshold: float, base: pd.Series) -> None:
    """Curves of one metric for every mode (no lower bound), the current setting marked, and a panel with every
    value of the chosen mode at the hovered threshold: scrubbing is Vega's, in the browser."""
    metric = st.radio("Curve", [c for c in CURVES if c in others.columns], horizontal=True, key="sim_curve")
    grid = others[others["threshold"] < data.UNCORRECTED]
    mine = rows[rows["threshold"] < data.UNCORRECTED].reset_index(drop=True)
    hover = alt.selection_point(name="scrub", fields=["threshold"], on="pointerover", nearest=True, clear=False,
                                value=[{"threshold": threshold}])
    x = alt.X("threshold:Q", scale=alt.Scale(type="log", domain=[min(mine["threshold"]), max(mine["threshold"])],
                                           nice=False), title="threshold C (log scale)")
    lines = alt.Chart(grid).mark_line().encode(
        x=x, y=alt.Y(f"{metric}:Q", title=metric, scale=alt.Scale(zero=False)), color=alt.Color("mode:N", title="mode", legend=alt.Legend(orient="bottom")),
        strokeDash=alt.condition(alt.datum.mode == mode, alt.value([1, 0]), alt.value([4, 3])))
    catcher = alt.Chart(mine).mark_point(opacity=0).encode(x=x, y=f"{metric}:Q").add_params(hover)
    rule = alt.Chart(mine).mark_rule(color="#555").encode(x=x).transform_filter(hover)
    current = alt.Chart(pd.DataFrame({"threshold": [threshold], metric: [float(mine.loc[
        mine["threshold"] == threshold, metric].iloc[0])]})).mark_point(
        size=200, shape="diamond", filled=True, color="black").encode(x=x, y=f"{metric}:Q")
    panel = _panel(mine, base, hover, mode)
    chart = alt.hconcat((lines + catcher + rule + current).properties(width=500, height=320), panel)
    st.altair_chart(chart, key="sim_sweep_chart", width="content")
    st.caption(f"Hover the curves to read every value of {mode} at that threshold (right); the diamond is the "
               "slider's setting. Dashed: the other modes (no lower bound).")


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


ui.run_page("IS simulator", render)
