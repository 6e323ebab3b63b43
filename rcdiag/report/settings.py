"""Trainer settings to paste for a recommended IS correction (mode, C, optional lower L) in verl, TRL, ms-swift
and slime, with the version and source file each name was checked against, and a note where a framework cannot
express the mode.

Names, defaults and quoting were read in each framework's source (rcdiag's research notes, settings.md):

- verl 0.10.0.dev (verl-project/verl @ 1dda039b, `verl/trainer/config/algorithm/rollout_correction.yaml`,
  `verl/trainer/config/algorithm.py` RolloutCorrectionConfig, `verl/trainer/ppo/rollout_corr_helper.py`):
  `algorithm.rollout_correction.{rollout_is, rollout_is_threshold, bypass_mode}`; a threshold string "L_U" means
  IcePop masking and must be quoted ('key="L_U"') or Hydra reads 0.5_2 as the float 0.52. Sequence IS is the
  product of the token ratios. TIS has no lower bound.
- TRL 1.10.0.dev0 (huggingface/trl @ f2cd5771, `trl/trainer/grpo_config.py`): `GRPOConfig(use_vllm=True,
  vllm_importance_sampling_correction, vllm_importance_sampling_mode, vllm_importance_sampling_clip_max,
  vllm_importance_sampling_clip_min)`; sequence modes use the product of the token ratios.
- ms-swift 4.6.0.dev0 (modelscope/ms-swift @ 3602360a, `swift/rlhf_trainers/args_mixin.py`):
  `--rollout_importance_sampling_mode`, `--rollout_importance_sampling_threshold`; sequence modes use the
  GEOMETRIC mean of the token ratios; no lower bound.
- slime 0.3.1 (THUDM/slime @ 624b824a, `slime/utils/arguments.py`, `slime/backends/megatron_utils/loss.py`,
  `examples/train_infer_mismatch_helper/mis.py`): `--use-tis --tis-clip C [--tis-clip-low L]`, token masking
  through `--custom-tis-function-path slime.backends.megatron_utils.loss.icepop_function`, sequence modes
  through mis.py and a YAML given by `--custom-config-path`.
"""
from __future__ import annotations

from dataclasses import dataclass

from rcdiag.analysis.correction.modes import CorrectionMode, get_mode


@dataclass(frozen=True)
class Snippet:
    """One framework's setting: `code` to paste (`language` for highlighting), the version and source file the
    names were checked against, and a `note` (what differs from rcdiag's simulation, or what cannot be said)."""

    framework: str
    version: str
    source: str
    language: str
    code: str
    note: str = ""


VERL = ("verl", "0.10.0.dev (verl-project/verl @ 1dda039b)",
        "verl/trainer/config/algorithm/rollout_correction.yaml, verl/trainer/ppo/rollout_corr_helper.py")
TRL = ("TRL", "1.10.0.dev0 (huggingface/trl @ f2cd5771)", "trl/trainer/grpo_config.py")
SWIFT = ("ms-swift", "4.6.0.dev0 (modelscope/ms-swift @ 3602360a)", "swift/rlhf_trainers/args_mixin.py")
SLIME = ("slime", "0.3.1 (THUDM/slime @ 624b824a)",
         "slime/utils/arguments.py, examples/train_infer_mismatch_helper/mis.py")
NO_LOWER = 1e-9
"""verl's IcePop needs a lower bound: 1e-9 lies below its exp(−20) ≈ 2.06e-9 floor, so it never fires."""
PRODUCT_NOTE = ("rcdiag's {convention} convention forms the sequence ratio as {kind}; this framework uses the "
                "product of the token ratios, so re-run `rcdiag report --convention {target}` to see its numbers "
                "at this C before pasting.")


MODE_NAMES = {("token", "truncate"): "token_truncate", ("token", "mask"): "token_mask",
              ("sequence", "truncate"): "sequence_truncate", ("sequence", "mask"): "sequence_mask"}
