"""Exact divergences between whole next-token distributions, position by position (float64; the row passes are
compiled: rcdiag.analysis.distributions.divergence_kernels).

The sampled-token estimators (`kl` = E[b − a], `k3_kl` = E[r − 1 − log r], r = π/μ at the sampled token) see one
token per position; "0-diff on the sampled tokens" says nothing about the rest of the vocabulary. Given both
sides' full log-probability rows at the same positions — μ the engine (rollout) distribution and π the trainer's,
each already at the sampling temperature — this module computes per position:

- `kl_mu_pi` = KL(μ‖π) = Σ μ (log μ − log π): what `kl` and `k3_kl` estimate (E over x ~ μ of k1 and of k3);
- `kl_pi_mu` = KL(π‖μ);
- `tv` = ½ Σ |μ − π| ∈ [0, 1]; `js` = ½ KL(μ‖m) + ½ KL(π‖m), m = (μ + π)/2, ∈ [0, ln 2];
- `top{k}_overlap` = |top-k(μ) ∩ top-k(π)| / k;
- under the run's top-p/top-k (applied to μ as vLLM does: top-k first, then the smallest set of the top-k
  renormalised probabilities whose mass reaches p), the kept set K and its masses `kept_mass_mu` = μ(K) — the S
  of the log S offset every processed log-prob carries (−log S = b − a when both sides agree) — and
  `kept_mass_pi` = π(K), the trainer's mass on the engine's support.

`exact_divergences` works on `[n, V]` rows (chunk them: a row of V float64 values is 8·V bytes); `summarize`
averages per-position values (the token-level expectation, as `kl`/`k3_kl` are) and sets them beside the
sampled-token estimators on the same positions.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rcdiag.analysis.distributions import divergence_kernels as dk

TOP_KS = (1, 5, 20)
"""The k of the top-k overlaps reported."""
PER_POSITION = ("kl_mu_pi", "kl_pi_mu", "tv", "js", *(f"top{k}_overlap" for k in TOP_KS), "kept_mass_mu",
                "kept_mass_pi", "kept_size")


def _log_normalised(logp: np.ndarray) -> np.ndarray:
    """Rows of log-probabilities renormalised in float64 (a row that sums to 1 up to float32 rounding stays)."""
    x = np.asarray(logp, dtype=np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    return x - (top + np.log(np.sum(np.exp(x - top), axis=-1, keepdims=True)))


def truncates(vocab: int, top_p: float = 1.0, top_k: int | None = None) -> bool:
    """Whether top-p/top-k remove anything from a vocabulary of `vocab` tokens."""
    return top_p < 1.0 or top_k is not None and 0 < top_k < vocab


def kept_mask(logp: np.ndarray, top_p: float = 1.0, top_k: int | None = None) -> np.ndarray:
    """bool `[n, V]`: the tokens the engine may sample from rows of log-probs under top-k then top-p (vLLM's
    order: top-k keeps the k most probable; top-p then keeps, in descending order of the top-k renormalised
    probabilities, every token whose predecessors' mass is below p — at least one; ties by token id). All True
    without truncation. One compiled pass a row (divergence_kernels.kept_mask), no sort of the vocabulary."""
    x = np.ascontiguousarray(logp, dtype=np.float64)
    n, vocab = x.shape
    if not truncates(vocab, top_p, top_k):
        return np.ones((n, vocab), dtype=bool)
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return dk.kept_mask(shifted, np.exp(shifted), float(top_p), int(top_k or 0))


def _top_ids(logp: np.ndarray, k: int) -> np.ndarray:
    """`[n, k]` token ids of each row's k largest entries, largest first (ties by id), in one compiled pass per
    row (divergence_kernels.top_ids), not a sort of the whole vocabulary."""
    x = np.ascontiguousarray(logp, np.float64)
    return dk.top_ids(x, min(k, x.shape[-1]))


def topk_overlap(logp_mu: np.ndarray, logp_pi: np.ndarray, k: int, *, top_mu: np.ndarray | None = None,
                 top_pi: np.ndarray | None = None) -> np.ndarray:
    """|top-k(μ) ∩ top-k(π)| / k per row; `top_mu`/`top_pi`: each row's ids by rank (≥ k of them) when known."""
    k = min(k, logp_mu.shape[-1])
    a = (_top_ids(logp_mu, k) if top_mu is None else top_mu)[:, :k]
    b = (_top_ids(logp_pi, k) if top_pi is None else top_pi)[:, :k]
    hits = (a[:, :, None] == b[:, None, :]).any(axis=-1).sum(axis=-1)
    return hits / k


def exact_divergences(logp_mu: np.ndarray, logp_pi: np.ndarray, *, top_p: float = 1.0,
                      top_k: int | None = None) -> dict[str, np.ndarray]:
    """Per-row PER_POSITION values for `[n, V]` log-prob rows of the engine (μ) and the trainer (π), both at the
    sampling temperature (see the module doc). Rows are renormalised in float64 first; the sums are one compiled
    pass per row (divergence_kernels.divergence_sums) over the numpy-computed probabilities and logs."""
    a, b = np.asarray(logp_mu), np.asarray(logp_pi)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"need two [n, V] arrays of one shape, got {a.shape} and {b.shape}")
    lmu, lpi = _log_normalised(a), _log_normalised(b)
    mu, pi = np.exp(lmu), np.exp(lpi)
    with np.errstate(divide="ignore"):  # m = 0 only where μ = π = 0, which the sums skip
        lmid = np.log(0.5 * (mu + pi))
    sums = dk.divergence_sums(lmu, lpi, mu, pi, lmid)
    out = {"kl_mu_pi": sums[:, 0], "kl_pi_mu": sums[:, 1], "tv": 0.5 * sums[:, 2], "js": 0.5 * sums[:, 3]}
    top_mu, top_pi = _top_ids(lmu, max(TOP_KS)), _top_ids(lpi, max(TOP_KS))
    for k in TOP_KS:
        out[f"top{k}_overlap"] = topk_overlap(lmu, lpi, k, top_mu=top_mu, top_pi=top_pi)
    keep = kept_mask(lmu, top_p, top_k)
    out["kept_mass_mu"], out["kept_mass_pi"] = (mu * keep).sum(axis=-1), (pi * keep).sum(axis=-1)
    out["kept_size"] = keep.sum(axis=-1).astype(np.float64)
    for name in ("kl_mu_pi", "kl_pi_mu", "js"):
        out[name] = np.maximum(out[name], 0.0)  # float64 rounding can leave −1e-17
    return out


