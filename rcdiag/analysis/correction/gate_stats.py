"""The gates' per-token statistics and their per-sequence / per-segment aggregates over one chunk (float64 numpy;
the aggregates one compiled pass, kernels.segment_means), cached on the chunk so every gate setting of a sweep
computes each once. Formulas: analysis.correction.gate_defs."""
from __future__ import annotations

import numpy as np

from rcdiag.analysis.passes import kernels
from rcdiag.analysis.passes.chunks import TokenChunk

CLIP = 1e-6
"""OpenRLHF's and KPop's probability clamp [1e-6, 1 − 1e-6] before the binary KL / TV."""
VERL_EPS = 1e-8
"""verl dppo_kl's `+ 1e-8` in log((1 − p_old + 1e-8) / (1 − p + 1e-8))."""


def train64(chunk: TokenChunk) -> np.ndarray:
    """Train log-probs as float64 (0 on masked rows): the stored float32 widened, as a float32 ℓ loses ~1e-7
    absolute, which k3 of a 1e-3 mismatch turns into a 1e-4 relative error. On a validated chunk the rows kept are
    the valid rows, so this is the chunk's own TokenChunk.a (one array for the metrics and the gates)."""
    if chunk.validated:
        return chunk.a
    return chunk.memo(("gate", "a64"), lambda: np.where(chunk.mask, chunk.train.astype(np.float64), 0.0))


def rollout64(chunk: TokenChunk) -> np.ndarray:
    """Rollout log-probs as float64 (0 on masked rows; TokenChunk.b on a validated chunk, as train64)."""
    if chunk.validated:
        return chunk.b
    return chunk.memo(("gate", "b64"), lambda: np.where(chunk.mask, chunk.rollout.astype(np.float64), 0.0))


def ell64(chunk: TokenChunk) -> np.ndarray:
    """ℓ = a − b in float64 (0 on masked rows): on a validated chunk the chunk's row terms' ℓ, the same bits
    (kernels.clamped_log_ratio subtracts the same widened values), computed once for the metrics and the gates."""
    if chunk.validated:
        return chunk.terms.ell
    return chunk.memo(("gate", "ell64"), lambda: train64(chunk) - rollout64(chunk))


def mismatch_k3(chunk: TokenChunk) -> np.ndarray:
    """k3 = exp(ℓ) − ℓ − 1 per row (prime-rl's mismatch_kl, NeMo-RL's gen_kl_error), once per chunk for both."""
    with np.errstate(over="ignore", invalid="ignore"):
        return chunk.memo(("gate", "k3"), lambda: k3(ell64(chunk)))


def _binary_kl(chunk: TokenChunk, x: str, y: str) -> np.ndarray:
    """D_B(x‖y) = x log(x/y) + (1 − x) log((1 − x)/(1 − y)) of the clamped probabilities named x, y ("P" the
    rollout's, "Q" the trainer's); their logs once per chunk for every direction and gate."""
    rollout, train = _clamped(chunk)
    values = {"P": rollout, "Q": train}

    def logs(name: str) -> tuple[np.ndarray, np.ndarray]:
        v = values[name]
        return (chunk.memo(("gate", "log", name), lambda: np.log(v)),
                chunk.memo(("gate", "log1m", name), lambda: np.log1p(-v)))

    (log_x, log1m_x), (log_y, log1m_y) = logs(x), logs(y)
    return values[x] * (log_x - log_y) + (1.0 - values[x]) * (log1m_x - log1m_y)


def _probs(chunk: TokenChunk) -> tuple[np.ndarray, np.ndarray]:
    """(p, q) = (exp(train), exp(rollout)) per row (1 on masked rows)."""
    return chunk.memo(("gate", "p"), lambda: np.exp(train64(chunk))), chunk.memo(("gate", "q"), lambda: np.exp(rollout64(chunk)))


def _clamped(chunk: TokenChunk) -> tuple[np.ndarray, np.ndarray]:
    p, q = _probs(chunk)
    return (chunk.memo(("gate", "P"), lambda: np.clip(q, CLIP, 1 - CLIP)),
            chunk.memo(("gate", "Q"), lambda: np.clip(p, CLIP, 1 - CLIP)))


def _prob_diff(chunk: TokenChunk) -> np.ndarray:
    p, q = _probs(chunk)
    return p - q


def _abs_prob_diff(chunk: TokenChunk) -> np.ndarray:
    return np.abs(token_statistic(chunk, "prob_diff"))


def _tv_clamped(chunk: TokenChunk) -> np.ndarray:
    rollout, train = _clamped(chunk)
    return np.abs(rollout - train)


def _binary_kl_openrlhf(chunk: TokenChunk) -> np.ndarray:
    return chunk.memo(("gate", "kl_PQ"), lambda: _binary_kl(chunk, "P", "Q"))  # OpenRLHF: p = rollout, q = train


def _binary_kl_two_sided(chunk: TokenChunk) -> np.ndarray:
    return np.maximum(_binary_kl(chunk, "Q", "P"), _binary_kl_openrlhf(chunk))


def _binary_kl_verl(chunk: TokenChunk) -> np.ndarray:
    p, q = _probs(chunk)  # verl: old_prob = q (the rollout's in bypass), prob = p
    return q * (rollout64(chunk) - train64(chunk)) + (1.0 - q) * np.log((1.0 - q + VERL_EPS) / (1.0 - p + VERL_EPS))


def _log_ratio(chunk: TokenChunk) -> np.ndarray:
    return ell64(chunk)


