"""The probe's part of `rcdiag report`: the latest RUN/probes/*.json as blocks (markdown/html), a bar chart, JSON.

`probe_section(run_path)` returns `(blocks, images, data)`; the report appends them when a probe exists and adds
nothing otherwise, so a run without probes reports exactly as before.
"""
from __future__ import annotations

import json
import os
from typing import Any

from rcdiag.errors import RunDirError
from rcdiag.probe.files import list_probes
from rcdiag.probe.summary import DISTANCE_NAMES, budget_frame, settings_frame
from rcdiag.report.figproc import FigureSpec
from rcdiag.report.render import Block

FIGURE = "probe_budget.png"


def latest_probe(run_path: str | os.PathLike) -> dict[str, Any] | None:
    """The newest probe summary of a run, or None when the run has no (complete) probe."""
    files = list_probes(run_path)
    if not files:
        return None
    try:
        return json.loads(files[-1].read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirError(f"{files[-1]}: unreadable probe summary ({exc}); re-run `rcdiag probe`") from None


def probe_blocks(summary: dict[str, Any]) -> list[Any]:
    """Report blocks of one probe summary: what was probed, the budget table and chart, distances, notes."""

    sample, gap = summary["sample"], summary["gap"]
    budget = budget_frame(summary)
    distances = settings_frame(summary, "vs_reference")
    return [
        Block("h", f"Mismatch budget (probe '{summary['name']}')"),
        Block("p", f"{sample['sequences']} sequences ({sample['valid_tokens']:,} valid tokens) recomputed under "
                   f"{len(summary['settings']) - 1} settings at temperature {summary['temperature']:g}. Observed gap, "
                   f"rollout vs the float32 trainer one sequence at a time: mean |ℓ| {gap['mean_abs']:.4g}, "
                   f"k3_kl {gap['k3_kl']:.4g}. Share = mean |setting − baseline| ÷ that gap (not additive)."),
        Block("image", "mismatch budget", image=FIGURE),
        Block("table", headers=list(budget.columns), rows=budget.values.tolist()),
        Block("h", "Distance of each setting to the reference", level=3),
        Block("table", headers=["setting", "factor", *DISTANCE_NAMES, "description"],
              rows=distances[["setting", "factor", *DISTANCE_NAMES, "description"]].values.tolist()),
        *[Block("callout", note) for note in summary.get("notes", [])],
    ]


def probe_section(run_path: str | os.PathLike) -> tuple[list[Any], dict[str, FigureSpec], dict[str, Any]]:
    """(blocks, {png name: figure to draw}, {"probe": summary}) for the latest probe of a run; three empties
    without one."""

    summary = latest_probe(run_path)
    if summary is None:
        return [], {}, {}
    return probe_blocks(summary), {FIGURE: ("budget_bars", (summary,))}, {"probe": summary}
