"""MoE routing agreement (rcdiag.analysis.moe.routing) against counts computed by hand on built cases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rcdiag.analysis.moe.routing import (
    agreement,
    confidence,
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


# ------------------------------------------------------------------------------------------ over a run
HAND_ENGINE = [[[1, 2], [3, 4]], [[1, 2], [5, 6]], [[0, 7], [1, 2]], [[4, 5], [6, 7]], [[0, 1], [2, 3]]]
HAND_TRAINER = [[[2, 1], [4, 3]], [[1, 3], [5, 6]], [[7, 0], [3, 4]], [[5, 4], [6, 7]], [[6, 7], [4, 5]]]
HAND_ELL = [0.01, 0.3, 0.5, 0.03, 5.0]
HAND_MASK = [True, True, True, True, False]
HAND_PROBS = [[[0.5, 0.3, 0.1], [0.6, 0.2, 0.15]], [[0.4, 0.3, 0.29], [0.6, 0.2, 0.15]],
              [[0.5, 0.3, 0.1], [0.5, 0.2, 0.19]], [[0.5, 0.3, 0.1], [0.6, 0.2, 0.15]],
              [[0.5, 0.3, 0.1], [0.6, 0.2, 0.15]]]


def hand_run(path, *, shard_tokens: int = 1 << 20, null_trainer_row: int | None = None):
    """Two sequences, 2 MoE layers × top-2 of 8 experts. Seq 0: token 0 agrees (layer 1's ids swapped), token 1
    shares one of two experts in layer 0, token 2 none in layer 1. Seq 1: token 0 agrees, token 1 is masked out
    (its disagreement and |ℓ| = 5 must not count). Trainer router probabilities: token 1 is a near tie in layer 0
    (0.30 vs 0.29), token 2 in layer 1 (0.20 vs 0.19)."""
    import pandas as pd

    from rcdiag.store.routes import RoutingInfo, token_columns
    from rcdiag.store.writer import write_run

    info = RoutingInfo(layers=2, top_k=2, experts=8, engine="sampled", trainer="rescored")
    tokens = pd.DataFrame({"seq_id": [0, 0, 0, 1, 1], "pos": [0, 1, 2, 0, 1], "token_id": [5, 6, 7, 8, 9],
                           "rollout_logprob": [-1.0] * 5, "train_logprob": [-1.0 + x for x in HAND_ELL],
                           "mask": HAND_MASK})
    for side, ids in (("engine", HAND_ENGINE), ("trainer", HAND_TRAINER)):
        probs = [np.array([p]) for p in HAND_PROBS] if side == "trainer" else None
        columns = token_columns(side, [np.array([x]) for x in ids], info, source="hand", probs=probs)
        for name, column in columns.items():
            tokens[name] = column.to_pylist()
    if null_trainer_row is not None:
        tokens.at[null_trainer_row, "train_routes"] = None
    return write_run(path, tokens, None, {"routing": info.to_dict()}, shard_tokens=shard_tokens)


@pytest.mark.parametrize("shard_tokens", [1 << 20, 3])
def test_run_summary_equals_hand_counts(tmp_path, shard_tokens):
    """The streamed summary of hand_run against counts by hand — the masked token left out: 4 routed tokens;
    layer 0 exact 3/4 (overlaps 1, ½, 1, 1), layer 1 exact 3/4 (1, 1, 0, 1); 2 of 4 tokens with a disagreeing
    layer; |ℓ| 0.02 mean over the agreeing two, 0.4 over the two with one layer off; gap 0.21, routing explains
    1 − 0.02/0.21. Trainer confidence: selected mass 0.775 per layer; one near tie per layer (¼); by smallest
    margin: 0.034 (token 1) → [0, 0.05), 0.051 (token 2) → [0.05, 0.1), 0.288 (tokens 0 and seq 1's) →
    [0.25, 0.5). Two shards (3 tokens per shard) give the same numbers."""
    from rcdiag.analysis.moe.routing import routing_summary
    from rcdiag.store.run import open_run

    summary = routing_summary(open_run(hand_run(tmp_path / "run", shard_tokens=shard_tokens).path))
    assert (summary.valid_tokens, summary.tokens, summary.scored) == (4, 4, 4)
    assert summary.exact_by_layer == pytest.approx([0.75, 0.75])
    assert summary.overlap_by_layer == pytest.approx([3.5 / 4, 3 / 4])
    assert summary.exact_rate == pytest.approx(6 / 8) and summary.mean_overlap == pytest.approx(6.5 / 8)
    assert summary.any_disagree_share == pytest.approx(0.5) and summary.mean_layers_disagree == pytest.approx(0.5)
    rows = {r["layers_disagree"]: r for r in summary.by_disagreement}
    assert list(rows) == ["0", "1", "2"]
    assert rows["0"]["tokens"] == 2 and rows["0"]["mean_abs_log_ratio"] == pytest.approx(0.02, abs=1e-6)
    assert rows["1"]["tokens"] == 2 and rows["1"]["mean_abs_log_ratio"] == pytest.approx(0.4, abs=1e-6)
    assert rows["2"]["tokens"] == 0 and math.isnan(rows["2"]["mean_abs_log_ratio"])
    share = summary.explains
    assert share.method == "observational" and share.gap == pytest.approx(0.21, abs=1e-6)
    assert share.share == pytest.approx(1 - 0.02 / 0.21, abs=1e-5) and share.disagreeing_share == 0.5
    assert not summary.judged  # 2 tokens per group: below MIN_GROUP
    trainer = summary.confidence["trainer"]
    assert trainer["tokens"] == 4 and "engine" not in summary.confidence
    assert trainer["selected_mass_by_layer"] == pytest.approx([0.775, 0.775], abs=1e-6)
    assert trainer["near_tie_by_layer"] == pytest.approx([0.25, 0.25])
    bins = {(r["margin_low"], r["margin_high"]): r for r in summary.by_margin}
    assert bins[(0.0, 0.05)]["tokens"] == 1 and bins[(0.0, 0.05)]["disagree_share"] == 1.0
    assert bins[(0.0, 0.05)]["mean_abs_log_ratio"] == pytest.approx(0.3, abs=1e-6)
    assert bins[(0.05, 0.1)]["tokens"] == 1 and bins[(0.05, 0.1)]["mean_abs_log_ratio"] == pytest.approx(0.5, abs=1e-6)
    assert bins[(0.25, 0.5)]["tokens"] == 2 and bins[(0.25, 0.5)]["disagree_share"] == 0.0
    assert sum(r["tokens"] for r in summary.by_margin) == 4
    replayed = summary.with_replay(gap=0.2, replay_gap=0.05)
    assert replayed.explains.method == "replay" and replayed.explains.share == pytest.approx(0.75) and replayed.judged


def test_run_summary_equals_the_array_functions_on_a_routed_run(tmp_path):
    """On tests/moe/routed_runs' realistic run, the streamed summary equals agreement() and routing_explains() of
    the whole arrays at once (|ℓ| from the stored float32 log-probs)."""
    from rcdiag.analysis.moe.routing import routing_summary
    from rcdiag.store.run import open_run
    from tests.moe.routed_runs import write_moe_run

    path, seqs = write_moe_run(tmp_path / "moe")
    summary = routing_summary(open_run(path))
    engine = np.concatenate([s["engine_ids"] for s in seqs])
    trainer = np.concatenate([s["train_ids"] for s in seqs])
    whole, disagree = agreement(engine, trainer)
    ell = np.abs(np.concatenate([s["rollout"].astype(np.float32).astype(np.float64)
                                 - s["train"].astype(np.float32).astype(np.float64) for s in seqs]))
    assert summary.tokens == whole.tokens and summary.exact_by_layer == pytest.approx(whole.exact_by_layer)
    assert summary.any_disagree_share == pytest.approx(whole.any_disagree_share)
    reference = routing_explains(ell, disagree)
    assert summary.explains.share == pytest.approx(reference.share, rel=1e-12)
    assert summary.explains.gap == pytest.approx(reference.gap, rel=1e-12)


def test_dense_run_has_no_summary(tmp_path):
    """A run without a routing section reads nothing and has no summary."""
    import pandas as pd

    from rcdiag.analysis.moe.routing import routing_summary
    from rcdiag.store.writer import write_run

    run = write_run(tmp_path / "dense", pd.DataFrame({"seq_id": [0], "pos": [0], "rollout_logprob": [-1.0],
                                                      "train_logprob": [-1.1]}))
    assert routing_summary(run) is None


def test_a_damaged_route_column_is_refused_naming_file_row_and_column(tmp_path):
    """A token file rewritten with a route list one layer short (3 tokens' routes where 4 are expected per row) is
    an InputError naming the file, the row and the column — not a reshape traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rcdiag.analysis.moe.routing import routing_summary
    from rcdiag.errors import InputError
    from rcdiag.store.run import open_run

    run = hand_run(tmp_path / "run")
    file = run.token_files[0]
    table = pq.read_table(file)
    routes = table.column("engine_routes").to_pylist()
    routes[2] = routes[2][:2]
    table = table.set_column(table.schema.get_field_index("engine_routes"), "engine_routes",
                             pa.array(routes, pa.list_(pa.int16())))
    pq.write_table(table, file)
    with pytest.raises(InputError) as err:
        routing_summary(open_run(run.path))
    text = str(err.value)
    assert "part-00000.parquet" in text and "row 3" in text and "engine_routes" in text, text


def test_a_token_without_the_trainers_route_is_left_out(tmp_path):
    """hand_run with seq 1's valid token lacking its trainer route (null): 3 routed tokens — layer 0 exact 2/3,
    layer 1 2/3, 2 of 3 with a differing layer, gap (0.01 + 0.3 + 0.5)/3 — and its probabilities not counted."""
    from rcdiag.analysis.moe.routing import routing_summary
    from rcdiag.store.run import open_run

    summary = routing_summary(open_run(hand_run(tmp_path / "run", null_trainer_row=3).path))
    assert (summary.valid_tokens, summary.tokens) == (4, 3)
    assert summary.exact_by_layer == pytest.approx([2 / 3, 2 / 3])
    assert summary.any_disagree_share == pytest.approx(2 / 3)
    assert summary.explains.gap == pytest.approx(0.81 / 3, abs=1e-6)
    assert summary.confidence["trainer"]["tokens"] == 3
