"""Mixture-of-experts routing agreement between the engine and the trainer (pure numpy), and how much of the
log-prob gap it explains.

Routes are per token, per MoE layer, the top-k expert ids each side chose: `[T, L, k]` integer arrays (the layout
of slime/miles `rollout_routed_experts`, verl `routed_experts`, SGLang's and vLLM's returned routes). The order of
the k ids within a layer does not matter (a set). Per token and layer:

- `exact`: the two sides chose the same set of k experts;
- `overlap`: |engine ∩ trainer| / k ∈ [0, 1].

Per token, `any_disagree`: some layer's set differs (the R3 paper's "~94 % of tokens see a different expert in some
layer"); `layers_disagree`: how many. Router confidence, from one side's router logits `[T, L, E]`: the selected
experts' softmax mass (prime-rl's "selected-expert mass") and the margin between the k-th and (k+1)-th logit — a
small margin is where a rounding difference flips a choice.

`routing_explains(abs_ell, any_disagree)` answers "routing explains N % of the gap": the share of mean |ℓ| that
goes away if the tokens whose routes differ had the mean |ℓ| of the tokens whose routes agree (an observational
estimate; the probe's `router_replay` factor measures it by forcing the engine's routes). With `replay_gap` (mean
|ℓ| with routes forced) it is measured instead: 1 − replay_gap / gap. The verdict's routing cause is
rcdiag.analysis.verdict.routing.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rcdiag.analysis.passes.accum import BatchConsumer, ExactSum, Totals
from rcdiag.analysis.passes.rows import BatchRows
from rcdiag.errors import InputError
from rcdiag.store.routes import (
    PROB_COLUMN,
    ROUTE_COLUMN,
    SIDES,
    RoutingInfo,
    confidence_from_probs,
    routing_info,
)


def _routes(x: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 3 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name}: routes must be an integer array [tokens, layers, k], got {a.dtype} {a.shape}")
    return a


def layer_hits(engine: np.ndarray, trainer: np.ndarray) -> np.ndarray:
    """|engine ∩ trainer| per token and layer (`[T, L]` int64) of two `[T, L, k]` route arrays: both sides' k ids
    sorted together, the equal neighbours counted ([T, L, 2k] of memory, not [T, L, k, k]: a 48-layer top-8
    batch of 65k tokens stays ~50 MB). The k ids of one side's layer are a top-k set (distinct)."""
    e, t = _routes(engine, "engine"), _routes(trainer, "trainer")
    if e.shape != t.shape:
        raise ValueError(f"engine routes {e.shape} and trainer routes {t.shape} differ in shape")
    both = np.sort(np.concatenate([e, t], axis=2), axis=2)
    return (both[:, :, 1:] == both[:, :, :-1]).sum(axis=2, dtype=np.int64)


def layer_agreement(engine: np.ndarray, trainer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exact `[T, L]` bool, overlap `[T, L]` float64) of two `[T, L, k]` route arrays (see the module doc)."""
    hits = layer_hits(engine, trainer)
    k = np.asarray(engine).shape[2]
    return hits == k, hits / k


@dataclass(frozen=True)
class RoutingAgreement:
    """Agreement over a batch of tokens: rates per layer and over all (token, layer) pairs, and per token."""

    tokens: int
    layers: int
    top_k: int
    exact_rate: float
    """Share of (token, layer) pairs with the same expert set."""
    mean_overlap: float
    any_disagree_share: float
    """Share of tokens with at least one layer whose set differs."""
    exact_by_layer: list[float]
    overlap_by_layer: list[float]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def agreement(engine: np.ndarray, trainer: np.ndarray) -> tuple[RoutingAgreement, np.ndarray]:
    """(the summary, per-token number of disagreeing layers `[T]` int) of two `[T, L, k]` route arrays."""
    exact, overlap = layer_agreement(engine, trainer)
    tokens, layers = exact.shape
    disagree = (~exact).sum(axis=1)
    empty = tokens == 0
    summary = RoutingAgreement(
        tokens=int(tokens), layers=int(layers), top_k=int(np.asarray(engine).shape[2]),
        exact_rate=math.nan if empty else float(exact.mean()),
        mean_overlap=math.nan if empty else float(overlap.mean()),
        any_disagree_share=math.nan if empty else float((disagree > 0).mean()),
        exact_by_layer=[math.nan] * layers if empty else exact.mean(axis=0).tolist(),
        overlap_by_layer=[math.nan] * layers if empty else overlap.mean(axis=0).tolist())
    return summary, disagree


def confidence(router_logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(selected-expert softmax mass `[T, L]`, margin `[T, L]` = k-th − (k+1)-th largest logit) from router
    logits `[T, L, E]` (E > k)."""
    z = np.asarray(router_logits, dtype=np.float64)
    if z.ndim != 3 or not 0 < k < z.shape[2]:
        raise ValueError(f"router logits must be [tokens, layers, experts] with more than k={k} experts")
    top = -np.sort(-z, axis=2)
    p = np.exp(z - top[:, :, :1])
    mass = np.sort(p, axis=2)[:, :, ::-1][:, :, :k].sum(axis=2) / p.sum(axis=2)
    return mass, top[:, :, k - 1] - top[:, :, k]


