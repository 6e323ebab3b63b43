"""The gate families the RL frameworks apply to the training–inference mismatch, as ONE table of declared
definitions (analysis.correction.gates simulates them; each default is defined here once).

A gate is not a weight: it decides, per token or per sequence, whether a token stays in the loss. With `a` the
trainer's and `b` the engine's log-prob of the sampled token, p = exp(a), q = exp(b), ℓ = a − b:

| statistic | formula (per valid token) | from |
|---|---|---|
| prob_diff | p − q | verl dppo_tv, prime-rl default / ipo, ROLL diff filters |
| abs_prob_diff | \\|p − q\\| | prime-rl ipo_loss_fn |
| tv_clamped | \\|P − Q\\|, P = clamp(q), Q = clamp(p) to [1e-6, 1 − 1e-6] | OpenRLHF gating=tv |
| binary_kl | P log(P/Q) + (1 − P) log((1 − P)/(1 − Q)) (clamped as above) | OpenRLHF gating=binary_kl |
| binary_kl_verl | q (b − a) + (1 − q) log((1 − q + 1e-8)/(1 − p + 1e-8)) | verl dppo_kl |
| binary_kl_two_sided | max(D_B(P‖Q), D_B(Q‖P)) (clamped) | prime-rl #3283 KPop (open PR) |
| log_ratio | ℓ (ratios are exp of its aggregate) | ROLL, SkyRL, OpenRLHF ratio gating |
| mult_prob_error | exp(\\|ℓ\\|) | NeMo-RL token_mult_prob_error / seq_logprob_error_threshold |

Aggregation (`level`/`reduce`): token; sequence = mean | sum | geometric (exp of the mean ℓ) | product (exp of
Σℓ) over the valid tokens; segment = ROLL's per contiguous run of valid tokens (mean). `clamp` = ±20 on the log
before exp (SkyRL's safe_exp_delta), None for none (ROLL, OpenRLHF token ratio).

Rules: `upper` keeps stat ≤ hi; `band` keeps lo ≤ stat ≤ hi; `dppo` (advantage-signed) keeps A > 0: stat ≤ hi,
else stat ≥ −lo; `dppo_kl` keeps A > 0: D ≤ hi or p ≤ q, else D ≤ lo or p ≥ q; `any_token` keeps a sequence when
every valid token lies in [lo, hi] (and drops it whole otherwise). Bounds from δ = `threshold` (`bounds`):
`upper` hi = δ; `sym` [1 − δ, 1 + δ]; `recip` [1/δ, δ]; `diff` [−δ, δ]; `signed` hi = δ, lo = `lower` or δ;
`fixed_low` hi = δ, lo = `lower` (default `default_lower`, None: no lower bound). A given `lower` replaces the low
end of a band.

Survivor `weight`: what multiplies the kept tokens' loss in the framework — `ratio` (the token ratio ρ, ±20 clamp:
verl dppo (min(ρ, clip_ratio_c) there), prime-rl, OpenRLHF mask mode) or `one` (the framework edits the loss mask
only: SkyRL, ROLL filters, NeMo-RL's sample mask).
"""
from __future__ import annotations

from dataclasses import dataclass

from rcdiag.errors import ConfigError, did_you_mean

VERL = "verl-project/verl @ 1dda039 verl/trainer/ppo/core_algos.py"
PRIME = "PrimeIntellect-ai/prime-rl @ 559b447 src/prime_rl/trainer/rl/loss.py"
OPENRLHF = "openrlhf 0.11.2 (wheel) openrlhf/models/loss.py PolicyLoss.forward"
SKYRL = "NovaSky-AI/SkyRL @ a956457 skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py"
ROLL = "alibaba/ROLL @ 8eb27cc roll/utils/train_infer_corrections.py compute_train_infer_correction"
NEMO = "NVIDIA-NeMo/RL @ 7ea279a nemo_rl/algorithms/grpo.py compute_and_apply_seq_logprob_error_masking"

LEVELS = ("token", "sequence", "segment")
RULES = ("upper", "band", "dppo", "dppo_kl", "any_token")
BOUNDS = ("upper", "sym", "recip", "diff", "signed", "fixed_low")
WEIGHTS = ("ratio", "one")


@dataclass(frozen=True)
class Gate:
    """One gate family: its statistic, aggregation, rule and defaults, and where it was read (`source`)."""

    name: str
    framework: str
    source: str
    statistic: str
    level: str
    rule: str
    bounds: str
    default: float
    grid: tuple[float, ...]
    reduce: str = "mean"
    clamp: float | None = None
    default_lower: float | None = None
    signed: bool = False
    weight: str = "ratio"
    doc: str = ""

    def __post_init__(self) -> None:
        if self.level not in LEVELS or self.rule not in RULES or self.bounds not in BOUNDS or \
                self.weight not in WEIGHTS:
            raise ValueError(f"gate {self.name}: bad declaration")  # a table typo, caught at import


