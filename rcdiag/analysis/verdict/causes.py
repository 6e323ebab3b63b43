"""The verdict's causes: what is most likely wrong with a run, the evidence, what to do, and whether a correction
may be advised — one rule per cause, tried in order of precedence.

A verdict is a claim about a cause. The order (rcdiag's; the sources of each rule are in its docstring and in
`Cause.source`):
1. **input defect** — a failed input check (misalignment, placeholders, temperature, truncation): the numbers
   measure the defect; fix it first. No correction.
2. **not numerics** — tokens no precision explains (rcdiag.analysis.metrics.floor: |ℓ| beyond 15 nats on any model, beyond
   2 nats — or a heavy tail — on a known dense one). Check the weight sync, the policy version, the tokenizer and
   the alignment. No correction: it would hide the bug and keep training on another policy's data.
3. **a change across training** — the mismatch jumped at one step (rcdiag.analysis.training.drift), or an analysis the
   caller contributes (`Context.extra`: staleness from policy versions, routing, the probe's attribution).
   An alarm (no correction) when the new level is more than the run's dtype explains; else a warning.
4. **drift** — the mismatch rises slowly across steps: a warning; re-check the threshold on the later steps.
5. **numerical mismatch**, sized against the run's own floor (what its dtypes give at its token probabilities):
   heavy-tailed (MoE routing flips: correct at token level, or replay the routes), above the floor (find the
   setting: `rcdiag probe`), beyond a health band, or at the floor — healthy, whatever the fixed bands say.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rcdiag.analysis.metrics.floor import (
    ANY_LIMIT,
    DENSE_LIMIT,
    DENSE_TAIL_SHARE,
    FLIP_GAP,
    TAIL_K,
    TAIL_SHARE,
    Floor,
    NoiseSummary,
)
from rcdiag.analysis.training.drift import ADVICE, CHANGE_ADVICE, Timeline
from rcdiag.analysis.training.lag_cause import LagCause
from rcdiag.analysis.verdict.health import (
    ALARM,
    BY_METRIC,
    HEALTHY,
    STATUSES,
    UNKNOWN,
    WARNING,
    num,
    statuses,
    worst,
)

CAUSE_KINDS = ("input_defect", "not_numerics", "step_change", "weights_unchanged", "staleness", "extra", "drift", "input_warning", "heavy_tail",
               "above_floor", "bands", "floor", "no_data")
"""Every kind of cause, in order of precedence."""
FLOOR_BAND = "abs_log_ratio_mean"
"""The band the floor replaces: mean |ℓ| is judged against what the run's dtypes give, not a fixed number."""
RECOMMENDATION = "recommendation (the report's, the dashboard's Overview)"
"""Where a cause's action sends the user for the correction: named by place, as the action is also shown where no
recommendation follows it (the dashboard's Routing page, the notebook card)."""
FLOOR_SOURCE = ("rcdiag's floor model: ℓ ≈ σ·(1 − p) per token for rounding-like noise, σ measured per dtype "
                "(docs/metrics.md, 'The noise floor')")
CHECKS_SOURCE = "rcdiag's input checks (docs/metrics.md, 'Input checks')"


@dataclass(frozen=True)
class Cause:
    """One claim about the run: `title` what is wrong (a line), `evidence` the numbers behind it, `action` what to
    do, `source` where the rule comes from; `correct` whether an IS correction may be advised (False where it
    would hide a bug); `step` the step it names, if any."""

    kind: str
    status: str
    title: str
    evidence: tuple[str, ...] = ()
    action: str = ""
    source: str = ""
    correct: bool = True
    step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "status": self.status, "title": self.title, "evidence": list(self.evidence),
                "action": self.action, "source": self.source, "correct": self.correct, "step": self.step}


@dataclass(frozen=True)
class Context:
    """What the verdict knows beyond the numbers: the coarser compute dtype of the two sides (None: not recorded),
    the model's architecture ('dense', 'moe' or None), whether the rollout side is a prefill replay of given text,
    the across-training timeline and causes other analyses contribute (ranked with the step change)."""

    dtype: str | None = None
    architecture: str | None = None
    replay: bool = False
    timeline: Timeline | None = None
    extra: tuple[Cause, ...] = ()
    noise: NoiseSummary | None = field(default=None)
    refused: str | None = None
    """Why the metrics refused the data (InputError text), if they did: the verdict is then n/a."""
    probe: str | None = None
    """The latest `rcdiag probe`'s answer (its top line), which the numerical causes cite as evidence."""


def _field(check: Any, name: str) -> Any:
    return check.get(name) if isinstance(check, Mapping) else getattr(check, name, None)


