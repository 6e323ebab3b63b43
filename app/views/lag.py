"""Policy lag page: the lag split (engine floor vs staleness per lag), weights unchanged, checkpoint attribution."""
from __future__ import annotations

from typing import Any

import streamlit as st

from app import ui
from rcdiag.analysis.lag import REFERENCES, lag_split
from rcdiag.analysis.lag_cause import cause_of
from rcdiag.analysis.unchanged import weights_unchanged
from rcdiag.store.run import open_run

COLUMNS = ["lag", "tokens", "token_share", "mean_log_ratio", "mean_abs_log_ratio", "k3_kl", "chi2_token", "ess",
           "is_weight_mean", "clipped_frac"]


@st.cache_data(max_entries=8)
def _lag(path: str, stamp: str) -> dict[str, Any]:
    """The library's split, check and cause of a run, once per file stamp."""
    run = open_run(path)
    split = lag_split(run)
    unchanged = weights_unchanged(run)
    cause = cause_of(split, unchanged)
    return {"split": split, "unchanged": [(u.message(), u.fires) for u in unchanged],
            "cause": None if cause is None else cause.to_dict()}


def render(ref: Any) -> None:
    found = _lag(ref.path, ref.stamp)
    split, cause = found["split"], found["cause"]
    if cause is not None:
        (st.error if cause["severity"] == "alarm" else st.warning)(
            f"{cause['cause']} — {cause['evidence']}. What to do: {cause['action']}.")
    if split is None:
        st.info("This run carries no policy versions (import an async dump — verl fully-async, AReaL, slime, TRL "
                "AsyncGRPO — or record with `rcdiag.Recorder(..).add(..., version=…)`).")
    else:
        st.caption(REFERENCES[split.reference] + "; the lag-0 bucket is the engine's floor, the excess over it "
                   f"staleness ({split.staleness_share:.0%} of the versioned tokens' mean |ℓ|)")
        st.bar_chart(split.buckets.set_index("lag")[["mean_abs_log_ratio"]], x_label="lag (versions)",
                     y_label="mean |ℓ|")
        st.dataframe(split.buckets[COLUMNS], hide_index=True, key="lag_buckets")
        if split.exact is not None:
            st.subheader("Exact split (checkpoint-rescored tokens)")
            st.dataframe(split.exact, hide_index=True, key="lag_exact")
    for message, fires in found["unchanged"]:
        (st.error if fires else st.caption)(f"Weights unchanged? {message}")


ui.run_page("Policy lag", render)
