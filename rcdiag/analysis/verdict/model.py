"""The verdict's vocabulary: a Cause (one claim about a run) and the Context the verdict knows beyond the numbers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rcdiag.analysis.distributions.shape import Concentration
from rcdiag.analysis.metrics.floor import NoiseSummary
from rcdiag.analysis.metrics.position_noise import PositionProfile
from rcdiag.analysis.metrics.precision import Floor, Precision
from rcdiag.analysis.training.drift import Timeline


@dataclass(frozen=True)
class Cause:
    """One claim about the run: `title` what is wrong (a line), `evidence` the numbers behind it, `action` what to
    do, `source` where the rule comes from; `correct` whether an IS correction may be advised (False where it
    would hide a bug); `step` the step it names, if any."""

    kind: str
    status: str
    title: str
    evidence: tuple[str, ...] = ()
    action: str = ""
    source: str = ""
    correct: bool = True
    step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "status": self.status, "title": self.title, "evidence": list(self.evidence),
                "action": self.action, "source": self.source, "correct": self.correct, "step": self.step}


@dataclass(frozen=True)
class Context:
    """What the verdict knows beyond the numbers. `dtype`: the run's Precision (each side's compute dtype, the
    engine's quantization and KV-cache dtype, as recorded) or, in the one-dtype form, the coarser side's dtype (None:
    nothing recorded — bfloat16 assumed, and said). `architecture` 'dense', 'moe' or None (not recorded: the
    dense-model limits are not applied); `replay` whether the rollout side is a prefill replay of given text;
    `timeline` the across-training one; `extra` causes other analyses contribute (ranked with the step change);
    `positions` the noise by response position and `concentration` how Σ|ℓ| spreads over sequences (the shape of
    the mismatch: rcdiag.analysis.verdict.shapes); `unknown` what else the run does not record (sampling settings,
    the trainer's correction), named in the verdict."""

    dtype: Precision | str | None = None
    architecture: str | None = None
    replay: bool = False
    timeline: Timeline | None = None
    extra: tuple[Cause, ...] = ()
    noise: NoiseSummary | None = field(default=None)
    refused: str | None = None
    """Why the metrics refused the data (InputError text), if they did: the verdict is then n/a."""
    probe: str | None = None
    """The latest `rcdiag probe`'s answer (its top line), which the numerical causes cite as evidence."""
    positions: PositionProfile | None = None
    concentration: Concentration | None = None
    unknown: tuple[str, ...] = ()

    def floor(self) -> Floor | None:
        """The floor the run's precision explains at its token probabilities (None without the noise evidence)."""
        return None if self.noise is None else self.noise.floor(self.dtype)

    def not_recorded(self, floor: Floor | None) -> str:
        """What the run does not record and the verdict assumed or left out in its place, in one line ('' when
        nothing): 'engine dtype (bfloat16 assumed), architecture (the dense-model limits not applied), …'."""
        parts = list(floor.assumed if floor is not None else ())
        if self.architecture is None:
            parts.append("architecture (the dense-model limits not applied)")
        parts += list(self.unknown)
        return ", ".join(parts)
