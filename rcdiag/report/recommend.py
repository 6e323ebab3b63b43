"""The report's recommendation, acting on the verdict: fix a failed check first; a healthy run needs no
correction (with the evidence); otherwise weigh every mode × threshold of the sweep by what it does to the tail
(the share of tokens / sequences beyond C and their share of the |ℓ| mass), the bias |E[w] − 1|, the ESS and what
it throws away, and say why in plain words. Every number of the chosen setting is the sweep's, i.e.
`rcdiag.simulate` at that setting; the settings to paste come from rcdiag.report.settings.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rcdiag.analysis.conventions import get_convention
from rcdiag.analysis.correction.gate_defs import GATES
from rcdiag.analysis.correction.modes import get_mode, mode_names
from rcdiag.analysis.distributions.tails import EDGES, TailAccumulator
from rcdiag.analysis.verdict.causes import MATERIAL
from rcdiag.analysis.verdict.health import HEALTHY, UNKNOWN
from rcdiag.report.gate_advice import gate_reasons, gate_rows
from rcdiag.report.options import ESS_TARGET
from rcdiag.report.settings import trainer_settings

BIAS_LIMIT = 0.05
"""The largest |E[w] − 1| a recommended setting may add (rcdiag's choice: 5 % of the gradient's scale)."""
THROWN_LIMIT = 0.10
"""The largest share of tokens a recommended setting may zero out (mask modes, rejection), and the largest share
of tokens / sequences it may clip: beyond that the correction rewrites the batch instead of guarding its tail."""
EXTREME_RATIO = 2.0
"""Tokens beyond this ratio are 'extreme' (R3, arXiv 2510.11370); verl's, ms-swift's and slime's default C."""
HEAVY_SHARE = 1e-3
"""A token tail is heavy when more than this share of tokens has a ratio beyond EXTREME_RATIO (the healthy edge
of health's frac_outside_0.5_2 band)."""
KINDS = ("fix_check", "fix_cause", "none", "correct", "fix_source", "unavailable")
"""Recommendation classes: a failed check first; a cause a correction would hide (not numerics, a step change the
dtypes do not explain: the verdict's cause says what to check); no correction needed; a correction; reweighting
cannot absorb the mismatch (fix its source); no data to recommend from."""
ACTION_RANK = {"truncate": 0, "mask": 1}
LEVEL_RANK = {"token": 0, "sequence": 1}


def token_tail(tails: TailAccumulator, threshold: float) -> tuple[float, float]:
    """(share of tokens with ratio > C, their share of Σ|ℓ|) from the streaming |ℓ| histogram (resolution one
    histogram bin, ≈ 1.2 %)."""
    if tails.n == 0 or tails.sums[0] <= 0:
        return float("nan"), float("nan")
    first = int(np.searchsorted(EDGES, np.log(threshold)))
    counts = tails.hist_pos[first:]
    centres = np.sqrt(EDGES[first:-1] * EDGES[first + 1:])
    return float(counts.sum() / tails.n), float(min((counts * centres).sum() / tails.sums[0], 1.0))


def sequence_tail(report: Any, threshold: float) -> tuple[float, float]:
    """(share of scored sequences whose sequence ratio (the convention's) exceeds C, their share of the summed
    |sequence log-ratio|)."""
    _, sums = report.scan.sums.table()
    t, s = sums[:, 0], sums[:, 3]
    scored = t > 0
    if not scored.any():
        return float("nan"), float("nan")
    kind = get_convention(report.options.convention).is_seq_ratio
    log_ratio = (s if kind.startswith("product") else s / np.maximum(t, 1))[scored]
    beyond = log_ratio > np.log(threshold)
    total = np.abs(log_ratio).sum()
    return float(beyond.mean()), float(log_ratio[beyond].sum() / total) if total > 0 else 0.0


