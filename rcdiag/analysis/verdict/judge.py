"""The run's verdict — healthy / warning / alarm (or n/a), its cause, the evidence and what to do — for every
reader: the report's banner, `rcdiag report`'s summary line and --fail-on, metrics.json, the dashboard's Overview
and Trends, the notebook card.

    v = verdict(values, checks, Context(dtype="bfloat16", timeline=timeline(trend_frame), noise=summary))
    v.status, v.cause.title, v.cause.action, v.line()

The causes and their precedence are rcdiag.analysis.verdict.causes; the bands rcdiag.analysis.verdict.health; the noise floor
rcdiag.analysis.metrics.floor; the timeline rcdiag.analysis.training.drift. Across training, `step_verdicts` judges each step's own
numbers (a trend row, noise columns included) and `status_changes` names the steps where that verdict changes.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from html import escape
from typing import Any

from rcdiag.analysis.metrics.floor import NoiseSummary
from rcdiag.analysis.verdict.causes import FLOOR_BAND, Cause, Context, diagnose, primary
from rcdiag.analysis.verdict.health import BY_METRIC, COLOURS, HEALTHY, UNKNOWN, WARNING, num, statuses

NUMERICAL_KINDS = ("bit_exact", "heavy_tail", "position_onset", "above_floor", "bands", "material_floor", "floor")
"""Causes that size numerical mismatch (rcdiag.analysis.verdict.causes.numerics)."""
REPLAY_CAVEAT = ("the rollout side is a prefill replay of the text (vLLM re-reading the tokens), not the log-probs "
                 "the rollout sampled with: decode-time effects (batch composition, KV cache, the trainer's TP "
                 "layout and vLLM version) are not in these numbers")


@dataclass
class Verdict:
    """The run's status and why: `cause` the primary claim (rcdiag.analysis.verdict.causes.primary), `causes` every one that
    applies in precedence order, `reasons` the lines a banner lists (the cause's evidence, then the other causes),
    `metric_status` each headline card's band (mean |ℓ| against the floor), `caveats` what the numbers leave out."""

    status: str
    cause: Cause = field(default_factory=lambda: Cause("no_data", UNKNOWN, "not judged"))
    causes: list[Cause] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    metric_status: dict[str, str] = field(default_factory=dict)
    caveats: list[str] = field(default_factory=list)

    @property
    def correct(self) -> bool:
        """Whether an IS correction may be advised (never where it would hide a bug)."""
        return self.cause.correct

    @property
    def first_check(self) -> str | None:
        """The failed check the verdict names first, if any."""
        return next((c.title.split("check ", 1)[1].split(" ", 1)[0] for c in self.causes
                     if c.kind == "input_defect"), None)

    def headline(self) -> str:
        """'ALARM: the mismatch jumped ×35 at step 50' — the status and the cause's title."""
        return f"{self.status.upper()}: {self.cause.title}"

    def line(self) -> str:
        """One line for a terminal or a heading: the headline, then up to three reasons."""
        why = "; ".join(self.reasons[:3]) + (f"; +{len(self.reasons) - 3} more" if len(self.reasons) > 3 else "")
        return self.headline() + (f" — {why}" if why else "")

    def html(self, max_reasons: int | None = None) -> str:
        """The verdict as a coloured banner — status and cause, the evidence, what to do, caveats — escaped: the
        dashboard's and the notebook's (the report's own is its template's)."""
        reasons = "".join(f"<li>{escape(r)}</li>" for r in self.reasons[:max_reasons])
        action = (f"<div style='margin-top:4px'><b>What to do:</b> {escape(self.cause.action)}</div>"
                  if self.cause.action else "")
        caveats = "".join(f"<div style='margin-top:4px;font-style:italic'>Note: {escape(c)}</div>"
                          for c in self.caveats)
        return (f'<div class="rcdiag-verdict" data-status="{self.status}" data-cause="{self.cause.kind}" '
                f'style="background:{COLOURS[self.status]};color:#fff;border-radius:8px;padding:8px 14px;'
                f'margin:6px 0"><div style="font-size:1.3em;font-weight:700">{escape(self.headline())}</div>'
                + (f'<ul style="margin:4px 0 0 18px">{reasons}</ul>' if reasons else "") + action + caveats
                + "</div>")

    def _repr_html_(self) -> str:
        return self.html()

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "cause": self.cause.to_dict(), "causes": [c.to_dict() for c in self.causes],
                "reasons": list(self.reasons), "metric_status": dict(self.metric_status),
                "caveats": list(self.caveats)}


