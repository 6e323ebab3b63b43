"""The frameworks' own names for rcdiag's numbers: ONE table per framework, read by the library (`keys=`) and by
every writer of metrics (the report's metrics.json, exports) through `rename`. docs/framework-keys.md lists every
logged key with the rcdiag call that reproduces it.

Key strings as the frameworks log them (prefixes included):
- verl v0.9.0 `verl/trainer/ppo/rollout_corr_helper.py`: `rollout_corr/<key>` (decoupled mode), and
  `verl/utils/debug/metrics.py`: `training/rollout_probs_diff_*`, `training/rollout_actor_probs_pearson_corr`.
  Bypass mode logs the `rollout_corr/` keys as `actor/rollout_corr/<key>` from inside the loss, per micro-batch,
  with the log-probs of the policy as it is being updated: not reproducible offline (one fixed trainer log-prob
  per token, no micro-batch split), so this table has no `actor/` names.
- ms-swift v4.5.2 `swift/rlhf_trainers/grpo_trainer.py` `_update_metrics`: `rollout_correction/<key>`.
- TRL v1.9.0 `trl/trainer/grpo_trainer.py` `_generate_and_score_completions`: `sampling/...` (eval runs prefix
  `eval_`).
A number the framework does not log keeps its rcdiag name under an `rcdiag/` prefix, so a renamed dict never
passes one of rcdiag's own numbers off as the framework's.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from rcdiag.errors import ConfigError

KEY_STYLES = ("canonical", "verl", "swift", "trl", "openrlhf", "skyrl", "nemo-rl", "prime-rl", "roll")
"""Values of `keys=` / `--keys`: canonical = docs/metrics.md names (unchanged); the others = the framework's keys."""
RCDIAG_PREFIX = "rcdiag/"

OFFPOLICY_NAMES = ("training_ppl", "training_log_ppl", "kl", "k3_kl", "rollout_ppl", "rollout_log_ppl",
                   "log_ppl_diff", "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio",
                   "chi2_token", "chi2_seq")
"""The off-policy diagnostics verl and ms-swift both log, under the same suffix."""

VERL_KEYS: dict[str, str] = {
    **{name: f"rollout_corr/{name}" for name in OFFPOLICY_NAMES},
    "is_weight_mean": "rollout_corr/rollout_is_mean", "is_weight_std": "rollout_corr/rollout_is_std",
    "is_weight_min": "rollout_corr/rollout_is_min", "is_weight_max": "rollout_corr/rollout_is_max",
    "ess": "rollout_corr/rollout_is_eff_sample_size",
    "fraction_high": "rollout_corr/rollout_is_ratio_fraction_high",
    "fraction_low": "rollout_corr/rollout_is_ratio_fraction_low",
    "is_oob_ratio": "rollout_corr/rollout_is_oob_ratio",
    "batch_norm_factor": "rollout_corr/rollout_is_batch_norm_factor",
    **{f"is_seq_{s}": f"rollout_corr/rollout_is_seq_{s}" for s in (
        "mean", "std", "min", "max", "max_deviation", "fraction_high", "fraction_low")},
    **{name: f"training/rollout_{name}" for name in (
        "probs_diff_valid", "probs_diff_max", "probs_diff_mean", "probs_diff_std", "actor_probs_pearson_corr")},
    "dppo_clipfrac": "actor/pg_clipfrac", "dppo_ppo_kl": "actor/ppo_kl",
    "dppo_clipfrac_lower": "actor/pg_clipfrac_lower",
    "rs_masked_fraction": "rollout_corr/rollout_rs_masked_fraction",
    "rs_seq_masked_fraction": "rollout_corr/rollout_rs_seq_masked_fraction",
    **{f"seq_{name}_{s}": f"training/off_policy/trajectory_{key}/{s}" for name, key in (
        ("lag", "staleness"), ("lag_worst", "staleness_worst"), ("span", "spans")) for s in ("mean", "max", "min")},
    "partial_seqs": "fully_async/partial/total_partial_num", "partial_seq_share": "fully_async/partial/partial_ratio",
    "partial_span_max": "fully_async/partial/max_partial_span",
}
"""verl: rcdiag name → key. Per-option rejection numbers `rs_<option>_<suffix>` → `rollout_corr/rollout_rs_...`.
Staleness (rcdiag.analysis.training.lag_trend's sequence columns): the V1 trainer's `training/off_policy/trajectory_*`
(verl/trainer/ppo/v1/trainer_base.py @ 1dda039, `_compute_metrics` step 5) and the fully-async trainer's
`fully_async/partial/*` (verl/experimental/fully_async_policy/detach_utils.py @ 1dda039,
`assemble_batch_from_rollout_samples`)."""