def sampled_estimators(logp_mu_token: np.ndarray, logp_pi_token: np.ndarray) -> dict[str, np.ndarray]:
    """Per-token k1 = log μ(x) − log π(x) and k3 = r − 1 − log r (r = π(x)/μ(x)) at sampled tokens x: the terms
    whose means are `kl` and `k3_kl`. Both have mean KL(μ‖π) over x ~ μ; k3 is ≥ 0 token by token."""
    log_r = np.asarray(logp_pi_token, np.float64) - np.asarray(logp_mu_token, np.float64)
    return {"k1": -log_r, "k3": np.expm1(log_r) - log_r}


def summarize(per_position: dict[str, np.ndarray], k1: np.ndarray | None = None, k3: np.ndarray | None = None,
              *, quantiles: Sequence[float] = (0.5, 0.99)) -> dict[str, float]:
    """Means (and `<name>_p50`, `_p99`, `_max` for the divergences) of per-position values; with the sampled
    k1/k3 of the same positions, `kl`, `k3_kl` and the gaps `k3_minus_exact` = mean k3 − mean KL(μ‖π) and its
    ratio `k3_over_exact`. `geo_kept_mass_mu` = exp(mean log S), the kept mass the log-S offset implies."""
    n = len(next(iter(per_position.values()))) if per_position else 0
    out: dict[str, float] = {"positions": float(n)}
    if n == 0:
        return out
    for name, values in per_position.items():
        v = np.asarray(values, np.float64)
        out[name] = float(v.mean())
        if name in ("kl_mu_pi", "kl_pi_mu", "tv", "js"):
            for q in quantiles:
                out[f"{name}_p{round(q * 100)}"] = float(np.quantile(v, q))
            out[f"{name}_max"] = float(v.max())
    if "kept_mass_mu" in per_position:
        out["geo_kept_mass_mu"] = float(np.exp(np.mean(np.log(np.asarray(per_position["kept_mass_mu"])))))
    exact = out.get("kl_mu_pi", math.nan)
    if k1 is not None:
        out["kl"] = float(np.mean(k1))
    if k3 is not None:
        out["k3_kl"] = float(np.mean(k3))
        out["k3_minus_exact"] = out["k3_kl"] - exact
        out["k3_over_exact"] = out["k3_kl"] / exact if exact > 0 else math.nan
    return out
