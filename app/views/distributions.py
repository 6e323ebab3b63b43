"""Distributions page: ℓ histogram, b-vs-a density and ℓ by position / rollout probability / entropy, filtered by
finish reason, reward and response length."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from app import aggregates, charts, data, ui


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
    result = aggregates.distributions(*ref.key, filters)
    tails = result["tails"]
    if tails.n == 0:
        st.warning("No valid token (mask true, both log-probs finite) in the selected sequences.")
        return
    stats = result["tail_stats"]
    st.caption(f"{tails.n:,} valid tokens in {len(index) if keep is None else keep.size:,} sequences · "
               f"mean |ℓ| {ui.fmt(stats['abs_log_ratio_mean'])} · p99 |ℓ| {ui.fmt(stats['abs_log_ratio_p99'])} · "
               f"max |ℓ| {ui.fmt(stats['abs_log_ratio_max'])}")
    specs = chart_specs(*ref.key, filters)
    left, right = st.columns(2)
    left.markdown("**ℓ histogram** (log counts)")
    charts.draw(left, specs["histogram"], key="dist_hist")
    right.markdown("**Rollout b vs training a** (token density, log colour; dashed: a = b)")
    charts.draw(right, specs["density"], key="dist_density")
    cols = st.columns(len(aggregates.SHOWN_STRATA))
    for col, name in zip(cols, aggregates.SHOWN_STRATA, strict=True):
        col.markdown(f"**ℓ by {aggregates.strata_title(name)}**")
        charts.draw(col, specs[name], key=f"dist_by_{name}")
    with st.expander("Strata tables"):  # one table at a time: each drawn table costs ~30 ms per rerun
        name = st.selectbox("Stratification", list(result["strata"]), format_func=aggregates.strata_title,
                            key="dist_table_choice")
        st.dataframe(result["strata"][name], hide_index=True, key="dist_table")


@st.cache_data(max_entries=64, show_spinner=False)
def chart_specs(path: str, stamp: str, filters: aggregates.Filters | None) -> dict[str, dict]:
    """The page's Vega-Lite specs for run (path, stamp) under `filters` (as aggregates.distributions takes them):
    histogram, density and one per shown stratification, built once per filter. Keyed on these small arguments:
    hashing the aggregated frames as a cache key on every rerun cost more than building the specs."""
    result = aggregates.distributions(path, stamp, filters)
    specs = {"histogram": charts.spec("histogram", aggregates.histogram(result["tails"])),
             "density": charts.spec("density", aggregates.density(result["tails"]))}
    for name in aggregates.SHOWN_STRATA:
        specs[name] = charts.spec("strata", result["strata"][name], title=aggregates.strata_title(name))
    return specs


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
