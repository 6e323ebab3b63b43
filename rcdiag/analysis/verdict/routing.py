"""The verdict's routing cause: when a heavy mismatch is mostly where the two sides chose other experts, name
routing and give each framework's routing-replay setting (rcdiag.analysis.moe.routing measures the agreement)."""
from __future__ import annotations

import numpy as np

from rcdiag.analysis.moe.routing import REPLAY_SETTINGS, ROUTING_EXPLAINS, RoutingSummary
from rcdiag.analysis.verdict.causes import RECOMMENDATION, Cause
from rcdiag.analysis.verdict.health import HEALTHY

HEAVY_KINDS = ("heavy_tail", "above_floor", "bands")
"""Numerical causes that mean the mismatch is larger than the run's floor or a health band allows."""


def replay_action(summary: RoutingSummary) -> str:
    """What to do when routing explains the gap: replay the engine's routes, with every framework's setting."""
    settings = "; ".join(f"{name} `{setting}`" for name, setting, _ in REPLAY_SETTINGS)
    measure = ("" if summary.explains is not None and summary.explains.method == "replay" else
               " The share is observational (tokens whose routes agree may also be easier tokens): "
               "`rcdiag probe RUN --factors router_replay` measures it by forcing the engine's routes in the "
               "trainer.")
    return (f"Replay the engine's expert choices in the trainer (routing replay, R3) rather than only correcting with "
            f"IS weights: {settings}. TRL has no routing replay. The {RECOMMENDATION} says "
            f"whether an IS correction is needed for what is left meanwhile.{measure}")


def routing_cause(summary: RoutingSummary | None, numerical: Cause) -> Cause | None:
    """The verdict's routing cause: when the mismatch is heavy (the numerical cause is a heavy tail, above the
    floor or outside a band) and routing explains at least ROUTING_EXPLAINS of it (measured, or observed on at
    least MIN_GROUP tokens of each kind), routing is named, at the numerical cause's status (the verdict lists the
    numerical cause after it, as what the mismatch looks like). None otherwise."""
    if summary is None or not summary.agreement or not summary.judged:
        return None
    if numerical.kind not in HEAVY_KINDS or numerical.status == HEALTHY:
        return None
    share = summary.explains
    if share.share < ROUTING_EXPLAINS:
        return None
    how = ("measured: the trainer with the engine's routes forced (the probe's router_replay) leaves mean |ℓ| "
           f"{share.gap * (1 - share.share):.3g} of {share.gap:.3g}" if share.method == "replay" else
           f"mean |ℓ| {share.gap:.3g} over the routed tokens against {share.agreeing_gap:.3g} where every layer "
           "chose the same experts")
    grows = ", ".join(f"{r['layers_disagree']} → {r['mean_abs_log_ratio']:.3g}" for r in summary.by_disagreement
                      if r["scored"])
    low = int(np.nanargmin(summary.exact_by_layer))
    evidence = (how, f"mean |ℓ| by layers whose experts differ: {grows}",
                f"{summary.exact_rate:.1%} of (token, layer) choices agree (lowest: layer {low}, "
                f"{summary.exact_by_layer[low]:.1%})")
    return Cause("routing", numerical.status,
                 f"routing differences explain {share.share:.0%} of the gap ({summary.any_disagree_share:.0%} of "
                 "tokens see a different expert in some layer)", evidence, replay_action(summary),
                 "rcdiag's routing agreement (docs/metrics.md, 'Routing (mixture of experts)'); R3, arXiv 2510.11370; "
                 "the settings: "
                 + "; ".join(source for _, _, source in REPLAY_SETTINGS))
