"""The verdict's causes: what is most likely wrong with a run, the evidence, what to do, and whether a correction
may be advised — one rule per cause, tried in order of precedence.

A verdict is a claim about a cause. The order (rcdiag's; the sources of each rule are in its docstring and in
`Cause.source`):
1. **input defect** — a failed input check (misalignment, placeholders, temperature, truncation): the numbers
   measure the defect; fix it first. No correction.
2. **the shape of a bug** — the first response positions of the sequences disagree and the gap fades (the two sides
   saw different prompts), or a few sequences hold most of the mismatch (rows paired with the wrong sequence):
   rcdiag.analysis.verdict.shapes. No correction. These read the data, so they hold on imports that record nothing.
3. **not numerics** — tokens no precision explains (rcdiag.analysis.metrics.floor: |ℓ| beyond 15 nats on any
   model, beyond 2 nats — or a heavy tail — on a known dense one). Check the weight sync, the policy version, the
   tokenizer and the alignment. No correction: it would hide the bug and keep training on another policy's data.
4. **a change across training** — the mismatch jumped at one step (rcdiag.analysis.training.drift), or an analysis
   the caller contributes (`Context.extra`: weights unchanged or staleness from policy versions, routing).
   An alarm (no correction) when the new level is more than the run's dtype explains; else a warning.
5. **drift** — the mismatch rises slowly across steps: a warning; re-check the threshold on the later steps.
6. **numerical mismatch**, sized against the run's own floor (what its precision gives at its token
   probabilities: each side's dtype, the engine's quantization and KV cache, rcdiag.analysis.metrics.precision):
   heavy-tailed (beyond the run's noise AND what its precision can give: MoE routing flips — correct at token
   level, or replay the routes), growing with position from an onset, above the floor (find the setting:
   `rcdiag probe`), beyond a health band, at a floor large enough to bias the gradient (a quantized engine: a
   token-level correction removes that bias), or at or below the floor — healthy, whatever the fixed bands say.
What the run does not record (dtypes, architecture) is named in the numerical causes' evidence, with what was
assumed in its place.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from rcdiag.analysis.metrics.floor import (
    ANY_LIMIT,
    DENSE_LIMIT,
    DENSE_TAIL_SHARE,
    FLIP_GAP,
    TAIL_K,
    TAIL_SHARE,
    NoiseSummary,
)
from rcdiag.analysis.metrics.precision import Floor, Precision
from rcdiag.analysis.training.drift import ADVICE, CHANGE_ADVICE
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
from rcdiag.analysis.verdict.model import Cause, Context
from rcdiag.analysis.verdict.shapes import few_sequences, position_onset, prompt_mismatch

CAUSE_KINDS = ("input_defect", "prompt_mismatch", "few_sequences", "not_numerics", "step_change", "weights_unchanged",
               "staleness", "extra", "drift", "input_warning", "bit_exact", "heavy_tail", "position_onset",
               "above_floor", "bands", "material_floor", "floor", "no_data")
"""Every kind of cause, in order of precedence."""
FLOOR_BAND = "abs_log_ratio_mean"
"""The band the floor replaces: mean |ℓ| is judged against what the run's dtypes give, not a fixed number."""
RECOMMENDATION = "recommendation (the report's, the dashboard's Overview)"
"""Where a cause's action sends the user for the correction: named by place, as the action is also shown where no
recommendation follows it (the dashboard's Routing page, the notebook card)."""
FLOOR_SOURCE = ("rcdiag's floor model: ℓ ≈ σ·(1 − p) per token for rounding-like noise, σ measured per dtype "
                "(docs/metrics.md, 'The noise floor')")
CHECKS_SOURCE = "rcdiag's input checks (docs/metrics.md, 'Input checks')"
MATERIAL = 0.05
"""Mean |ℓ| beyond which the mismatch biases the gradient materially even at its floor: each token's weight is off by
~5 % on average, which an IS correction removes on every token, not only where it clips (rcdiag's choice: the same
5 % a recommended correction may add, BIAS_LIMIT; FlashRL and the FP8-RL reports train quantized rollouts with TIS
on). Dense bf16 runs measured here: 0.0035 (sample model), 0.025–0.027 (SmolLM2)."""


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