@dataclass(frozen=True)
class RoutingShare:
    """"Routing explains N % of the gap", with its evidence (what the verdict quotes)."""

    share: float
    gap: float
    """Mean |ℓ| over all tokens."""
    agreeing_gap: float
    """Mean |ℓ| over tokens whose routes agree in every layer."""
    disagreeing_share: float
    method: str
    """'replay' (measured with the engine's routes forced) or 'observational' (agreeing tokens as the baseline)."""

    def sentence(self) -> str:
        how = ("measured by replaying the engine's routes in the trainer" if self.method == "replay" else
               "if tokens whose routes differ had the |ℓ| of tokens whose routes agree")
        return (f"routing explains {self.share:.0%} of the gap (mean |ℓ| {self.gap:.3g}; {how}; "
                f"{self.disagreeing_share:.0%} of tokens have a layer whose experts differ)")

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "sentence": self.sentence()}


def routing_explains(abs_ell: np.ndarray, layers_disagree: np.ndarray, replay_gap: float | None = None
                     ) -> RoutingShare:
    """See the module doc. NaN share when there is no token, or no agreeing token and no replay."""
    a = np.asarray(abs_ell, np.float64)
    agree = np.asarray(layers_disagree) == 0
    gap = float(a.mean()) if a.size else math.nan
    agreeing = float(a[agree].mean()) if agree.any() else math.nan
    disagreeing = float((~agree).mean()) if a.size else math.nan
    if replay_gap is not None and gap > 0:
        return RoutingShare(1 - replay_gap / gap, gap, agreeing, disagreeing, "replay")
    if not a.size or not agree.any() or not gap > 0:
        return RoutingShare(math.nan, gap, agreeing, disagreeing, "observational")
    counterfactual = float(np.where(agree, a, agreeing).mean())
    return RoutingShare(1 - counterfactual / gap, gap, agreeing, disagreeing, "observational")


# --------------------------------------------------------------------------------------------- over a run
MARGIN_EDGES = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, math.inf)
"""Bins (nats) of a token's smallest k/(k+1) router margin over its layers: fixed edges, so a streamed run bins
the same way whatever its size (quantile bins would need every margin at once). Below ~0.1 nats a bf16 rounding of
the router logits (relative 2⁻⁸, ~0.01–0.05 nats on logits of size 1–10) can flip the choice."""
NEAR_TIE = 0.1
"""A (token, layer) whose k/(k+1) margin is below this many nats is a near tie (counted per layer)."""
ROUTING_EXPLAINS = 0.5
"""The verdict names routing as the cause of a heavy mismatch when routing explains at least this share of it."""
MARGIN_CAP = 20.0
"""Margins are averaged capped at this many nats (an unchosen expert of probability 0 has an infinite margin; no
margin above a few nats is ever flipped by rounding)."""
MIN_GROUP = 50
"""The observational estimate needs at least this many tokens whose routes agree and as many whose routes differ
(fewer: the share is not judged; the section still shows it)."""


