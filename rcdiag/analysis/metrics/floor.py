"""The run's own noise floor: how much of the mismatch the two sides' precision explains, which tokens no precision
can explain, and the temperature signature that numerical noise cannot fake.

**The floor model.** A small perturbation δ of the logits (rounding in bf16, another kernel, another batch
shape) moves the sampled token's log-prob by δ_tok − Σ_j p_j δ_j. For perturbations of std σ, independent across
the vocabulary, its std is σ·√(1 − 2p + Σ_j p_j²), which lies in [σ(1 − p), √2·σ(1 − p)] since
Σ_{j≠tok} p_j² ≤ (1 − p)²: a near-certain token cannot move, a real choice moves by ≈ σ. So the *standardised*
mismatch u = |ℓ| / (1 − p), with p = exp(min(a, b)) (the smaller probability: the larger scale, generous to
numerics), is ≈ c·σ·|N(0, 1)| with c ∈ [1, √2] on every token of a numerically mismatched run, whatever its
entropy. Its robust scale σ̂ = median(u) / 0.6745 is **the run's noise scale**, and the floor a dtype explains is
σ_dtype·√(2/π)·E[1 − p] in mean |ℓ|. Checked on real runs (rcdiag's own measurements):
- the shipped sample model (4 M parameters), vLLM bf16 → transformers fp32 (45k tokens): σ̂ = 0.034, max u = 11σ̂,
  mean |ℓ| 0.0035, no token beyond 10σ̂;
- SmolLM2-135M-Instruct (30 layers, vocab 49k; `make demo-real`, 192 chat/reasoning sequences, 24k tokens),
  vLLM bf16 → fp32: σ̂ = 0.052, mean |ℓ| 0.027, max |ℓ| 0.25, no token beyond 10σ̂, temperature q = −0.001;
  user review 3's run of it: mean |ℓ| 1.3e-4 on tokens with p ≥ 0.99 against 0.035–0.039 below p = 0.1, the
  (1 − p) scaling the model predicts (0.005·0.037 ≈ 1.9e-4);
- synthetic runs with N(0, σ²) logit noise per step (tests/trend/test_step_verdicts.py): σ̂ recovers σ within 20 %.

**What no precision explains** (`beyond_*` counts): numerical noise is a bulk whose u stays within ~10σ̂; a token
far outside it needs another cause. Rules, each with its source:
- on a known dense model, |ℓ| > DENSE_LIMIT nats (rcdiag's measurements: the worst token of a dense bf16 run moved
  0.16 (sample model) and 0.21 nats (SmolLM2), 0.36 under any dtype/kernel the probe tried);
- on any model, |ℓ| > ANY_LIMIT nats (beyond every published MoE mismatch: R3, arXiv 2510.11370, worst MoE
  tokens 2–6 nats);
- the engine confident (p ≥ ½) where the trainer is > FLIP_GAP nats lower (a confident token both stacks share
  cannot be flipped by rounding on a dense model; MoE routing can — so it counts as evidence on dense models only).
A heavy tail (more than TAIL_SHARE of tokens with u > TAIL_K·σ̂) is what MoE routing flips give; on a known dense
model it is itself a sign that something other than rounding differs.

**The temperature signature.** Sampling at T_e with scoring at T = 1 multiplies the logits' gaps by 1/T_e: on a
confident token with surprisal s = −log p, the engine's surprisal is ≈ s^(1/T_e) (exactly so with one competitor),
so q = log(log(−b) / log(−a)) sits at ≈ −log T_e on *every* confident token. Numerical noise moves q around 0 by
noise/(s·log s), symmetrically, and a few large flips move the median not at all — unlike a least-squares slope of
b on a, which noise on either side attenuates (regression dilution: heavy MoE-like noise read as "sharper").
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from rcdiag.analysis.metrics.precision import Floor, Precision

DENSE_LIMIT = 2.0
"""|ℓ| (nats) beyond which a token of a known dense model is not numerical mismatch (see the module doc)."""
ANY_LIMIT = 15.0
"""|ℓ| (nats) beyond which no numerical effect explains a token, MoE included (see the module doc)."""
FLIP_GAP = 2.0
"""The engine at p ≥ ½ and the trainer this many nats lower: a confident flip (evidence on dense models)."""
TAIL_K = 10.0
"""A token is an outlier of the noise bulk when u > TAIL_K·σ̂ (a Gaussian bulk puts 1e-23 there; the sample
model's bf16 run has none beyond 11σ̂)."""
TAIL_SHARE = 1e-3
"""More outliers than this share of scored tokens make the mismatch heavy-tailed (MoE-like)."""
DENSE_TAIL_SHARE = 1e-2
"""On a known dense model, more outliers than this share are not numerics (rcdiag's choice: ten times TAIL_SHARE,
a margin for dense runs longer or deeper than the two measured here, which had none beyond 10σ̂; between the two
the verdict says heavy-tailed and that it is unusual for a dense model)."""
CERTAIN = 1e-7
"""1 − p below this on both sides: a certain token (float32 cannot show its mismatch); not scored for u."""
MIN_SCORED = 200
"""Fewer scored tokens than this: no noise scale (too few to judge)."""
CONFIDENT = (math.log(0.5), -1e-4)
"""The window of log-probs (both sides) whose surprisal ratio carries the temperature signature."""
TEMPERATURE_TOLERANCE = 0.1
"""|q| above this (exp(q) outside [0.90, 1.11]) is a temperature signature (rcdiag's choice: noise-only runs,
MoE-like included, give |q| < 0.005; T_e = 0.9 gives ≈ 0.2)."""
MIN_CONFIDENT = 50
"""Fewer confident tokens than this: the temperature signature is not tested."""

U_LOG10 = (-9.0, 3.0)
U_BINS = 480
Q_RANGE = (-3.0, 3.0)
Q_BINS = 1200
NORMAL_MAD = 0.6744897501960817
"""The median of |N(0, 1)|."""

NOISE_NAMES = ("noise_sigma", "noise_tail_share", "noise_mean_gap", "noise_scored", "noise_certain", "beyond_dense",
               "beyond_any", "confident_flips", "noise_tokens", "noise_max_abs", "noise_mean_abs", "noise_u_p99",
               "noise_u_p999", "noise_identical")
"""NoiseSummary.values' names: per step in rcdiag.trend's frame, and among the verdict's headline values."""
def noise_terms(a: np.ndarray, b: np.ndarray, temperature: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-row transcendental terms of `noise_evidence` for a whole batch, by numpy's vectorised (SIMD) loops,
    in float64 whatever the stored dtype: (gap = 1 − p_min = −expm1(min(a, b)), log10(u) with u = |a − b| / gap,
    q = log(log(−b) / log(−a)); q empty unless `temperature`).

    Why here and not in the kernel: libm called row by row cost ~6–10 ns a value, numpy's float64 loops ~1.6 ns
    (float64 batches: the same bits as libm's on the benchmark runs). Why float64 for float32 batches too: numpy's
    float32 expm1 is biased (−7e-9 relative on average, up to 3 ulp), which moved Σ(1 − p) by ~6e-9; float64
    terms move it by what float32 rounding was (~1e-10). Rows that are not clean (invalid, non-finite, ≥ 0,
    ≤ −1e9) get meaningless values here; the kernel skips them."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(all="ignore"):
        gap = -np.expm1(np.minimum(a, b))
        log10_u = np.log10(np.abs(a - b) / gap)
        q = np.log(np.log(-b) / np.log(-a)) if temperature else gap[:0]
    return gap, log10_u, q


@numba.njit(cache=True, nogil=True)
def noise_evidence(a, b, valid, gap, log10_u, q, temperature, u_hist, q_hist, counts, sums):
    """Add one batch (a, b float [n], valid bool [n], and its `noise_terms` gap, log10_u, q) to the histograms and
    counters, in place: a branchy pass with no transcendental call left in it (those are numpy's, vectorised).

    u_hist int64 [U_BINS + 2]: log10(u) bins over U_LOG10 (first/last cell: under/overflow); q_hist int64 [Q_BINS + 2]
    the same for q (only when `temperature`); counts int64 [8]: clean, certain, scored, beyond DENSE_LIMIT,
    beyond ANY_LIMIT, confident flips, confident (q) tokens, bit-identical (a == b) tokens; sums float64 [3]: Σ|ℓ| (clean), Σ(1 − p) (scored),
    max |ℓ|. Clean: valid with both sides finite, < 0 and > −1e9 (the checks report the rest). The sums are
    added row by row in row order, as before the terms moved out, so they keep their bits."""
    lo, hi = U_LOG10
    u_scale = U_BINS / (hi - lo)
    q_lo, q_hi = Q_RANGE
    q_scale = Q_BINS / (q_hi - q_lo)
    c_lo, c_hi = CONFIDENT
    log_half = math.log(0.5)
    for i in range(a.size):
        x, y = a[i], b[i]
        if not valid[i] or not (math.isfinite(x) and math.isfinite(y)) or x >= 0.0 or y >= 0.0 \
                or x <= -1e9 or y <= -1e9:
            continue
        counts[0] += 1
        counts[7] += x == y  # bit-identical: both sides stored the same float32 value
        d = abs(x - y)
        sums[0] += d
        if d > sums[2]:
            sums[2] = d
        counts[3] += d > DENSE_LIMIT
        counts[4] += d > ANY_LIMIT
        counts[5] += (y >= log_half) and (x < y - FLIP_GAP)
        g = gap[i]  # 1 − p_min, exact near p = 1
        if g < CERTAIN:
            counts[1] += 1
        else:
            counts[2] += 1
            sums[1] += g
            # u = d / g > 0 unless d = 0 (0 < g < 1): log10(u) is finite here
            k = 0 if d <= 0.0 else int(math.floor((log10_u[i] - lo) * u_scale)) + 1
            u_hist[min(max(k, 0), U_BINS + 1)] += 1
        if temperature and c_lo <= x <= c_hi and c_lo <= y <= c_hi:
            k = int(math.floor((q[i] - q_lo) * q_scale)) + 1
            q_hist[min(max(k, 0), Q_BINS + 1)] += 1
            counts[6] += 1


def hist_quantile(hist: np.ndarray, lo: float, width: float, share: float) -> float:
    """The `share` quantile of a histogram whose first and last cells are the under/overflow of the bins
    [lo + k·width, lo + (k + 1)·width): linear inside the bin that crosses it, the range's edge for the outer cells;
    NaN when empty."""
    total = int(hist.sum())
    if total == 0:
        return math.nan
    cum = np.cumsum(hist)
    k = int(np.searchsorted(cum, share * total, side="left"))
    if k == 0:
        return lo
    if k == hist.size - 1:
        return lo + (hist.size - 2) * width
    inside = (share * total - cum[k - 1]) / hist[k]
    return lo + (k - 1 + inside) * width


@dataclass
class NoiseEvidence:
    """Mergeable evidence for the noise floor, the tokens beyond it and the temperature signature
    (fresh → update → merge → finish). `temperature=False` skips the signature's histogram (per-step copies)."""

    temperature: bool = True
    u_hist: np.ndarray = field(default_factory=lambda: np.zeros(U_BINS + 2, np.int64))
    q_hist: np.ndarray = field(default_factory=lambda: np.zeros(Q_BINS + 2, np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(8, np.int64))
    sums: np.ndarray = field(default_factory=lambda: np.zeros(3, np.float64))

    def fresh(self) -> NoiseEvidence:
        return NoiseEvidence(self.temperature)

    def update(self, a: np.ndarray, b: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add rows: a, b float [n] (train, rollout log-probs), valid bool [n]. Returns the rows' (gap, log10 u)
        terms, for evidence that bins the same rows another way (rcdiag.analysis.metrics.position_noise)."""
        gap, log10_u, q = noise_terms(a, b, self.temperature)
        noise_evidence(a, b, valid, gap, log10_u, q, self.temperature, self.u_hist, self.q_hist, self.counts,
                       self.sums)
        return gap, log10_u

    def merge(self, other: NoiseEvidence) -> NoiseEvidence:
        self.u_hist += other.u_hist
        self.q_hist += other.q_hist
        self.counts += other.counts
        self.sums[:2] += other.sums[:2]
        self.sums[2] = max(self.sums[2], other.sums[2])
        return self

    def finish(self) -> NoiseSummary:
        clean, certain, scored, dense, any_, flips, confident, identical = (int(c) for c in self.counts)
        width = (U_LOG10[1] - U_LOG10[0]) / U_BINS
        sigma = tail = p99 = p999 = math.nan
        if scored >= MIN_SCORED:
            sigma = 10 ** hist_quantile(self.u_hist, U_LOG10[0], width, 0.5) / NORMAL_MAD
            tail = tail_share(self.u_hist, scored, TAIL_K * sigma)
            p99 = 10 ** hist_quantile(self.u_hist, U_LOG10[0], width, 1 - DENSE_TAIL_SHARE)
            p999 = 10 ** hist_quantile(self.u_hist, U_LOG10[0], width, 1 - TAIL_SHARE)
        q = math.nan
        if self.temperature and confident >= MIN_CONFIDENT:
            q = hist_quantile(self.q_hist, Q_RANGE[0], (Q_RANGE[1] - Q_RANGE[0]) / Q_BINS, 0.5)
        return NoiseSummary(tokens=clean, certain=certain, scored=scored, sigma=sigma, tail_share=tail,
                            mean_abs=self.sums[0] / clean if clean else math.nan,
                            mean_gap=self.sums[1] / scored if scored else math.nan, max_abs=float(self.sums[2]),
                            beyond_dense=dense, beyond_any=any_, confident_flips=flips, confident=confident,
                            temperature_q=q, u_p99=p99, u_p999=p999, identical=identical,
                            u_hist=self.u_hist.copy())


def tail_share(u_hist: np.ndarray, scored: int, edge: float, bins: int = U_BINS) -> float:
    """The share of `scored` tokens whose u lies beyond `edge`, from a log10(u) histogram of `bins` bins over U_LOG10
    with under/overflow cells (the bins that start above the edge; NaN without scored tokens)."""
    if not scored:
        return math.nan
    width = (U_LOG10[1] - U_LOG10[0]) / bins
    at = math.log10(edge) if edge > 0 else U_LOG10[0]
    k = int(math.floor((at - U_LOG10[0]) / width)) + 1
    return float(u_hist[min(max(k + 1, 0), bins + 1):].sum() / scored)


@dataclass(frozen=True)
class NoiseSummary:
    """What NoiseEvidence found (see the module doc): `sigma` the run's noise scale σ̂ (NaN with fewer than
    MIN_SCORED scored tokens), `tail_share` the share of scored tokens beyond TAIL_K·σ̂, `u_p99` / `u_p999` the
    99th / 99.9th percentiles of u (a tail is heavy only where they also lie beyond what the floor's precision
    can give: `heavy`), `mean_gap` E[1 − p], `beyond_dense` / `beyond_any` / `confident_flips` the counts of
    tokens no precision explains, and `temperature_q` the median of log(log(−b)/log(−a)) over `confident` tokens
    (NaN when too few). `u_hist` the u histogram itself (run level only: a trend row's values do not carry it)."""

    tokens: int
    certain: int
    scored: int
    sigma: float
    tail_share: float
    mean_abs: float
    mean_gap: float
    max_abs: float
    beyond_dense: int
    beyond_any: int
    confident_flips: int
    confident: int
    temperature_q: float
    u_p99: float = math.nan
    u_p999: float = math.nan
    identical: int = 0
    """Clean tokens whose two log-probs are bit-identical (the same stored float32 value: prime-rl's audit counts
    the others as `logprob_bit_mismatch`)."""
    u_hist: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def bit_exact(self) -> bool:
        """Every clean token bit-identical on both sides (and at least one): on-policy to the last bit."""
        return self.tokens > 0 and self.identical == self.tokens

    @property
    def heavy_tail(self) -> bool:
        """More than TAIL_SHARE of tokens beyond TAIL_K·σ̂ — relative to the run's own noise only; `heavy` also asks
        that they be beyond what the floor's precision can give."""
        return self.tail_share > TAIL_SHARE

    def tail_edge(self, floor: Floor | None) -> float:
        """u beyond which a token is an outlier: TAIL_K × the larger of the run's σ̂ and the largest σ the floor's
        precision can give (a run below its floor has no tail at 10σ̂: its tokens are still within rounding)."""
        largest = floor.sigma_largest if floor is not None else 0.0
        return TAIL_K * max(self.sigma if math.isfinite(self.sigma) else 0.0, largest)

    def heavy(self, floor: Floor | None, share: float = TAIL_SHARE) -> bool:
        """A heavy tail: more than `share` (TAIL_SHARE, or DENSE_TAIL_SHARE) of the scored tokens beyond
        tail_edge(floor) — large against the run's own noise AND beyond what its precision can give at their
        probabilities (user review: a clean run whose worst token moved 0.03 nats was called heavy-tailed against
        its own tiny σ̂). From the histogram where the summary has it, else from the matching percentile of u."""
        if not self.tail_share > share:
            return False
        edge = self.tail_edge(floor)
        if self.u_hist is not None:
            return self.beyond(edge) > share
        quantile = {TAIL_SHARE: self.u_p999, DENSE_TAIL_SHARE: self.u_p99}.get(share, math.nan)
        return not math.isfinite(quantile) or quantile > edge

    def beyond(self, edge: float) -> float:
        """The share of scored tokens with u beyond `edge` (NaN without the histogram)."""
        if self.u_hist is None:
            return math.nan
        return tail_share(self.u_hist, self.scored, edge)

    def floor(self, precision: Precision | str | None) -> Floor:
        """The floor the run's `precision` (or the coarser side's dtype) explains at its token probabilities."""
        p = precision if isinstance(precision, Precision) else Precision.coarse(precision)
        typical, largest = p.floor_sigma()
        scale = math.sqrt(2 / math.pi) * (self.mean_gap if math.isfinite(self.mean_gap) else 0.0)
        scored_share = self.scored / self.tokens if self.tokens else 0.0
        return Floor(p.label(), not p.assumed(), typical, largest, typical * scale * scored_share,
                     largest * scale * scored_share, p.assumed(), p.coarsest())

    def values(self) -> dict[str, float]:
        """The summary as flat NOISE_NAMES values (a trend row's or the verdict's headline values)."""
        return {"noise_sigma": self.sigma, "noise_tail_share": self.tail_share, "noise_mean_gap": self.mean_gap,
                "noise_scored": float(self.scored), "noise_certain": float(self.certain),
                "beyond_dense": float(self.beyond_dense), "beyond_any": float(self.beyond_any),
                "confident_flips": float(self.confident_flips), "noise_tokens": float(self.tokens),
                "noise_max_abs": self.max_abs, "noise_mean_abs": self.mean_abs, "noise_u_p99": self.u_p99,
                "noise_u_p999": self.u_p999, "noise_identical": float(self.identical)}

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> NoiseSummary | None:
        """The summary back from NOISE_NAMES values (None when they are absent: a run judged without them)."""
        if "noise_sigma" not in values:
            return None
        get = values.get
        return cls(tokens=int(get("noise_tokens", 0)), certain=int(get("noise_certain", 0)),
                   scored=int(get("noise_scored", 0)), sigma=float(get("noise_sigma")),
                   tail_share=float(get("noise_tail_share", math.nan)), mean_abs=float(get("noise_mean_abs", math.nan)),
                   mean_gap=float(get("noise_mean_gap", math.nan)), max_abs=float(get("noise_max_abs", math.nan)),
                   beyond_dense=int(get("beyond_dense", 0)), beyond_any=int(get("beyond_any", 0)),
                   confident_flips=int(get("confident_flips", 0)), confident=0, temperature_q=math.nan,
                   u_p99=float(get("noise_u_p99", math.nan)), u_p999=float(get("noise_u_p999", math.nan)),
                   identical=int(get("noise_identical", 0)))

    def to_dict(self) -> dict[str, Any]:
        return ({k: getattr(self, k) for k in self.__dataclass_fields__ if k != "u_hist"}
                | {"heavy_tail": self.heavy_tail})


def temperature_ratio(q: float) -> float:
    """exp(q): the typical ratio of the engine's to the trainer's surprisal exponent on confident tokens (1 for
    equal temperatures; > 1 when the engine is sharper, i.e. sampled at a lower temperature)."""
    return math.exp(q)
