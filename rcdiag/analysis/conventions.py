"""The per-framework formula table (METRICS.md "Conventions"): one frozen record per convention, no if-ladders."""
from __future__ import annotations

from dataclasses import dataclass

from rcdiag.errors import ConfigError

LOG_RATIO_CLAMP = 20.0
"""The ±20 clamp on log-ratios (METRICS.md notation ℓ̂)."""


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


CONVENTIONS: dict[str, Convention] = {
    "canonical": Convention("canonical"),
    "swift": Convention(
        "swift", seq_rows="all", k3="clamped10", chi2_seq="geometric", is_seq_ratio="swift", ess="swift",
        allow_lower=frozenset(), seq_mask_weight="token", float32_counts=frozenset({"clipped_frac"}),
        clipped_rows="all"),
    "verl": Convention(
        "verl", seq_rows="all", k3="raw", chi2_seq="product", is_seq_ratio="product_clamped", ess="verl",
        allow_lower=frozenset({"mask"}), seq_extrema="raw",
        float32_counts=frozenset({"fraction_high", "fraction_low"}), high_low_rows="all"),
    "trl": Convention("trl", token_clamp=None, is_seq_ratio="product", seq_extrema="per_sequence"),
}
"""canonical = METRICS.md definitions; swift = ms-swift ≥ 3.11; verl = 0.9.x rollout_corr_helper; trl = GRPO.

trl reports no KL/PPL/chi² diagnostics of its own, so compute_metrics under trl gives the canonical values; its
convention changes only the IS simulation (no ±20 clamp, product sequence ratio, per-sequence ratio statistics).
verl's unclamped k3 is computed in float64 (inf only past ~709 nats; verl's float32 overflows past ~88)."""

DEFAULT_CONVENTION = "canonical"


def get_convention(name: str | Convention) -> Convention:
    """Look up a convention by name (ConfigError listing the choices when unknown)."""
    if isinstance(name, Convention):
        return name
    try:
        return CONVENTIONS[str(name).lower()]
    except KeyError:
        raise ConfigError(f"unknown convention {name!r}; choose one of {', '.join(CONVENTIONS)}") from None
