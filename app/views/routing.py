"""Routing page (MoE runs with routes only; app/dashboard.py shows it when the sidebar's run has a routing
section): how often the engine and the trainer chose the same experts, layer by layer, and how |ℓ| grows with the
layers whose experts differ — the report's Routing section, from the report's own judgement (app/judged.py)."""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import judged, ui
from app.text import md
from rcdiag.report.routing_section import explains_line, layer_rows


def render(ref: Any) -> None:
    report = judged.report(*ref.key)
    found = report.routing
    if found.error:
        st.error(f"Routing not computed: {md(found.error)}")
        return
    summary = found.summary
    if summary is None:
        st.info("This run carries no routes (a dense model, or a run scored or imported without route capture).")
        return
    cause = report.verdict.cause
    if cause.kind == "routing":
        (st.error if report.verdict.status == "alarm" else st.warning)(f"**{md(cause.title)}** — {md(cause.action)}")
    st.caption(md(explains_line(summary, found.probe, ref.path)))
    if summary.agreement:
        cols = st.columns(4)
        cols[0].metric("tokens with a differing layer", f"{summary.any_disagree_share:.1%}")
        cols[1].metric("(token, layer) choices that agree", f"{summary.exact_rate:.1%}")
        cols[2].metric("mean overlap |∩|/k", f"{summary.mean_overlap:.1%}")
        share = summary.explains
        cols[3].metric("routing explains", "n/a" if share is None or share.share != share.share else
                       f"{share.share:.0%}", help=None if share is None else f"{share.method}; mean |ℓ| "
                       f"{share.gap:.3g}, {share.agreeing_gap:.3g} where every layer agrees")
    layers = pd.DataFrame(layer_rows(summary))
    left, right = st.columns(2)
    if summary.agreement:
        with left:
            st.subheader("Disagreement by layer")  # a few % at most: agreement bars would all read as full
            st.caption("another expert set: tokens whose top-k set differs; experts not shared: 1 − |∩|/k")
            differ = pd.DataFrame({"another expert set": 1.0 - layers["exact"],
                                   "experts not shared": 1.0 - layers["overlap"]}).set_index(layers["layer"])
            st.bar_chart(differ, stack=False, x_label="MoE layer", y_label="share of tokens")
        with right:
            st.subheader("|ℓ| by agreement")
            rows = pd.DataFrame([r for r in summary.by_disagreement if r["tokens"]])
            st.bar_chart(rows.set_index("layers_disagree")[["mean_abs_log_ratio"]], x_label="layers whose experts "
                         "differ", y_label="mean |ℓ|")
        st.dataframe(pd.DataFrame(summary.by_disagreement)[["layers_disagree", "tokens", "share",
                                                            "mean_abs_log_ratio"]], hide_index=True,
                     key="routing_by_disagreement")
    st.subheader("By layer: agreement and router confidence")
    st.dataframe(layers, hide_index=True, key="routing_by_layer")
    if summary.by_margin:
        st.subheader(f"By the token's smallest router margin ({summary.margin_side})")
        st.dataframe(pd.DataFrame([r for r in summary.by_margin if r["tokens"]]), hide_index=True,
                     key="routing_by_margin")


ui.run_page("Routing", render)
