"""Policy lag page: the lag split (engine floor vs staleness per lag), weights unchanged, checkpoint attribution.

The numbers are the judged report's own (app.judged: rcdiag.report.build.judge computes the lag split and the
weights check once, for the verdict), so the page makes no pass of its own and cannot disagree with the
report's "Policy lag" section; a run with no lag to show — no versions, no repeated context tested — is one line.
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from app import judged, ui
from app.text import md
from rcdiag.analysis.training.lag import REFERENCES
from rcdiag.analysis.training.unchanged import MIN_PAIRS

COLUMNS = ["lag", "tokens", "token_share", "mean_log_ratio", "mean_abs_log_ratio", "k3_kl", "chi2_token", "ess",
           "is_weight_mean", "clipped_frac"]
NO_VERSIONS = ("This run carries no policy versions (import an async dump — verl fully-async, AReaL, slime, TRL "
               "AsyncGRPO — or record with `rcdiag.Recorder(..).add(..., version=…)`).")


def render(ref: Any) -> None:
    found = judged.report(*ref.key).lag
    if found.error:
        st.error(f"Lag split not computed: {md(found.error)}")
        return
    split, cause = found.split, found.cause
    tested = [u for u in found.unchanged if u.pairs >= MIN_PAIRS or u.fires]
    if split is None and not tested and cause is None:
        st.info(NO_VERSIONS)  # nothing lag-related to show: one line
        return
    if cause is not None:
        (st.error if cause.severity == "alarm" else st.warning)(
            f"{cause.cause} — {cause.evidence}. What to do: {cause.action}.")
    if split is None:
        st.info(NO_VERSIONS)
    else:
        st.caption(REFERENCES[split.reference] + "; the lag-0 bucket is the engine's floor, the excess over it "
                   f"staleness ({split.staleness_share:.0%} of the versioned tokens' mean |ℓ|)")
        st.bar_chart(split.buckets.set_index("lag")[["mean_abs_log_ratio"]], x_label="lag (versions)",
                     y_label="mean |ℓ|")
        st.dataframe(split.buckets[COLUMNS], hide_index=True, key="lag_buckets")
        if split.exact is not None:
            st.subheader("Exact split (checkpoint-rescored tokens)")
            st.dataframe(split.exact, hide_index=True, key="lag_exact")
    for unchanged in tested:
        (st.error if unchanged.fires else st.caption)(f"Weights unchanged? {unchanged.message()}")


ui.run_page("Policy lag", render)
