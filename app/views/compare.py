"""Compare page: two or more runs side by side (metrics table, overlaid ℓ histograms and strata)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from app import aggregates, charts, data, ui
from rcdiag.store.names import unique_run_names

TABLE_METRICS = ("tokens", "sequences", "empty_sequences", "kl", "k3_kl", "chi2_token", "chi2_seq",
                 "log_ppl_diff", "log_ppl_abs_diff", "ppl_ratio", "abs_log_ratio_mean", "abs_log_ratio_p99",
                 "abs_log_ratio_max", "ess", "is_weight_mean", "clipped_frac")


def render() -> None:
    st.header("Compare runs")
    known = list(dict.fromkeys([*st.session_state.get(ui.GIVEN, []), *st.session_state.get(ui.OPENED, [])]))
    chosen = st.multiselect("Runs", known, default=known[:4], format_func=lambda p: Path(p).name,
                            key="cmp_runs", help="The runs given on the command line and those opened in the sidebar.")
    extra = st.text_input("Add a run directory", key="cmp_add", placeholder="runs/other")
    paths = list(dict.fromkeys([*chosen, *([extra.strip()] if extra.strip() else [])]))
    refs = [ref for ref in (_open(p) for p in paths) if ref is not None]
    if len(refs) < 2:
        st.info("Choose at least two runs to compare.")
        return
    names = unique_run_names([r.path for r in refs])
    table = _table(refs, names)
    st.dataframe(table, key="cmp_table", width="stretch", height=35 * (len(table) + 1) + 3)
    _overlays(refs, names)


def _open(path: str) -> data.RunRef | None:
    try:
        return ui.open_allowed(path)
    except Exception as exc:  # one bad run must not hide the others
        st.error(f"{path}: {exc}")
        return None


def _table(refs: list[data.RunRef], names: list[str]) -> pd.DataFrame:
    """Rows: metrics (TABLE_METRICS present in any run); columns: runs; values formatted with ui.fmt."""
    columns = {}
    for ref, name in zip(refs, names, strict=True):
        columns[name] = aggregates.headline(*ref.key)
    rows = [m for m in TABLE_METRICS if any(m in v for v in columns.values())]
    return pd.DataFrame({name: [ui.fmt(v.get(m)) for m in rows] for name, v in columns.items()},
                        index=pd.Index(rows, name="metric"))


def _overlays(refs: list[data.RunRef], names: list[str]) -> None:
    results = [aggregates.distributions(*ref.key, None) for ref in refs]
    limit = max(r["tails"].max_abs for r in results) or None
    hist = pd.concat([aggregates.histogram(r["tails"], limit).assign(run=n) for r, n in zip(results, names, strict=True)],
                     ignore_index=True)
    st.markdown("**ℓ histograms** (log counts, overlaid)")
    st.altair_chart(charts.histogram(hist, colour="run"), width="stretch", key="cmp_hist")
    cols = st.columns(len(aggregates.SHOWN_STRATA))
    for col, name in zip(cols, aggregates.SHOWN_STRATA, strict=True):
        merged = pd.concat([r["strata"][name].assign(run=n) for r, n in zip(results, names, strict=True)],
                           ignore_index=True)
        title = aggregates.strata_title(name)
        col.markdown(f"**ℓ by {title}**")
        col.altair_chart(charts.strata(merged, title, colour="run"), width="stretch", key=f"cmp_by_{name}")


ui.guarded(render)
