"""The floor model's precisions: how much noise each side's compute dtype, the engine's weight quantization and its
KV-cache dtype add (σ per part, in quadrature), and the Floor a run's Precision explains
(rcdiag.analysis.metrics.floor measures the run's own noise scale against it)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rcdiag.store.context import dtype_name

DTYPE_SIGMA: dict[str, tuple[float, float]] = {
    "bfloat16": (0.045, 0.10),
    "float16": (0.0045, 0.0125),
    "float32": (1e-5, 1e-4),
}
"""(typical, largest plausible) noise scale σ one side adds when it computes in this dtype. bf16: measured here,
vLLM bf16 → transformers fp32: 0.034 (sample model, 4 layers), 0.052 (SmolLM2, 30 layers); the largest plausible,
2× the deeper one, is rcdiag's extrapolation to larger models and long contexts (published dense k3 levels — R3's
Qwen3-8B 6.4e-4 — match SmolLM2's 6.3e-4). fp16: 3 more mantissa bits (÷8). fp32 on both sides: kernel differences
only (the probe's vLLM fp32 → transformers fp32 on SmolLM2: mean |Δ| 8.6e-6). The two sides' noises are
independent, so a run's floor adds the sides' σ in quadrature (Precision.floor_sigma)."""
QUANT_SIGMA: dict[str, tuple[float, float]] = {
    "fp8": (0.30, 0.70),
    "int8": (0.12, 0.30),
    "int4": (0.80, 2.20),
}
"""(typical, largest plausible) noise scale an engine's weight quantization adds on top of its compute dtype.
Measured here (benchmarks/measure_quant_floor.py: SmolLM2-135M-Instruct, its linear weights fake-quantized with one
scale per output channel, bf16 compute, 2,304 tokens it sampled in float32, judged against float32): fp8 e4m3 σ̂
0.34, int8 0.13, 4-bit round-to-nearest (one scale per 128 inputs) 2.15, against bf16 alone 0.065 — so the added
parts ≈ 0.34, 0.11 and 2.1. The typical values are those, rounded down for larger models whose logits average more
weights; the largest plausible ≈ 2× (as bf16's), 4-bit's the round-to-nearest measurement itself (calibrated AWQ /
GPTQ grids do better). The FP8-RL and FlashRL reports train quantized rollouts with TIS on for this reason."""
KV_SIGMA: dict[str, tuple[float, float]] = {
    "fp8": (0.05, 0.15),
    "int8": (0.05, 0.15),
}
"""(typical, largest plausible) noise scale a quantized KV cache adds (rcdiag's estimate: one quantized read of K and
V per layer and position, growing with the context it holds; the position bands show where it sets in)."""
QUANT_ALIASES = (("fp8", "fp8"), ("e4m3", "fp8"), ("e5m2", "fp8"), ("mxfp8", "fp8"), ("int8", "int8"),
                 ("w8a8", "int8"), ("smoothquant", "int8"), ("awq", "int4"), ("gptq", "int4"), ("int4", "int4"),
                 ("w4a16", "int4"), ("nf4", "int4"), ("bitsandbytes", "int4"), ("marlin", "int4"))
"""A recorded quantization / KV-cache dtype (vLLM's `quantization` and `kv_cache_dtype` names) → its family in
QUANT_SIGMA / KV_SIGMA, by substring, first match wins; 'auto', 'none' and '' are no quantization."""
ASSUMED_DTYPE = "bfloat16"
"""The dtype a run is judged against when its manifest records none (the usual engine dtype in RL)."""


@dataclass(frozen=True)
class Floor:
    """The noise a precision explains: σ typical / largest plausible, and the mean |ℓ| they give at the run's token
    probabilities (mean_abs_typical / mean_abs_largest). `dtype` names the precision ('bfloat16', 'fp8 engine +
    float32 trainer' …); `recorded`: every part of it came from the manifest; `assumed` what was not (and what
    rcdiag assumed in its place); `coarsest` the coarsest compute dtype of the two sides."""

    dtype: str
    recorded: bool
    sigma_typical: float
    sigma_largest: float
    mean_abs_typical: float
    mean_abs_largest: float
    assumed: tuple[str, ...] = ()
    coarsest: str = ASSUMED_DTYPE

    def explains(self, sigma: float) -> bool:
        """Whether a noise scale σ̂ is within what this precision can give."""
        return math.isfinite(sigma) and sigma <= self.sigma_largest

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


DTYPE_ORDER = ("float32", "float16", "bfloat16")
"""Finer to coarser; the coarser side of a run sets its floor."""
def canonical_dtype(dtype: Any) -> str | None:
    """'bfloat16' | 'float16' | 'float32' for a recorded compute dtype (bf16, torch.float16 …:
    rcdiag.store.context.dtype_name); None when it is none of them ('auto', missing)."""
    return dtype_name(dtype)


def quant_family(name: Any) -> str | None:
    """The QUANT_SIGMA / KV_SIGMA family of a recorded quantization or KV-cache dtype (None: none recorded, 'auto',
    'none', or an unquantized dtype such as 'bfloat16'); an unknown scheme reads as int8-like."""
    text = str(name or "").strip().lower()
    if text in ("", "auto", "none", "null", "false") or canonical_dtype(text):
        return None
    return next((family for key, family in QUANT_ALIASES if key in text), "int8")


def coarser_dtype(*dtypes: Any) -> str | None:
    """The coarsest of the recorded dtypes (None when none is a known dtype: 'auto', missing)."""
    known = [d for d in (canonical_dtype(x) for x in dtypes) if d is not None]
    return max(known, key=DTYPE_ORDER.index) if known else None


@dataclass(frozen=True)
class Precision:
    """What each side computes in, as far as the run records it: the engine's compute dtype, its weight
    quantization and KV-cache dtype, the trainer's dtype (None: not recorded). The floor adds the sides' noise in
    quadrature; an unrecorded compute dtype is taken as ASSUMED_DTYPE, and said so (`assumed`)."""

    engine: str | None = None
    trainer: str | None = None
    quantization: str | None = None
    kv_cache: str | None = None

    @classmethod
    def of(cls, engine: Any = None, trainer: Any = None, quantization: Any = None, kv_cache: Any = None
           ) -> Precision:
        return cls(canonical_dtype(engine), canonical_dtype(trainer), quant_family(quantization),
                   quant_family(kv_cache))

    @classmethod
    def coarse(cls, dtype: Any) -> Precision:
        """The old one-dtype form: the coarser side's dtype on the engine, float32 on the trainer (None: nothing
        recorded, both assumed)."""
        known = canonical_dtype(dtype)
        return cls(known, "float32") if known else cls()

    def assumed(self) -> tuple[str, ...]:
        """What the floor assumes because the run does not record it."""
        return tuple(f"{side} dtype ({ASSUMED_DTYPE} assumed)"
                     for side, value in (("engine", self.engine), ("trainer", self.trainer)) if value is None)

    def floor_sigma(self) -> tuple[float, float]:
        """(typical, largest plausible) σ of the run: the sides' compute dtypes, the engine's quantization and KV
        cache, added in quadrature."""
        parts = [DTYPE_SIGMA[self.engine or ASSUMED_DTYPE], DTYPE_SIGMA[self.trainer or ASSUMED_DTYPE]]
        parts += [QUANT_SIGMA[self.quantization]] if self.quantization else []
        parts += [KV_SIGMA[self.kv_cache]] if self.kv_cache in KV_SIGMA else []
        return (math.sqrt(sum(t * t for t, _ in parts)), math.sqrt(sum(x * x for _, x in parts)))

    def coarsest(self) -> str:
        return max(self.engine or ASSUMED_DTYPE, self.trainer or ASSUMED_DTYPE, key=DTYPE_ORDER.index)

    def label(self) -> str:
        """The precision in a few words, as 'the X floor' reads it: the coarsest compute dtype ('bfloat16') when
        nothing is quantized, 'fp8-quantized' for an engine's quantized weights, 'bfloat16 + fp8 KV cache'."""
        if self.quantization:
            return f"{self.quantization}-quantized" + (f" + {self.kv_cache} KV cache" if self.kv_cache else "")
        return self.coarsest() + (f" + {self.kv_cache} KV cache" if self.kv_cache else "")

    def coarser_side(self) -> str:
        """Which side computes coarser: 'engine', 'trainer' or 'both'."""
        engine, trainer = self.engine or ASSUMED_DTYPE, self.trainer or ASSUMED_DTYPE
        if self.quantization or self.kv_cache:
            return "engine"
        if engine == trainer:
            return "both"
        return "engine" if DTYPE_ORDER.index(engine) > DTYPE_ORDER.index(trainer) else "trainer"
