"""Probes page: the mismatch budget of a run's probes (RUN/probes/*.json from `rcdiag probe`), table and bars."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from app import charts, ui
from app.text import md
from rcdiag.errors import InputError
from rcdiag.probe.answer import divergence_rows, probe_answer
from rcdiag.probe.files import list_probes
from rcdiag.probe.summary import DISTANCE_NAMES, budget_frame, settings_frame
from rcdiag.store.files import MAX_MANIFEST_BYTES
from rcdiag.store.safefile import read_json

AGAINST = {"vs_reference": "the reference (float32 trainer, alone)", "vs_rollout": "the run's rollout log-probs",
           "vs_baseline": "the setting's own baseline (one factor changed)"}


@st.cache_data(max_entries=32)
def _summary(path: str, mtime: float) -> object:
    """The probe file's JSON, or the InputError's text: a FIFO there blocked the page forever, a 5,000-digit
    integer or deep nesting was a traceback (rcdiag.store.safefile)."""
    try:
        return read_json(Path(path), "probe summary", MAX_MANIFEST_BYTES)
    except InputError as exc:
        return str(exc)


def _section(summary: dict, name: str) -> dict:
    value = summary.get(name)
    return value if isinstance(value, dict) else {}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def render() -> None:
    ref = ui.current_run()
    if ref is None:
        return
    st.header(f"Probes · {ref.name}")
    files = list_probes(ref.path)
    if not files:
        st.info(f"No probe yet. Run `rcdiag probe {ref.path}` to find out which factor the mismatch comes from.")
        return
    chosen = st.selectbox("Probe", files[::-1], format_func=lambda f: f.stem, key="probe_choice")
    summary = _summary(str(chosen), chosen.stat().st_mtime)
    if isinstance(summary, str):
        st.error(f"Could not read the probe: {md(summary)}. Re-run `rcdiag probe`.")
        return
    if not isinstance(summary, dict):
        st.error(f"{md(chosen.name)} is not a probe summary (a JSON object); re-run `rcdiag probe`.")
        return
    gap, sample = _section(summary, "gap"), _section(summary, "sample")
    st.caption(f"{md(sample.get('sequences', '?'))} sequences · {md(sample.get('valid_tokens', '?'))} valid tokens "
               f"· temperature {md(summary.get('temperature', '?'))} · observed gap mean |ℓ| "
               f"{ui.fmt(_number(gap.get('mean_abs')))}, k3_kl {ui.fmt(_number(gap.get('k3_kl')))}")
    st.success(md(probe_answer(summary).top_line))  # text, not Markdown, as the notes
    budget = budget_frame(summary)
    residual = budget.dropna(subset=["residual"]).sort_values("residual")
    st.subheader("Residual gap if you change one setting")
    st.dataframe(residual[["change", "residual_mean_abs", "residual", "removes", "factor", "setting"]],
                 hide_index=True, key="probe_residual_table")
    headers, div_rows = divergence_rows(summary)
    if div_rows:
        st.subheader("Whole next-token distributions (exact)")
        st.dataframe(pd.DataFrame(div_rows, columns=headers), hide_index=True, key="probe_divergence_table")
    st.subheader("Mismatch budget")
    st.markdown("Share = mean |setting − baseline| ÷ mean |rollout − reference|: how far this factor alone moves "
                "the log-probs, relative to the observed gap (not additive; can exceed 1).")
    charts.draw(st, charts.spec("budget", budget), key="probe_budget_chart")  # JSON: no Altair import (0.2 s)
    st.dataframe(budget, hide_index=True, key="probe_budget_table")
    against = st.radio("Distances to", list(AGAINST), format_func=AGAINST.get, horizontal=True, key="probe_against")
    table = settings_frame(summary, against)
    if table.empty:
        st.info("This probe holds no settings (its grid was empty): nothing to compare. Run `rcdiag probe` with "
                "--factors naming at least one factor.")
    else:
        st.dataframe(table[["setting", "factor", "side", *DISTANCE_NAMES, "description"]], hide_index=True,
                     key="probe_distances")
    notes = summary.get("notes")
    for note in notes if isinstance(notes, list) else [] if notes is None else [notes]:
        st.info(md(note))  # a probe file's text, shown as text: Markdown in it would load remote images
    with st.expander("Probe summary (JSON)"):
        st.json(summary, expanded=False)


ui.guarded(render)