def disagreement_bins(layers: int) -> list[tuple[int, int]]:
    """(low, high) ranges of 'layers whose expert set differs': 0, 1, then doubling (2–3, 4–7, …) up to L, so a
    48-layer model reads in 7 rows and a 4-layer one as 0, 1, 2–3, 4."""
    bins, low = [(0, 0), (1, 1)], 2
    while low <= layers:
        bins.append((low, min(2 * low - 1, layers)))
        low *= 2
    return [b for b in bins if b[0] <= layers]


def _label(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}–{high}"


def _take(present: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The rows of `values` (one per present row of the batch, in order) of the batch rows `wanted` (⊆ present):
    no copy into a batch-sized array when every row is present, the common case."""
    if present.all():
        return values if wanted.all() else values[wanted]
    return values[(np.cumsum(present) - 1)[wanted]]


class RoutingAccumulator(BatchConsumer):
    """One pass's routing statistics over the valid token rows that carry routes (a BatchConsumer: it reads the
    route list columns of each record batch; O(L) state). Per layer: tokens whose expert sets are equal and the
    summed |∩|; per token: the number of disagreeing layers, binned with |ℓ|; per side with router probabilities:
    the selected mass and k/(k+1) margin per layer; |ℓ| and disagreement by the smallest margin of `margin_side`.
    Sums of |ℓ| are exact (accum.ExactSum), so the share routing explains does not depend on how the run is
    split."""

    def __init__(self, info: RoutingInfo, sides: tuple[str, ...], prob_sides: tuple[str, ...] = (),
                 margin_side: str | None = None) -> None:
        self.info, self.sides, self.prob_sides = info, tuple(sides), tuple(prob_sides)
        self.margin_side = margin_side
        self.columns = ("seq_id", "pos", "rollout_logprob", "train_logprob", "mask",
                        *(ROUTE_COLUMN[s] for s in self.sides), *(PROB_COLUMN[s] for s in self.prob_sides))
        L = info.layers
        self.valid = self.routed = self.scored = 0
        self.exact = np.zeros(L, np.int64)
        self.hits = np.zeros(L, np.int64)
        self.layers_off = np.zeros(L + 1, np.int64)
        """Routed tokens by number of disagreeing layers (0 … L)."""
        self.scored_off = np.zeros(L + 1, np.int64)
        self.abs_off = [ExactSum() for _ in range(L + 1)]
        self.mass = {s: np.zeros(L) for s in self.prob_sides}
        """Σ selected mass per layer (float64 sums: averages of values in [0, 1] and [0, MARGIN_CAP], within
        1e-13 however the run is split; |ℓ|, which the verdict's share reads, is summed exactly)."""
        self.margin = {s: np.zeros(L) for s in self.prob_sides}
        self.near = {s: np.zeros(L, np.int64) for s in self.prob_sides}
        self.confident = {s: 0 for s in self.prob_sides}
        bins = len(MARGIN_EDGES) - 1
        self.by_margin = np.zeros(bins, np.int64)
        self.by_margin_off = np.zeros(bins, np.int64)
        self.by_margin_scored = np.zeros(bins, np.int64)
        self.by_margin_abs = [ExactSum() for _ in range(bins)]

    def fresh(self) -> RoutingAccumulator:
        return RoutingAccumulator(self.info, self.sides, self.prob_sides, self.margin_side)

    def merge(self, other: RoutingAccumulator) -> RoutingAccumulator:
        for name in ("valid", "routed", "scored"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("exact", "hits", "layers_off", "scored_off", "by_margin", "by_margin_off", "by_margin_scored"):
            getattr(self, name)[...] += getattr(other, name)
        for mine, theirs in zip([*self.abs_off, *self.by_margin_abs], [*other.abs_off, *other.by_margin_abs],
                                strict=True):
            mine.merge(theirs)
        for s in self.prob_sides:
            self.mass[s] += other.mass[s]
            self.margin[s] += other.margin[s]
            self.near[s] += other.near[s]
            self.confident[s] += other.confident[s]
        return self

    def _column(self, rows: BatchRows, name: str, width: int, file: str, row0: int) -> tuple[np.ndarray, np.ndarray]:
        """(present `[n]` bool, values `[present, width]`) of one list column, its lengths checked."""
        column = rows.batch.column(name)
        present = ~np.asarray(column.is_null(), dtype=bool)
        lengths = np.asarray(pc.fill_null(pc.list_value_length(column), width), dtype=np.int64)
        bad = np.flatnonzero(lengths != width)
        if bad.size:
            i = int(bad[0])
            raise InputError(f"{lengths[i]} values where {width} were expected ({self.info.layers} layers × "
                             f"{width // self.info.layers} per layer): the route count must equal the token count",
                             file=file, row=row0 + i + 1, field=name)
        values = np.asarray(pc.list_flatten(column))
        return present, values.reshape(-1, width)

    def update_batch(self, rows: BatchRows, file: str, row0: int) -> None:
        L, k = self.info.layers, self.info.top_k
        valid = rows.mask
        self.valid += int(valid.sum())
        columns = {side: self._column(rows, ROUTE_COLUMN[side], L * k, file, row0) for side in self.sides}
        keep = valid.copy()
        for present, _ in columns.values():
            keep &= present
        routes = {side: _take(present, ids, keep).reshape(-1, L, k) for side, (present, ids) in columns.items()}
        probs = {}
        for side in self.prob_sides:
            present, p = self._column(rows, PROB_COLUMN[side], L * (k + 1), file, row0)
            probs[side] = (present[keep], _take(present, p, keep & present).reshape(-1, L, k + 1))
        idx = np.flatnonzero(keep)
        self.routed += idx.size
        if not idx.size:
            return
        ell = np.abs(rows.a[idx] - rows.b[idx])
        finite = np.isfinite(ell)
        self.scored += int(finite.sum())
        if len(self.sides) == 2:
            hits = layer_hits(routes["engine"], routes["trainer"])
            exact = hits == k
            self.exact += exact.sum(axis=0)
            self.hits += hits.sum(axis=0)
            off = (~exact).sum(axis=1)
        else:
            off = None
        if off is not None:
            self.layers_off += np.bincount(off, minlength=L + 1)
            self.scored_off += np.bincount(off[finite], minlength=L + 1)
            for d in np.unique(off[finite]):
                self.abs_off[d].add(ell[finite & (off == d)])
        margins = None
        for side in self.prob_sides:
            ok, p = probs[side]
            if not ok.any():
                continue
            mass, margin = confidence_from_probs(p, k)
            self.confident[side] += int(ok.sum())
            self.mass[side] += mass.sum(axis=0)
            self.margin[side] += np.minimum(margin, MARGIN_CAP).sum(axis=0)
            self.near[side] += (margin < NEAR_TIE).sum(axis=0)
            if side == self.margin_side:
                margins = np.full(idx.size, np.nan)
                margins[ok] = margin.min(axis=1)
        if margins is not None:
            known = np.isfinite(margins) | (margins == np.inf)
            which = np.clip(np.searchsorted(MARGIN_EDGES, margins, side="right") - 1, 0, len(MARGIN_EDGES) - 2)
            self.by_margin += np.bincount(which[known], minlength=self.by_margin.size)
            if off is not None:
                self.by_margin_off += np.bincount(which[known & (off > 0)], minlength=self.by_margin.size)
            sel = known & finite
            self.by_margin_scored += np.bincount(which[sel], minlength=self.by_margin.size)
            for b in np.unique(which[sel]):
                self.by_margin_abs[b].add(ell[sel & (which == b)])

    def finish(self, totals: Totals) -> RoutingSummary:
        return RoutingSummary.from_state(self)


@dataclass(frozen=True)
class RoutingSummary:
    """A run's routing numbers (see docs/metrics.md, 'Routing (mixture of experts)'): per-layer agreement, |ℓ| by
    the number of disagreeing layers and by router margin, router confidence per side, and how much of the gap
    routing explains. Rates are NaN where nothing was counted; `agreement` is False when only one side has
    routes."""

    layers: int
    top_k: int
    experts: int | None
    engine: str | None
    trainer: str | None
    sides: tuple[str, ...]
    valid_tokens: int
    """Valid (mask True) token rows of the run."""
    tokens: int
    """Valid tokens with routes on every side read."""
    scored: int
    """Of those, the ones with both log-probs (finite |ℓ|)."""
    exact_by_layer: list[float]
    overlap_by_layer: list[float]
    exact_rate: float
    mean_overlap: float
    any_disagree_share: float
    mean_layers_disagree: float
    by_disagreement: list[dict[str, Any]]
    confidence: dict[str, dict[str, Any]]
    margin_side: str | None
    by_margin: list[dict[str, Any]]
    explains: RoutingShare | None

    @property
    def agreement(self) -> bool:
        return len(self.sides) == 2

    @staticmethod
    def from_state(acc: RoutingAccumulator) -> RoutingSummary:
        L, k, n = acc.info.layers, acc.info.top_k, acc.routed
        both = len(acc.sides) == 2 and n > 0
        nan = [math.nan] * L
        exact = (acc.exact / n).tolist() if both else nan
        overlap = (acc.hits / (n * k)).tolist() if both else nan
        by_disagreement, explains = [], None
        if len(acc.sides) == 2:
            scored = max(int(acc.scored_off.sum()), 1)
            for low, high in disagreement_bins(L):
                tokens = int(acc.layers_off[low:high + 1].sum())
                count = int(acc.scored_off[low:high + 1].sum())
                total = math.fsum(acc.abs_off[d].value() for d in range(low, high + 1))
                by_disagreement.append({"layers_disagree": _label(low, high), "low": low, "high": high,
                                        "tokens": tokens, "share": tokens / n if n else math.nan,
                                        "scored": count, "score_share": count / scored,
                                        "mean_abs_log_ratio": total / count if count else math.nan})
            explains = _explains(acc)
        confidence = {}
        for side in acc.prob_sides:
            m = acc.confident[side]
            mass = (acc.mass[side] / m).tolist() if m else nan
            margin = (acc.margin[side] / m).tolist() if m else nan
            near = (acc.near[side] / m).tolist() if m else nan
            confidence[side] = {"tokens": m, "selected_mass": float(np.mean(mass)) if m else math.nan,
                                "selected_mass_by_layer": mass, "margin_mean": float(np.mean(margin)) if m else
                                math.nan, "margin_by_layer": margin,
                                "near_tie_share": float(np.mean(near)) if m else math.nan, "near_tie_by_layer": near}
        by_margin = []
        if acc.margin_side is not None and acc.by_margin.sum():
            for b in range(acc.by_margin.size):
                tokens, scored = int(acc.by_margin[b]), int(acc.by_margin_scored[b])
                by_margin.append({"margin_low": MARGIN_EDGES[b], "margin_high": MARGIN_EDGES[b + 1], "tokens": tokens,
                                  "disagree_share": int(acc.by_margin_off[b]) / tokens if tokens and both else
                                  math.nan,
                                  "mean_abs_log_ratio": acc.by_margin_abs[b].value() / scored if scored else math.nan})
        layers_off = np.arange(L + 1)
        return RoutingSummary(
            layers=L, top_k=k, experts=acc.info.experts, engine=acc.info.engine, trainer=acc.info.trainer,
            sides=acc.sides, valid_tokens=acc.valid, tokens=n, scored=acc.scored, exact_by_layer=exact,
            overlap_by_layer=overlap, exact_rate=float(acc.exact.sum() / (n * L)) if both else math.nan,
            mean_overlap=float(acc.hits.sum() / (n * L * k)) if both else math.nan,
            any_disagree_share=float(acc.layers_off[1:].sum() / n) if both else math.nan,
            mean_layers_disagree=float((acc.layers_off * layers_off).sum() / n) if both else math.nan,
            by_disagreement=by_disagreement, confidence=confidence, margin_side=acc.margin_side,
            by_margin=by_margin, explains=explains)

    def with_replay(self, gap: float, replay_gap: float) -> RoutingSummary:
        """This summary with the share measured by a replay (the probe's `router_replay`: mean |ℓ| `gap` without
        and `replay_gap` with the engine's routes forced, on the probe's sample) instead of estimated."""
        if self.explains is None or not (gap > 0 and math.isfinite(replay_gap)):
            return self
        share = RoutingShare(1 - replay_gap / gap, gap, self.explains.agreeing_gap, self.explains.disagreeing_share,
                             "replay")
        return replace(self, explains=share)

    @property
    def judged(self) -> bool:
        """Whether the share may name a cause: measured by replay, or observed on enough tokens of each kind."""
        if self.explains is None or not math.isfinite(self.explains.share):
            return False
        if self.explains.method == "replay":
            return True
        agree = self.by_disagreement[0]["scored"] if self.by_disagreement else 0
        return agree >= MIN_GROUP and self.scored - agree >= MIN_GROUP

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["explains"] = None if self.explains is None else self.explains.to_dict()
        out["sides"] = list(self.sides)
        out["agreement"] = self.agreement
        out["judged"] = self.judged
        return out


def _explains(acc: RoutingAccumulator) -> RoutingShare:
    """routing_explains from the accumulated bins (the same formula: 1 − agreeing mean |ℓ| / mean |ℓ|)."""
    count = int(acc.scored_off.sum())
    total = math.fsum(s.value() for s in acc.abs_off)
    agree_n = int(acc.scored_off[0])
    gap = total / count if count else math.nan
    agreeing = acc.abs_off[0].value() / agree_n if agree_n else math.nan
    disagreeing = (count - agree_n) / count if count else math.nan
    if not (count and agree_n and gap > 0):
        return RoutingShare(math.nan, gap, agreeing, disagreeing, "observational")
    return RoutingShare(1 - agreeing / gap, gap, agreeing, disagreeing, "observational")


def run_sides(run: Any, info: RoutingInfo) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(sides with route columns in every token file, sides with probability columns in every token file) — read
    from the Parquet footers only."""
    names = [set(pq.read_schema(f).names) for f in run.token_files]
    sides = tuple(s for s in SIDES if names and all(ROUTE_COLUMN[s] in n for n in names))
    probs = tuple(s for s in sides if all(PROB_COLUMN[s] in n for n in names))
    return sides, probs


def routing_summary(run: Any, *, map_files: Any = None) -> RoutingSummary | None:
    """The routing summary of a Run (one pass over its route columns, file by file, merged in file order); None
    for a run without a `routing` section or without any route column (a dense run: nothing is read)."""
    from rcdiag.analysis.passes.engine import Fresh, run_pass

    info = routing_info(run.info)
    if info is None or not run.token_files:
        return None
    sides, probs = run_sides(run, info)
    if not sides:
        return None
    margin_side = "trainer" if "trainer" in probs else (probs[0] if probs else None)
    acc = RoutingAccumulator(info, sides, probs, margin_side)
    merged = run_pass(run, Fresh((acc,)), map_files=map_files, desc="routes", strict=False)
    if not merged.consumers:
        return acc.finish(merged.totals)
    return merged.consumers[0].finish(merged.totals)


# ----------------------------------------------------------------------------------- what addresses routing
REPLAY_SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("verl", "actor_rollout_ref.actor.megatron.router_replay.mode=R3 "
             "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
     "verl examples/router_replay/README.md (Megatron engine; VeOmni: actor_rollout_ref.actor.veomni.router_replay."
     "mode)"),
    ("ms-swift", "--router_replay_mode R3",
     "ms-swift docs/source_en/Instruction/GRPO/AdvancedResearch/router_replay.md (Megatron backend, megatron-core "
     "≥ 0.16, vLLM ≥ 0.14)"),
    ("slime / miles", "--use-rollout-routing-replay",
     "slime docs, customization: MoE routing replay (the slime router path; whether your version also needs "
     "--use-slime-router is not verified)"),
    ("NeMo-RL", "policy.router_replay.enabled=true",
     "NeMo-RL nemo_rl/models/megatron/router_replay.py (Megatron policy, vLLM generation)"),
    ("prime-rl", "[trainer] enable_router_replay = true",
     "prime-rl docs/inference.md, Router Replay (it sets inference.vllm.enable_return_routed_experts)"),
)
"""Each framework's routing replay (R3) setting, with where it was read; TRL has none."""
