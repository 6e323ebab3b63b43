"""Independent float64 reference of docs/metrics.md: plain Python loops over sequences, written from the text of the
contract and sharing no code with rcdiag. Exact sums (math.fsum) so that the reference itself has no rounding drift.

Threshold comparisons are written in log space (ℓ̂ ≤ log C ⟺ ρ ≤ C), which is how a tie ρ = C is decided exactly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

CLAMP = 20.0
NAN = math.nan


@dataclass
class Seq:
    """One row of B: its valid tokens' train (a) and rollout (b) log-probs, as Python floats."""

    seq_id: int
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)

    @property
    def t(self) -> int:
        return len(self.a)

    @property
    def ells(self) -> list[float]:
        return [x - y for x, y in zip(self.a, self.b, strict=True)]


def clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def sequences(tokens, universe=None) -> list[Seq]:
    """Group valid token rows by seq_id (rows in pos order); `universe` adds rows with no tokens."""
    rows: dict[int, Seq] = {}
    seq = tokens["seq_id"].tolist()
    pos = tokens["pos"].tolist()
    a = tokens["train_logprob"].astype("float64").tolist()
    b = tokens["rollout_logprob"].astype("float64").tolist()
    mask = tokens["mask"].tolist() if "mask" in tokens else [True] * len(seq)
    for s, _, x, y, m in sorted(zip(seq, pos, a, b, mask, strict=True), key=lambda r: (r[0], r[1])):
        entry = rows.setdefault(int(s), Seq(int(s)))
        if m:
            entry.a.append(float(x))
            entry.b.append(float(y))
    for s in universe if universe is not None else ():
        rows.setdefault(int(s), Seq(int(s)))
    return [rows[k] for k in sorted(rows)]


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else NAN


def _expm1(x: float) -> float:
    try:
        return math.expm1(x)
    except OverflowError:
        return math.inf


# ------------------------------------------------------------------------------------------------ metrics
def metrics(seqs: list[Seq], convention: str) -> dict[str, float]:
    ells = [e for s in seqs for e in s.ells]
    n = len(ells)
    valid = [s for s in seqs if s.t > 0]
    counts = {"tokens": n, "sequences": len(seqs), "empty_sequences": len(seqs) - len(valid)}
    names = ("kl", "k3_kl", "training_log_ppl", "training_ppl", "rollout_log_ppl", "rollout_ppl", "log_ppl_diff",
             "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq")
    trl = {}
    if convention == "trl":  # TRL's sampling_logp_difference: |ℓ| over valid tokens, 0.0 without any
        trl = {"abs_log_ratio_mean": math.fsum(abs(e) for e in ells) / n if n else 0.0,
               "abs_log_ratio_max": max((abs(e) for e in ells), default=0.0)}
    if n == 0 and not (convention == "swift" and seqs):  # ms-swift divides by max(N, 1): numbers, not NaN
        return {**dict.fromkeys(names, NAN), **trl, **counts}
    k3 = []
    for e in ells:
        if convention == "verl":
            k3.append(_expm1(e) - e)
        else:
            c = clamp(e, -CLAMP, CLAMP)
            value = math.expm1(c) - c
            k3.append(clamp(value, -10.0, 10.0) if convention == "swift" else value)
    rows = seqs if convention in ("swift", "verl") else valid
    per = {"tlp": [], "tp": [], "rlp": [], "rp": [], "diff": [], "abs": [], "ratio": [], "chi2": []}
    for s in rows:
        t = max(s.t, 1)
        abar = math.fsum(s.a) / t
        bbar = math.fsum(s.b) / t
        total = math.fsum(s.ells)
        lbar = total / t
        per["tlp"].append(-abar)
        per["tp"].append(math.exp(-abar))
        per["rlp"].append(-bbar)
        per["rp"].append(math.exp(-bbar))
        per["diff"].append(-lbar)
        per["abs"].append(abs(lbar))
        per["ratio"].append(math.exp(-lbar))
        x = total if convention == "verl" else lbar
        per["chi2"].append(math.expm1(2 * clamp(x, -CLAMP, CLAMP)))
    chi2_token = math.fsum(math.expm1(2 * clamp(e, -CLAMP, CLAMP)) for e in ells) / n if n else -1.0  # swift
    n = max(n, 1)
    return {
        "kl": -math.fsum(ells) / n, "k3_kl": math.fsum(k3) / n,
        "training_log_ppl": mean(per["tlp"]), "training_ppl": mean(per["tp"]),
        "rollout_log_ppl": mean(per["rlp"]), "rollout_ppl": mean(per["rp"]),
        "log_ppl_diff": mean(per["diff"]), "log_ppl_abs_diff": mean(per["abs"]),
        "log_ppl_diff_max": max(per["diff"]), "log_ppl_diff_min": min(per["diff"]),
        "ppl_ratio": mean(per["ratio"]),
        "chi2_token": chi2_token,
        "chi2_seq": mean(per["chi2"]), **trl, **counts,
    }