def _weigh(report: Any) -> list[dict[str, Any]]:
    """Every sweep row with its tail share and mass beyond C, bias and share thrown away; level and action are
    the mode's declared ones (rcdiag.analysis.correction.modes.CorrectionMode)."""
    rows = []
    cache: dict[tuple[str, float], tuple[float, float]] = {}
    for record in report.sweep.to_dict(orient="records"):
        mode = get_mode(record["mode"])  # the declared row: a preset's name says nothing of its level or action
        level, action = mode.level, mode.action
        key = (level, float(record["threshold"]))
        if key not in cache:
            cache[key] = (token_tail(report.scan.tails, key[1]) if level == "token"
                          else sequence_tail(report, key[1]))
        share, mass = cache[key]
        rows.append({**record, "level": level, "action": action, "beyond_share": share, "beyond_mass": mass,
                     "bias": abs(record["is_weight_mean"] - 1.0), "thrown": 1.0 - record["kept_token_frac"]})
    return rows


def _acceptable(row: dict[str, Any]) -> bool:
    return (row["ess"] >= ESS_TARGET and row["bias"] <= BIAS_LIMIT and row["thrown"] <= THROWN_LIMIT
            and row["clipped_frac"] <= THROWN_LIMIT)


def _preference(row: dict[str, Any]) -> tuple:
    """C ≤ the extreme ratio first (it bounds the extreme tokens), truncation before masking (it keeps every
    token), token level before sequence level (sequence ratios grow with length), then the largest such C (the
    least bias)."""
    return (row["threshold"] > EXTREME_RATIO, ACTION_RANK[row["action"]], LEVEL_RANK[row["level"]],
            -row["threshold"])


def _why_not(row: dict[str, Any] | None, mode: str, heavy: bool) -> str:
    if row is None:
        return f"{mode} clips nothing at any C in the sweep: it would leave the tail untouched"
    if row["ess"] < ESS_TARGET:
        return f"{mode} at C={row['threshold']:g} drops the ESS to {row['ess']:.3f} (< {ESS_TARGET})"
    if row["bias"] > BIAS_LIMIT:
        return f"{mode} at C={row['threshold']:g} adds a bias |E[w]−1| = {row['bias']:.1%} (> {BIAS_LIMIT:.0%})"
    if row["thrown"] > THROWN_LIMIT:
        return f"{mode} at C={row['threshold']:g} throws away {row['thrown']:.1%} of tokens"
    if row["clipped_frac"] > THROWN_LIMIT:
        return f"{mode} at C={row['threshold']:g} clips {row['clipped_frac']:.1%} (> {THROWN_LIMIT:.0%})"
    what = "throws away" if row["action"] == "mask" else "bounds"
    return (f"{mode} at C={row['threshold']:g} {what} {row['clipped_frac']:.2%} of "
            f"{'tokens' if row['level'] == 'token' else 'sequences'} (also acceptable)")


def _numbers(row: dict[str, Any]) -> dict[str, Any]:
    return {k: float(row.get(k, float("nan"))) for k in NUMBERS}


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


def gate_fits(report: Any) -> list[dict[str, Any]]:
    """Each gate family at its default δ: framework, δ, masked share, survivors' ESS and why it fits this run's tail
    or not (rcdiag.report.gate_advice)."""
    reasons = gate_reasons(report)
    return [{"gate": g["mode"], "framework": GATES[g["mode"]].framework, "threshold": float(g["threshold"]),
             "masked": float(g["thrown"]), "ess": float(g["ess"]), "why": reasons[g["mode"]]}
            for g in gate_rows(report) if g["mode"] in reasons and g["threshold"] == GATES[g["mode"]].default]


NUMBERS = ("ess", "clipped_frac", "is_weight_mean", "kept_token_frac", "kept_seq_frac", "fraction_high",
           "beyond_share", "beyond_mass", "bias", "thrown")
"""The chosen setting's numbers a Recommendation carries (its sweep row's)."""


