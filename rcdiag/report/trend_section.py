"""The across-training part of `rcdiag report`: per-step numbers, drift, figures with intervals, and by_step JSON.

`report_trend(run, options)` makes the trend (one extra pass, only for a run with more than one step; a one-step
run gets its single by_step row from the report's own numbers, no pass); `trend_section(report)` returns
`(blocks, images, data)` like probe_section, so a one-step run's report reads as before plus `by_step`/`drift`.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from rcdiag.analysis.drift import ADVICE, DRIFT_METRICS, Drift, drifts
from rcdiag.analysis.health import StatusChange, status_changes, step_verdicts
from rcdiag.analysis.trend import INTERVAL_NAMES, has_steps, step_index, trend
from rcdiag.report.figproc import FigureSpec
from rcdiag.report.render import Block, fmt
from rcdiag.store.run import Run

FIGURE = "trend.png"
PANELS = (("kl", "kl (k1)"), ("k3_kl", "k3_kl"), ("chi2_token", "χ² (token)"), ("ess", "ESS (token_truncate)"),
          ("clipped_frac", "clipped share"), ("abs_log_ratio_mean", "mean |ℓ|"))
"""(trend column, panel title) of the trend figure, in order."""
TABLE_COLUMNS = ("step", "sequences", "tokens", "kl", "k3_kl", "chi2_token", "ess", "clipped_frac",
                 "abs_log_ratio_mean", "status")
SHOWN_CHANGES = 20
"""Verdict changes listed in the report (all are in metrics.json's status_changes)."""


def report_trend(run: Any, options: Any) -> tuple[Any, dict[str, Drift]]:
    """(trend DataFrame, {metric: Drift}) of a multi-step run at the report's convention and threshold, with the
    token_truncate mode (the one whose ESS the headline shows); (None, {}) for a run with one step."""
    if not has_steps(run):
        return None, {}
    frame = trend(run, options.convention, "token_truncate", options.threshold, options.lower,
                  replicates=options.replicates, level=options.level, seed=options.seed, silent=options.silent)
    return frame, drifts(frame)


def by_step(report: Any) -> list[dict[str, Any]]:
    """metrics.json's by_step: one dict per step, with `status`, the verdict of that step's numbers
    (health.step_verdicts); a one-step run's single row from the report's own numbers."""
    rows = _rows(report)
    for row, judged in zip(rows, step_verdicts(rows), strict=True):
        row["status"] = judged.status
    return rows


def _rows(report: Any) -> list[dict[str, Any]]:
    if report.trend is not None:
        return [{k: _plain(v) for k, v in row.items()} for row in report.trend.to_dict(orient="records")]
    if not report.metrics:
        return []
    row: dict[str, Any] = {"step": _only_step(report), **report.metrics}
    row.update({k: report.tails.get(k, math.nan) for k in ("abs_log_ratio_mean", "abs_log_ratio_max")})
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


def drift_text(drift: dict[str, Drift]) -> str:
    """One callout: the drifting metrics first, in words, or that none drifts."""
    found = [d for d in drift.values() if d.detected]
    if found:
        return "Drift (warning): " + " ".join(d.text for d in found) + " " + ADVICE
    names = ", ".join(drift) or ", ".join(DRIFT_METRICS)
    return f"No drift (healthy): none of {names} rises steadily above its first steps beyond the bootstrap noise."


def changes_text(rows: list[dict[str, Any]], changes: list[StatusChange]) -> str:
    """The per-step verdict in one sentence: where it starts and each step where it changes."""
    start = f"Verdict per step (each step's numbers against the health bands): {rows[0]['status']} at step " \
            f"{rows[0]['step']}"
    if not changes:
        return start + f", unchanged through step {rows[-1]['step']}."
    listed = "; ".join(c.text() for c in changes[:SHOWN_CHANGES])
    more = f"; … {len(changes) - SHOWN_CHANGES} more (metrics.json status_changes)" if len(changes) > SHOWN_CHANGES \
        else ""
    return f"{start}; it changes at {len(changes)} step(s): {listed}{more}."


def trend_section(report: Any) -> tuple[list[Block], dict[str, FigureSpec], dict[str, Any]]:
    """(blocks, figures to draw, data) of the trend: blocks and the figure only for a multi-step run; data carries
    by_step with each step's status, status_changes, and drift ({} for one step)."""
    steps = by_step(report)
    changes = status_changes(steps)
    data = {"by_step": steps, "status_changes": [c.to_dict() for c in changes],
            "drift": {k: d.to_dict() for k, d in report.drift.items()}}
    frame = report.trend
    if frame is None:
        return [], {}, data
    rows = [[fmt(r[c]) if c != "status" else r[c] for c in TABLE_COLUMNS] for r in steps]
    level = frame.attrs.get("level", 0.95)
    blocks = [Block("h", "Across training"),
              Block("p", f"{len(frame)} steps ({int(frame['step'].iloc[0])}–{int(frame['step'].iloc[-1])}); "
                         f"bars are {level:.0%} bootstrap intervals over each step's sequences. Drift: one-sided "
                         "CUSUM of each step's excess over the first steps, in units of its bootstrap error "
                         "(K=0.5, H=5); the drift starts where the sum last left zero."),
              Block("callout", drift_text(report.drift)),
              Block("p", changes_text(steps, changes)),
              Block("image", "mismatch per step", image=FIGURE),
              Block("table", headers=list(TABLE_COLUMNS), rows=rows)]
    return blocks, {FIGURE: ("trend_panels", (frame, report.drift, PANELS))}, data
