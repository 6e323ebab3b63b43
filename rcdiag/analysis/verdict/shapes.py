"""The verdict's causes read from the mismatch's shape — where in the responses and in which sequences it sits —
rather than from what the manifest records (most imports record no architecture, no dtypes).

- **Prompt mismatch** (a bug): the first response positions of most sequences are far above the later ones' noise
  and the excess fades with position. Numerics has no reason to favour position 0; two sides that conditioned on
  different prompt tokens (a chat template, a system prompt, a BOS token on one side only, a truncated prompt) do
  exactly that, until the response's own tokens dominate the context.
- **A few sequences** (a bug): the top 2 % of sequences hold most of Σ|ℓ| at a per-token level far above the typical
  sequence's (rcdiag.analysis.distributions.shape). Rounding and routing flips hit tokens independently of their
  sequence; another sequence's log-probs, a row paired with the wrong sample, or a sample from another policy hits
  whole sequences.
- **An onset with position** (numerics): the early positions sit at the floor and the later ones above it from some
  position on — precision that degrades with the context a step attends over (a quantized KV cache, RoPE or
  attention in low precision at long context).

Each returns a verdict Cause or None; rcdiag.analysis.verdict.causes ranks them.
"""
from __future__ import annotations

import math

from rcdiag.analysis.distributions.shape import CONCENTRATED_RATIO, CONCENTRATED_SHARE, Concentration
from rcdiag.analysis.metrics.floor import TAIL_K
from rcdiag.analysis.metrics.position_noise import MIN_BAND_SCORED, Band, PositionProfile
from rcdiag.analysis.metrics.precision import Floor
from rcdiag.analysis.verdict.health import ALARM, WARNING
from rcdiag.analysis.verdict.model import Cause

PROMPT_RATIO = 10.0
"""The first response position's noise scale at least this many times the later positions' (≥ LATE_START) is a
prompt mismatch (rcdiag's choice: routing flips and rounding leave position 0 within ~2× of the rest)."""
EARLY_END = 4
"""The 'first positions': bands starting below this (0, 1, 2–3)."""
LATE_START = 16
"""Positions from here on are the response's own context."""
ONSET_SHARE = 0.1
"""An onset needs at least this share of the scored tokens in bands above the floor."""
ONSET_MAJORITY = 2 / 3
"""…and from the onset band on, at least this share of the tokens in bands above it."""
SHAPE_SOURCE = "rcdiag: the mismatch by response position and by sequence (docs/metrics.md, 'The shape of the mismatch')"


def scale(band: Band) -> float:
    """A band's noise scale: its σ̂ where it holds MIN_BAND_SCORED scored tokens, else the one its mean |ℓ| implies
    under the floor model (E|ℓ| ≈ σ·√(2/π)·E[1 − p])."""
    if math.isfinite(band.sigma):
        return band.sigma
    if band.mean_gap > 0 and math.isfinite(band.mean_gap):
        return band.mean_abs / (math.sqrt(2 / math.pi) * band.mean_gap)
    return math.nan


def _late_scale(profile: PositionProfile) -> float:
    """The median noise scale of the bands from LATE_START on that hold enough scored tokens (token-weighted)."""
    late = sorted((b.sigma, b.scored) for b in profile.bands if b.start >= LATE_START and math.isfinite(b.sigma))
    total = sum(n for _, n in late)
    if not total:
        return math.nan
    seen = 0
    for sigma, n in late:
        seen += n
        if seen * 2 >= total:
            return sigma
    return late[-1][0]


def prompt_mismatch(profile: PositionProfile | None, floor: Floor | None) -> Cause | None:
    """The prompt-mismatch cause (module doc), or None."""
    if profile is None or floor is None:
        return None
    bands = {b.start: b for b in profile.bands}
    first, late = bands.get(0), _late_scale(profile)
    if first is None or not first.scored or not math.isfinite(late) or late <= 0:
        return None
    early = [b for b in profile.bands if b.start < EARLY_END]
    s0 = scale(first)
    fading = [scale(b) for b in profile.bands if b.start < LATE_START]
    if not (s0 >= PROMPT_RATIO * late and s0 > floor.sigma_largest and fading[-1] < s0):
        return None
    share = first.beyond(TAIL_K * max(late, floor.sigma_largest))
    profile_text = ", ".join(f"{b.label}: {scale(b):.2g}" for b in profile.bands if b.start < LATE_START)
    evidence = (f"noise scale σ̂ at the first response position {s0:.2g}, ×{s0 / late:,.0f} the later positions' "
                f"({late:.2g} from position {LATE_START} on); by position: {profile_text}",
                f"mean |ℓ| {sum(b.mean_abs * b.tokens for b in early) / sum(b.tokens for b in early):.3g} at "
                f"positions 0–{EARLY_END - 1} against {_late_mean(profile):.3g} from {LATE_START} on"
                + (f"; the first token of {share:.0%} of the sequences lies beyond {TAIL_K:g}× the later noise"
                   if math.isfinite(share) else ""))
    return Cause("prompt_mismatch", ALARM, "not numerical mismatch: the first response tokens of the sequences "
                 "disagree and the gap fades with position — the two sides saw different prompts", evidence,
                 "Compare the prompt tokens both sides scored: the chat template (its version, "
                 "add_generation_prompt, a system prompt), a BOS or special token added on one side only, a prompt "
                 "truncated or re-rendered before rescoring. Rescore with the engine's exact prompt token ids. A "
                 "correction would train on log-probs of another context.", SHAPE_SOURCE, correct=False)


