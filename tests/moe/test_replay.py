"""Routing replay in the trainer (rcdiag.score.routes.RouteHooks with forced routes, R3): forcing the trainer's own
routes reproduces the unforced log-probs, alone and packed; forcing other routes moves them; the forced weights are
the trainer's router probabilities over the forced experts, renormalised as the model does (float64 reference)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rcdiag.score.routes import RouteHooks, moe_shape, route_weights
from rcdiag.score.sample import SAMPLE_MOE
from rcdiag.score.scoring import load_model, score_sequences
from tests.moe.test_capture import all_router_logits, random_pairs, reference_routes

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def moe_model():
    return load_model(SAMPLE_MOE, dtype="float32", device="cpu")


def own_routes(model, pairs) -> list[np.ndarray]:
    """The trainer's own top-2 routes at every input position of each pair (float64 top-k of its logits)."""
    return [reference_routes(all_router_logits(model, p, r), 2)[0] for p, r in pairs]


@pytest.mark.parametrize("budget", [1 << 30, 40])
def test_forcing_own_routes_reproduces_log_probs(moe_model, budget: int) -> None:
    """Guards a replay that is not a replay (weights recomputed wrongly, positions shifted within a packed row):
    with the trainer's own routes forced, every log-prob equals the unforced one to float32 rounding."""
    pairs = random_pairs(6, seed=1)
    plain = score_sequences(moe_model, pairs, token_budget=budget).logprobs
    with RouteHooks(moe_model, moe_shape(moe_model.config), forced=own_routes(moe_model, pairs)) as hooks:
        forced = score_sequences(moe_model, pairs, token_budget=budget, routes=hooks).logprobs
    np.testing.assert_allclose(forced, plain, atol=2e-6, rtol=0)


def test_forcing_other_routes_moves_log_probs(moe_model) -> None:
    """Guards hooks whose forced ids are ignored: other experts than the router's choice move the log-probs by far more than rounding, and the recorded routes are the forced ones."""
    pairs = random_pairs(4, seed=2)
    plain = score_sequences(moe_model, pairs).logprobs
    other = [(r + 1) % 8 for r in own_routes(moe_model, pairs)]  # each chosen expert's neighbour: still 2 distinct
    with RouteHooks(moe_model, moe_shape(moe_model.config), forced=other) as hooks:
        forced = score_sequences(moe_model, pairs, routes=hooks).logprobs
    assert np.abs(forced - plain).mean() > 1e-2
    start = 0
    for (prompt, response), routes in zip(pairs, other, strict=True):
        np.testing.assert_array_equal(hooks.ids[start:start + len(response)], routes[len(prompt) - 1:])
        start += len(response)


def test_replay_weights_are_renormalised_router_probabilities() -> None:
    """Guards R3 weights taken from the wrong place: softmax over all experts in float64, gathered at the forced
    ids, renormalised over them (norm_topk_prob) — and left unnormalised for a model that does not renormalise."""
    rng = np.random.default_rng(3)
    z = rng.normal(size=(5, 8))
    ids = np.array([[3, 1], [0, 7], [2, 3], [6, 5], [4, 0]])
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    picked = np.take_along_axis(p, ids, 1)
    logits = torch.tensor(z, dtype=torch.float32)
    np.testing.assert_allclose(route_weights(logits, torch.tensor(ids), True).numpy(),
                               picked / picked.sum(1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(route_weights(logits, torch.tensor(ids), False).numpy(), picked, atol=1e-6)
