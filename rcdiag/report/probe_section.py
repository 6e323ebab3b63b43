"""The probe's part of `rcdiag report`: the latest RUN/probes/*.json as blocks (markdown/html), a bar chart, JSON.

`probe_section(run_path)` returns `(blocks, images, data)`; the report appends them when a probe exists and adds
nothing otherwise, so a run without probes reports exactly as before. The section opens with the probe's answer
(`rcdiag.probe.answer`), which the verdict can quote through `rcdiag.probe.answer.latest_answer(run_path)`.
"""
from __future__ import annotations

import os
from typing import Any

from rcdiag.errors import InputError, RunDirError
from rcdiag.probe.answer import divergence_rows, probe_answer
from rcdiag.probe.files import list_probes
from rcdiag.probe.summary import DISTANCE_NAMES, budget_frame, settings_frame
from rcdiag.report.figproc import FigureSpec
from rcdiag.report.render import Block
from rcdiag.store.files import MAX_MANIFEST_BYTES
from rcdiag.store.safefile import read_json

FIGURE = "probe_budget.png"


def latest_probe(run_path: str | os.PathLike) -> dict[str, Any] | None:
    """The newest probe summary of a run, or None when the run has no (complete) probe."""
    files = list_probes(run_path)
    if not files:
        return None
    try:  # bounded, no FIFO (it blocked the report forever), JSON's tracebacks named (rcdiag.store.safefile)
        return read_json(files[-1], "probe summary", MAX_MANIFEST_BYTES)
    except InputError as exc:
        raise RunDirError(f"unreadable probe summary: {exc}; re-run `rcdiag probe`") from None


RESIDUAL_HEADERS = ["if you change", "residual gap (mean |ℓ|)", "residual", "removes", "factor", "setting",
                    "moves log-probs by (vs baseline)"]


def residual_rows(summary: dict[str, Any]) -> list[list[Any]]:
    """The budget as "residual gap if you change X" rows, the most helpful change first."""
    budget = budget_frame(summary).dropna(subset=["residual"]).sort_values("residual")
    return [[r.change or r.setting, r.residual_mean_abs, f"{r.residual:.2%}", f"{r.removes:.2%}", r.factor,
             r.setting, r.mean_abs] for r in budget.itertuples()]


def probe_blocks(summary: dict[str, Any]) -> list[Any]:
    """Report blocks of one probe summary: the answer, the residual-gap table and chart, the exact divergences,
    distances, notes."""
    sample, gap = summary["sample"], summary["gap"]
    answer = probe_answer(summary)
    distances = settings_frame(summary, "vs_reference")
    div_headers, div_rows = divergence_rows(summary)
    blocks = [
        Block("h", f"Where the gap comes from (probe '{summary['name']}')"),
        Block("callout", answer.top_line),
        Block("p", f"{sample['sequences']} sequences ({sample['valid_tokens']:,} valid tokens) recomputed under "
                   f"{len(summary['settings']) - 1} settings at temperature {summary['temperature']:g}. Observed gap, "
                   f"rollout vs the float32 trainer one sequence at a time: mean |ℓ| {gap['mean_abs']:.4g}, "
                   f"k3_kl {gap['k3_kl']:.4g}. Residual = the gap left if the run changed that one setting (an "
                   "engine setting against the float32 trainer, a trainer setting against the rollout)."),
        Block("image", "residual gap if you change one setting", image=FIGURE),
        Block("table", headers=RESIDUAL_HEADERS, rows=residual_rows(summary)),
    ]
    if div_rows:
        blocks += [Block("h", "Whole next-token distributions (exact)", level=3),
                   Block("p", "At sampled positions, the engine's full-vocabulary distribution (prefill replay) "
                              "against the reference trainer's: exact KL both ways, total variation, Jensen–Shannon, "
                              "top-k overlap and the mass the run's top-p/top-k keeps, beside the sampled-token "
                              "estimators on the same positions. k3 − exact KL is the sampled estimator's own error."),
                   Block("table", headers=div_headers, rows=div_rows)]
    return blocks + [
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
    return probe_blocks(summary), {FIGURE: ("budget_bars", (summary,))}, {
        "probe": summary, "probe_answer": probe_answer(summary).to_dict()}
