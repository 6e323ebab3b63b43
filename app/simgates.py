"""The simulator's gate families (rcdiag.analysis.correction.gates): one cached pass sweeps every gate over its δ grid; the
page picks a gate and δ and shows what it keeps — per advantage sign where the gate reads it — and the
survivors' ESS, with a chart of the kept share and ESS against δ."""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import data, runcheck
from app.simvalues import shown
from app.text import md
from rcdiag.analysis.correction.gate_defs import GATES

GATE_SHOWN = ("kept_token_frac", "kept_pos_frac", "kept_neg_frac", "kept_seq_frac", "ess", "is_weight_mean",
              "fraction_high", "fraction_low", "masked_seq_frac")
GATE_MEANING = {"kept_token_frac": "share of valid tokens the gate keeps",
                "kept_pos_frac": "kept share of tokens with advantage > 0", "kept_neg_frac": "kept share of tokens "
                "with advantage < 0", "kept_seq_frac": "share of sequences with a kept token",
                "ess": "ESS of the token ratios of the kept tokens", "is_weight_mean": "mean weight the framework "
                "applies (ρ or 1 on kept tokens, 0 on masked)", "fraction_high": "masked above the upper bound",
                "fraction_low": "masked below the lower bound", "masked_seq_frac": "sequences losing a token"}


@st.cache_data(show_spinner="Sweeping the gate families…", max_entries=16)
def gate_grid(path: str, stamp: str) -> pd.DataFrame:
    """rcdiag.gate_sweep of the run: every gate × its δ grid, one pass."""
    from rcdiag.analysis.correction.gates import gate_sweep

    return gate_sweep(runcheck.checked_run(path, stamp))


def chart(rows: pd.DataFrame, delta: float) -> dict[str, Any]:
    """Kept share and ESS against δ for one gate, the chosen δ ringed."""
    long = rows.melt(id_vars=["threshold"], value_vars=["kept_token_frac", "ess"], var_name="metric")
    x = {"field": "threshold", "type": "quantitative", "title": "δ", "scale": {"type": "log"}}
    return {"$schema": "https://vega.github.io/schema/vega-lite/v6.json", "width": 560, "height": 280,
            "data": {"values": long.to_dict(orient="records")}, "layer": [
                {"mark": {"type": "line", "point": True}, "encoding": {
                    "x": x, "y": {"field": "value", "type": "quantitative", "title": "share"},
                    "color": {"field": "metric", "type": "nominal", "legend": {"orient": "bottom"}}}},
                {"transform": [{"filter": f"datum.threshold == {delta}"}], "mark": {
                    "type": "point", "size": 300, "filled": False, "color": "black", "strokeWidth": 2},
                 "encoding": {"x": x, "y": {"field": "value", "type": "quantitative"}}}]}


def render(ref: data.RunRef) -> None:
    """Gate, δ, the cards and the chart."""
    frame = gate_grid(*ref.key)
    source = str(frame["advantage_source"].iloc[0]) if len(frame) else "none"
    names = list(dict.fromkeys(frame["gate"]))
    left, right = st.columns([1, 2])
    gate = left.selectbox("Gate", names, key="sim_gate", format_func=lambda g: f"{g} ({GATES[g].framework})")
    rows = frame[frame["gate"] == gate].reset_index(drop=True)
    grid = [float(t) for t in rows["threshold"]]
    default = GATES[gate].default if GATES[gate].default in grid else grid[0]
    delta = right.select_slider("δ (the gate's threshold)", options=grid, value=default, key=f"sim_delta_{gate}",
                                format_func=lambda d: f"{d:g}")
    st.caption(md(GATES[gate].doc) + f" — {md(GATES[gate].source)}. Advantages: {md(source)}"
               + ("" if source != "none" else " (the DPPO gates need them: not shown)") + ".")
    at = rows[rows["threshold"] == delta].iloc[0]
    columns = st.columns(5)
    for i, name in enumerate(GATE_SHOWN):
        columns[i % 5].metric(name, shown(name if name != "ess" else "ess", float(at[name])),
                              help=GATE_MEANING.get(name))
    st.vega_lite_chart(chart(rows, delta), key="sim_gate_chart", width="content")