SWIFT_KEYS: dict[str, str] = {
    **{name: f"rollout_correction/{name}" for name in OFFPOLICY_NAMES},
    **{name: f"rollout_correction/{name}" for name in ("is_weight_mean", "ess", "clipped_frac")},
}
"""ms-swift: rcdiag name → key."""

TRL_KEYS: dict[str, str] = {
    "is_weight_min": "sampling/importance_sampling_ratio/min",
    "is_weight_mean": "sampling/importance_sampling_ratio/mean",
    "is_weight_max": "sampling/importance_sampling_ratio/max",
    "abs_log_ratio_mean": "sampling/sampling_logp_difference/mean",
    "abs_log_ratio_max": "sampling/sampling_logp_difference/max",
    "seq_lag_mean": "sample/staleness_mean", "seq_lag_max": "sample/staleness_max",
}
"""TRL: rcdiag name → key (TRL logs no KL, PPL, χ², ESS or fractions for the mismatch). Staleness: AsyncGRPO's
`sample/staleness_{mean,max}` (trl 1.16.0 trl/experimental/async_grpo/async_grpo_trainer.py,
RolloutQueueDataset.__iter__: the trainer's model_version − the sample's, per consumed sample)."""

OPENRLHF_KEYS: dict[str, str] = {"kl": "train/vllm_kl", "vllm_kl": "train/vllm_kl",
                                 "is_filter_ratio": "train/is_filter_ratio"}
"""OpenRLHF 0.11.2 (`PolicyLoss.forward` → ppo_actor `experience.info`, logged as `train/<key>`): vllm_kl =
masked_mean(rollout − old) (rcdiag's kl), is_filter_ratio (the gates')."""

_SKYRL = "policy/loss_metrics/"
SKYRL_KEYS: dict[str, str] = {
    **{f"skyrl_abs_diff_{s}": f"policy/rollout_train_logprobs_abs_diff_{s}" for s in ("max", "min", "mean", "std")},
    **{f"skyrl_is_ratio_{s}": f"{_SKYRL}is_ratio_{s}" for s in ("mean", "std", "max", "min")},
    **{f"{p}_{s}_ratio": f"{_SKYRL}{p}_{s}_ratio" for p in ("outlier_seq", "geo_sequence_mask", "product_sequence_mask")
       for s in ("masked", "over_high", "under_low")},
    "token_mask_ratio": f"{_SKYRL}token_mask_ratio",
}
"""SkyRL @ a956457: trainer-level `policy/rollout_train_logprobs_abs_diff_*` (skyrl/train/trainer.py) and the
off-policy correction's `loss_metrics/*` (off_policy_correction_utils.py), both under the trainer's `policy/`."""

_NEMO_SEQ = tuple(f"{s}_seq_mult_prob_error{a}" for s in ("max", "mean", "min") for a in ("", "_after_mask"))
NEMO_KEYS: dict[str, str] = {
    **{n: f"train/{n}" for n in ("token_mult_prob_error", "gen_kl_error", "policy_kl_error", "js_divergence_error",
                                 "sampling_importance_ratio", "num_masked_seqs_by_logprob_error",
                                 "masked_correct_pct", *_NEMO_SEQ)},
    **{f"nemo_kept_{n}": f"train/{n}" for n in ("token_mult_prob_error", "gen_kl_error", "policy_kl_error",
                                                "js_divergence_error")},
}
"""NeMo-RL @ 7ea279a (`logger.log_metrics(metrics, step, prefix="train")` in grpo.py)."""

_PRIME_GATE = ("is_masked", "is_masked_low", "is_masked_high", "masked_advantage_positive",
               "masked_advantage_negative", "masked_mismatch_kl", "unmasked_mismatch_kl")
