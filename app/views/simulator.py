"""IS simulator page: pick mode, threshold, lower bound and convention; see the IS metrics and the sweep curves."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from app import data, ui
from rcdiag.analysis.conventions import CONVENTIONS
from rcdiag.analysis.correction import DEFAULT_THRESHOLD, MODES

SHOWN = ("is_weight_mean", "ess", "clipped_frac", "kept_token_frac", "kept_seq_frac", "fraction_high",
         "fraction_low", "is_weight_std", "is_weight_min", "is_weight_max")
CURVES = ("is_weight_mean", "ess", "clipped_frac", "kept_token_frac")


def render(ref: data.RunRef) -> None:
    left, mid, right = st.columns(3)
    mode = left.selectbox("Mode", list(MODES), key="sim_mode")
    convention = left.selectbox("Convention", list(CONVENTIONS), key="sim_convention",
                                help="canonical = METRICS.md; the others reproduce each framework's own numbers")
    threshold = mid.slider("Threshold C", min_value=1.01, max_value=10.0, value=DEFAULT_THRESHOLD, step=0.01,
                           key="sim_threshold")
    use_lower = right.checkbox("Lower bound L", key="sim_use_lower")
    lower = right.number_input("L", min_value=0.0, max_value=1.0, value=0.5, step=0.01, key="sim_lower",
                               disabled=not use_lower)
    result = data.simulate(*ref.key, mode, float(threshold), float(lower) if use_lower else None, convention)
    columns = st.columns(5)
    for i, name in enumerate(n for n in SHOWN if n in result):
        columns[i % 5].metric(name, ui.fmt(result[name]))
    st.subheader("Threshold sweep")
    _sweep_chart(data.sweep(*ref.key, convention), mode, float(threshold), result)
    st.caption("Lines: rcdiag.sweep over the default thresholds (no lower bound); the marked point is the current "
               "setting (with its lower bound, if any).")


def _sweep_chart(sweep: pd.DataFrame, mode: str, threshold: float, result: dict[str, float]) -> None:
    metric = st.radio("Curve", [c for c in CURVES if c in sweep.columns], horizontal=True, key="sim_curve")
    lines = alt.Chart(sweep).mark_line(point=True).encode(
        x=alt.X("threshold:Q", scale=alt.Scale(type="log"), title="threshold C"),
        y=alt.Y(f"{metric}:Q", title=metric), color="mode:N",
        strokeDash=alt.condition(alt.datum.mode == mode, alt.value([1, 0]), alt.value([4, 3])),
        tooltip=["mode", "threshold", metric])
    current = pd.DataFrame({"threshold": [threshold], metric: [result.get(metric)], "mode": [mode]})
    point = alt.Chart(current).mark_point(size=220, shape="diamond", filled=True, color="black").encode(
        x="threshold:Q", y=f"{metric}:Q", tooltip=["mode", "threshold", metric])
    st.altair_chart(lines + point, width="stretch", key="sim_sweep_chart")


ui.run_page("IS simulator", render)
