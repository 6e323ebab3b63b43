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
|ℓ| with routes forced) it is measured instead: 1 − replay_gap / gap.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


def _routes(x: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 3 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name}: routes must be an integer array [tokens, layers, k], got {a.dtype} {a.shape}")
    return a


def layer_agreement(engine: np.ndarray, trainer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exact `[T, L]` bool, overlap `[T, L]` float64) of two `[T, L, k]` route arrays (see the module doc)."""
    e, t = _routes(engine, "engine"), _routes(trainer, "trainer")
    if e.shape != t.shape:
        raise ValueError(f"engine routes {e.shape} and trainer routes {t.shape} differ in shape")
    k = e.shape[2]
    hits = (np.sort(e, axis=2)[:, :, :, None] == np.sort(t, axis=2)[:, :, None, :]).any(axis=3).sum(axis=2)
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


def ell_by_disagreement(abs_ell: np.ndarray, layers_disagree: np.ndarray) -> list[dict[str, float]]:
    """Mean |ℓ| (and token count) by number of disagreeing layers: 0, 1, 2, 3+ — how |ℓ| grows with routing
    disagreement."""
    a = np.asarray(abs_ell, np.float64)
    d = np.asarray(layers_disagree)
    rows = []
    for label, where in (("0", d == 0), ("1", d == 1), ("2", d == 2), ("3+", d >= 3)):
        rows.append({"layers_disagree": label, "tokens": int(where.sum()),
                     "mean_abs_ell": float(a[where].mean()) if where.any() else math.nan})
    return rows


def ell_by_margin(abs_ell: np.ndarray, margin: np.ndarray, bins: int = 4) -> list[dict[str, float]]:
    """Mean |ℓ| by quantile bin of a token's smallest router margin over layers (`margin` `[T, L]`): tokens whose
    routing is a near tie are where the two sides' choices flip."""
    a = np.asarray(abs_ell, np.float64)
    m = np.asarray(margin, np.float64).min(axis=1)
    if a.size == 0:
        return []
    edges = np.quantile(m, np.linspace(0, 1, bins + 1))
    which = np.clip(np.searchsorted(edges, m, side="right") - 1, 0, bins - 1)
    return [{"margin_low": float(edges[i]), "margin_high": float(edges[i + 1]), "tokens": int((which == i).sum()),
             "mean_abs_ell": float(a[which == i].mean()) if (which == i).any() else math.nan} for i in range(bins)]


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
