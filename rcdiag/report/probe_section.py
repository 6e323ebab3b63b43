"""The probe's part of `rcdiag report`: the latest RUN/probes/*.json as blocks (markdown/html), a bar chart, JSON.

`probe_section(run_path)` returns `(blocks, images, data)`; the report appends them when a probe exists and adds
nothing otherwise, so a run without probes reports exactly as before.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

from matplotlib.figure import Figure

from rcdiag.errors import RunDirError
from rcdiag.probe.files import list_probes
from rcdiag.probe.summary import DISTANCE_NAMES, budget_frame, settings_frame
from rcdiag.report.plots import png_bytes
from rcdiag.report.render import Block

FIGURE = "probe_budget.png"
SIDE_COLORS = {"trainer": "#2563eb", "engine": "#dc2626"}


def latest_probe(run_path: str | os.PathLike) -> dict[str, Any] | None:
    """The newest probe summary of a run, or None when the run has no (complete) probe."""
    files = list_probes(run_path)
    if not files:
        return None
    try:
        return json.loads(files[-1].read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirError(f"{files[-1]}: unreadable probe summary ({exc}); re-run `rcdiag probe`") from None


def budget_figure(summary: dict[str, Any]) -> Figure:
    """Horizontal bars: each setting's share of the observed gap (mean |Δ| vs its baseline / mean |rollout −
    reference|), coloured by side, with the observed gap at 1. No budget rows → an empty axis with a note."""
    rows = [r for r in summary.get("budget") or [] if r["share"] is not None and math.isfinite(r["share"])]
    fig = Figure(figsize=(6.4, 0.35 * max(len(rows), 3) + 1.2), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    if not rows:
        ax.text(0.5, 0.5, "no finite shares (the observed gap is 0)", ha="center", va="center",
                transform=ax.transAxes)
        return fig
    labels = [f"{r['factor']}: {r['setting']}" for r in rows]
    shares = [max(r["share"], 1e-6) for r in rows]
    ax.barh(range(len(rows)), shares, color=[SIDE_COLORS.get(r["side"], "#555") for r in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="#111", linewidth=1, linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("share of the observed gap (mean |Δ| vs baseline ÷ mean |rollout − reference|), log scale")
    ax.set_title("Mismatch budget (blue: trainer, red: engine)", fontsize=10)
    return fig


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


def probe_section(run_path: str | os.PathLike) -> tuple[list[Any], dict[str, bytes], dict[str, Any]]:
    """(blocks, {png name: bytes}, {"probe": summary}) for the latest probe of a run; three empties without one."""

    summary = latest_probe(run_path)
    if summary is None:
        return [], {}, {}
    return probe_blocks(summary), {FIGURE: png_bytes(budget_figure(summary))}, {"probe": summary}
