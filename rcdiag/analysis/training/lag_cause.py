"""lag_cause: the verdict's cause from policy lag — staleness over the engine floor, or weights that never changed.

For the report's verdict (rcdiag.report.recommend / analysis.verdict.causes call it): a record {cause, evidence, action,
severity} naming what the lag split and the weights-unchanged check found, or None when neither says anything
(no versions and no repeated contexts, or a healthy split).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rcdiag.analysis.training.lag import LagSplit, lag_split
from rcdiag.analysis.training.unchanged import Unchanged, weights_unchanged

STALE_TIMES = 2.0
"""A lag ≥ 1 bucket whose mean |ℓ| is at least this many times the lag-0 floor is staleness, not engine noise."""
MIN_STALE_TOKENS = 100
"""Fewest lag ≥ 1 tokens before staleness is called."""
STALENESS_ACTION = ("bound the policy lag or correct against the generating policy: verl fully-async "
                    "async_training.staleness_threshold / trigger_parameter_sync_step, TRL AsyncGRPO "
                    "max_staleness, prime-rl orchestrator.max_off_policy_steps, AReaL max_head_offpolicyness; "
                    "or decoupled PPO / IS with the behaviour policy's log-probs (AReaL π_behave)")
NO_FLOOR_ACTION = ("keep the correction against the behaviour policy: the rollout's own log-probs are what the "
                   "samples were drawn from, so IS on them (decoupled PPO, TIS on π_old = the engine's) handles the "
                   "lag — it is the design of a one-step-off or async trainer, not an engine bug, and hunting "
                   "kernels with `rcdiag probe` would measure the wrong thing; bound the lag where it grows ("
                   "verl async_training.staleness_threshold, TRL AsyncGRPO max_staleness, prime-rl "
                   "orchestrator.max_off_policy_steps)")
UNCHANGED_ACTION = ("check the weight sync: that it runs every step (vLLM sleep mode, trl#5312), that the "
                    "prefix cache is reset after a refit (NeMo-RL#4018), and — an fp32 trainer with a bf16 engine — "
                    "that the updates are above bf16's resolution (lr × |grad| ≥ 2⁻⁸ of the weight)")


REFERENCE_WORDS = {"trainer_version": "lags from the recorded trainer versions",
                   "step_newest": "lags from each step's newest sample: the trainer's version is not recorded"}


@dataclass(frozen=True)
class LagCause:
    """What the verdict says about lag: cause (one line), evidence (numbers), action (what to change),
    severity (warning | alarm)."""

    cause: str
    evidence: str
    action: str
    severity: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _open(data: Any) -> Any:
    """A Run from a Run, a run path, or anything with .path (a RunReport)."""
    from rcdiag.store.run import Run, open_run

    if isinstance(data, Run):
        return data
    if isinstance(data, str | os.PathLike):
        return open_run(data)
    return open_run(Path(data.path))


def staleness_cause(split: LagSplit) -> LagCause | None:
    """Staleness when the lag ≥ 1 tokens are many and well above the lag-0 floor — or when there is no lag-0 token
    at all (a one-step-off or fully async trainer: every sample at lag ≥ 1), where the engine's own floor cannot be
    told apart from staleness, which the cause then says."""
    stale_rows = split.buckets[(split.buckets["lag"] > 0) & (split.buckets["tokens"] > 0)]
    if split.floor is None:
        tokens = int(stale_rows["tokens"].sum())
        if tokens < MIN_STALE_TOKENS:
            return None
        lags = sorted(int(x) for x in stale_rows["lag"])
        mean_abs = float(sum(stale_rows["mean_abs_log_ratio"] * stale_rows["tokens"]) / tokens)
        which = f"lag {lags[0]}" if len(lags) == 1 else f"lags {lags[0]}–{lags[-1]}"
        return LagCause(
            cause=(f"staleness: every sample is {lags[0]} step{'s' if lags[0] > 1 else ''} or more behind the trainer"
                   if len(lags) > 1 else f"staleness: every sample is {lags[0]} step{'s' if lags[0] > 1 else ''} "
                   "behind the trainer (no on-policy sample)"),
            evidence=(f"{tokens:,} tokens, all at {which} (mean |ℓ| {mean_abs:.3g}; {REFERENCE_WORDS[split.reference]}"
                      "); without lag-0 samples the engine's own floor cannot be separated from the staleness — "
                      "`rcdiag score --rescore-only RUN --checkpoint V=PATH` with the weights that sampled splits them "
                      "exactly"),
            action=NO_FLOOR_ACTION, severity="warning")
    if split.staleness.empty:
        return None
    stale = split.staleness[split.staleness["tokens"] > 0]
    tokens = int(stale["tokens"].sum())
    if tokens < MIN_STALE_TOKENS or not (stale["times"] >= STALE_TIMES).any():
        return None
    worst = stale.loc[stale["times"].idxmax()]
    floor = split.floor["mean_abs_log_ratio"]
    return LagCause(
        cause="staleness: samples from older policy versions carry most of the gap",
        evidence=(f"lag {int(worst['lag'])} tokens have mean |ℓ| {floor + worst['excess_mean_abs']:.3g} vs the lag-0 "
                  f"floor {floor:.3g} ({worst['times']:.3g}×); {tokens:,} tokens at lag ≥ 1; staleness is "
                  f"{split.staleness_share:.0%} of the versioned tokens' mean |ℓ| ({REFERENCE_WORDS[split.reference]})"),
        action=STALENESS_ACTION, severity="alarm" if split.staleness_share >= 0.5 else "warning")


def cause_of(split: LagSplit | None, unchanged: list[Unchanged]) -> LagCause | None:
    """The cause from a computed split and weights-unchanged check: weights unchanged first (a broken sync
    explains everything else), then staleness; None when neither fires."""
    for side in unchanged:
        if side.fires:
            return LagCause(cause=f"weights not updated on the {side.side} side", evidence=side.message(),
                            action=UNCHANGED_ACTION, severity="alarm")
    return None if split is None else staleness_cause(split)


def lag_cause(data: Any) -> dict[str, str] | None:
    """The lag cause of a run (a Run, a path, or a RunReport) as {cause, evidence, action, severity}, or None
    (see cause_of)."""
    run = _open(data)
    found = cause_of(lag_split(run), weights_unchanged(run))
    return None if found is None else found.to_dict()