def not_numerics(noise: NoiseSummary | None, ctx: Context, floor: Floor | None = None,
                 renormalised: bool = False) -> Cause | None:
    """Tokens no precision explains (rcdiag.analysis.metrics.floor's rules and sources); a dense model's heavy tail
    counts only where its tokens are also beyond what the run's precision can give (`NoiseSummary.heavy`). When the
    engine renormalised over a top-p/top-k support (`renormalised`), b − a = −log S moves tokens by more than the
    dense limits, so only the any-model limit stands."""
    if noise is None or noise.tokens == 0:
        return None
    dense = ctx.architecture == "dense" and not renormalised
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
    if dense and noise.heavy(floor, DENSE_TAIL_SHARE):
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
    if noise is not None and noise.bit_exact:
        return Cause("bit_exact", HEALTHY, f"bit-exact on-policy: all {noise.tokens:,} tokens' log-probs are "
                     "identical on both sides", (
                         "every clean token has a = b to the last bit of the stored float32: kl, k3_kl and χ² are 0 "
                         "and every ratio 1 exactly, in float64 (a k3 that only rounds to 0 proves nothing; this one "
                         "is 0 token by token)",), "No correction needed: the trainer scores what the engine sampled. "
                     "Keep the setup that makes it so (the same kernels, dtypes and batch-invariant reductions on "
                     "both sides) and keep auditing it.", "prime-rl's bit audit (logprob_bit_mismatch); rcdiag "
                     "counts bit-identical tokens (docs/metrics.md, 'The noise floor')")
    if noise is None or not math.isfinite(noise.sigma) or floor is None:
        if band_status == HEALTHY:
            return Cause("floor", HEALTHY, "every headline metric inside its healthy band", (),
                         "No correction needed; keep logging the mismatch metrics.", "rcdiag's health bands")
        return Cause("bands", band_status, "the mismatch is outside the health bands", tuple(band_reasons),
                     f"See the {RECOMMENDATION}.", "rcdiag's health bands (docs/metrics.md, 'Health bands')")
    sizes = (f"noise scale σ̂ = {noise.sigma:.2g} against the {floor.dtype} floor's {floor.sigma_typical:.2g} "
             f"(typical) to {floor.sigma_largest:.2g} (largest plausible); mean |ℓ| {noise.mean_abs:.3g} against "
             f"{floor.mean_abs_typical:.2g}–{floor.mean_abs_largest:.2g} at this run's token probabilities")
    unknown = ctx.not_recorded(floor)
    identical = (f"; {noise.identical / noise.tokens:.1%} of tokens bit-identical on both sides"
                 if noise.identical and noise.tokens else "")
    told = (sizes + identical, *([f"not recorded: {unknown}"] if unknown else []))
    if noise.heavy(floor):
        return Cause("heavy_tail", worst([WARNING, band_status]),
                     f"heavy-tailed mismatch: {noise.tail_share:.2%} of tokens lie beyond {TAIL_K:g}× the run's "
                     f"noise scale (worst |ℓ| {noise.max_abs:.2g})", (*told, *band_reasons),
                     ("Unusual for a dense model, whose rounding noise has no such tail: check the weight sync, the "
                      f"policy version and the kernels (`rcdiag probe`) before correcting; the {RECOMMENDATION} says "
                      "whether a token-level correction is needed meanwhile." if ctx.architecture == "dense" else
                      "This is what MoE routing flips give: routing replay (R3: the engine's expert choices replayed "
                      f"in the trainer) removes them at the source; the {RECOMMENDATION} says whether a token-level "
                      "correction is needed meanwhile."
                      + ("" if ctx.architecture == "moe" else " On a dense model nothing numerical does: check "
                         "the weight sync and the policy version instead.")),
                     FLOOR_SOURCE + "; MoE: R3, arXiv 2510.11370")
    onset = position_onset(ctx.positions, floor)
    if onset is not None:
        return replace(onset, status=worst([onset.status, band_status]),
                       evidence=(*onset.evidence, *told[1:], *band_reasons))
    quantized = isinstance(ctx.dtype, Precision) and bool(ctx.dtype.quantization or ctx.dtype.kv_cache)
    if noise.sigma > floor.sigma_largest or noise.mean_abs > floor.mean_abs_largest:
        over = (f"σ̂ {noise.sigma:.2g} is ×{noise.sigma / floor.sigma_typical:.2g} its typical "
                f"{floor.sigma_typical:.2g}" if noise.sigma > floor.sigma_largest else
                f"mean |ℓ| {noise.mean_abs:.3g} is beyond the {floor.mean_abs_largest:.2g} it gives at this run's "
                "token probabilities")
        maybe_quantized = "" if quantized else (
            " If the engine runs quantized (fp8/int8 weights, an fp8 KV cache), this may be its floor: record it "
            "(`rcdiag score --quantization/--kv-cache-dtype`, `rcdiag import --quantization`) and the report "
            "judges it against that.")
        return Cause("above_floor", worst([WARNING, band_status]),
                     f"numerical mismatch above the {floor.dtype} floor: {over}", (*told, *band_reasons),
                     "Find the setting that adds it: `rcdiag probe RUN` recomputes the tokens under each dtype, "
                     f"attention kernel, batch shape and LM-head precision.{maybe_quantized} The {RECOMMENDATION} "
                     "says whether a correction is needed meanwhile.", FLOOR_SOURCE)
    if noise.mean_abs > MATERIAL:
        return Cause("material_floor", worst([WARNING, band_status]),
                     f"numerical mismatch at the {floor.dtype} floor, large enough to bias training: mean |ℓ| "
                     f"{noise.mean_abs:.3g} (each token's weight off by ~{noise.mean_abs:.0%})", (*told, *band_reasons),
                     "Correct it: an IS correction reweights every token by π_train/π_rollout, removing the bias "
                     "whether or not it clips (FlashRL and the FP8-RL reports train quantized rollouts with TIS "
                     f"on); the {RECOMMENDATION} gives the setting. To shrink the floor itself, quantize less (the "
                     "KV cache in bf16, fp8 weights only) or align the trainer's quantization with the engine's.",
                     FLOOR_SOURCE + f"; material above mean |ℓ| {MATERIAL:g} (docs/metrics.md, 'The noise floor')")
    if band_status != HEALTHY:
        return Cause("bands", band_status, f"the mismatch is at or below the {floor.dtype} floor but outside the "
                     "health bands", (*told, *band_reasons), f"See the {RECOMMENDATION}.",
                     "rcdiag's health bands (docs/metrics.md, 'Health bands')")
    lower = _lower(ctx.dtype if isinstance(ctx.dtype, Precision) else Precision.coarse(ctx.dtype), floor)
    return Cause("floor", HEALTHY, f"numerical mismatch at or below the {floor.dtype} floor (mean |ℓ| "
                 f"{noise.mean_abs:.3g} ≤ {floor.mean_abs_largest:.2g})", told,
                 f"No correction needed. To lower it, {lower}.", FLOOR_SOURCE)