# ------------------------------------------------------------------------------------------------ rejection
def _k(stat: str, e: float) -> float:
    c = clamp(e, -CLAMP, CLAMP)
    return {"k1": -c, "k2": 0.5 * c * c, "k3": math.expm1(c) - c}[stat]


def rejection_keep(s: Seq, option: str, upper: float, lower: float | None) -> list[bool]:
    """verl rejection: keep flags of s's valid tokens."""
    scope, stat = option.rsplit("_", 1)
    if stat == "k1":
        lo, hi = math.log(lower if lower is not None else 1 / upper), math.log(upper)
    else:
        lo, hi = (-math.inf if lower is None else lower), upper
    values = [_k(stat, e) for e in s.ells]
    if scope == "token":
        return [lo <= v <= hi for v in values]
    if scope == "seq_sum":
        agg = math.fsum(values)
    elif scope == "seq_mean":
        agg = math.fsum(values) / max(s.t, 1)
    else:
        agg = max(values, default=0.0)
    return [lo <= agg <= hi] * s.t


# ------------------------------------------------------------------------------------------------ IS modes
def seq_log_ratio(s: Seq, convention: str) -> float:
    total = math.fsum(s.ells)
    if convention == "canonical":
        return clamp(total / s.t, -CLAMP, CLAMP) if s.t else 0.0
    if convention == "swift":
        return math.fsum(clamp(e, -CLAMP, CLAMP) for e in s.ells) / max(s.t, 1)
    if convention == "verl":
        return clamp(total, -CLAMP, CLAMP)
    return total  # trl


def is_metrics(seqs: list[Seq], convention: str, mode: str, upper: float, lower: float | None = None,
               rejection: tuple = (), batch_normalize: bool = False,
               applied: list[float] | None = None) -> dict[str, float]:
    """IS metrics of docs/metrics.md; `applied` (when given) receives each valid token's applied weight in (seq, pos)
    order, 0 for tokens a rejection option removed."""
    level, action = mode.split("_")
    log_c = math.log(upper)
    log_l = math.log(lower) if lower is not None else -math.inf
    log_lo = math.log(lower) if lower is not None else -log_c
    tokens = []  # (seq index, token log-ratio, token ratio, scored)
    seq_info = []  # per sequence: (log ratio, out-of-bounds, scored token count)
    for i, s in enumerate(seqs):
        keep = [True] * s.t
        for option, up, lo in rejection:
            keep = [k and r for k, r in zip(keep, rejection_keep(s, option, up, lo), strict=True)]
        for e, k in zip(s.ells, keep, strict=True):
            lr = e if convention == "trl" else clamp(e, -CLAMP, CLAMP)
            # verl: the IS metrics ignore rejection (scored); what the loss keeps still drops rejected tokens
            tokens.append((i, lr, math.exp(lr), True if convention == "verl" else k, k))
        lam = seq_log_ratio(s, convention)
        seq_info.append((lam, lam > log_c or lam < log_l, s.t if convention == "verl" else sum(keep)))
    weights, ess_w, kept = [], [], []
    for i, lr, rho, scored, survives in tokens:
        lam, out_seq, _ = seq_info[i]
        if level == "token":
            out = lr > log_c or lr < log_l
            if action == "truncate":
                w = min(rho, upper) if lower is None else clamp(rho, lower, upper)
            else:
                w = 0.0 if out else rho
        else:
            out = out_seq
            r = math.exp(lam)
            if action == "truncate":
                w = min(r, upper) if lower is None else clamp(r, lower, upper)
            elif convention == "swift":
                w = 0.0 if out else rho
            else:
                w = 0.0 if out else r
        is_kept = not (action == "mask" and out)
        kept.append((i, survives and is_kept))
        if applied is not None:
            applied.append(w if scored else 0.0)
        if scored:
            weights.append(w)
            ess_w.append(clamp(w, 1 / upper, upper) if convention == "swift" else clamp(w, 0.0, upper))
    population = weights
    if convention == "trl" and level == "sequence":
        population = []
        for lam, out, n_scored in seq_info:
            r = math.exp(lam) if n_scored else 1.0
            if action == "truncate":
                population.append(min(r, upper) if lower is None else clamp(r, lower, upper))
            else:
                population.append(0.0 if (out and n_scored) else r)
    n_valid = sum(s.t for s in seqs)
    n_valid_seqs = sum(1 for s in seqs if s.t)
    out = {}
    mu = mean(population)
    out["is_weight_mean"] = mu
    if len(population) > 1:
        out["is_weight_std"] = math.sqrt(math.fsum((w - mu) ** 2 for w in population) / len(population))
    else:
        out["is_weight_std"] = 0.0 if population else NAN
    out["is_weight_min"] = min(population, default=NAN)
    out["is_weight_max"] = max(population, default=NAN)
    if convention == "verl" and level == "sequence" and n_valid:
        sums = [math.fsum(s.ells) for s in seqs]
        out["is_weight_max"] = math.exp(min(max(sums), CLAMP))
        out["is_weight_min"] = math.exp(min(sums))
    if convention == "trl" and n_valid == 0:  # TRL logs 0.0 (token modes) / exp(0) = 1.0 per row (sequence modes)
        value = 1.0 if level == "sequence" and seqs else 0.0
        out.update(is_weight_mean=value, is_weight_min=value, is_weight_max=value)
    out["ess"] = _ess(ess_w, convention)
    out.update(_fractions(seqs, tokens, seq_info, convention, level, action, log_c, log_l, log_lo,
                           (upper, lower if lower is not None else 1 / upper)))
    if n_valid == 0:
        out.update(clipped_frac=NAN, fraction_high=NAN, fraction_low=NAN)
    out["kept_token_frac"] = sum(1 for _, k in kept if k) / n_valid if n_valid else NAN
    kept_seqs = {i for i, k in kept if k}
    out["kept_seq_frac"] = len(kept_seqs) / n_valid_seqs if n_valid_seqs else NAN
    if convention == "swift" and n_valid == 0 and seqs:  # ms-swift's max(N, 1) divisors: 0, ESS 1 / 1e-10
        out.update(is_weight_mean=0.0, ess=1e10, clipped_frac=0.0)
    if batch_normalize and convention != "verl":  # divide by the token mean (verl logs pre-normalisation)
        scale = mean(weights)
        for key in ("is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max"):
            out[key] = out[key] / scale if scale else NAN
    return out


