"""Tracker key names per framework: rcdiag's trend columns → the keys verl, ms-swift and TRL log, and back.

So an export lands in the same TensorBoard / W&B panels as the trainer's own curves, and a cross-check can read the
trainer's curves by their names. Names and arithmetic from /tmp/research/framework_keys.md (verl 0.9
rollout_corr_helper, ms-swift 4.5 grpo_trainer, TRL 1.9 GRPOTrainer). When rcdiag.analysis.keys (the convention
key tables) lands, KEY_TABLES should be read from there; this module is then the one place to change.
"""
from __future__ import annotations

from rcdiag.analysis.metrics import COUNT_NAMES, METRIC_NAMES
from rcdiag.analysis.trend import ABS_NAMES, INTERVAL_NAMES, IS_METRIC_NAMES
from rcdiag.errors import ConfigError

_VERL_IS = {"is_weight_mean": "rollout_is_mean", "is_weight_std": "rollout_is_std", "is_weight_min": "rollout_is_min",
            "is_weight_max": "rollout_is_max", "ess": "rollout_is_eff_sample_size",
            "fraction_high": "rollout_is_ratio_fraction_high", "fraction_low": "rollout_is_ratio_fraction_low"}
_CANONICAL = (*COUNT_NAMES, *METRIC_NAMES, *ABS_NAMES, *IS_METRIC_NAMES,
              *(f"{n}_{b}" for n in INTERVAL_NAMES for b in ("low", "high")))

KEY_TABLES: dict[str, dict[str, str]] = {
    "verl": {**{m: f"rollout_corr/{m}" for m in METRIC_NAMES},
             **{k: f"rollout_corr/{v}" for k, v in _VERL_IS.items()}},
    "swift": {m: f"rollout_correction/{m}" for m in (*METRIC_NAMES, "is_weight_mean", "ess", "clipped_frac")},
    "trl": {"is_weight_min": "sampling/importance_sampling_ratio/min",
            "is_weight_mean": "sampling/importance_sampling_ratio/mean",
            "is_weight_max": "sampling/importance_sampling_ratio/max",
            "abs_log_ratio_mean": "sampling/sampling_logp_difference/mean",
            "abs_log_ratio_max": "sampling/sampling_logp_difference/max"},
    "canonical": {m: f"rcdiag/{m}" for m in _CANONICAL},
}
"""framework → {trend column: tracker key}. verl logs the 13 off-policy keys and rollout_is_* under rollout_corr/
(no clipped_frac/kept_*); swift 16 keys under rollout_correction/; TRL only sampling/…; canonical is everything
rcdiag computes, under rcdiag/."""
CONVENTION_OF = {"verl": "verl", "swift": "swift", "trl": "trl", "canonical": "canonical"}
"""The --convention whose arithmetic reproduces each key set's numbers."""
KEY_SETS = tuple(KEY_TABLES)


def key_table(keys: str) -> dict[str, str]:
    """The table of one key set; ConfigError naming the choices for an unknown one."""
    if keys not in KEY_TABLES:
        raise ConfigError(f"unknown --keys {keys!r}; choose one of {', '.join(KEY_SETS)}")
    return KEY_TABLES[keys]


def guess_keys(logged: set[str]) -> str | None:
    """The key set whose keys (possibly under a prefix such as actor/ or train/) the logged names share most."""
    best, hits = None, 0
    for name, table in KEY_TABLES.items():
        if name == "canonical" and best is not None:
            continue
        found = sum(1 for key in table.values() if any(t == key or t.endswith("/" + key) for t in logged))
        if found > hits:
            best, hits = name, found
    return best
