"""The per-framework formula table (docs/metrics.md, its conventions section): one frozen record per convention, no if-ladders."""
from __future__ import annotations

from dataclasses import dataclass

from rcdiag.errors import ConfigError

LOG_RATIO_CLAMP = 20.0
"""The ±20 clamp on log-ratios (docs/metrics.md notation ℓ̂)."""


@dataclass(frozen=True)
class Convention:
    """How one framework forms each number. Field values are the keys of small dispatch tables in metrics.py and
    correction.py.

    - `token_clamp`: clamp on ℓ before exp for token ratios (None: trl, no clamp).
    - `seq_rows`: "valid" = sequence means over T_i > 0; "all" = over all B rows, empty rows as ā = b̄ = ℓ̄ = 0.
    - `k3`: "clamped" E[k3(ℓ̂)]; "clamped10" swift's clamp(k3(ℓ̂), ±10); "raw" verl's k3(ℓ) unclamped.
    - `chi2_seq`: "geometric" exp(2·clamp(ℓ̄)) or "product" exp(2·clamp(S_i)).
    - `is_seq_ratio`: "geometric" exp(clamp(ℓ̄, ±20)); "swift" exp(Σℓ̂/max(T,1)); "product_clamped" exp(clamp(S));
      "product" exp(S).
    - `is_seq_rows`: rows of the sequence-level IS counts: "valid" (T_i > 0) or "all" (B).
    - `ess`: "canonical" | "swift" | "verl" (verl's std sqrt(max(E[w̃²] − E[w̃]², 0)) equals the canonical
      population std because every verl weight is already ≤ C).
    - `allow_lower`: which actions accept a lower bound L.
    - `seq_mask_weight`: "ratio" (the sequence ratio) or "token" (swift: untruncated token ratios).
    - `seq_extrema`: "applied" (over applied weights) | "raw" (verl: exp(min(max S, 20)), exp(min S) over B)
      | "per_sequence" (trl: one value per sequence over B).
    - `float32_counts`: IS count metrics rounded as float32(k/N) (the framework's `.float()`).
    - `clipped_rows`: rows of sequence-level `clipped_frac`: "valid" or "all" (swift).
    - `high_low_rows`: rows of sequence-level fraction_high/low: "valid" or "all" (verl, on S vs float32 log C).
    - `framework`: which framework's extra logged numbers to add ("verl": rollout_is_seq_*, batch_norm_factor and
      the rollout_rs_* rejection statistics, verlstats.py; "trl": the sampling_logp_difference mean/max; "").
    - `is_scope`: tokens the IS metrics are computed over: "scored" (valid and not rejected) or "original" (verl:
      every valid token of the original response mask, rejection ignored).
    - `batch_norm`: "divide" (canonical: the IS metrics are of the normalised weights) or "factor" (verl: metrics
      before normalisation, plus batch_norm_factor).
    - `no_upper`: an upper bound of None (no C) is allowed (TRL's vllm_importance_sampling_clip_max=None).
    - `no_data`: "nan" (canonical, verl: no valid token → NaN; verl itself raises ValueError), "trl" (TRL logs 0.0
      for token modes, 1.0 for sequence modes and 0.0 for the logp differences) or "swift" (ms-swift's max(N, 1)
      divisors: kl = k3_kl = 0, chi2_token = −1, PPL 1, is_weight_mean 0, ess 1e10, clipped_frac 0).
    """

    name: str
    token_clamp: float | None = LOG_RATIO_CLAMP
    seq_rows: str = "valid"
    k3: str = "clamped"
    chi2_seq: str = "geometric"
    is_seq_ratio: str = "geometric"
    ess: str = "canonical"
    allow_lower: frozenset[str] = frozenset({"truncate", "mask"})
    seq_mask_weight: str = "ratio"
    seq_extrema: str = "applied"
    float32_counts: frozenset[str] = frozenset()
    clipped_rows: str = "valid"
    high_low_rows: str = "valid"
    framework: str = ""
    is_scope: str = "scored"
    batch_norm: str = "divide"
    no_upper: bool = False
    no_data: str = "nan"


CONVENTIONS: dict[str, Convention] = {
    "canonical": Convention("canonical"),
    "swift": Convention(
        "swift", seq_rows="all", k3="clamped10", chi2_seq="geometric", is_seq_ratio="swift", ess="swift",
        allow_lower=frozenset(), seq_mask_weight="token", float32_counts=frozenset({"clipped_frac"}),
        clipped_rows="all", no_data="swift"),
    "verl": Convention(
        "verl", seq_rows="all", k3="raw", chi2_seq="product", is_seq_ratio="product_clamped", ess="verl",
        allow_lower=frozenset({"mask"}), seq_extrema="raw",
        float32_counts=frozenset({"fraction_high", "fraction_low"}), high_low_rows="all", framework="verl",
        is_scope="original", batch_norm="factor"),
    "trl": Convention("trl", token_clamp=None, is_seq_ratio="product", seq_extrema="per_sequence", framework="trl",
                      no_upper=True, no_data="trl"),
    **{name: Convention(name, framework=name) for name in ("openrlhf", "skyrl", "nemo-rl", "prime-rl", "roll")},
}
"""canonical = docs/metrics.md definitions; swift = ms-swift v4.5.2 `swift/rlhf_trainers/grpo_trainer.py`; verl = v0.9.0
`verl/trainer/ppo/rollout_corr_helper.py`; trl = v1.9.0 `trl/trainer/grpo_trainer.py` (GRPOTrainer).

trl reports no KL/PPL/chi² diagnostics of its own, so compute_metrics under trl gives the canonical values plus
TRL's `sampling_logp_difference` mean/max; its convention changes the IS simulation (no ±20 clamp, product sequence
ratio, per-sequence ratio statistics, optional upper bound, 0.0/1.0 with no valid token).
openrlhf, skyrl, nemo-rl, prime-rl, roll: the canonical formulas plus the numbers each logs on every step
(analysis.metrics.peer_logs, through MetricsAccumulator) under its keys (analysis.keys); their corrections are the gate
families (analysis.correction.gate_defs: simulate(run, "<gate>", δ, keys=<framework>)), and the IS modes are computed with the
canonical formulas under these names (SkyRL's TIS is product-ratio: use convention verl's numbers for it).
verl's unclamped k3 is computed in float64 (inf only past ~709 nats; verl's float32 overflows past ~88).

Ties: rcdiag decides ρ ≤ C exactly, in float64 log space (ℓ̂ ≤ log C), under every convention. The frameworks compare
float32 values (exp_f32(ℓ_f32) with float32(C)), so within about one float32 ulp of C (|ρ/C − 1| ≲ 6e-8) a framework
may keep a token that rcdiag counts above C, or the reverse; everywhere else the decisions agree. rcdiag does not
emulate float32 because a tie decided by rounding is noise, and an exact rule keeps results independent of the
stored dtype."""

DEFAULT_CONVENTION = "canonical"


def get_convention(name: str | Convention) -> Convention:
    """Look up a convention by name (ConfigError listing the choices when unknown)."""
    if isinstance(name, Convention):
        return name
    try:
        return CONVENTIONS[str(name).lower()]
    except KeyError:
        raise ConfigError(f"unknown convention {name!r}; choose one of {', '.join(CONVENTIONS)}") from None