CHECK_TITLES = {
    "count_mismatch": "the two sides were not cut at the same tokens",
    "alignment_shift": "the two sides are shifted by one position",
    "temperature": "the two sides use different temperatures",
    "truncation_offset": "the engine renormalised over a top-p/top-k support",
    "placeholders": "placeholder or impossible log-probs on valid positions",
    "storage_precision": "the log-probs were stored at a lower precision",
    "threshold_floor": "a threshold lies within storage rounding",
    "manifest_flags": "the run's settings record a convention problem",
}
"""What each input check's failure means, in a few words (the banner's title)."""
CONVENTION_WARNINGS = ("truncation_offset", "manifest_flags")
"""Check warnings that are convention defects: the fix is a setting, and a correction would only bound the
symptom, so none is advised (storage precision, a threshold in rounding or a few placeholders are not)."""


def input_defects(checks: Iterable[Any]) -> list[Cause]:
    """A failed check (error) → alarm, no correction; a check warning → a warning with its fix."""
    found = []
    for check in checks:
        severity, name = _field(check, "severity"), str(_field(check, "name"))
        message, fix = str(_field(check, "message")), str(_field(check, "fix") or "")
        means = CHECK_TITLES.get(name)
        if severity == "error":
            found.append(Cause("input_defect", ALARM, f"fix the failed input check {name} first"
                               + (f": {means}" if means else ""),
                               (f"check {name}: {message}",), _sentence(fix) + (" " if fix else "") +
                               "The numbers measure that defect, not numerical mismatch: re-run the report once "
                               "it is fixed.", CHECKS_SOURCE, correct=False))
        elif severity == "warning":
            found.append(Cause("input_warning", WARNING, f"{means} (input check {name})" if means else
                               f"input check {name} needs attention",
                               (f"check {name}: {message}",), fix, CHECKS_SOURCE,
                               correct=name not in CONVENTION_WARNINGS))
    return found


def not_numerics(noise: NoiseSummary | None, ctx: Context) -> Cause | None:
    """Tokens no precision explains (rcdiag.analysis.metrics.floor's rules and sources)."""
    if noise is None or noise.tokens == 0:
        return None
    dense = ctx.architecture == "dense"
    evidence = []
    if noise.beyond_any:
        evidence.append(f"{noise.beyond_any:,} token(s) with |ℓ| > {ANY_LIMIT:g} nats (worst {noise.max_abs:.3g}): "
                        "no rounding, kernel or routing difference moves a token the engine sampled that far")
    if dense and noise.beyond_dense:
        evidence.append(f"{noise.beyond_dense:,} token(s) with |ℓ| > {DENSE_LIMIT:g} nats on a dense model (worst "
                        f"{noise.max_abs:.3g}; dense bf16 runs measured here move their worst token 0.16–0.36)")
    if dense and noise.confident_flips:
        evidence.append(f"{noise.confident_flips:,} token(s) where the engine was confident (p ≥ ½) and the trainer "
                        f"> {FLIP_GAP:g} nats lower")
    if dense and noise.tail_share > DENSE_TAIL_SHARE:
        evidence.append(f"{noise.tail_share:.2%} of tokens lie beyond {TAIL_K:g}× the run's noise scale: a dense "
                        "model's rounding noise has no such tail")
    if not evidence:
        return None
    model = "a dense model" if dense else "any model"
    return Cause("not_numerics", ALARM, "not numerical mismatch: tokens no precision can explain", tuple(evidence),
                 "Check the weight sync (did the engine load the trainer's current weights?), the policy version "
                 "the engine sampled with, the tokenizer and the alignment — the worst tokens below show where. A "
                 "correction would hide the bug and keep training on another policy's data.",
                 f"rcdiag: limits for {model} (docs/metrics.md, 'What no precision explains'; MoE: R3, "
                 "arXiv 2510.11370, worst tokens 2–6 nats)", correct=False)