WITHHELD = {"prompt_mismatch": "", "few_sequences": ""}
"""Why no correction is advised, by the cause it acts on, where the cause's own action does not already say it (the
shapes' actions do; the default names training on another policy's data)."""
SOURCE_FIRST = {"routing": "replay the engine's routes"}
"""Verdict causes whose action removes the gap's source → that action in a few words: a correction chosen for
such a run is what to run until then, and the recommendation and the headline say so instead of offering it as
the fix."""


@dataclass(frozen=True)
class Recommendation:
    """What the report advises: `kind` (KINDS), the setting (`mode` — an IS mode or a gate family — `threshold`,
    `lower`; None when it advises none), `text` in words, `settings` to paste (Snippet dicts), each mode's and
    gate family's handling of the tail (`alternatives`, `gates`), the setting's `numbers` (its sweep row: ESS,
    clipped share, bias …), whether it meets the ESS/bias/throw-away targets, and the verdict `cause` it acts on
    when it withholds a correction."""

    kind: str
    text: str
    mode: str | None = None
    threshold: float | None = None
    lower: float | None = None
    settings: tuple[dict[str, Any], ...] = ()
    alternatives: tuple[dict[str, Any], ...] = ()
    gates: tuple[dict[str, Any], ...] = ()
    numbers: dict[str, float] = field(default_factory=dict)
    meets_target: bool | None = None
    cause: str | None = None
    family: str = "mode"

    @property
    def phrase(self) -> str:
        """What the recommendation adds to a verdict's headline: the correction, when it is one."""
        if self.kind == "correct":
            what = "the gate" if self.family == "gate" else ""
            return f" — correct with {what + ' ' if what else ''}{self.mode} at " + \
                (f"δ={self.threshold:g}" if self.family == "gate" else f"C={self.threshold or 0:g}")
        if self.kind == "fix_source":
            return " — reweighting cannot absorb it; fix its source"
        return ""

    def to_dict(self) -> dict[str, Any]:
        """metrics.json's recommendation: every field, the numbers flat beside them."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "numbers"}
        return {**out, "settings": list(self.settings), "alternatives": list(self.alternatives),
                "gates": list(self.gates), **self.numbers}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recommendation:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "numbers"}
        for name in ("settings", "alternatives", "gates"):
            known[name] = tuple(known.get(name) or ())
        return cls(**known, numbers={k: float(data[k]) for k in NUMBERS if k in data})


def recommend(report: Any) -> Recommendation:
    """The report's Recommendation (the module doc says how it is chosen)."""
    return Recommendation.from_dict(_recommend(report))


