"""The probe's MoE factors (`router_replay`, `router_precision`): which of them a run can measure, the engine routes
the replay forces, and how far each setting's routes are from the reference trainer's.

`router_replay` forces, at every input position of a sampled sequence (prompt + response[:-1]), the run's engine
routes — `engine_prompt_routes` for the prompt positions, `engine_routes` for the response tokens' — in the float32
trainer (R3: rcdiag.score.routes.RouteHooks); the probe's residual gap for it is mean |rollout − replayed trainer|,
the gap routing replay would leave. On CPU the engine routes are prefill routes (the manifest's routing.engine), so
the replay forces what the engine's routers choose re-reading the text, not what they chose while decoding.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rcdiag.probe.factors import PREFILL_NOTE, Setting, TrainSetting
from rcdiag.score.routes import PREFILL, MoeShape
from rcdiag.store.routes import PROMPT_ROUTES, ROUTE_COLUMN, RoutingInfo, as_3d, routing_info
from rcdiag.store.run import Run

Pair = tuple[np.ndarray, np.ndarray]


@dataclass
class ProbeRouting:
    """An MoE probe's routing inputs: the model's shape, the engine routes to force per sampled pair (None when the
    run has none), and the notes on what was skipped."""

    shape: MoeShape
    forced: list[np.ndarray] | None = None
    engine: np.ndarray | None = None
    """The engine's token routes of the sample `[N, L, k]` (token-row order), for agreement."""
    notes: list[str] = field(default_factory=list)


def select_routed(settings: list[Setting], shape: MoeShape | None, run: Run, model: str
                  ) -> tuple[list[Setting], list[str]]:
    """The settings the run can measure, and a note per skipped routed setting: every routed setting on a dense
    model, `router_replay` on a run without engine routes."""
    routed = [s for s in settings if isinstance(s, TrainSetting) and s.routed]
    if not routed:
        return settings, []
    if shape is None:
        names = ", ".join(s.name for s in routed)
        return [s for s in settings if s not in routed], [
            f"{names} skipped: {model} is a dense model (its config declares no experts), so there are no routes "
            "to replay or recompute"]
    replay = [s for s in routed if s.routes == "engine"]
    if not replay:
        return settings, []
    info = routing_info(run.info)
    if info is None or info.engine is None:
        return [s for s in settings if s not in replay], [
            "router_replay skipped: the run has no engine routes (score it with `rcdiag score`, which records "
            "them for MoE models, or import a dump with routes)"]
    other = _other_shape(info, shape)
    if other:
        return [s for s in settings if s not in replay], [
            f"router_replay skipped: the run's engine routes are {other}, so they are another model's routes and "
            f"cannot be forced in {model} (probe with the model the run was scored or trained with)"]
    return settings, []


def _other_shape(info: RoutingInfo, shape: MoeShape) -> str:
    """How the run's recorded routes differ from what `shape` (the probed model's config) can take; '' when they
    fit. Forcing top-8 routes into a top-2 router, or expert 100 into a 64-expert layer, would index outside the
    router's weights: a replay measures nothing then."""
    if info.top_k != shape.top_k:
        return f"top-{info.top_k} and the model routes top-{shape.top_k}"
    if info.experts is not None and info.experts != shape.experts:
        return f"over {info.experts} experts and the model has {shape.experts}"
    return ""


def load_routing(run: Run, frame: pd.DataFrame, pairs: Sequence[Pair], shape: MoeShape, replay: bool
                 ) -> ProbeRouting:
    """The engine routes of the sampled sequences (token rows in `frame` order) and, for `replay`, the routes to
    force per pair (prompt routes, then token routes); a note instead when some are missing."""
    routing = ProbeRouting(shape)
    info = routing_info(run.info)
    if info is None or info.engine is None:
        return routing
    seq_ids = np.unique(frame["seq_id"].to_numpy())
    tokens = run.token_table(["seq_id", "pos", ROUTE_COLUMN["engine"]], seq_ids=seq_ids)
    column = tokens.column(ROUTE_COLUMN["engine"])
    if column.null_count:
        routing.notes.append(f"{column.null_count:,} sampled token(s) have no engine routes: router_replay and the "
                             "engine-vs-trainer agreement are not measured")
        return routing
    routing.engine = as_3d(column, len(column), info.layers, info.top_k, np.int16)
    if not replay:
        return routing
    prompts = run.sequence_table(["seq_id", PROMPT_ROUTES], seq_ids=seq_ids)
    by_seq = dict(zip(prompts.column("seq_id").to_pylist(), prompts.column(PROMPT_ROUTES).to_pylist(),
                      strict=True))
    forced, start = [], 0
    for seq, (_, response) in zip(seq_ids, pairs, strict=True):
        head = by_seq.get(int(seq))
        if head is None:
            routing.notes.append(f"seq {int(seq)} has no engine_prompt_routes: router_replay is not measured")
            return routing
        head = np.asarray(head, dtype=np.int16).reshape(-1, info.layers, info.top_k)  # [P − 1, L, k]
        forced.append(np.concatenate([head,
                                      routing.engine[start:start + len(response)]]))
        start += len(response)
    routing.forced = forced
    if info.engine == PREFILL:
        routing.notes.append(PREFILL_NOTE)
    return routing


def agreement_record(routes: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """Top-k agreement of `[N, L, k]` routes with the reference trainer's (rcdiag.analysis.moe.routing.agreement)."""
    from rcdiag.analysis.moe.routing import agreement

    summary, _ = agreement(routes, reference)
    return {"exact_rate": summary.exact_rate, "mean_overlap": summary.mean_overlap,
            "any_disagree_share": summary.any_disagree_share, "tokens": summary.tokens}


def routing_record(routing: ProbeRouting, routes: dict[str, np.ndarray], run: Run) -> dict[str, Any]:
    """The summary's `routing` section: the shape, what the engine routes are, and each setting's (and the
    engine's) top-k agreement with the reference trainer's routes on the sample."""
    info = routing_info(run.info)
    reference = routes.get("reference")
    agreement = {}
    if reference is not None:
        if routing.engine is not None and routing.engine.shape == reference.shape:
            agreement["engine"] = agreement_record(routing.engine, reference)
        for name, found in routes.items():
            if name != "reference" and found.shape == reference.shape:
                agreement[name] = agreement_record(found, reference)
    return {"layers": int(reference.shape[1]) if reference is not None else None, "top_k": routing.shape.top_k,
            "experts": routing.shape.experts, "engine_routes": None if info is None else info.engine,
            "agreement_with_reference": agreement}