def _roll(agg: str, kind: str) -> Gate:
    ratio = kind == "ratio"
    level = {"token": "token", "segment": "segment"}.get(agg, "sequence")
    reduce = {"geometric": "geometric" if ratio else "mean", "sequence": "product" if ratio else "sum"}.get(
        agg, "mean")
    return Gate(f"roll_{agg}_{kind}", "roll", ROLL, "log_ratio" if ratio else "prob_diff", level, "band",
                "sym" if ratio else "diff", 0.2, (0.05, 0.1, 0.2, 0.3, 0.5) if ratio else (0.02, 0.05, 0.1, 0.2, 0.3),
                reduce=reduce, weight="one",
                doc=f"ROLL filter agg_type={agg}, {'ratio' if ratio else 'diff'} band "
                    f"{'[ratio_low, ratio_high] = [0.8, 1.2]' if ratio else '[diff_low, diff_high] = [-0.2, 0.2]'}"
                    f" (defaults); {'segment = each run of response_mask = 1' if agg == 'segment' else ''}")


_DIV_GRID = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
_TV_GRID = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5)
_RECIP_GRID = (1.25, 1.5, 2.0, 3.0, 5.0, 10.0)

GATE_LIST: tuple[Gate, ...] = (
    Gate("dppo_tv", "verl", f"{VERL} compute_policy_loss_dppo_tv; {PRIME} default_loss_fn", "prob_diff", "token",
         "dppo", "signed", 0.2, _TV_GRID, signed=True,
         doc="DPPO-Binary-TV: A > 0 masks p − q > δ_high, A ≤ 0 masks p − q < −δ_low (verl clip_ratio_low/high, "
             "default 0.2; its example script 0.15; prime-rl dppo_mask_low/high 0.2)"),
    Gate("dppo_kl", "verl", f"{VERL} compute_policy_loss_dppo_kl", "binary_kl_verl", "token", "dppo_kl", "signed",
         0.2, _DIV_GRID + (0.5,), signed=True,
         doc="DPPO-Binary-KL: A > 0 masks D > δ_high where p > q, A ≤ 0 masks D > δ_low where p < q (verl default "
             "clip_ratio 0.2; its example script 0.05)"),
    Gate("token_tv", "openrlhf", OPENRLHF, "tv_clamped", "token", "upper", "upper", 0.2, _TV_GRID,
         doc="OpenRLHF is_correction_level=token, gating=tv: masks |p − q| > δ"),
    Gate("seq_tv", "openrlhf", OPENRLHF, "tv_clamped", "sequence", "upper", "upper", 0.1, _TV_GRID,
         doc="OpenRLHF is_correction_level=seq, gating=tv: masks a sequence whose mean |p − q| > δ"),
    Gate("token_binary_kl", "openrlhf", OPENRLHF, "binary_kl", "token", "upper", "upper", 0.05, _DIV_GRID,
         doc="OpenRLHF is_correction_level=token, gating=binary_kl: masks D_B(q‖p) > δ"),
    Gate("seq_binary_kl", "openrlhf", OPENRLHF, "binary_kl", "sequence", "upper", "upper", 0.01, _DIV_GRID,
         doc="OpenRLHF is_correction_level=seq, gating=binary_kl (FlashREINFORCE): masks a sequence whose mean "
             "binary KL > δ"),
    Gate("openrlhf_token_ratio", "openrlhf", OPENRLHF, "log_ratio", "token", "band", "fixed_low", 5.0,
         _RECIP_GRID, default_lower=0.5,
         doc="OpenRLHF is_correction_level=token, gating=ratio, mode=mask (ICEPOP): keeps ρ in [low, high], "
             "default 0.5 5.0"),
    Gate("openrlhf_seq_ratio", "openrlhf", OPENRLHF, "log_ratio", "sequence", "band", "fixed_low", 5.0,
         _RECIP_GRID, reduce="geometric", default_lower=0.5,
         doc="OpenRLHF is_correction_level=seq, gating=ratio (seq-mask-tis): keeps sequences whose geometric-mean "
             "ratio is in [low, high]"),
    Gate("two_sided_kl", "prime-rl", "PrimeIntellect-ai/prime-rl#3283 (open PR) kpop_loss_fn", "binary_kl_two_sided",
         "token", "upper", "upper", 0.1, _DIV_GRID,
         doc="KPop: keeps a token when D_B(p‖q) ≤ φ and D_B(q‖p) ≤ φ (kpop_threshold, default 0.1)"),
    Gate("ipo", "prime-rl", f"{PRIME} ipo_loss_fn", "abs_prob_diff", "token", "upper", "upper", 0.1,
         (0.02, 0.05, 0.1, 0.2, 0.3),
         doc="prime-rl loss type ipo: masks |p − q| > ipo_threshold (default 0.1), whatever the advantage"),
    *(_roll(agg, kind) for kind in ("ratio", "diff") for agg in ("token", "geometric", "sequence", "segment")),
    Gate("skyrl_outlier", "skyrl", f"{SKYRL} compute_outlier_token_mask", "log_ratio", "sequence", "any_token",
         "fixed_low", 100.0, (2.0, 5.0, 10.0, 20.0, 50.0, 100.0), clamp=20.0, default_lower=1e-4, weight="one",
         doc="SkyRL outlier_token_is_threshold_low/high (suggested 1e-4 / 100): drops a sequence when any token's "
             "ρ is outside [low, high]"),
    Gate("skyrl_geo_mask", "skyrl", f"{SKYRL} compute_sequence_mask", "log_ratio", "sequence", "band", "sym", 0.01,
         (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1), reduce="geometric", clamp=20.0, weight="one",
         doc="SkyRL sequence_mask_metric=geometric, geo_mask_low/high 0.99 / 1.01"),
    Gate("skyrl_product_mask", "skyrl", f"{SKYRL} compute_sequence_mask", "log_ratio", "sequence", "band", "recip",
         2.0, _RECIP_GRID, reduce="product", clamp=20.0, weight="one",
         doc="SkyRL sequence_mask_metric=product, product_mask_low/high 0.5 / 2.0"),
    Gate("skyrl_token_mask", "skyrl", f"{SKYRL} compute_token_mask", "log_ratio", "token", "band", "recip", 2.0,
         _RECIP_GRID, clamp=20.0, weight="one",
         doc="SkyRL token_mask_is_threshold_low/high (no default: off); δ = C gives [1/C, C]"),
    Gate("nemo_seq_logprob_error", "nemo-rl", NEMO, "mult_prob_error", "sequence", "upper", "upper", 1.5,
         (1.01, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0), weight="one",
         doc="NeMo-RL grpo.seq_logprob_error_threshold (default None: off; 1.5 in its docs): masks a sequence whose "
             "mean exp(|ℓ|) exceeds it"),
)
GATES: dict[str, Gate] = {g.name: g for g in GATE_LIST}
"""Every gate family by name."""


