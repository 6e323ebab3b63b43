"""Turn the evidence gathered by checks.CheckAccumulator into Findings: one small function per check, in a table.

Each verdict states what was seen (evidence with numbers and a location), how bad it is, and the setting that
fixes it. The statistical checks (temperature, truncation offset) stay quiet ('info') on misaligned data, where
their premise fails.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.metrics.floor import TEMPERATURE_TOLERANCE, temperature_ratio
from rcdiag.checks.evidence import (
    MIN_TOKENS,
    SEVERITIES,
    SIDES,
    CheckAccumulator,
    Finding,
    accumulate,
    sequence_lengths,
)
from rcdiag.store.manifest import Engine, Manifest, Trainer

SHIFT_RATIO = 0.5
"""Another shift fires when its mean |a − b| is below this fraction of the mean at shift 0."""
OFFSET_POSITIVE_SHARE = 0.8
OFFSET_NEGATIVE_SHARE = 0.05
"""An unrecorded one-sided offset: b > a on at least this share of the tokens whose log-probs differ, b < a on at
most that share of all tokens (a temperature below the trainer's also raises most sampled tokens, but lowers many:
b < a on ~18 % of them in tests/fixtures/scenarios.py's temperature_low)."""
ZERO_SHARE = 0.001
MIN_ZEROS = 20
ZERO_SURPRISAL = 0.7
"""One-token supports — b exactly 0.0 where the trainer's p < 0.99 — on at least this share of valid tokens (and
this many), with a mean trainer surprisal −a of at most ZERO_SURPRISAL nats (the support is one token where the
policy is confident; a 0.0 placeholder falls on any token), are a truncated support by themselves: no temperature
or rounding gives a sampled token an exact 0.0 there."""
OFFSET_SIGMAS = 3.0
"""A recorded support's offset is measurable when the signed mean of b − a exceeds this many standard errors
(1.25·mean |ℓ| / √n, the error of a mean of Laplace-like noise)."""


@dataclass
class Context:
    acc: CheckAccumulator
    lengths: tuple[np.ndarray, np.ndarray]
    info: Manifest
    """The run's typed manifest (rcdiag.store.manifest): the checks read the settings it records."""
    thresholds: Sequence[float]
    misaligned: bool = False
    truncated: bool = False

    @property
    def engine(self) -> Engine:
        return self.info.engine or Engine()

    @property
    def trainer(self) -> Trainer:
        return self.info.trainer or Trainer()


def _ok(name: str, message: str, **evidence: Any) -> Finding:
    return Finding(name, "ok", message, evidence)


# ----------------------------------------------------------------------------------------------- verdicts
def check_counts(ctx: Context) -> Finding:
    ids, rows, maxpos = ctx.acc.per_sequence()
    seq_ids, response_len = ctx.lengths
    have = np.zeros(seq_ids.size, dtype=np.int64)
    idx = np.searchsorted(seq_ids, ids)
    have[idx] = rows
    known = response_len >= 0
    bad = np.flatnonzero(known & (have != response_len))
    gaps = np.flatnonzero(maxpos + 1 != rows)
    if not bad.size and not gaps.size:
        return _ok("count_mismatch", f"token rows match response_len for all {seq_ids.size} sequences",
                   sequences=int(seq_ids.size))
    evidence: dict[str, Any] = {"sequences": int(seq_ids.size), "mismatched": int(bad.size),
                                "position_gaps": int(gaps.size)}
    if bad.size:
        i = int(bad[0])
        evidence["first"] = {"seq_id": int(seq_ids[i]), "response_len": int(response_len[i]),
                             "token_rows": int(have[i])}
        evidence["mean_difference"] = float((have[bad] - response_len[bad]).mean())
    if gaps.size:
        evidence["first_gap_seq_id"] = int(ids[gaps[0]])
    return Finding("count_mismatch", "error",
                   f"{bad.size} of {seq_ids.size} sequences have a different number of token rows than their "
                   f"response_len, {gaps.size} have gaps in pos: the two sides were not cut the same way",
                   evidence, "cut both sides at the same response tokens: strip the prompt with the same prompt_len, "
                   "keep (or drop) the EOS token on both, and do not retokenize the response text "
                   "(import the engine's token ids)")


PLACEHOLDER_FIX = ("mask these positions (mask=False) or fill them with real values: request logprobs for every "
                   "sampled token (vLLM SamplingParams(logprobs=0), logprobs_mode=processed_logprobs) and never pad "
                   "with 0.0 / -inf / -1e9 inside the response")


def check_placeholders(ctx: Context) -> Finding:
    counts = {side: {k: v for k, v in stats.counts.items() if v} for side, stats in ctx.acc.sides.items()}
    if ctx.truncated:  # b = 0 exactly is a one-token top-p/top-k support, not a placeholder
        counts["rollout_logprob"].pop("zero", None)
    total = sum(sum(c.values()) for c in counts.values())
    if not total:
        return _ok("placeholders", "no placeholder or impossible values on valid positions")
    fatal = any(k in c for c in counts.values() for k in ("nan", "pos_inf", "neg_inf", "huge_negative", "positive"))
    pos0 = sum(s.pos0 for s in ctx.acc.sides.values())
    # the worst side's share: summing both sides counted a position bad on both twice (up to "200 %")
    share = max(sum(c.values()) for c in counts.values()) / max(ctx.acc.valid, 1)
    severity = "error" if fatal or share >= 1e-3 else "warning"
    parts = [f"{n} × {kind} in {SIDES[side]}" for side, c in counts.items() for kind, n in c.items()]
    where = f"; {pos0} of them at pos 0 (a first-token value the engine did not return)" if pos0 else ""
    first = {side: s.first for side, s in ctx.acc.sides.items() if s.first}
    absent = [side for side, c in counts.items() if c.get("nan", 0) >= ctx.acc.valid]
    if set(counts.get("train_logprob", {})) == {"nan"} and not counts.get("rollout_logprob"):
        fix = ("the training side is missing (null/NaN) on valid tokens — an unfinished or failed rescore: re-run "
               "the rescore (the same `rcdiag score --rescore-only RUN …` command resumes it) before reading the "
               "metrics")
    else:
        fix = PLACEHOLDER_FIX
    return Finding("placeholders", severity,
                   f"placeholder or impossible log-probs on valid positions: {', '.join(parts)} "
                   f"({share:.3%} of valid tokens on the worse side){where}",
                   {"counts": counts, "share": share, "at_pos0": pos0, "first": first},
                   _missing_side_fix(absent) or fix)


def _missing_side_fix(absent: list[str]) -> str | None:
    """The fix when a whole side is missing (an import without trainer or engine log-probs): compute it."""
    if absent == ["train_logprob"]:
        return ("the run has no trainer log-probs: compute them with `rcdiag score --rescore-only RUN "
                "--train-model MODEL` (or `rcdiag score --rescore-both RUN --model MODEL --overwrite` to recompute "
                "the rollout side through vLLM as well)")
    if absent:
        return ("the run lacks the " + " and ".join(SIDES[s] for s in absent) + " log-probs: compute them with "
                "`rcdiag score --rescore-both RUN --model MODEL` (replays the tokens through vLLM, then rescores "
                "them with transformers)")
    return None


def check_shift(ctx: Context) -> Finding:
    n, minus, zero, plus = ctx.acc.shift
    if n < MIN_TOKENS:
        return Finding("alignment_shift", "info", f"only {int(n)} interior token pairs: alignment not tested",
                       {"pairs": int(n)})
    means = {-1: minus / n, 0: zero / n, 1: plus / n}
    best = min(means, key=means.get)
    evidence = {"pairs": int(n), "mean_abs_diff": {str(k): v for k, v in means.items()}, "best_shift": best}
    if best == 0 or means[best] >= SHIFT_RATIO * means[0]:
        return _ok("alignment_shift", f"shift 0 aligns best (mean |a−b| {means[0]:.3g})", **evidence)
    ctx.misaligned = True
    direction = "one position ahead of" if best == 1 else "one position behind"
    return Finding("alignment_shift", "error",
                   f"training log-probs are {direction} the rollout's: mean |a − b| is {means[best]:.3g} at shift "
                   f"{best:+d} against {means[0]:.3g} at shift 0", evidence,
                   "take the training log-prob of token t from the logits at position t−1 (logits[:, :-1] "
                   "against input_ids[:, 1:]) and slice the response from prompt_len−1, not prompt_len")


def check_temperature(ctx: Context) -> Finding:
    """The temperature signature on confident tokens (rcdiag.analysis.metrics.floor): q = log(log(−b)/log(−a)) sits at
    ≈ −log(T_engine/T_trainer) on every confident token when the temperatures differ, and at 0 ± noise otherwise —
    numerical noise, however heavy, moves its median by < 0.01 (the least-squares slope of b on a, kept in the
    evidence, is attenuated by noise on either side and read heavy MoE-like noise as a sharper engine)."""
    engine_t, trainer_t = ctx.engine.temperature, ctx.trainer.temperature
    noise = ctx.acc.noise.finish()
    n = noise.confident
    if ctx.misaligned or ctx.truncated or not math.isfinite(noise.temperature_q):
        why = ("misaligned data" if ctx.misaligned else "the engine renormalised over a top-p/top-k support, which "
               "also sharpens its log-probs" if ctx.truncated else f"only {n} confident tokens (p ≥ ½ on both sides)")
        return Finding("temperature", "info", f"temperature signature not tested ({why})", {"confident_tokens": n})
    q = noise.temperature_q
    evidence = {"confident_tokens": n, "median_q": q, "surprisal_exponent": temperature_ratio(q),
                **_least_squares(ctx.acc.fit), "manifest_engine_temperature": engine_t,
                "manifest_trainer_temperature": trainer_t}
    if abs(q) <= TEMPERATURE_TOLERANCE:
        return _ok("temperature", f"both sides use the same temperature: on {n:,} confident tokens the engine's "
                   f"surprisal is the trainer's to the power {temperature_ratio(q):.3f} (median; 1 when equal)",
                   **evidence)
    sharper, lower = ("rollout", "below") if q > 0 else ("training", "above")
    return Finding("temperature", "error",
                   f"the {sharper} log-probs are sharper: on {n:,} confident tokens (p ≥ ½ on both sides) the "
                   f"engine's surprisal −log p is the trainer's to the power {temperature_ratio(q):.2f} (median; "
                   f"1 when both use the same temperature, > 1 when the engine's distribution is sharper) — the "
                   f"signature of the engine sampling at a temperature {lower} the one the trainer scores at. "
                   f"Manifest: engine T={engine_t}, trainer T={trainer_t}", evidence,
                   "divide the trainer's logits by the sampling temperature, and have the engine return "
                   "post-temperature values (vLLM logprobs_mode=processed_logprobs; TRL/verl pass the rollout "
                   "temperature to the actor's log-prob computation)")


def _least_squares(fit: np.ndarray) -> dict[str, float]:
    """The least-squares line b ≈ slope·a + intercept over clean tokens (evidence only: see check_temperature)."""
    n, sa, sb, saa, sab, _ = fit
    var_a = saa / n - (sa / n) ** 2 if n else 0.0
    slope = (sab / n - sa * sb / n**2) / var_a if var_a > 0 else 1.0
    return {"slope": float(slope), "intercept": float(sb / n - slope * sa / n) if n else 0.0}


def recorded_support(engine: Engine) -> dict[str, Any]:
    """The top-p / top-k support the manifest records the engine sampling over ({} when none: top_p 1 or unset,
    top_k ≤ 0 or unset). With processed log-probs (vLLM's default for RL) the engine's log-probs are renormalised
    over it; raw log-probs are not (the manifest flag check reports those)."""
    found: dict[str, Any] = {}
    if isinstance(engine.top_p, int | float) and 0 < engine.top_p < 1:
        found["top_p"] = engine.top_p
    if isinstance(engine.top_k, int) and not isinstance(engine.top_k, bool) and engine.top_k > 0:
        found["top_k"] = engine.top_k
    if found and str(engine.logprobs_mode or "").startswith("raw"):
        return {}
    return found


def check_truncation(ctx: Context) -> Finding:
    """A top-p/top-k renormalisation raises every sampled token's log-prob by −log S ≥ 0 (S the kept mass). Three
    signs of it, each enough: the manifest records a support (top_p < 1 or top_k > 0) with processed log-probs; a
    one-sided offset (b > a on ≥ 80 % of tokens, b < a on ≤ 5 %); or one-token supports — b exactly 0.0 where the
    trainer gave p < 1 — on ≥ ZERO_SHARE of valid tokens (a placeholder is never a sampled token's exact 0.0 that
    often). The signs are judged on tokens with both log-probs below 0; the kept mass on those with b > a plus the
    one-token supports (b exactly 0.0, a < 0: S = exp(a)), which an estimate over b < 0 alone left out (it read
    0.942 for an exact 0.951). The signed mean of b − a and its sign on the unconfident tokens (p < ½ on both
    sides, where a sharper temperature would lower b) are evidence beside them."""
    total, positive, negative, equal, zero_total, zeros, u_pos, u_neg, signed = ctx.acc.offset
    count = positive + negative + equal
    support = recorded_support(ctx.engine)
    top_p, top_k = ctx.engine.top_p, ctx.engine.top_k
    if count < MIN_TOKENS or ctx.misaligned:
        return Finding("truncation_offset", "info", "top-p/top-k offset not tested (too few usable tokens or "
                       "misaligned data)", {"tokens": int(count)})
    mean = (total + zero_total) / max(positive + zeros, 1)
    noise = ctx.acc.noise.finish()
    spread = 1.25 * noise.mean_abs / math.sqrt(count) if math.isfinite(noise.mean_abs) else math.inf
    evidence = {"share_b_above_a": positive / count, "share_b_below_a": negative / count,
                "mean_offset": mean, "implied_kept_mass": math.exp(-mean), "one_token_supports": int(zeros),
                "signed_mean_offset": signed / count, "signed_mean_error": spread,
                "unconfident_share_b_above_a": u_pos / max(u_pos + u_neg, 1), "manifest_top_p": top_p,
                "manifest_top_k": top_k}
    moved = positive + negative
    one_sided = (moved > 0 and positive / moved >= OFFSET_POSITIVE_SHARE and negative / count <= OFFSET_NEGATIVE_SHARE)
    one_token = (zeros >= max(MIN_ZEROS, ZERO_SHARE * max(ctx.acc.valid, 1))
                 and zero_total / zeros <= ZERO_SURPRISAL)
    measurable = signed / count > OFFSET_SIGMAS * spread
    if not (support or one_sided or one_token):
        return _ok("truncation_offset", "no one-sided offset: b − a changes sign as numeric noise does",
                   **evidence)
    ctx.truncated = True
    evidence["rollout_exact_zeros"] = ctx.acc.sides["rollout_logprob"].counts["zero"]
    recorded = ", ".join(f"{k}={v}" for k, v in support.items())
    size = (f"b > a on {positive / count:.1%} of tokens (b < a on {negative / count:.2%}), mean b − a "
            f"{signed / count:+.3g} nats (±{spread:.1g}), kept mass S ≈ {math.exp(-mean):.3f}"
            + (f", {int(zeros):,} one-token supports (b = 0.0 exactly)" if zeros else ""))
    fix = ("sample RL rollouts with top_p=1.0 and top_k=-1 (0 in HF), or renormalise the trainer's log-probs over "
           "the same kept support (vLLM return_sampling_mask)")
    if support and not (measurable or one_sided or one_token):
        return Finding("truncation_offset", "info",
                       f"the manifest records sampling over a truncated support ({recorded}, processed log-probs), "
                       f"but its offset is not measurable here ({size}): the kept mass is ≈ 1 on these tokens",
                       evidence, fix)
    if support:
        why = (f"the manifest records sampling over a truncated support ({recorded}) with processed log-probs, so "
               f"the engine's log-probs are renormalised over it (b − a = −log S ≥ 0); measured: {size}")
    elif one_token:
        why = (f"{int(zeros):,} tokens have a rollout log-prob of exactly 0.0 where the trainer's is below 0 — "
               f"one-token top-p/top-k supports; the engine renormalised over a truncated support ({size}). "
               f"Manifest: top_p={top_p}, top_k={top_k}")
    else:
        why = (f"{size}: the engine renormalised over a top-p/top-k support (b − a = −log S). Manifest: "
               f"top_p={top_p}, top_k={top_k}")
    return Finding("truncation_offset", "warning", why, evidence, fix)


def _grids(ctx: Context) -> dict[str, Any]:
    return {side: stats.grid() for side, stats in ctx.acc.sides.items()}


def noise_floor(ctx: Context) -> dict[str, float] | None:
    """The rounding noise the storage grid puts on ℓ: typical |ℓ| and the p99 bound on |ℓ| (nats); None if none."""
    grids = {side: g for side, g in _grids(ctx).items() if g is not None}
    if not grids:
        return None
    halves = {side: ctx.acc.sides[side].half_ulp(g) for side, g in grids.items()}
    var = sum(h["ulp_sq_mean"] / 12 for h in halves.values())
    return {"mean_abs": math.sqrt(var) * math.sqrt(2 / math.pi), "p99_bound": sum(h["p99"] for h in halves.values()),
            "max_bound": sum(h["max"] for h in halves.values())}


def check_quantisation(ctx: Context) -> Finding:
    grids = {side: g.name for side, g in _grids(ctx).items() if g is not None}
    floor = noise_floor(ctx)
    if floor is None:
        return _ok("storage_precision", "log-probs are stored at float32 precision")
    names = ", ".join(f"{SIDES[s]} on the {g} grid" for s, g in grids.items())
    return Finding("storage_precision", "warning",
                   f"stored log-probs were rounded to a lower precision ({names}): rounding alone puts a noise "
                   f"floor of ≈ {floor['mean_abs']:.2g} nats on mean |ℓ| (up to {floor['p99_bound']:.2g} on 99% of "
                   "tokens); smaller mismatches cannot be measured from this data",
                   {"grids": grids, "noise_floor": floor},
                   "store log-probs as float32 (e.g. slime/verl: keep rollout_log_probs in float32, "
                   "old_log_prob.float() before saving)")


def check_threshold_floor(ctx: Context) -> Finding:
    floor = noise_floor(ctx)
    if floor is None:
        return _ok("threshold_floor", "thresholds are not limited by storage precision")
    below = [c for c in sorted(set(ctx.thresholds)) if math.log(c) <= floor["p99_bound"]]
    evidence = {"p99_rounding_bound": floor["p99_bound"], "thresholds_below": below}
    if not below:
        return _ok("threshold_floor", f"every threshold's log C exceeds the rounding bound {floor['p99_bound']:.2g}",
                   **evidence)
    return Finding("threshold_floor", "warning",
                   f"threshold(s) {', '.join(f'{c:g}' for c in below)} lie within storage rounding: log C ≤ "
                   f"{floor['p99_bound']:.3g} nats, so rounding alone clips or masks tokens at them", evidence,
                   "use a larger threshold or store the log-probs as float32")


MANIFEST_FLAGS: tuple[tuple[str, Callable[[Context], Any], Callable[[Any], bool], str, str, str], ...] = (
    ("allow_truncated_sampling", lambda ctx: ctx.engine.allow_truncated_sampling, bool, "warning",
     "the run was scored with allow_truncated_sampling: top-p/top-k renormalise the engine's log-probs",
     "sample with top_p=1.0 and top_k=-1 for RL rollouts"),
    ("retokenized", lambda ctx: ctx.info.source.retokenized, bool, "warning",
     "the import re-tokenized response text: token boundaries may differ from what the engine sampled",
     "import the engine's token ids instead of text"),
    ("logprobs_mode", lambda ctx: ctx.engine.logprobs_mode, lambda v: str(v).startswith("raw"), "error",
     "the engine returned raw log-probs (before temperature/top-p): they are not the sampling distribution",
     "set vLLM logprobs_mode=processed_logprobs (`--logprobs-mode processed_logprobs` for a vLLM server)"),
)
"""(manifest field, its typed read, when it fires, severity, message, fix) of each manifest flag."""


def check_manifest(ctx: Context) -> Finding:
    hits = []
    for key, read, fires, severity, message, fix in MANIFEST_FLAGS:
        value = read(ctx)
        if value is not None and fires(value):
            hits.append((severity, f"{message} ({key}={value!r})", fix))
    engine_t, trainer_t = ctx.engine.temperature, ctx.trainer.temperature
    engine_t = 1.0 if engine_t == 0 else engine_t  # greedy: the engine's processed log-probs are at T = 1
    for warning in ctx.info.warnings:
        hits.append(("warning", f"the run recorded a warning: {warning}", ""))
    if isinstance(engine_t, int | float) and isinstance(trainer_t, int | float) and engine_t != trainer_t:
        hits.append(("error", f"the manifest records sampling temperature {engine_t} but training temperature "
                     f"{trainer_t}", "score the trainer side at the sampling temperature"))
    if not hits:
        return _ok("manifest_flags", "the manifest records no convention problem")
    severity = max((h[0] for h in hits), key=["ok", "info", "warning", "error"].index)
    return Finding("manifest_flags", severity, "; ".join(h[1] for h in hits), {"flags": [h[1] for h in hits]},
                   "; ".join(dict.fromkeys(h[2] for h in hits if h[2])))


VERDICTS: tuple[Callable[[Context], Finding], ...] = (
    check_counts, check_shift, check_truncation, check_temperature, check_placeholders, check_quantisation,
    check_threshold_floor, check_manifest)
"""Every check, in evaluation order: alignment gates the statistical checks; truncation explains b = 0 exactly and
sharpens the engine's log-probs (so it gates the temperature signature)."""


def findings(acc: CheckAccumulator, lengths: tuple[np.ndarray, np.ndarray],
             manifest: Manifest | dict[str, Any] | None, thresholds: Sequence[float] = (DEFAULT_THRESHOLD,)
             ) -> list[Finding]:
    """All verdicts on gathered evidence, worst first (stable within a severity). `manifest`: the run's `info`
    (or a manifest dict, validated here)."""
    ctx = Context(acc, lengths, Manifest.of(manifest), tuple(thresholds))
    return worst_first([verdict(ctx) for verdict in VERDICTS])


def worst_first(findings: list[Finding]) -> list[Finding]:
    """Findings sorted error → warning → info → ok (stable within a severity)."""
    return sorted(findings, key=lambda f: -SEVERITIES.index(f.severity))


def run_checks(run: Any, *, thresholds: Sequence[float] = (DEFAULT_THRESHOLD,), silent: bool = True) -> list[Finding]:
    """Every check on a Run, worst first. `thresholds`: the IS thresholds C the user intends to use."""
    return findings(accumulate(run, silent=silent), sequence_lengths(run), run.info, thresholds)