def step_change(ctx: Context, floor: Floor | None) -> Cause | None:
    """The timeline's step change: an alarm when the new level is beyond what the dtype explains."""
    change = ctx.timeline.change if ctx.timeline else None
    if change is None:
        return None
    sigma_after = change.numbers.get("noise_sigma", (math.nan, math.nan))[1]
    tail_after = change.numbers.get("noise_tail_share", (math.nan, math.nan))[1]
    explained = (floor is not None and math.isfinite(sigma_after) and sigma_after <= floor.sigma_largest
                 and not tail_after > TAIL_SHARE)
    evidence = [change.text[0].upper() + change.text[1:]]
    if explained:
        evidence.append(f"the new level is still within what {floor.dtype} gives (noise scale {sigma_after:.2g} ≤ "
                        f"{floor.sigma_largest:.2g}): a precision or kernel change is the likely cause")
    else:
        evidence.append("the new level is more than the run's dtypes explain (noise scale "
                        f"{sigma_after:.2g}" + (f" > {floor.sigma_largest:.2g} for {floor.dtype})" if floor else ")")
                        + ": the engine and the trainer no longer compute the same policy")
    return Cause("step_change", WARNING if explained else ALARM,
                 f"the mismatch jumped ×{_factor(change.numbers['abs_log_ratio_mean'])} at step {change.step}",
                 tuple(evidence), CHANGE_ADVICE + (" The steps before it are the run's numerical floor." if not
                                                   explained else ""),
                 "rcdiag: a two-segment median test on a log scale (docs/metrics.md, 'Across training')",
                 correct=explained, step=change.step)


def from_lag(found: LagCause | None) -> Cause | None:
    """The lag split's cause (rcdiag.analysis.training.lag_cause): weights that never changed — a broken sync, no correction —
    or staleness, which a correction against the generating policy (decoupled PPO, IS on the behaviour policy's
    log-probs) legitimately handles."""
    if found is None:
        return None
    unchanged = found.cause.startswith("weights not updated")
    return Cause("weights_unchanged" if unchanged else "staleness", ALARM if found.severity == "alarm" else WARNING,
                 found.cause, (found.evidence,), found.action[0].upper() + found.action[1:] + ".",
                 "rcdiag: the lag split and the weights-unchanged check (docs/metrics.md, 'Policy lag')",
                 correct=not unchanged)


def drift(ctx: Context) -> Cause | None:
    found = ctx.timeline.drift if ctx.timeline else None
    if found is None:
        return None
    return Cause("drift", WARNING, f"the mismatch drifts up from step {found.start_step} (×{found.rise:.2g})",
                 (found.text[0].upper() + found.text[1:],), ADVICE + " Re-check the IS threshold against the later "
                 "steps: the report's numbers pool all of them.",
                 "rcdiag: a flat-then-rising fit on a log scale (docs/metrics.md, 'Across training')",
                 step=found.start_step)


def numerics(values: Mapping[str, Any], noise: NoiseSummary | None, floor: Floor | None,
             ctx: Context = Context()) -> Cause:
    """Numerical mismatch, sized against the floor; the fixed bands (but mean |ℓ|, which the floor judges) keep
    their say on the size of the effect."""
    bands = {m: s for m, s in statuses(values).items() if m != FLOOR_BAND or noise is None}
    band_status = worst(bands.values())
    band_reasons = [f"{m} = {num(values[m])} ({s}: {BY_METRIC[m].limit(s)}; {BY_METRIC[m].source})"
                    for level in (ALARM, WARNING) for m, s in bands.items() if s == level]
    if noise is None or not math.isfinite(noise.sigma) or floor is None:
        if band_status == HEALTHY:
            return Cause("floor", HEALTHY, "every headline metric inside its healthy band", (),
                         "No correction needed; keep logging the mismatch metrics.", "rcdiag's health bands")
        return Cause("bands", band_status, "the mismatch is outside the health bands", tuple(band_reasons),
                     f"See the {RECOMMENDATION}.", "rcdiag's health bands (docs/metrics.md, 'Health bands')")
    sizes = (f"noise scale σ̂ = {noise.sigma:.2g} (what {floor.dtype} typically gives: {floor.sigma_typical:.2g}, at "
             f"most {floor.sigma_largest:.2g}{'' if floor.recorded else '; dtypes not recorded, bf16 assumed'}); "
             f"mean |ℓ| {noise.mean_abs:.3g} against a {floor.dtype} floor of {floor.mean_abs_typical:.2g}–"
             f"{floor.mean_abs_largest:.2g} at this run's token probabilities")
    if noise.heavy_tail:
        return Cause("heavy_tail", worst([WARNING, band_status]),
                     f"heavy-tailed mismatch: {noise.tail_share:.2%} of tokens lie beyond {TAIL_K:g}× the run's "
                     f"noise scale (worst |ℓ| {noise.max_abs:.2g})", (sizes, *band_reasons),
                     ("Unusual for a dense model, whose rounding noise has no such tail: check the weight sync, the "
                      f"policy version and the kernels (`rcdiag probe`) before correcting; the {RECOMMENDATION} says "
                      "whether a token-level correction is needed meanwhile." if ctx.architecture == "dense" else
                      "This is what MoE routing flips give: routing replay (R3: the engine's expert choices replayed "
                      f"in the trainer) removes them at the source; the {RECOMMENDATION} says whether a token-level "
                      "correction is needed meanwhile."
                      + ("" if ctx.architecture == "moe" else " On a dense model nothing numerical does: check "
                         "the weight sync and the policy version instead.")),
                     FLOOR_SOURCE + "; MoE: R3, arXiv 2510.11370")
    if noise.sigma > floor.sigma_largest:
        return Cause("above_floor", worst([WARNING, band_status]),
                     f"numerical mismatch above the {floor.dtype} floor: σ̂ {noise.sigma:.2g} is "
                     f"×{noise.sigma / floor.sigma_typical:.2g} what {floor.dtype} typically gives",
                     (sizes, *band_reasons), "Find the setting that adds it: `rcdiag probe RUN` recomputes the "
                     "tokens under each dtype, attention kernel, batch shape and LM-head precision. "
                     f"The {RECOMMENDATION} says whether a correction is needed meanwhile.", FLOOR_SOURCE)
    if band_status != HEALTHY:
        return Cause("bands", band_status, f"the mismatch is at the {floor.dtype} floor but outside the health "
                     "bands", (sizes, *band_reasons), f"See the {RECOMMENDATION}.",
                     "rcdiag's health bands (docs/metrics.md, 'Health bands')")
    lower = {"bfloat16": "run the engine in float16 or float32 (the probe shows how much each removes)",
             "float16": "run both sides in float32"}.get(floor.dtype, "nothing numerical is left to remove")
    return Cause("floor", HEALTHY, f"numerical mismatch at the {floor.dtype} floor: mean |ℓ| {noise.mean_abs:.3g} "
                 f"is what {floor.dtype} gives at this run's token probabilities", (sizes,),
                 f"No correction needed. To lower it, {lower}.", FLOOR_SOURCE)


