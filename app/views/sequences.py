"""Sequences page: a paged, sortable table of sequences; the selected one's prompt and its token strip."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import streamlit as st

from app import data, tokenstrip, ui

PAGE_SIZE = 25
# sort label → sequence_stats column (absent columns are not offered)
SORT_KEYS = {"max |ℓ|": "max_abs_log_ratio", "mean |ℓ|": "mean_abs_log_ratio", "sequence ratio": "seq_ratio",
             "log-PPL diff": "log_ppl_diff", "seq_id": "seq_id"}

TABLE_COLUMNS = ("seq_id", "n_valid", "mean_abs_log_ratio", "max_abs_log_ratio", "seq_ratio", "log_ppl_diff",
                 "finish_reason", "reward", "response_len", "prompt_id", "sample_index")
COLUMN_FORMATS = {name: st.column_config.NumberColumn(name, format="%.4g")
                  for name in ("mean_abs_log_ratio", "max_abs_log_ratio", "seq_ratio", "log_ppl_diff",
                               "mean_log_ratio", "sum_log_ratio", "training_log_ppl", "rollout_log_ppl")}
STATS_SHOWN = ("n_valid", "mean_abs_log_ratio", "max_abs_log_ratio", "seq_ratio", "log_ppl_diff")


def render(ref: data.RunRef) -> None:
    index = data.sequence_index(*ref.key)
    page = _page(ref, index)
    if page.empty:
        st.info("The run has no sequences.")
        return
    labels = {int(r.seq_id): f"seq {int(r.seq_id)}" for r in page.itertuples()}
    chosen = int(st.selectbox("Sequence", list(labels), format_func=labels.get, key="seq_select"))
    _detail(ref, chosen, index[index["seq_id"] == chosen].iloc[0])


def _page(ref: data.RunRef, index: pd.DataFrame) -> pd.DataFrame:
    """Sort controls and one page of the index, shown as a table (never more than PAGE_SIZE rows)."""
    options = {label: col for label, col in SORT_KEYS.items() if col in index.columns}
    left, mid, right = st.columns([2, 1, 1])
    label = left.selectbox("Sort by", list(options), key="seq_sort")
    descending = mid.toggle("Descending", value=True, key="seq_desc")
    pages = max(1, math.ceil(len(index) / PAGE_SIZE))
    number = right.number_input(f"Page (of {pages})", min_value=1, max_value=pages, value=1, key="seq_page")
    order = data.sequence_order(*ref.key, options[label], descending)
    page = index.iloc[order[(number - 1) * PAGE_SIZE: number * PAGE_SIZE]]
    shown = [c for c in TABLE_COLUMNS if c in page.columns]
    event = st.dataframe(page[shown + [c for c in page.columns if c not in shown]], hide_index=True,
                         key="seq_table", width="stretch", column_config=COLUMN_FORMATS, on_select="rerun",
                         selection_mode="single-row")
    _follow_table(page, event.selection.rows)
    st.caption(f"{len(index):,} sequences · rows {(number - 1) * PAGE_SIZE + 1}–"
               f"{(number - 1) * PAGE_SIZE + len(page)}")
    return page


def _follow_table(page: pd.DataFrame, rows: list[int]) -> None:
    """A row newly clicked in the table becomes the selected sequence (the selectbox below follows it)."""
    picked = int(page.iloc[rows[0]]["seq_id"]) if rows and rows[0] < len(page) else None
    if picked is not None and picked != st.session_state.get("seq_table_picked"):
        st.session_state["seq_select"] = picked
    st.session_state["seq_table_picked"] = picked


def _detail(ref: data.RunRef, seq_id: int, stats: pd.Series) -> None:
    row, tokens = data.sequence_detail(*ref.key, seq_id)
    st.subheader(f"Sequence {seq_id}")
    cols = st.columns(len(STATS_SHOWN))
    for col, name in zip(cols, STATS_SHOWN, strict=True):
        value = stats.get(name)
        col.metric(name, ui.fmt(None if value is None or pd.isna(value) else float(value)))
    facts = {k: row.get(k) for k in ("prompt_id", "sample_index", "finish_reason", "reward", "response_len")}
    st.caption(" · ".join(f"{k}: {v}" for k, v in facts.items() if v is not None))
    st.markdown("**Prompt**")
    st.text(row.get("prompt_text") or "(no prompt text in the run)")
    ids = tuple(int(t) if t == t else -1 for t in tokens["token_id"].to_numpy(dtype=float, na_value=np.nan))
    texts = data.decode_tokens(ref.manifest, ids)
    if texts is None:
        st.caption("No tokenizer found through the manifest's model path: tokens show as [id]. "
                   "Response text:")
        st.text(row.get("response_text") or "")
    lr = (tokens["train_logprob"] - tokens["rollout_logprob"]).to_numpy(dtype=float)
    finite = np.abs(lr[np.isfinite(lr)])
    default = float(max(finite.max(), 1e-3)) if finite.size else 1.0
    scale = st.columns([1, 3])[0].number_input("Colour scale: |ℓ| at full colour", min_value=1e-4, value=float(f"{default:.3g}"),
                            format="%.4g", key=f"seq_scale_{seq_id}")
    st.markdown("**Response** (hover a token for its log-probs)")
    st.html(tokenstrip.legend_html(scale))
    st.html(tokenstrip.strip_html(tokens, texts, scale))


ui.run_page("Sequences", render)
