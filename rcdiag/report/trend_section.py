"""The across-training part of `rcdiag report`: per-step numbers, the timeline (a step change or a drift:
rcdiag.analysis.training.drift), figures with intervals, and by_step JSON.

`report_trend(run, options)` makes the trend (one extra pass, only for a run with more than one step; a one-step
run gets its single by_step row from the report's own numbers, no pass); `trend_section(report)` returns
a Section, so a one-step run's report reads as before plus `by_step`/`timeline`.
The report puts the section right after the recommendation when the timeline found something.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from rcdiag.analysis.correction.modes import lower_for
from rcdiag.analysis.training.drift import Timeline
from rcdiag.analysis.training.trend import INTERVAL_NAMES, has_steps, step_index, trend
from rcdiag.analysis.verdict.causes import Context
from rcdiag.analysis.verdict.judge import StatusChange, status_changes, step_verdicts
from rcdiag.report.render import Block, fmt
from rcdiag.report.section import Section
from rcdiag.store.run import Run

FIGURE = "trend.png"
PANELS = (("abs_log_ratio_mean", "mean |ℓ|"), ("k3_kl", "k3_kl"), ("chi2_token", "χ² (token)"),
          ("noise_sigma", "noise scale σ̂"), ("ess", "ESS (token_truncate)"), ("clipped_frac", "clipped share"))
"""(trend column, panel title) of the trend figure, in order (the positive, heavy-tailed ones on a log axis)."""
TABLE_COLUMNS = ("step", "sequences", "tokens", "kl", "k3_kl", "chi2_token", "ess", "clipped_frac",
                 "abs_log_ratio_mean", "status")
LAG_COLUMNS = ("token_lag_mean", "token_lag_max", "stale_token_share", "floor_abs_log_ratio_mean",
               "stale_abs_log_ratio_mean", "seq_lag_mean", "seq_lag_max", "partial_seqs")
LAG_PANELS = (("stale_token_share", "share of tokens at lag ≥ 1"), ("floor_abs_log_ratio_mean", "floor mean |ℓ| (lag 0)"))
"""The second table (step, then those of these columns the trend has) and the figure panels added for a run with
policy versions (rcdiag.analysis.training.lag_trend; the seq_ columns only with the trainer's version)."""
SHOWN_CHANGES = 20
"""Verdict changes listed in the report (all are in metrics.json's status_changes)."""


def report_trend(run: Any, options: Any) -> Any:
    """The trend DataFrame of a multi-step run at the report's convention and threshold, with the token_truncate
    mode (the one whose ESS the headline shows); None for a run with one step."""
    if not has_steps(run):
        return None
    lower = lower_for("token_truncate", options.convention, options.lower)
    return trend(run, options.convention, "token_truncate", options.threshold, lower,
                 replicates=options.replicates, level=options.level, seed=options.seed, silent=options.silent)


def by_step(report: Any) -> list[dict[str, Any]]:
    """metrics.json's by_step: one dict per step, with `status` and `cause`, the verdict of that step's numbers
    (rcdiag.analysis.verdict.judge.step_verdicts); a one-step run's single row from the report's own numbers."""
    rows = _rows(report)
    for row, judged in zip(rows, step_verdicts(rows, _step_context(report)), strict=True):
        row["status"] = judged.status
        row["cause"] = judged.cause.kind
    return rows


def _step_context(report: Any) -> Context:
    """The run's verdict context (dtype, architecture) for judging its steps."""
    return report.context


def _rows(report: Any) -> list[dict[str, Any]]:
    if report.trend is not None:
        return [{k: _plain(v) for k, v in row.items()} for row in report.trend.to_dict(orient="records")]
    if not report.metrics:
        return []
    row: dict[str, Any] = {"step": _only_step(report), **report.metrics}
    row.update({k: report.tails.get(k, math.nan) for k in ("abs_log_ratio_mean", "abs_log_ratio_max")})
    row.update(report.noise.values() if report.noise is not None else {})
    row.update(report.is_modes.get("token_truncate", {}))
    for name in INTERVAL_NAMES:
        for bound in ("low", "high", "se"):
            row[f"{name}_{bound}"] = report.intervals.get(name, {}).get(bound, math.nan)
    return [{k: _plain(v) for k, v in row.items()}]


def _only_step(report: Any) -> int:
    # the report already opened (and validated) the run: re-opening it with validation read every file again
    steps = step_index(Run(report.path, validate=False))[1]
    return int(steps[0]) if steps.size else 0


def _plain(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def timeline_text(timeline: Timeline | None) -> str:
    """One callout: the step change or the drift, in words, with its status — or that the run is steady."""
    if timeline is None:
        return ""
    if timeline.change is not None:
        return "Step change (see the verdict): " + timeline.text
    if timeline.drift is not None:
        return "Drift (warning): " + timeline.text
    return timeline.text


def changes_text(rows: list[dict[str, Any]], changes: list[StatusChange]) -> str:
    """The per-step verdict in one sentence: where it starts and each step where it changes."""
    start = f"Verdict per step (each step's own numbers: its floor, tail and bands): {rows[0]['status']} at step " \
            f"{rows[0]['step']}"
    if not changes:
        return start + f", unchanged through step {rows[-1]['step']}."
    listed = "; ".join(c.text() for c in changes[:SHOWN_CHANGES])
    more = f"; … {len(changes) - SHOWN_CHANGES} more (metrics.json status_changes)" if len(changes) > SHOWN_CHANGES \
        else ""
    return f"{start}; it changes at {len(changes)} step(s): {listed}{more}."


def trend_section(report: Any) -> Section:
    """The trend: blocks and the figure only for a multi-step run; data carries by_step with each step's status,
    status_changes, and the timeline (None for one step)."""
    steps = by_step(report)
    changes = status_changes(steps, _step_context(report))
    timeline = report.timeline
    data = {"by_step": steps, "status_changes": [c.to_dict() for c in changes],
            "timeline": timeline and timeline.to_dict()}
    frame = report.trend
    if frame is None:
        return Section([], data=data)
    lagged = LAG_COLUMNS[0] in frame
    rows = [[fmt(r[c]) if c != "status" else r[c] for c in TABLE_COLUMNS] for r in steps]
    level = frame.attrs.get("level", 0.95)
    marks = [] if timeline is None else [(timeline.change.step, "step change")] if timeline.change else \
        [(timeline.drift.start_step, "drift starts")] if timeline.drift else []
    blocks = [Block("h", "Across training"),
              Block("p", f"{len(frame)} steps ({int(frame['step'].iloc[0])}–{int(frame['step'].iloc[-1])}); "
                         f"bars are {level:.0%} bootstrap intervals over each step's sequences. Changes are judged "
                         "on a log scale from per-step statistics a heavy tail cannot dominate (mean |ℓ|, the noise "
                         "scale σ̂ — a median — and the share of outlier tokens): a step change is a jump between "
                         "two plateaus, a drift a steady rise (docs/metrics.md, 'Across training')."
                         + (" The run has policy versions: per step (second table) its token lag, the share of tokens "
                            "at lag ≥ 1, the mean |ℓ| of the lag-0 floor and of the stale tokens, and the "
                            "trajectories' staleness where the trainer's version is recorded "
                            "(docs/metrics.md, 'Policy lag')." if lagged else "")),
              Block("callout", timeline_text(timeline)),
              Block("p", changes_text(steps, changes)),
              Block("image", "mismatch per step", image=FIGURE),
              Block("table", headers=list(TABLE_COLUMNS), rows=rows)]
    if lagged:
        lag = ["step", *(c for c in LAG_COLUMNS if c in frame)]
        blocks.append(Block("table", headers=lag, rows=[[fmt(r[c]) for c in lag] for r in steps]))
    panels = (*PANELS, *LAG_PANELS) if lagged else PANELS
    return Section(blocks, {FIGURE: ("trend_panels", (frame, marks, panels))}, data)
