"""The run as `rcdiag report` judges it: rcdiag.report.build.judge over the shared pass cache (rcdiag.report.cache).

The Overview's verdict, cards and checks, the whole-run distributions, Compare's table and the simulator's
recommended point all come from this ONE pass — the report's own, with its defaults — so the dashboard and the
report cannot disagree, and a run that `rcdiag report` (or the notebook card) already judged opens with a pickle
read instead of a pass over its tokens. Kept in memory once per server (st.cache_resource: the scan holds
fixed-size histograms, never the token table); callers only read it.
"""
from __future__ import annotations

import json
from typing import Any

import pandas as pd
import streamlit as st

from app import runcheck
from rcdiag.analysis.metrics.compute import sequence_frame
from rcdiag.report.build import RunReport, headline_values, judge
from rcdiag.report.options import ReportOptions
from rcdiag.report.recommend import recommend

OPTIONS = ReportOptions()
"""The report's defaults: the same pass options as a plain `rcdiag report RUN`, so its cache entry is ours."""


@st.cache_resource(show_spinner="Judging the run: one pass over its tokens (a cache read once `rcdiag report` "
                                "has run on it; the first pass after installing also compiles rcdiag's kernels, "
                                "~20 s once)…", max_entries=16)
def report(path: str, stamp: str) -> RunReport:
    """rcdiag.report.build.judge of the run with the report's defaults (checks, tails, metrics, IS modes, sweep,
    verdict); `stamp` (data.file_stamp) keys the memory copy, the pass cache keys its own by the files' bytes."""
    return judge(runcheck.checked_run(path, stamp), OPTIONS)


def headline(path: str, stamp: str) -> dict[str, float]:
    """What the verdict judges: metrics, tail statistics of ℓ and the verdict's IS point (ess, is_weight_mean of
    token_truncate at C = 2); empty metrics when the report withheld or refused them (`metrics_error`)."""
    return headline_values(report(path, stamp))


@st.cache_data(max_entries=64)
def findings(path: str, stamp: str) -> list[dict[str, Any]]:
    """The report's checks, worst first, as dicts (name, severity, message, evidence, fix)."""
    return [json.loads(json.dumps(f.to_dict(), default=str)) for f in report(path, stamp).checks]


@st.cache_data(max_entries=64)
def recommendation(path: str, stamp: str) -> dict[str, Any]:
    """The report's recommendation (rcdiag.report.recommend): kind, mode, threshold, text and the chosen row's
    numbers; mode and threshold are None when it recommends no setting (a failed check, no data)."""
    return json.loads(json.dumps(recommend(report(path, stamp)).to_dict(), default=str))


def recommended_setting(path: str, stamp: str) -> tuple[str, float] | None:
    """(mode, threshold) of the report's recommendation, None when it recommends no setting: the simulator's ring."""
    advice = recommendation(path, stamp)
    if not advice.get("mode") or advice.get("family") != "mode":  # a gate family is not on the modes' sweep
        return None
    return advice["mode"], float(advice["threshold"])


def sequence_stats(path: str, stamp: str) -> pd.DataFrame | None:
    """rcdiag.analysis.metrics.compute.sequence_stats's frame (metrics.sequence_frame) from the report's per-sequence
    table (no pass of its own: the Sequences page of a 10 M-token run reads the cached pass), or None when the
    report refused or withheld the metrics — the caller then asks the library, which says why."""
    rep = report(path, stamp)
    if rep.metrics_error:
        return None
    return sequence_frame(*rep.scan.sums.table(rep.scan.info.seq_id))