def diagnose(values: Mapping[str, Any], checks: Iterable[Any], ctx: Context) -> list[Cause]:
    """Every cause that applies, in order of precedence (CAUSE_KINDS); never empty. Nothing measured (no valid
    token, or metrics the data made the library refuse: `ctx.refused`) is `no_data` — n/a, which fails every gate —
    unless a failed input check explains it."""
    noise = ctx.noise
    floor = noise.floor(ctx.dtype) if noise is not None else None
    defects = input_defects(checks)
    errors = [c for c in defects if c.kind == "input_defect"]
    warnings = [c for c in defects if c.kind == "input_warning"]
    measured = any(s in STATUSES for s in statuses(values).values()) or (noise is not None and noise.tokens > 0)
    if ctx.refused or values.get("tokens") == 0 or not measured:
        why = (f"the metrics refused the data: {ctx.refused}" if ctx.refused else
               "no metric could be computed (no valid token)")
        return [*errors, Cause("no_data", UNKNOWN, f"nothing judged: {why}", (),
                               "Fix the data the checks and the message point at, then re-run the report.",
                               CHECKS_SOURCE, correct=False), *warnings]
    bug, change = not_numerics(noise, ctx), step_change(ctx, floor)
    if bug is not None and change is not None:  # the step names when the tokens no precision explains appeared
        change = Cause("step_change", ALARM, f"{change.title}: not numerical mismatch",
                       change.evidence + bug.evidence, f"{CHANGE_ADVICE} {bug.action.split('. ', 1)[1]}",
                       f"{change.source}; {bug.source}", correct=False, step=change.step)
        bug = None
    found = [*errors, bug, change, *ctx.extra, drift(ctx), *warnings,
             _with_probe(numerics(values, noise, floor, ctx), ctx)]
    return [c for c in found if c is not None]


def _with_probe(cause: Cause, ctx: Context) -> Cause:
    """A numerical cause with the probe's measured answer among its evidence (where the gap comes from)."""
    if ctx.probe is None:
        return cause
    return replace(cause, evidence=(*cause.evidence, f"the probe: {ctx.probe}"))


def primary(causes: list[Cause]) -> Cause:
    """The cause the verdict names: a failed input check, else nothing measured, else the first (by precedence)
    of those at the most severe status."""
    for kind in ("input_defect", "no_data"):
        hit = next((c for c in causes if c.kind == kind), None)
        if hit is not None:
            return hit
    status = worst(c.status for c in causes)
    return next(c for c in causes if c.status == status)


def _sentence(text: str) -> str:
    """`text` ending in a full stop ('' stays '')."""
    text = text.strip()
    return text if not text or text.endswith((".", "!", "?")) else text + "."


def _factor(pair: tuple[float, float]) -> str:
    before, after = pair
    if not (before > 0 and math.isfinite(after)):
        return "?"
    x = after / before
    return f"{x:.2g}" if x < 100 else f"{x:,.0f}" if x < 1e6 else f"{x:.1e}"