"""TRL's vllm_importance_sampling_mode and ms-swift's --rollout_importance_sampling_mode for a mode's (level,
action): both name their four modes so (grpo_config.py, args_mixin.py). A preset of rcdiag's own name (a
`token_band_mask`) is set under its framework name, with its bounds."""
VERL_LEVELS = {"token": "token", "sequence": "sequence"}
"""verl's algorithm.rollout_correction.rollout_is for a level (rollout_correction.yaml)."""


def _g(x: float) -> str:
    return f"{x:g}"


def _verl(mode: CorrectionMode | None) -> Snippet:
    head = "actor_rollout_ref.rollout.calculate_log_probs=True \\\n"
    if mode is None:
        return Snippet(*VERL, "bash", head + "algorithm.rollout_correction.rollout_is=null",
                       "metrics only: rollout_corr/* (kl, k3_kl, chi2_token, …) are logged, no weights applied.")
    key, c, lower = "algorithm.rollout_correction", mode.upper, mode.lower
    note = ""
    if mode.action == "truncate":
        threshold = f"{key}.rollout_is_threshold={_g(c)}"
        if lower is not None:
            note = "verl's TIS clamps from above only: the lower bound L cannot be expressed (an \"L_U\" string " \
                   "switches to masking)."
    else:
        threshold = f"'{key}.rollout_is_threshold=\"{_g(lower if lower is not None else NO_LOWER)}_{_g(c)}\"'"
        note = "IcePop masking: weights outside [L, C] become 0; the loss denominator is unchanged."
    code = (head + f"{key}.rollout_is={VERL_LEVELS[mode.level]} \\\n{threshold} \\\n{key}.bypass_mode=false")
    return Snippet(*VERL, "bash", code, note)


def _trl(mode: CorrectionMode | None) -> Snippet:
    if mode is None:
        return Snippet(*TRL, "python", "GRPOConfig(use_vllm=True, vllm_importance_sampling_correction=False)",
                       "TRL corrects by default (sequence_mask, C = 3.0); it logs "
                       "sampling/sampling_logp_difference/* either way.")
    low = "" if mode.lower is None else f",\n           vllm_importance_sampling_clip_min={_g(mode.lower)}"
    code = (f"GRPOConfig(use_vllm=True, vllm_importance_sampling_correction=True,\n"
            f"           vllm_importance_sampling_mode=\"{MODE_NAMES[mode.level, mode.action]}\",\n"
            f"           vllm_importance_sampling_clip_max={_g(mode.upper)}{low})")
    return Snippet(*TRL, "python", code)


def _swift(mode: CorrectionMode | None) -> Snippet:
    head = "swift rlhf --rlhf_type grpo --use_vllm true \\\n  "
    if mode is None:
        return Snippet(*SWIFT, "bash", head + "--log_rollout_offpolicy_metrics true",
                       "metrics only (rollout_correction/*), no weights applied.")
    notes = []
    if mode.level == "sequence":
        notes.append("ms-swift's sequence modes bound the GEOMETRIC mean of the token ratios (rcdiag's "
                     "--convention swift), not their product: C means something else than in verl/TRL.")
    if (mode.level, mode.action) == ("sequence", "mask"):
        notes.append("Kept sequences get their untruncated token ratios as weights.")
    if mode.lower is not None:
        notes.append("No lower bound L exists in ms-swift.")
    code = head + (f"--rollout_importance_sampling_mode {MODE_NAMES[mode.level, mode.action]} \\\n  "
                   f"--rollout_importance_sampling_threshold {_g(mode.upper)}")
    return Snippet(*SWIFT, "bash", code, " ".join(notes))


SLIME_YAML = """# rcdiag_mis.yaml (copy of mis.yaml; mis.py reads every key; write floats with a dot)
use_tis: true
use_rs: false
tis_level: "sequence"
rs_level: "sequence"
tis_mode: "{tis_mode}"
tis_lower_bound: {lower}
tis_upper_bound: {upper}
rs_lower_bound: null
rs_upper_bound: null
rs_veto_threshold: null
tis_batch_normalize: false"""


def _float(x: float) -> str:
    text = repr(float(x))
    return text if "." in text else text.replace("e", ".0e")