def _mult_prob_error(chunk: TokenChunk) -> np.ndarray:
    return np.exp(np.abs(ell64(chunk)))


_STATISTICS = {"prob_diff": _prob_diff, "abs_prob_diff": _abs_prob_diff, "tv_clamped": _tv_clamped,
               "binary_kl": _binary_kl_openrlhf, "binary_kl_two_sided": _binary_kl_two_sided,
               "binary_kl_verl": _binary_kl_verl, "log_ratio": _log_ratio, "mult_prob_error": _mult_prob_error}
"""Gate.statistic → per-row values (gate_defs module docstring)."""


def token_statistic(chunk: TokenChunk, name: str) -> np.ndarray:
    """The statistic per row (masked rows hold junk the callers never read), computed once per chunk."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return chunk.memo(("gate_stat", name), lambda: _STATISTICS[name](chunk))


def sequence_sum(chunk: TokenChunk, values: np.ndarray) -> np.ndarray:
    """Per-sequence compensated sum of `values` over valid rows (float64 [S]; kernels.segment_means)."""
    return kernels.segment_means(values, chunk.mask, chunk.starts, False)[1]


def valid_counts(chunk: TokenChunk) -> np.ndarray:
    """Valid rows per sequence (int64 [S]), once per chunk."""
    return chunk.memo(("gate", "valid"), lambda: np.add.reduceat(chunk.mask.view(np.int8), chunk.starts,
                                                                dtype=np.int64))


def mean_of_sums(chunk: TokenChunk, sums: np.ndarray) -> np.ndarray:
    """Per-sequence means from per-sequence sums over valid rows: sum / max(count, 1) (0 for a sequence without a
    valid row, as ROLL's / SkyRL's clamped divisors)."""
    return sums / np.maximum(valid_counts(chunk), 1)


def sequence_mean(chunk: TokenChunk, values: np.ndarray) -> np.ndarray:
    """Per-sequence mean of `values` over valid rows (mean_of_sums of sequence_sum)."""
    return mean_of_sums(chunk, sequence_sum(chunk, values))


def segment_mean(chunk: TokenChunk, values: np.ndarray) -> np.ndarray:
    """Each valid row's segment mean of `values` (0 on masked rows, as ROLL fills them): ROLL's segments, each run
    of consecutive valid rows within a sequence (`compute_segment_masked_mean`: runs of response_mask = 1)."""
    return kernels.segment_means(values, chunk.mask, chunk.starts, True)[0]


def at_level(chunk: TokenChunk, name: str, level: str, reduce: str) -> np.ndarray:
    """Statistic `name` at a gate's level, once per chunk for every gate that shares it: token → per row; segment
    → per row, its segment's mean (0 on masked rows); sequence → per SEQUENCE (float64 [S]), the sum (reduce sum /
    product: of ℓ, exp'd by the caller) or the mean (mean / geometric) over its valid rows, 0 for a sequence
    without one. A sequence's sum is computed once (sequence_sum) for its mean and
    its sum — the mean is that sum / max(count, 1) — and never broadcast to the rows:
    the gate kernel places a whole sequence by its one value (gate_kernels.gate_family, `whole`)."""
    if level == "token":
        return token_statistic(chunk, name)
    if level == "segment":
        return chunk.memo(("gate_segment", name), lambda: segment_mean(chunk, token_statistic(chunk, name)))
    total = chunk.memo(("gate_seq_sum", name), lambda: sequence_sum(chunk, token_statistic(chunk, name)))
    if reduce in ("sum", "product"):
        return total
    return chunk.memo(("gate_seq_mean", name), lambda: mean_of_sums(chunk, total))


def k3(log_ratio: np.ndarray) -> np.ndarray:
    """exp(x) − x − 1, accurate for small x (prime-rl's mismatch_kl, NeMo-RL's k3)."""
    with np.errstate(over="ignore"):
        return np.expm1(log_ratio) - log_ratio


LOG_COSH_LINEAR = 700.0
"""Above this x, log cosh x is x − log 2 to the last bit (e^(−2x) is far below an ulp; expm1(x)² would overflow)."""


def js_divergence(chunk: TokenChunk) -> np.ndarray:
    """NeMo-RL's per-token js_divergence_error term ½ k3(a − m) + ½ k3(b − m), m = log(½p + ½q), per row, once per
    chunk for the gates and the peer numbers. In closed form: with x = |ℓ|/2 the sum is log cosh x (the terms are
    2σ(±ℓ) − 1 + softplus(∓ℓ) − log 2), computed as log1p(e · e / (2(1 + e))), e = expm1(x): one expm1 and one
    log1p where NeMo-RL's form takes a logaddexp and two expm1 (≈ 2× the time), and no cancellation — its form
    loses ~ε/|ℓ| relative (1e-9 at |ℓ| = 1e-7), this one a few ulps."""
    def make() -> np.ndarray:
        x = np.abs(ell64(chunk)) * 0.5
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.expm1(np.minimum(x, LOG_COSH_LINEAR))
            return np.where(x > LOG_COSH_LINEAR, x - np.log(2.0), np.log1p(e * (e / (2.0 * (1.0 + e)))))

    return chunk.memo(("gate", "js"), make)


def policy_k3(chunk: TokenChunk) -> np.ndarray:
    """k3 of −ℓ per row (NeMo-RL's policy_kl_error), once per chunk for the gates and the peer numbers."""
    with np.errstate(over="ignore", invalid="ignore"):
        return chunk.memo(("gate", "k3-"), lambda: k3(-ell64(chunk)))
