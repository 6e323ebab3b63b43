"""Bootstrap confidence intervals over sequences for the headline metrics, from per-sequence sums.

Every headline metric is a function of sums over sequences of per-sequence quantities (token sums, or a
sequence's own mean), so one streaming pass keeps only O(#sequences × 16) float64 (`SequenceSums`) and the
bootstrap re-weights those rows. It is a Poisson(1) bootstrap (each sequence's weight ~ Poisson(1), the standard
streaming approximation of resampling n of n with replacement), seeded. The weights are never materialised: a
compiled kernel (kernels.poisson_totals) turns seeded uniforms into Poisson(1) counts by the inverse CDF and adds
the weighted rows in the same loop, on a thread per core — 1,000 replicates over 100 k sequences take ~0.5 s
instead of ~6 s of numpy's Poisson sampler (the draws differ from the former rng.poisson stream, so intervals
moved within their Monte-Carlo error). Uniforms are drawn in chunks of replicates (16 MB whatever the number of
sequences), in order from one seeded stream: the intervals do not depend on the number of threads.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rcdiag.analysis import kernels
from rcdiag.analysis.conventions import LOG_RATIO_CLAMP, get_convention
from rcdiag.analysis.defaults import DEFAULT_LEVEL, DEFAULT_REPLICATES, DEFAULT_THRESHOLD
from rcdiag.analysis.threads import ordered_map

CLAMP = LOG_RATIO_CLAMP
SWIFT_K3_CLAMP = 10.0
COLUMNS = ("T", "sum_a", "sum_b", "sum_l", "sum_abs", "max_abs", "sum_k3", "sum_k3_swift", "sum_k3_raw",
           "sum_rho2", "w_sum", "w_sq", "ws_sum", "ws_sq")
"""Per-sequence sums over valid tokens (ℓ = a − b; ρ = exp(clamp(ℓ, ±20)); w = clamp(ρ, L or 0, C) the
token_truncate weight; ws = clamp(ρ, 1/C, C) swift's ESS weight; sum_k3_raw without the ±20 clamp)."""
CHUNK_CELLS = 1 << 21
"""Uniforms drawn at a time (16 MB); at most 2 × cores chunks are in flight (analysis.threads.ordered_map)."""
POISSON1_CDF = np.cumsum([math.exp(-1.0) / math.factorial(k) for k in range(19)])
"""P(K ≤ k) of Poisson(1), k = 0…18 (the tail beyond 18 is < 1e-17, under a float64 uniform's resolution)."""
POISSON1_CDF[-1] = 1.0


@dataclass
class SequenceSums:
    """Mergeable per-sequence sums (COLUMNS) for the IS threshold `threshold` and optional `lower`."""

    threshold: float = DEFAULT_THRESHOLD
    lower: float | None = None

    def __post_init__(self) -> None:
        self.ids: list[np.ndarray] = []
        self.rows: list[np.ndarray] = []

    def update(self, seq: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        """seq int64 [n] (sorted), a/b float64 [n] of valid finite tokens."""
        if not seq.size:
            return
        lr = a - b
        lc = np.clip(lr, -CLAMP, CLAMP)
        rho = np.exp(lc)
        k3 = np.expm1(lc) - lc
        with np.errstate(over="ignore"):
            k3_raw = np.expm1(lr) - lr
        w = np.clip(rho, self.lower or 0.0, self.threshold)
        ws = np.clip(rho, 1.0 / self.threshold, self.threshold)
        columns = (None, a, b, lr, np.abs(lr), None, k3, np.clip(k3, -SWIFT_K3_CLAMP, SWIFT_K3_CLAMP), k3_raw,
                   rho * rho, w, w * w, ws, ws * ws)
        starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
        sums = np.empty((starts.size, len(COLUMNS)))
        sums[:, 0] = np.diff(np.r_[starts, seq.size])
        for j, values in enumerate(columns):
            if values is not None:
                sums[:, j] = np.add.reduceat(values, starts)
        sums[:, 5] = np.maximum.reduceat(columns[4], starts)
        self.ids.append(seq[starts])
        self.rows.append(sums)

    def merge(self, other: SequenceSums) -> SequenceSums:
        self.ids += other.ids
        self.rows += other.rows
        return self

    def table(self, all_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(seq_id [n], sums [n, len(COLUMNS)]) with a sequence's pieces merged; `all_ids` adds zero rows for
        sequences without valid tokens (empty responses), sorted by seq_id."""
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, dtype=np.int64)
        rows = np.concatenate(self.rows) if self.rows else np.zeros((0, len(COLUMNS)))
        if all_ids is not None:
            ids = np.concatenate([ids, np.asarray(all_ids, dtype=np.int64)])
            rows = np.concatenate([rows, np.zeros((len(all_ids), len(COLUMNS)))])
        uniq, inverse = np.unique(ids, return_inverse=True)
        out = np.zeros((uniq.size, len(COLUMNS)))
        np.add.at(out, inverse, rows)
        mx = np.zeros(uniq.size)
        np.maximum.at(mx, inverse, rows[:, 5])
        out[:, 5] = mx
        return uniq, out


# ----------------------------------------------------------------------------------------------- headline
K3_COLUMN = {"clamped": "sum_k3", "clamped10": "sum_k3_swift", "raw": "sum_k3_raw"}
"""Convention.k3 → the per-sequence k3 sum it uses."""


def sequence_terms(sums: np.ndarray, convention: str) -> dict[str, np.ndarray]:
    """Per-sequence terms [n] whose column totals give every headline metric under `convention`.

    Driven by the convention's record (rcdiag.analysis.conventions): sequence means run over T_i > 0 ("valid") or over
    every row with ā = b̄ = 0 ("all"); k3 and chi2_seq variants as METRICS.md.
    """
    conv = get_convention(convention)
    c = dict(zip(COLUMNS, sums.T, strict=True))
    T = c["T"]
    rows = np.ones_like(T) if conv.seq_rows == "all" else (T > 0).astype(float)
    denom = np.maximum(T, 1)
    abar, bbar = c["sum_a"] / denom, c["sum_b"] / denom
    seq_log = c["sum_l"] if conv.chi2_seq == "product" else c["sum_l"] / denom
    return {
        "T": T, "b_minus_a": c["sum_b"] - c["sum_a"], "k3": c[K3_COLUMN[conv.k3]], "rho2": c["sum_rho2"],
        "abs": c["sum_abs"], "rows": rows, "diff": rows * (bbar - abar), "abs_diff": rows * np.abs(bbar - abar),
        "ppl_ratio": rows * np.exp(np.clip(bbar - abar, -700, 700)),
        "chi2_seq": rows * np.expm1(2 * np.clip(seq_log, -CLAMP, CLAMP)),
        "w": c["w_sum"], "w2": c["w_sq"], "ws": c["ws_sum"], "ws2": c["ws_sq"],
    }


def _ess(convention: str) -> Callable[[dict[str, Any]], Any]:

    kind = get_convention(convention).ess
    if kind == "swift":
        return lambda t: 1 / np.maximum(t["ws2"] / t["T"] / (t["ws"] / t["T"] + 1e-8) ** 2, 1e-10)
    eps = 1e-8 if kind == "verl" else 0.0
    return lambda t: 1 / (t["w2"] / t["T"] / (t["w"] / t["T"] + eps) ** 2)


HEADLINE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "kl": lambda t: t["b_minus_a"] / t["T"],
    "k3_kl": lambda t: t["k3"] / t["T"],
    "log_ppl_diff": lambda t: t["diff"] / t["rows"],
    "log_ppl_abs_diff": lambda t: t["abs_diff"] / t["rows"],
    "ppl_ratio": lambda t: t["ppl_ratio"] / t["rows"],
    "chi2_token": lambda t: t["rho2"] / t["T"] - 1,
    "chi2_seq": lambda t: t["chi2_seq"] / t["rows"],
    "abs_log_ratio_mean": lambda t: t["abs"] / t["T"],
}
"""Headline metric → function of column totals (METRICS.md names; `ess` is token_truncate at --threshold)."""


def headline_functions(convention: str) -> dict[str, Callable[[dict[str, Any]], Any]]:
    return {**HEADLINE, "ess": _ess(convention)}


def point_estimates(sums: np.ndarray, convention: str = "canonical") -> dict[str, float]:
    """The headline metrics on all sequences (no resampling); NaN where undefined (no valid tokens)."""
    terms = sequence_terms(sums, convention)
    totals = {k: v.sum() for k, v in terms.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        return {name: float(fn(totals)) for name, fn in headline_functions(convention).items()}


def bootstrap(sums: np.ndarray, convention: str = "canonical", *, replicates: int = DEFAULT_REPLICATES,
              level: float = DEFAULT_LEVEL, seed: int = 0) -> dict[str, dict[str, float]]:
    """{metric: {"low", "high", "se"}}: percentile interval at `level` over Poisson-bootstrap replicates.

    sums: [n_sequences, len(COLUMNS)] from SequenceSums.table. With fewer than 2 sequences every bound is NaN.
    """
    names = list(headline_functions(convention))
    if sums.shape[0] < 2 or replicates < 2:
        return {name: {"low": float("nan"), "high": float("nan"), "se": float("nan")} for name in names}
    terms = sequence_terms(sums, convention)
    keys = list(terms)
    matrix = np.stack([terms[k] for k in keys], axis=1)
    matrix = np.ascontiguousarray(matrix)
    n = matrix.shape[0]
    chunk = max(1, CHUNK_CELLS // n)
    draws: dict[str, list[np.ndarray]] = {name: [] for name in names}
    fns = headline_functions(convention)
    finite = bool(np.isfinite(matrix).all())

    def totals_of(start: int) -> np.ndarray:
        """Replicates start… of the ONE seeded stream default_rng(seed) would give (PCG64 draws one 64-bit
        output per uniform, so the block starts `start · n` draws in): each thread draws its own block's
        uniforms and runs the kernel (which releases the GIL), the same numbers whatever the thread count.
        Drawing the blocks one after the other on the calling thread took ~40 % of the bootstrap."""
        stream = np.random.Generator(np.random.PCG64(seed).advance(start * n))
        return kernels.poisson_totals(stream.random((min(chunk, replicates - start), n)), matrix, POISSON1_CDF,
                                      finite)

    for block in ordered_map(totals_of, range(0, replicates, chunk)):
        totals = dict(zip(keys, block.T, strict=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            for name in names:
                draws[name].append(np.asarray(fns[name](totals), dtype=np.float64))
    alpha = (1 - level) / 2
    out = {}
    for name in names:
        values = np.concatenate(draws[name])
        values = values[np.isfinite(values)]
        if values.size < 2:
            out[name] = {"low": float("nan"), "high": float("nan"), "se": float("nan")}
            continue
        low, high = np.quantile(values, [alpha, 1 - alpha])
        out[name] = {"low": float(low), "high": float(high), "se": float(values.std(ddof=1))}
    return out