def verdict(values: Mapping[str, Any], checks: Iterable[Any] = (), context: Context = Context()) -> Verdict:
    """The verdict of a run from its headline `values` (metrics, tails, `ess` / `is_weight_mean` of the verdict's
    IS point and, when present, the noise floor's NOISE_NAMES), its input `checks` (Findings or their dicts) and
    what `context` knows (dtypes, architecture, replay, timeline, contributed causes)."""
    if context.noise is None:
        context = replace(context, noise=NoiseSummary.from_values(values))
    causes = diagnose(values, checks, context)
    cause = primary(causes)
    # behind a defect or a bug the numerical causes measure its symptoms: they are not worth listing beside it
    others = [c for c in causes if c is not cause and c.status != HEALTHY
              and (cause.correct or c.kind not in NUMERICAL_KINDS)]
    reasons = [*cause.evidence, *(f"{c.status}: {c.title}" for c in others)]
    caveats = [REPLAY_CAVEAT] if context.replay else []
    return Verdict(cause.status, cause, causes, reasons, _metric_status(values, context), caveats)


def _metric_status(values: Mapping[str, Any], context: Context) -> dict[str, str]:
    """Each headline band's status; mean |ℓ| against the run's floor where the noise scale is known."""
    found = statuses(values)
    if values.get("tokens") == 0:  # a framework's no-data values (swift's 0 / −1 / 1e10, TRL's 0.0) measure nothing
        return dict.fromkeys(found, UNKNOWN)
    noise = context.noise
    if noise is not None and noise.sigma == noise.sigma and FLOOR_BAND in found:
        floor = noise.floor(context.dtype)
        at_floor = floor.explains(noise.sigma) and not noise.heavy(floor) and noise.mean_abs <= floor.mean_abs_largest
        found[FLOOR_BAND] = HEALTHY if at_floor else WARNING
    return found


# ----------------------------------------------------------------------------------------------- across steps
@dataclass(frozen=True)
class StatusChange:
    """The verdict of one step differs from the step before: `before` → `after`, with the metrics whose band
    changed ({metric: (before, after)}) and why (the new verdict's cause)."""

    step: int
    before: str
    after: str
    metrics: dict[str, tuple[str, str]]
    reasons: list[str]

    def text(self) -> str:
        """'step 6: healthy → warning (heavy-tailed mismatch: …)'."""
        why = "; ".join(self.reasons) or ", ".join(f"{m} {a} → {b}" for m, (a, b) in self.metrics.items())
        return f"step {self.step}: {self.before} → {self.after}" + (f" ({why})" if why else "")

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "from": self.before, "to": self.after, "text": self.text(),
                "metrics": {m: {"from": a, "to": b} for m, (a, b) in self.metrics.items()}}


def step_verdicts(rows: Iterable[Mapping[str, Any]], context: Context = Context()) -> list[Verdict]:
    """The verdict of each per-step row (rcdiag.trend's: metrics, the IS mode's ess / is_weight_mean, the noise
    columns) from its numbers alone: input checks, the timeline and the run's shape (its position bands and how Σ|ℓ|
    spreads over its sequences) judge the run, not a step — a run-wide few-sequences finding would otherwise stamp
    every step, including those without the sequences."""
    base = replace(context, timeline=None, extra=(), noise=None, positions=None, concentration=None)
    return [verdict(row, (), base) for row in rows]


def status_changes(rows: Iterable[Mapping[str, Any]], context: Context = Context()) -> list[StatusChange]:
    """The steps whose verdict differs from the previous judged step's, in step order (the first step is the start,
    not a change). A step with nothing to judge (UNKNOWN) is no change: the next judged step compares with the last
    judged one."""
    rows = list(rows)
    changes = []
    judged = [(row, v) for row, v in zip(rows, step_verdicts(rows, context), strict=True) if v.status != UNKNOWN]
    for (_, prev), (row, now) in zip(judged[:-1], judged[1:], strict=False):
        if now.status == prev.status:
            continue
        moved = {m: (prev.metric_status.get(m, UNKNOWN), s) for m, s in now.metric_status.items()
                 if s != prev.metric_status.get(m, UNKNOWN)}
        reasons = [now.cause.title] if now.status != HEALTHY else \
            [f"{m} = {num(row[m])}, {BY_METRIC[m].limit(s)}" for m, (_, s) in moved.items() if s == now.status]
        changes.append(StatusChange(int(row["step"]), prev.status, now.status, moved, reasons))
    return changes
