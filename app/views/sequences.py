"""Sequences page: a paged, sortable table of sequences; the selected one's prompt (as chat turns) and its token
strip, coloured on a run-wide scale and drawn one window of tokens at a time."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import streamlit as st

from app import aggregates, data, state, tokenstrip, ui
from app.text import chat_turns, md

PAGE_SIZE = 25

TABLE_COLUMNS = ("seq_id", "n_valid", "mean_abs_log_ratio", "max_abs_log_ratio", "seq_ratio", "log_ppl_diff",
                 "finish_reason", "reward", "response_len", "prompt_id", "sample_index")
COLUMN_FORMATS = {name: st.column_config.NumberColumn(name, format="%.4g")
                  for name in ("mean_abs_log_ratio", "max_abs_log_ratio", "seq_ratio", "log_ppl_diff",
                               "mean_log_ratio", "sum_log_ratio", "training_log_ppl", "rollout_log_ppl")}
STATS_SHOWN = ("n_valid", "mean_abs_log_ratio", "max_abs_log_ratio", "seq_ratio", "log_ppl_diff")
# The strip's full colour sits at the run's 99th percentile of |ℓ| (rcdiag.analysis.distributions.tails), the same for every
# sequence: one outlier token does not wash out the rest, and colours compare across sequences.
SCALE_QUANTILE = "abs_log_ratio_p99"


def render(ref: data.RunRef) -> None:
    index = data.sequence_index(*ref.key)
    page = _page(ref, index)
    if page.empty:
        st.info("The run has no sequences.")
        return
    labels = {int(r.seq_id): f"seq {int(r.seq_id)}" for r in page.itertuples()}
    known = set(index["seq_id"].astype(int))
    if state.bind("seq_select", "seq", int, known.__contains__):
        st.session_state["seq_pinned"] = st.session_state["seq_select"]
    pinned = st.session_state.get("seq_pinned")  # a linked sequence stays selected until the user pages or sorts
    if pinned is not None and pinned not in labels:
        labels[int(pinned)] = f"seq {pinned} (linked; not on this page)"
    chosen = int(st.selectbox("Sequence", list(labels), format_func=labels.get, key="seq_select"))
    state.publish("seq", chosen)
    _detail(ref, chosen, index[index["seq_id"] == chosen].iloc[0])


def _page(ref: data.RunRef, index: pd.DataFrame) -> pd.DataFrame:
    """Sort controls, one page of the index as a table (≤ PAGE_SIZE rows), and the pager below the table (the
    table's hover toolbar covers whatever sits just above its right edge)."""
    options = {label: col for label, col in data.SORT_KEYS.items() if col in index.columns}
    pages = max(1, math.ceil(len(index) / PAGE_SIZE))
    state.bind("seq_sort", "sort", str, options.__contains__)
    state.bind("seq_desc", "desc", state.as_bool)
    state.bind("seq_page", "page", int, lambda n: 1 <= n <= pages)
    left, mid, _ = st.columns([2, 1, 2])
    label = left.selectbox("Sort by", list(options), key="seq_sort")
    st.session_state.setdefault("seq_desc", True)
    descending = mid.toggle("Descending", key="seq_desc")
    number = int(st.session_state.get("seq_page", 1))
    number = min(max(number, 1), pages)
    order = data.sequence_order(*ref.key, options[label], descending)
    page = index.iloc[order[(number - 1) * PAGE_SIZE: number * PAGE_SIZE]]
    shown = [c for c in TABLE_COLUMNS if c in page.columns]
    event = st.dataframe(page[shown + [c for c in page.columns if c not in shown]], hide_index=True,
                         key="seq_table", width="stretch", column_config=COLUMN_FORMATS, on_select="rerun",
                         selection_mode="single-row")
    _follow_table(page, event.selection.rows)
    pager, info = st.columns([1, 4], vertical_alignment="bottom")
    pager.number_input(f"Page (of {pages})", min_value=1, max_value=pages, key="seq_page")
    info.caption(f"{len(index):,} sequences · rows {(number - 1) * PAGE_SIZE + 1}–"
                 f"{(number - 1) * PAGE_SIZE + len(page)} · click a row to open it")
    view = (label, descending, number)
    if st.session_state.get("seq_view", view) != view:
        st.session_state.pop("seq_pinned", None)
    st.session_state["seq_view"] = view
    state.publish("sort", label)
    state.publish("desc", int(descending))
    state.publish("page", number)
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
    st.caption(" · ".join(f"{k}: {md(v)}" for k, v in facts.items() if v is not None))
    _prompt(row.get("prompt_text"))
    _strip(ref, row, tokens, seq_id)


def _prompt(prompt: str | None) -> None:
    """The prompt as chat turns when it carries a known chat template's markers, else as plain text."""
    st.markdown("**Prompt**")
    turns = chat_turns(prompt) if prompt else None
    if not turns:
        st.text(prompt or "(no prompt text in the run)")
        return
    with st.container(border=True):  # plain turns: chat avatars are icon-font glyphs or emoji (no font offline)
        for role, content in turns:
            st.markdown(f"**{md(role)}**")
            st.text(content or "(the response starts here)")


def _strip(ref: data.RunRef, row: dict, tokens: pd.DataFrame, seq_id: int) -> None:
    spans = tokenstrip.windows(len(tokens))
    lr = (tokens["train_logprob"] - tokens["rollout_logprob"]).to_numpy(dtype=float)
    worst = int(np.nanargmax(np.abs(np.where(np.isfinite(lr), lr, np.nan)))) if np.isfinite(lr).any() else 0
    left, right = st.columns([1, 3])
    run_scale = aggregates.distributions(*ref.key, None)["tail_stats"].get(SCALE_QUANTILE, float("nan"))
    default = float(run_scale) if math.isfinite(run_scale) and run_scale > 0 else 1.0
    scale = left.number_input("Full colour at |ℓ| =", min_value=1e-4, value=float(f"{default:.3g}"), format="%.4g",
                              key=f"seq_scale_{seq_id}",
                              help="Default: the run's 99th percentile of |ℓ| (the same scale for every sequence).")
    start, stop = spans[0]
    if len(spans) > 1:
        labels = {i: f"positions {lo}–{hi - 1}" + (" (holds the largest |ℓ|)" if lo <= worst < hi else "")
                  for i, (lo, hi) in enumerate(spans)}
        which = right.selectbox(f"Tokens ({len(tokens):,}; {tokenstrip.WINDOW:,} at a time)", list(labels),
                                index=worst // tokenstrip.WINDOW, format_func=labels.get, key=f"seq_window_{seq_id}")
        start, stop = spans[which]
    window = tokens.iloc[start:stop]
    ids = tuple(int(t) if t == t else -1 for t in window["token_id"].to_numpy(dtype=float, na_value=np.nan))
    texts = data.decode_tokens(ref.manifest, ids)
    if texts is None:
        st.caption("No tokenizer found through the manifest's model path: tokens show as [id]. Response text:")
        st.text((row.get("response_text") or "")[:20_000])
    st.markdown("**Response** (hover a token for its log-probs)")
    st.html(tokenstrip.legend_html(scale))
    st.html(tokenstrip.strip_html(window.reset_index(drop=True), texts, scale))


ui.run_page("Sequences", render)
