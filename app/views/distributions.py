"""Distributions page: ℓ histogram, b-vs-a density and ℓ by position / rollout probability / entropy, filtered by
finish reason, reward and response length."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from app import aggregates, charts, data, distview, ui


def render(ref: data.RunRef) -> None:
    _view(ref)


@st.fragment
def _view(ref: data.RunRef) -> None:
    """Filters (a form: one rescan per "Apply", not one per slider step) and the charts, as one fragment: applying
    reruns this, not the page."""
    index = data.sequence_index(*ref.key)
    with st.form("dist_filters"):
        filters = _filters(index)
        st.form_submit_button("Apply filters", key="dist_apply")
    keep = None if filters is None else data.seq_ids_where(index, *filters)
    if keep is not None and keep.size == 0:
        st.warning("No sequence passes these filters.")
        return
    shown = distview.view(*ref.key, filters)
    if shown["tokens"] == 0:
        st.warning("No valid token (mask true, both log-probs finite) in the selected sequences.")
        return
    stats = shown["stats"]
    st.caption(f"{shown['tokens']:,} valid tokens in {len(index) if keep is None else keep.size:,} sequences · "
               f"mean |ℓ| {ui.fmt(stats['abs_log_ratio_mean'])} · p99 |ℓ| {ui.fmt(stats['abs_log_ratio_p99'])} · "
               f"max |ℓ| {ui.fmt(stats['abs_log_ratio_max'])}")
    specs = shown["charts"]
    left, right = st.columns(2)
    left.markdown("**ℓ histogram** (log counts)")
    charts.draw(left, specs["histogram"], key="dist_hist")
    right.markdown("**Rollout b vs training a** (token density, log colour; dashed: a = b)")
    charts.draw(right, specs["density"], key="dist_density")
    cols = st.columns(len(aggregates.SHOWN_STRATA))
    for col, name in zip(cols, aggregates.SHOWN_STRATA, strict=True):
        col.markdown(f"**ℓ by {aggregates.strata_title(name)}**")
        charts.draw(col, specs[name], key=f"dist_by_{name}")
    tables = st.expander("Strata tables", key="dist_tables", on_change="rerun")
    if tables.open:  # drawn only while open (a table and its selector cost ~30-40 ms of every rerun), one at a time
        with tables:
            name = st.selectbox("Stratification", list(shown["strata"]), format_func=aggregates.strata_title,
                                key="dist_table_choice")
            st.dataframe(shown["strata"][name], hide_index=True, key="dist_table")


def _filters(index: pd.DataFrame) -> aggregates.Filters | None:
    """Filter widgets; their (finish reasons, reward range, length range), or None when nothing is filtered out."""
    cols = st.columns(3)
    reasons = sorted(index["finish_reason"].fillna("(none)").unique())
    finish = cols[0].multiselect("Finish reason", reasons, default=reasons, key="dist_finish")
    reward = _range(cols[1], "Reward", index["reward"], "dist_reward", float)
    length = _range(cols[2], "Response length", index["response_len"], "dist_length", int)
    chosen = (None if set(finish) == set(reasons) else tuple(finish), reward, length)
    return None if chosen == (None, None, None) else chosen


def _range(col, label: str, values: pd.Series, key: str, kind: type) -> tuple[float, float] | None:
    """A range slider over the column's finite values; None when it has fewer than two distinct values or the
    whole range is chosen (then sequences without a value are kept too)."""
    finite = values.to_numpy(dtype=float, na_value=np.nan)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0 or finite.min() == finite.max():
        col.caption(f"{label}: {'not recorded' if finite.size == 0 else f'all {kind(finite[0])}'}")
        return None
    lo, hi = kind(finite.min()), kind(finite.max())
    chosen = col.slider(label, min_value=lo, max_value=hi, value=(lo, hi), key=key)
    return None if tuple(chosen) == (lo, hi) else (float(chosen[0]), float(chosen[1]))


ui.run_page("Distributions", render)