def _late_mean(profile: PositionProfile) -> float:
    late = [b for b in profile.bands if b.start >= LATE_START]
    tokens = sum(b.tokens for b in late)
    return sum(b.mean_abs * b.tokens for b in late) / tokens if tokens else math.nan


def few_sequences(found: Concentration | None, floor: Floor | None) -> Cause | None:
    """The few-sequences cause (module doc), or None — also when those sequences' own level is within what the
    run's precision can give (a run one ulp off in one token is "concentrated" in one sequence, and harmless)."""
    if found is None or not found.concentrated:
        return None
    if floor is not None and found.top_mean <= floor.mean_abs_largest:
        return None
    ids = ", ".join(str(i) for i in found.ids)
    return Cause("few_sequences", ALARM, f"not numerical mismatch: {found.top} of {found.sequences:,} sequences "
                 f"hold {found.share:.0%} of the mismatch", (
                     f"the top {found.top} sequences by Σ|ℓ| (> {CONCENTRATED_SHARE:.0%} of it) have mean |ℓ| "
                     f"{found.top_mean:.3g} per token, ×{found.ratio:,.0f} the median sequence's "
                     f"{found.median_mean:.3g} (≥ {CONCENTRATED_RATIO:g}×: numerics hits tokens, not sequences)",
                     f"worst sequences: {ids} (the report's worst sequences; the dashboard's Sequences page)"),
                 "Check how the dump pairs rows: another sequence's log-probs (a sample index, a sort by length "
                 "undone on one side only, left vs right padding), a sample generated by another policy or prompt. "
                 "Open the worst sequences token by token. A correction would mask or down-weight whole sequences "
                 "and hide the bug.", SHAPE_SOURCE, correct=False)


def position_onset(profile: PositionProfile | None, floor: Floor | None) -> Cause | None:
    """The onset cause (module doc), or None: a numerical cause (a correction may be advised)."""
    if profile is None or floor is None:
        return None
    bands = [b for b in profile.bands if b.start >= LATE_START and b.scored >= MIN_BAND_SCORED]
    scored = sum(b.scored for b in profile.bands)
    above = [b.sigma > floor.sigma_largest for b in bands]
    if not any(above) or not scored:
        return None
    for j, band in enumerate(bands):
        if not above[j] or j == 0:  # above from the first band on: no onset (the whole-run floor judges it)
            continue
        head, tail = bands[:j], bands[j:]
        head_scored = sum(b.scored for b in head)
        if sum(b.scored for b, a in zip(head, above[:j], strict=True) if a) > 0.2 * head_scored:
            return None
        over = sum(b.scored for b, a in zip(tail, above[j:], strict=True) if a)
        if over >= ONSET_MAJORITY * sum(b.scored for b in tail) and over >= ONSET_SHARE * scored:
            before = sum(b.sigma * b.scored for b in head) / head_scored
            after = max(b.sigma for b in tail)
            return Cause("position_onset", WARNING,
                         f"numerical mismatch that grows with position: above the {floor.dtype} floor from "
                         f"position {band.start:,} on", (
                             f"noise scale σ̂ {before:.2g} before position {band.start:,} (within {floor.dtype}'s "
                             f"{floor.sigma_largest:.2g}), up to {after:.2g} after it "
                             f"(×{after / floor.sigma_largest:.2g}); {over / scored:.0%} of the scored tokens lie "
                             "in bands above the floor",
                             "by position: " + ", ".join(f"{b.label}: {b.sigma:.2g}" for b in bands)),
                         "Precision that degrades with the context a step attends over: a quantized KV cache "
                         "(vLLM kv_cache_dtype fp8 → auto), RoPE or attention in low precision at long context, "
                         "the attention backend's long-sequence path. `rcdiag probe RUN` on the long sequences "
                         "names the setting; meanwhile prefer token-level corrections (sequence ratios compound "
                         "over long responses).", SHAPE_SOURCE)
    return None