def _ess(w: list[float], convention: str) -> float:
    if not w:
        return NAN
    m = mean(w)
    if convention == "swift":
        return 1 / max(mean([(x / (m + 1e-8)) ** 2 for x in w]), 1e-10)
    if m == 0:
        return NAN
    if convention == "verl":
        return 1 / mean([(x / (m + 1e-8)) ** 2 for x in w])
    return 1 / mean([(x / m) ** 2 for x in w])


def _f32(k: int, n: int) -> float:
    return float(np.float32(k) / np.float32(n)) if n else NAN


def _fractions(seqs, tokens, seq_info, convention, level, action, log_c, log_l, log_lo, bounds) -> dict[str, float]:
    if level == "token":
        scored = [(lr, rho) for _, lr, rho, k, _ in tokens if k]
        n = len(scored)
        high = sum(1 for lr, _ in scored if lr > log_c)
        low = sum(1 for lr, _ in scored if lr < log_lo)
        clipped = sum(1 for lr, _ in scored if lr > log_c or lr < log_l)
        if convention == "verl":
            return {"clipped_frac": clipped / n if n else NAN, "fraction_high": _f32(high, n),
                    "fraction_low": _f32(low, n)}
        # swift: mm((ρ > C).float(), m) = float32(k) / float32(N)
        return {"clipped_frac": _f32(clipped, n) if convention == "swift" else clipped / n if n else NAN,
                "fraction_high": high / n if n else NAN, "fraction_low": low / n if n else NAN}
    rows = [(lam, out) for lam, out, n_scored in seq_info if n_scored > 0]
    n = len(rows)
    out = {"clipped_frac": sum(1 for _, o in rows if o) / n if n else NAN,
           "fraction_high": sum(1 for lam, _ in rows if lam > log_c) / n if n else NAN,
           "fraction_low": sum(1 for lam, _ in rows if lam < log_lo) / n if n else NAN}
    b = len(seqs)
    if convention == "swift":
        out["clipped_frac"] = _f32(sum(1 for lam, _ in rows if lam > log_c), b)
    if convention == "verl":  # verl: unclamped S_i vs torch.log(torch.tensor(x)) in float32, over all B rows
        c32, lo32 = (float(np.log(np.float32(x))) for x in bounds)
        sums = [math.fsum(s.ells) for s in seqs]
        out["fraction_high"] = _f32(sum(1 for x in sums if x > c32), b)
        out["fraction_low"] = _f32(sum(1 for x in sums if x < lo32), b)
    return out