def _lower(precision: Precision, floor: Floor) -> str:
    """What lowers the floor: the coarser side's precision, named."""
    coarse, side = floor.coarsest, precision.coarser_side()
    if precision.quantization or precision.kv_cache:
        return "quantize less on the engine (the KV cache in bf16, weights in bf16)"
    if coarse == "float32":
        return "nothing numerical is left to remove (both sides compute in float32)"
    finer = "float16 or float32" if coarse == "bfloat16" else "float32"
    if side == "both":
        return f"run both sides in {finer} (both compute in {coarse}; the probe shows how much each removes)"
    return f"run the {side} in {finer} (it computes in {coarse}; the probe shows how much each removes)"


def diagnose(values: Mapping[str, Any], checks: Iterable[Any], ctx: Context) -> list[Cause]:
    """Every cause that applies, in order of precedence (CAUSE_KINDS); never empty. Nothing measured (no valid
    token, or metrics the data made the library refuse: `ctx.refused`) is `no_data` — n/a, which fails every gate —
    unless a failed input check explains it."""
    noise = ctx.noise
    floor = ctx.floor()
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
    shaped = [c for c in (prompt_mismatch(ctx.positions, floor), few_sequences(ctx.concentration, floor)) if c]
    renormalised = any(_convention(c) for c in warnings)
    bug, change = not_numerics(noise, ctx, floor, renormalised), step_change(ctx, floor)
    if shaped and bug is not None:  # the shape names what the tokens no precision explains come from
        shaped[0] = replace(shaped[0], evidence=(*shaped[0].evidence, *bug.evidence))
        bug = None
    if (bug is not None or shaped) and change is not None:  # the step names when they appeared
        found = bug or shaped[0]
        change = Cause("step_change", ALARM, f"{change.title}: not numerical mismatch",
                       change.evidence + found.evidence, f"{CHANGE_ADVICE} {found.action.split('. ', 1)[1]}",
                       f"{change.source}; {found.source}", correct=False, step=change.step)
        bug = None
    found = [*errors, *shaped, bug, change, *ctx.extra, drift(ctx), *warnings,
             _with_probe(numerics(values, noise, floor, ctx), ctx)]
    return [c for c in found if c is not None]


def _with_probe(cause: Cause, ctx: Context) -> Cause:
    """A numerical cause with the probe's measured answer among its evidence (where the gap comes from)."""
    if ctx.probe is None:
        return cause
    return replace(cause, evidence=(*cause.evidence, f"the probe: {ctx.probe}"))


def primary(causes: list[Cause]) -> Cause:
    """The cause the verdict names: a failed input check, else the shape of a bug, else a convention warning (a
    top-p/top-k support, a manifest flag: the numbers then measure that setting, as a failed check's measure its
    defect), else nothing measured, else the first (by precedence) of those at the most severe status."""
    for kinds in (("input_defect",), SHAPE_KINDS, ("convention",), ("no_data",)):
        hit = next((c for c in causes if c.kind in kinds or (kinds == ("convention",) and _convention(c))), None)
        if hit is not None:
            return hit
    status = worst(c.status for c in causes)
    return next(c for c in causes if c.status == status)


SHAPE_KINDS = ("prompt_mismatch", "few_sequences")
"""The bugs the mismatch's shape names (rcdiag.analysis.verdict.shapes)."""


def _convention(cause: Cause) -> bool:
    """An input warning whose fix is a setting and under which no correction is advised (CONVENTION_WARNINGS)."""
    return cause.kind == "input_warning" and not cause.correct


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
