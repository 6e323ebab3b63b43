"""IS simulator page: pick mode, convention, lower bound and threshold; see the IS metrics against "no correction"
and the threshold sweep, which the mouse scrubs in the browser (no rerun).

One cached pass sweeps every threshold of `data.threshold_grid()` (log-spaced, finer near 1) plus the uncorrected
row, so the threshold slider and the hover panel only look rows up. Combinations a convention cannot express
(a lower bound L under swift, or under verl for truncation) are disabled with the reason instead of failing.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import data, judged, simchart, simgates, state, ui
from app.simvalues import CURVES, FRACTIONS, MEANING, SHOWN, lower_refusal, shown
from app.text import md
from rcdiag.analysis.conventions import CONVENTIONS
from rcdiag.analysis.correction.modes import DEFAULT_THRESHOLD, MODES


def render(ref: data.RunRef) -> None:
    family = st.radio("Family", ["IS modes (ratio weights)", "Gate families (masks)"], horizontal=True,
                      key="sim_family", help="IS modes reweight or mask by the ratio; the gate families are the "
                      "frameworks' divergence masks (DPPO TV/KL, OpenRLHF, KPop, prime-rl, ROLL, SkyRL, NeMo-RL)")
    if family.startswith("Gate"):
        simgates.render(ref)
        return
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
                                help="canonical = docs/metrics.md; the others reproduce each framework's own numbers")
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
    others = data.sweep_grid(*ref.key, tuple(MODES), None, convention)  # one pass: every mode, no lower bound
    rows = (others[others["mode"] == mode].reset_index(drop=True) if lower_value is None
            else data.sweep_grid(*ref.key, (mode,), lower_value, convention))
    at = rows[rows["threshold"] == float(threshold)].iloc[0]
    base = rows[rows["threshold"] == data.UNCORRECTED].iloc[0]
    _cards(at, base)
    st.subheader("Threshold sweep")
    _sweep_chart(ref, list(others.columns), mode, lower_value, convention, float(threshold), at)


def _cards(at: pd.Series, base: pd.Series) -> None:
    st.caption("Each value with its change against no correction (the raw ratios as weights).")
    columns = st.columns(5)
    for i, name in enumerate(n for n in SHOWN if n in at.index):
        value, before = float(at[name]), float(base[name])
        delta = value - before
        change = (f"{100 * delta:+.2f} pp" if name in FRACTIONS else f"{delta:+.4g}") if delta == delta else None
        columns[i % 5].metric(name, shown(name, value), change if delta else "no change", delta_color="off",
                              delta_arrow="auto" if delta else "off", help=MEANING.get(name))


def _sweep_chart(ref: data.RunRef, columns: list[str], mode: str, lower: float | None, convention: str,
                 threshold: float, at: pd.Series) -> None:
    """The cached sweep chart of this setting (app.simchart) with the slider's setting placed in it, and the
    report's recommended setting marked (a button moves the controls there)."""
    metric = st.radio("Curve", [c for c in CURVES if c in columns], horizontal=True, key="sim_curve")
    advice = judged.recommendation(*ref.key)
    recommended = judged.recommended_setting(*ref.key)
    spec = simchart.chart(*ref.key, tuple(MODES), mode, lower, convention, metric, recommended)
    st.vega_lite_chart(simchart.place(spec, threshold, float(at[metric])), key="sim_sweep_chart", width="content")
    st.caption(f"Hover the curves to read every value of {mode} at that threshold (right); the black diamond is the "
               "slider's setting, which the read-out shows while the mouse is elsewhere. Dashed: the other modes (no "
               "lower bound).")
    if recommended is None:
        st.caption(f"The report recommends no setting here ({md(advice['kind'].replace('_', ' '))}): see the "
                   "Overview.")
        return
    st.caption(f"Red ring: the report's recommendation, {recommended[0]} at C = {recommended[1]:g} (canonical "
               f"convention, no lower bound). {md(advice['text'])}")
    st.button("Use the recommended setting", key="sim_use_recommended", on_click=_use, args=recommended)


def _use(mode: str, threshold: float) -> None:
    """Move the controls to (mode, C) with no lower bound (a button callback: runs before the widgets exist)."""
    st.session_state.update(sim_mode=mode, sim_threshold=threshold, sim_use_lower=False,
                            sim_convention="canonical")


ui.run_page("IS simulator", render)
