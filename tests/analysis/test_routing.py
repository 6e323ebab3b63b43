"""MoE routing agreement (rcdiag.analysis.routing) against counts computed by hand on built cases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rcdiag.analysis.routing import (
    agreement,
    confidence,
    ell_by_disagreement,
    layer_agreement,
    routing_explains,
)


def test_agreement_equals_hand_counts():
    """3 tokens × 2 layers × top-2. Token 0: same sets (order swapped in layer 1). Token 1: layer 0 shares one of
    two experts. Token 2: layer 1 shares none. By hand: exact 4/6, overlaps [[1,1],[.5,1],[1,0]], 2 of 3 tokens
    with a disagreeing layer; layer 0 exact 2/3, layer 1 exact 2/3."""
    engine = np.array([[[1, 2], [3, 4]], [[1, 2], [5, 6]], [[0, 7], [1, 2]]], dtype=np.int16)
    trainer = np.array([[[1, 2], [4, 3]], [[1, 3], [5, 6]], [[7, 0], [3, 4]]], dtype=np.int16)
    exact, overlap = layer_agreement(engine, trainer)
    assert exact.tolist() == [[True, True], [False, True], [True, False]]
    assert overlap.tolist() == [[1.0, 1.0], [0.5, 1.0], [1.0, 0.0]]
    summary, disagree = agreement(engine, trainer)
    assert summary.exact_rate == pytest.approx(4 / 6) and summary.mean_overlap == pytest.approx(4.5 / 6)
    assert summary.any_disagree_share == pytest.approx(2 / 3) and disagree.tolist() == [0, 1, 1]
    assert summary.exact_by_layer == pytest.approx([2 / 3, 2 / 3])
    assert summary.overlap_by_layer == pytest.approx([2.5 / 3, 2 / 3])


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="differ in shape"):
        layer_agreement(np.zeros((2, 3, 2), int), np.zeros((2, 3, 1), int))
    with pytest.raises(ValueError, match="integer array"):
        layer_agreement(np.zeros((2, 3, 2)), np.zeros((2, 3, 2)))


def test_confidence_mass_and_margin():
    """Logits (3, 1, 0, -1), k=2: mass (e³+e¹)/(e³+e¹+e⁰+e⁻¹), margin 1 − 0 = 1."""
    z = np.array([[[1.0, 3.0, -1.0, 0.0]]])
    mass, margin = confidence(z, 2)
    e = np.exp([3.0, 1.0, 0.0, -1.0])
    assert mass[0, 0] == pytest.approx((e[0] + e[1]) / e.sum()) and margin[0, 0] == pytest.approx(1.0)


def test_routing_explains_counterfactual_and_replay():
    """|ℓ| 0.01 on 6 agreeing tokens, 0.31 on 4 disagreeing ones: gap 0.13; with the agreeing level on every
    token the gap would be 0.01, so routing explains 1 − 0.01/0.13; a replay gap of 0.026 measures 80 %."""
    ell = np.array([0.01] * 6 + [0.31] * 4)
    disagree = np.array([0] * 6 + [2] * 4)
    share = routing_explains(ell, disagree)
    assert share.gap == pytest.approx(0.13) and share.share == pytest.approx(1 - 0.01 / 0.13)
    assert share.method == "observational" and "routing explains 92%" in share.sentence()
    replay = routing_explains(ell, disagree, replay_gap=0.026)
    assert replay.share == pytest.approx(0.8) and replay.method == "replay"
    assert math.isnan(routing_explains(ell, np.ones(10)).share)
    rows = ell_by_disagreement(ell, disagree)
    assert rows[0] == {"layers_disagree": "0", "tokens": 6, "mean_abs_ell": pytest.approx(0.01)}
    assert rows[2]["tokens"] == 4 and rows[1]["tokens"] == 0 and math.isnan(rows[1]["mean_abs_ell"])