def is_gate(mode: object) -> bool:
    """Whether `mode` names (or is) a gate family."""
    return isinstance(mode, Gate) or (isinstance(mode, str) and mode in GATES)


def get_gate(name: str | Gate) -> Gate:
    """The gate of that name (ConfigError listing close matches when unknown)."""
    if isinstance(name, Gate):
        return name
    if name in GATES:
        return GATES[name]
    raise ConfigError(f"unknown gate {name!r}{did_you_mean(str(name), GATES)}; choose one of {', '.join(GATES)}")


def gate_bounds(gate: Gate, threshold: float, lower: float | None) -> tuple[float, float]:
    """(lo, hi) of the gate's rule at δ = threshold (module docstring: `bounds`); -inf for no lower bound."""
    kind = gate.bounds
    if kind == "upper":
        if lower is not None:
            raise ConfigError(f"gate {gate.name} bounds its statistic from above only: drop lower={lower!r}")
        return -float("inf"), threshold
    if kind == "signed":
        return (threshold if lower is None else lower), threshold
    if kind == "fixed_low":
        low = gate.default_lower if lower is None else lower
        return (-float("inf") if low is None else low), threshold
    lo, hi = {"sym": (1.0 - threshold, 1.0 + threshold), "recip": (1.0 / threshold, threshold),
              "diff": (-threshold, threshold)}[kind]
    return (lo if lower is None else lower), hi


def check_delta(gate: Gate, threshold: float, lower: float | None) -> None:
    """ConfigError for a δ (and lower bound) the gate cannot take."""
    if not threshold > 0:
        raise ConfigError(f"gate {gate.name}: δ must be a positive number, got {threshold!r}")
    if gate.bounds == "recip" and threshold < 1:
        raise ConfigError(f"gate {gate.name}: δ = C is a ratio bound ≥ 1 (the band is [1/C, C]), got {threshold!r}")
    if gate.bounds == "sym" and threshold >= 1 and lower is None:
        raise ConfigError(f"gate {gate.name}: the band [1 − δ, 1 + δ] needs δ < 1, got {threshold!r}")
    lo, hi = gate_bounds(gate, threshold, lower)
    if gate.bounds != "signed" and lo > hi:
        raise ConfigError(f"gate {gate.name}: lower bound {lo!r} is above the upper bound {hi!r}")
    if gate.bounds == "signed" and lo < 0:
        raise ConfigError(f"gate {gate.name}: δ_low must be ≥ 0, got {lo!r}")