PRIME_KEYS: dict[str, str] = {
    **{f"prime_mismatch_kl_{s}": f"mismatch_kl/all/{s}" for s in ("mean", "std", "max")},
    **{f"prime_{n}_{s}": f"{n}/{s}" for n in _PRIME_GATE for s in ("mean", "max")},
}
"""prime-rl @ 559b447: Tensors.compute_stats keys after filter_rl_trainer_tensor_stats_for_wandb."""

ROLL_KEYS: dict[str, str] = {
    **{f"roll_{k}_{a}_mean": f"actor/train_infer_{k}_{a}_mean@sum" for k in ("ratio", "diff")
       for a in ("token", "geometric", "sequence", "segment")},
    "train_infer_final_mask_mean": "actor/train_infer_final_mask_mean",
}
"""ROLL @ 8eb27cc compute_train_infer_correction (metrics merged into the actor's `actor/` step metrics)."""

TABLES: dict[str, Mapping[str, str]] = {"verl": VERL_KEYS, "swift": SWIFT_KEYS, "trl": TRL_KEYS,
                                        "openrlhf": OPENRLHF_KEYS, "skyrl": SKYRL_KEYS, "nemo-rl": NEMO_KEYS,
                                        "prime-rl": PRIME_KEYS, "roll": ROLL_KEYS}


def check_keys(keys: str | None) -> str:
    """The key style (None → canonical); ConfigError listing the choices when unknown."""
    style = "canonical" if keys is None else str(keys).lower()
    if style not in KEY_STYLES:
        raise ConfigError(f"unknown keys {keys!r}; choose one of {', '.join(KEY_STYLES)}")
    return style


def key_convention(keys: str | None, convention: str | None) -> str:
    """The convention to compute with: the given one, else the framework named by `keys`, else canonical.
    A framework's key names on another convention's numbers would mislabel them: ConfigError."""
    style = check_keys(keys)
    if style == "canonical":
        return convention or "canonical"
    if convention is not None and str(getattr(convention, "name", convention)).lower() != style:
        raise ConfigError(f"keys={style!r} names {style}'s numbers, but convention={convention!r} computes another "
                          f"framework's; leave convention out or pass convention={style!r}")
    return style


def framework_key(name: str, keys: str | None) -> str:
    """One rcdiag name under the key style (`rcdiag/<name>` for a number the framework does not log)."""
    style = check_keys(keys)
    if style == "canonical":
        return name
    table = TABLES[style]
    if name in table:
        return table[name]
    if style == "verl" and name.startswith("rs_"):
        return f"rollout_corr/rollout_{name}"
    return RCDIAG_PREFIX + name


def rename(values: Mapping[str, object], keys: str | None) -> dict[str, object]:
    """`values` with every key under the key style, order kept (canonical: unchanged)."""
    style = check_keys(keys)
    if style == "canonical":
        return dict(values)
    return {framework_key(name, style): value for name, value in values.items()}


def tracker_table(keys: str | None, names: Iterable[str]) -> dict[str, str]:
    """{rcdiag name: tracker key} of `names` for a tracker export or a cross-check: a framework style keeps only
    the names that framework logs, under its keys (an rcdiag-only number in the trainer's panels would sit beside
    curves it cannot be compared with); canonical puts every name under `rcdiag/` (one panel group)."""
    style = check_keys(keys)
    if style == "canonical":
        return {name: RCDIAG_PREFIX + name for name in names}
    table = {name: framework_key(name, style) for name in names}
    return {name: key for name, key in table.items() if not key.startswith(RCDIAG_PREFIX)}


def guess_keys(logged: Iterable[str]) -> str | None:
    """The key style of a trainer's logged names (each possibly under a prefix such as actor/ or train/): the
    framework sharing most keys with them, else canonical if any is an `rcdiag/` name, else None."""
    names = set(logged)

    def hits(style: str) -> int:
        return sum(1 for key in TABLES[style].values() if any(n == key or n.endswith("/" + key) for n in names))

    best = max(TABLES, key=hits)
    if hits(best):
        return best
    return "canonical" if any(n.startswith(RCDIAG_PREFIX) or "/" + RCDIAG_PREFIX in n for n in names) else None