def _slime(mode: CorrectionMode | None) -> Snippet:
    if mode is None:
        return Snippet(*SLIME, "bash", "# nothing to set: train/train_rollout_logprob_abs_diff is logged whenever "
                       "rollout log-probs exist", "Megatron backend only.")
    c, lower = mode.upper, mode.lower
    low = "" if lower is None else f" --tis-clip-low {_g(lower)}"
    if mode.level == "token":
        if mode.action == "truncate":
            return Snippet(*SLIME, "bash", f"--use-tis --tis-clip {_g(c)}{low}", "Megatron backend only.")
        return Snippet(*SLIME, "bash", f"--use-tis --tis-clip {_g(c)}{low} \\\n--custom-tis-function-path "
                       "slime.backends.megatron_utils.loss.icepop_function",
                       "icepop_function zeroes weights outside [L, C]; the loss mask is unchanged.")
    tis_mode = ("clip" if lower is not None else "truncate") if mode.action == "truncate" else "mask"
    yaml = SLIME_YAML.format(tis_mode=tis_mode, upper=_float(c), lower=_float(lower or 0.0))
    code = ("--use-tis --custom-config-path rcdiag_mis.yaml \\\n--custom-tis-function-path "
            "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp\n\n" + yaml)
    return Snippet(*SLIME, "bash", code, "The README's --tis-mode / --mis-* flags do not exist (silently ignored): "
                   "use the YAML. Megatron backend only.")


BUILDERS = (_verl, _trl, _swift, _slime)
PRODUCT_FRAMEWORKS = ("verl", "TRL", "slime")
"""The frameworks whose sequence ratio is the product of the token ratios (the note when the report's is not)."""


def trainer_settings(mode: str | CorrectionMode | None, threshold: float | None = None,
                     lower: float | None = None, convention: str = "canonical",
                     sequence_ratio: str = "geometric") -> list[Snippet]:
    """The snippets of every framework for `mode` (a preset's name or a CorrectionMode) at C = `threshold` (lower
    L optional: None keeps the mode's own, e.g. a preset's 1/C); mode None gives the 'monitor only' settings (no
    correction, metrics logged). Each builder reads the mode's declared level and action, never its name.
    `sequence_ratio` is how the report's convention forms a sequence ratio (Convention.is_seq_ratio): for
    sequence modes the product-based frameworks get a note when it differs."""
    c = float(threshold) if threshold is not None else 2.0
    row = None if mode is None else get_mode(mode).with_bounds(c, lower)
    out = [build(row) for build in BUILDERS]
    if row is not None and row.level == "sequence" and not sequence_ratio.startswith("product"):
        extra = PRODUCT_NOTE.format(convention=convention, kind="the geometric mean of the token ratios",
                                    target="verl")
        out = [Snippet(s.framework, s.version, s.source, s.language, s.code, f"{s.note} {extra}".strip())
               if s.framework in PRODUCT_FRAMEWORKS else s for s in out]
    return out


GATE_SOURCES = {
    "verl": ("verl", "0.10.0.dev (verl-project/verl @ 1dda039b)", "verl/trainer/ppo/core_algos.py, "
             "verl/workers/config/actor.py"),
    "prime-rl": ("prime-rl", "0.8.1.dev67 (PrimeIntellect-ai/prime-rl @ 559b447)",
                 "packages/prime-rl-configs/.../trainer.py DefaultLossConfig / IPOLossConfig"),
    "openrlhf": ("OpenRLHF", "0.11.2 (PyPI wheel)", "openrlhf/cli/train_ppo_ray.py"),
    "skyrl": ("SkyRL", "skyrl-v0.3.0+ (NovaSky-AI/SkyRL @ a956457)", "skyrl/train/config/config.py "
              "OffPolicyCorrectionConfig"),
    "nemo-rl": ("NeMo-RL", "v0.7.0 (NVIDIA-NeMo/RL @ 7ea279a)", "nemo_rl/algorithms/grpo.py GRPOConfig"),
    "roll": ("ROLL", "v0.3.0 (alibaba/ROLL @ 8eb27cc)", "roll/configs/base_config.py TrainInferCorrectionConfig"),
}