def _recommend(report: Any) -> dict[str, Any]:
    o = report.options
    conv = get_convention(o.convention)
    base = {"mode": None, "threshold": None, "lower": o.lower, "alternatives": []}

    def done(kind: str, text: str, row: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        mode = None if row is None else row["mode"]
        c = None if row is None else float(row["threshold"])
        snippets = trainer_settings(mode, c, o.lower, o.convention, conv.is_seq_ratio)
        lower = o.lower if mode is None else get_mode(mode).with_bounds(c, o.lower).lower  # a preset's own L
        return {**base, "kind": kind, "mode": mode, "threshold": c, "lower": lower, "text": text,
                "settings": [asdict(s) for s in snippets], **({} if row is None else _numbers(row)), **extra}

    errors = [f for f in report.checks if f.severity == "error"]
    if errors:
        first = errors[0]
        others = f" (and {', '.join(f.name for f in errors[1:])})" if len(errors) > 1 else ""
        return {**done("fix_check", f"Fix the failed check {first.name} first{others}: {_sentence(first.message)} "
                       + (f"Fix: {_sentence(first.fix)} " if first.fix else "")
                       + "No recommendation until then: the numbers below measure that defect, not numerical "
                         "mismatch. Re-run the report once it is fixed."), "settings": []}
    verdict = report.verdict
    if verdict.status != UNKNOWN and not verdict.correct:
        cause = verdict.cause
        why = WITHHELD.get(cause.kind, "An IS correction here would bound the symptom and keep training on data "
                                       "from another policy.")
        why = ("An IS correction would only bound the symptom of that setting." if cause.kind.startswith("input")
               else why)
        return {**done("fix_cause", f"No correction: {_sentence(cause.title[0].upper() + cause.title[1:])} "
                       f"{_sentence(cause.action)}{' ' + why if why else ''}"), "settings": [], "cause": cause.kind}
    frame = report.sweep
    if frame is None or len(frame) == 0 or not np.isfinite(frame["ess"].to_numpy(dtype=float)).any():
        why = report.metrics_error or ("no valid token has a weight (the run has no valid tokens)"
                                       if frame is not None and len(frame) else "no IS sweep was computed")
        return {**done("unavailable", f"No recommendation: {why}."), "settings": []}
    rows = _weigh(report)
    share2, mass2 = token_tail(report.scan.tails, EXTREME_RATIO)
    heavy = bool(share2 > HEAVY_SHARE)
    tis = next((r for r in rows if r["mode"] == "token_truncate" and r["threshold"] == o.threshold), None)
    if verdict.status == HEALTHY:
        evidence = (f"{share2:.3%} of tokens have a ratio above {EXTREME_RATIO:g}, carrying {mass2:.2%} of the "
                    "|ℓ| mass")
        if tis is not None:
            evidence += (f"; TIS at C={o.threshold:g} would keep ESS {tis['ess']:.4f} and add a bias "
                         f"|E[w]−1| = {tis['bias']:.2%} while bounding {tis['clipped_frac']:.3%} of tokens")
        return done("none", f"No correction needed: {verdict.cause.title} ({evidence}). Keep logging the mismatch "
                    "metrics (the settings below); a default correction (e.g. TRL's sequence_mask at C=3) is harmless "
                    "here.")
    candidates = [r for r in rows if r["clipped_frac"] > 0] if heavy else rows
    good = sorted((r for r in candidates if _acceptable(r)), key=_preference)
    alternatives = []
    for mode in mode_names():
        own = [r for r in candidates if r["mode"] == mode]
        pick = (sorted((r for r in own if _acceptable(r)), key=_preference)
                or sorted(own, key=lambda r: (-r["ess"], r["bias"])))
        alternatives.append({"mode": mode, **({"threshold": float(pick[0]["threshold"]), **_numbers(pick[0])}
                                              if pick else {"threshold": None}),
                             "why": _why_not(pick[0] if pick else None, mode, heavy)})
    tail = (f"{share2:.2%} of tokens have a ratio above {EXTREME_RATIO:g} and carry {mass2:.1%} of the |ℓ| "
            "mass" if heavy else f"the token tail is light ({share2:.3%} of tokens beyond {EXTREME_RATIO:g})")
    gates = gate_fits(report)
    if not good:
        fitting = [g for g in gate_rows(report) if g["thrown"] > 0 and _acceptable(g)]
        if fitting:  # no ratio mode fits, but a divergence gate removes the tail and keeps the batch well weighted
            gate = sorted(fitting, key=lambda g: (-g["ess"], g["thrown"]))[0]
            text = (f"Use the {gate['mode']} gate ({GATES[gate['mode']].framework}) at δ={gate['threshold']:g} "
                    f"(verdict: {verdict.status}). Here {tail}, and no ratio mode keeps ESS ≥ {ESS_TARGET} with a "
                    f"bias ≤ {BIAS_LIMIT:.0%}. {gate_reasons(report).get(gate['mode'], '')}")
            return {**base, "kind": "correct", "mode": gate["mode"], "threshold": float(gate["threshold"]),
                    "text": stopgap(verdict.cause.kind, text), "settings": [gate["settings"]], **_numbers(gate), "meets_target": True,
                    "alternatives": alternatives, "gates": gates, "family": "gate"}
        pool = candidates or rows
        best = sorted(pool, key=lambda r: (-r["ess"], r["bias"]))[0]
        return done("fix_source", f"Reweighting cannot absorb this mismatch (verdict: {verdict.status}): "
                    f"{tail}, and no setting keeps ESS ≥ {ESS_TARGET} with a bias ≤ {BIAS_LIMIT:.0%} while "
                    f"clipping or throwing away ≤ {THROWN_LIMIT:.0%}. Fix the source of the mismatch (the same "
                    "dtype on both sides, an FP32 LM head, FP16 instead of BF16, routing replay for MoE). The "
                    f"least bad setting is {best['mode']} at C={best['threshold']:g} (ESS {best['ess']:.3f}, bias "
                    f"{best['bias']:.2%}, {best['clipped_frac']:.2%} clipped).", best, meets_target=False,
                    alternatives=alternatives, gates=gates)
    best = good[0]
    unit = "tokens" if best["level"] == "token" else "sequences"
    acts = ("throws away" if best["action"] == "mask" else "bounds the weight of")
    text = (f"Use {best['mode']} at C={best['threshold']:g} (verdict: {verdict.status}). Here {tail}. At this "
            f"setting it {acts} the {best['clipped_frac']:.2%} of {unit} beyond C (their share of the log-ratio "
            f"mass: {best['beyond_mass']:.1%}), keeps ESS at {best['ess']:.4f} (≥ {ESS_TARGET}), adds a bias "
            f"|E[w]−1| = {best['bias']:.2%} and zeroes {best['thrown']:.2%} of tokens. "
            "Why this one: a C at or below the extreme ratio bounds the extreme tokens, truncation keeps every "
            "token, token-level weights do not compound over a long sequence, and the largest such C adds the "
            "least bias.")
    for alt in alternatives:
        if alt["mode"] == best["mode"] and alt["threshold"] == best["threshold"]:
            alt["why"] = "recommended"
    spread = float(report.tails.get("abs_log_ratio_mean", float("nan")))
    if best["clipped_frac"] == 0 and spread > MATERIAL:  # no tail to bound, but every token is off: reweight them
        outside = float(report.tails.get("frac_outside_0.9_1.1", float("nan")))
        text = (f"Use {best['mode']} at C={best['threshold']:g} (verdict: {verdict.status}). The mismatch is spread "
                f"over every token rather than in a tail: mean |ℓ| {spread:.3g}, {outside:.1%} of tokens have a ratio "
                f"outside [0.9, 1.1], none beyond C. Uncorrected, each token enters the gradient weighted by the "
                f"engine's probability instead of the trainer's — a bias of ~{spread:.0%} a token, above the "
                f"{MATERIAL:.0%} the report calls material; the correction's weights remove it on every token they "
                "reweight, not only where they clip (FlashRL and the FP8-RL reports train quantized rollouts with TIS "
                f"on). At this setting it clips {best['clipped_frac']:.2%}, keeps ESS at {best['ess']:.4f} and adds "
                f"a bias |E[w]−1| = {best['bias']:.2%} of its own.")
        return done("correct", stopgap(verdict.cause.kind, text), best, meets_target=True,
                    alternatives=alternatives, gates=gates)
    if best["clipped_frac"] == 0:  # nothing to bound: paste the monitoring settings, not a correction
        text = (f"No correction is needed for the tail (verdict: {verdict.status}, {verdict.cause.title}): {tail}, "
                f"and every acceptable setting clips nothing (e.g. {best['mode']} at C={best['threshold']:g} keeps "
                f"ESS {best['ess']:.4f}, bias {best['bias']:.2%}). Nothing to bound; the verdict above says what "
                "finds or removes its source.")
        return done("none", text, meets_target=True, alternatives=alternatives, gates=gates)
    return done("correct", stopgap(verdict.cause.kind, text), best, meets_target=True, alternatives=alternatives,
                gates=gates)


def stopgap(kind: str, text: str) -> str:
    """A correction's text after a cause whose action removes the source (SOURCE_FIRST): what to run until then."""
    if kind not in SOURCE_FIRST:
        return text
    return f"Until you {SOURCE_FIRST[kind]} (the verdict's action), u{text[1:]}" if text.startswith("Use ") else text