def _gate_code(gate: str, lo: float, hi: float, delta: float) -> tuple[str, str, str, str]:
    """(framework, language, code, note) for one gate setting."""
    if gate in ("dppo_tv", "dppo_kl"):
        return ("verl", "bash", f"actor_rollout_ref.actor.policy_loss.loss_mode={gate} \\\n"
                f"actor_rollout_ref.actor.clip_ratio_low={_g(lo)} \\\nactor_rollout_ref.actor.clip_ratio_high={_g(hi)}",
                "The mask acts on p − p_old: it gates this mismatch only when old_log_prob is the rollout's "
                "(fully-async use_rollout_log_probs=True); bypass_mode=true replaces the loss.")
    if gate == "ipo":
        return ("prime-rl", "toml", f"[trainer.loss]\ntype = \"ipo\"\nipo_threshold = {_g(hi)}", "")
    if gate == "two_sided_kl":
        return ("prime-rl", "toml", f"[trainer.loss]\ntype = \"kpop\"\nkpop_threshold = {_g(hi)}",
                "KPop is an open PR (prime-rl#3283): the name may change before it lands.")
    if gate.startswith(("token_", "seq_", "openrlhf_")):
        level = "seq" if gate.startswith(("seq_", "openrlhf_seq")) else "token"
        gating = "ratio" if "ratio" in gate else ("tv" if gate.endswith("tv") else "binary_kl")
        band = f"{_g(lo)} {_g(hi)}" if gating == "ratio" else _g(hi)
        return ("openrlhf", "bash", f"--algo.advantage.is_correction_level {level} \\\n"
                f"--algo.advantage.is_correction_mode mask \\\n--algo.advantage.is_correction_gating {gating} \\\n"
                f"--algo.advantage.is_correction_threshold {band}", "")
    if gate.startswith("skyrl_"):
        base = "trainer.algorithm.off_policy_correction"
        code = {"skyrl_outlier": f"{base}.outlier_token_is_threshold_low={_g(lo)} \\\n"
                                 f"{base}.outlier_token_is_threshold_high={_g(hi)}",
                "skyrl_token_mask": f"{base}.token_mask_is_threshold_low={_g(lo)} \\\n"
                                    f"{base}.token_mask_is_threshold_high={_g(hi)}",
                "skyrl_geo_mask": f"{base}.sequence_mask_metric=geometric \\\n{base}.geo_mask_low={_g(lo)} \\\n"
                                  f"{base}.geo_mask_high={_g(hi)}",
                "skyrl_product_mask": f"{base}.sequence_mask_metric=product \\\n{base}.product_mask_low={_g(lo)} \\\n"
                                      f"{base}.product_mask_high={_g(hi)}"}[gate]
        return ("skyrl", "bash", code, "Field names from OffPolicyCorrectionConfig; the Hydra path is the trainer "
                                       "config's algorithm section.")
    if gate == "nemo_seq_logprob_error":
        return ("nemo-rl", "yaml", f"grpo:\n  seq_logprob_error_threshold: {_g(hi)}", "")
    agg, kind = gate.split("_")[1:3]
    bounds = (f"ratio_enabled: true\n      ratio_low: {_g(lo)}\n      ratio_high: {_g(hi)}\n      diff_enabled: false"
              if kind == "ratio" else
              f"ratio_enabled: false\n      diff_enabled: true\n      diff_low: {_g(lo)}\n      diff_high: {_g(hi)}")
    return ("roll", "yaml", f"train_infer_correction:\n  filters:\n    - enabled: true\n      agg_type: {agg}\n"
            f"      {bounds}", "")


def gate_settings(gate: str, lo: float, hi: float, delta: float) -> Snippet:
    """The setting to paste for a gate family at the bounds (lo, hi) rcdiag simulated (δ = `delta`)."""
    framework, language, code, note = _gate_code(gate, lo, hi, delta)
    return Snippet(*GATE_SOURCES[framework], language, code, note)
