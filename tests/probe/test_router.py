"""The probe's MoE factors on real transformers (rcdiag.probe.routing): `router_replay` with the engine's routes set
to the trainer's own reproduces the reference exactly and agrees 100 %; other engine routes move it; both factors
reach the budget and the answer; a dense run skips them with a note."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rcdiag.probe.answer import answer_lines, probe_answer
from rcdiag.probe.factors import PREFILL_NOTE
from rcdiag.probe.run import ProbeConfig, run_probe
from rcdiag.score.sample import SAMPLE_MOE
from rcdiag.score.scoring import load_model, score_sequences
from rcdiag.store.routes import PROMPT_ROUTES, RoutingInfo, prompt_column, token_columns
from rcdiag.store.writer import write_run
from tests.moe.test_capture import all_router_logits, random_pairs, reference_routes

pytestmark = pytest.mark.model
FACTORS = ("router_replay", "router_precision")


def routed_run(path: Path, shift: int, top_k: int = 2) -> tuple[Path, np.ndarray]:
    """A run of 5 random sequences on the MoE sample whose engine routes are the float32 trainer's own top-2
    (`shift` 0) or each expert id + shift mod 8; rollout = the trainer's log-probs + N(0, 0.05²). `top_k` other
    than the model's 2: routes of another model's shape."""
    model = load_model(SAMPLE_MOE, dtype="float32", device="cpu")
    pairs = random_pairs(5, seed=4)
    train = score_sequences(model, pairs).logprobs
    routes = [(reference_routes(all_router_logits(model, p, r), top_k)[0] + shift) % 8 for p, r in pairs]
    info = RoutingInfo(layers=4, top_k=top_k, experts=8, engine="prefill_replay")
    rng = np.random.default_rng(0)
    tokens = pd.DataFrame({"seq_id": np.concatenate([np.full(len(r), i) for i, (_, r) in enumerate(pairs)]),
                           "pos": np.concatenate([np.arange(len(r)) for _, r in pairs]),
                           "token_id": np.concatenate([r for _, r in pairs]),
                           "rollout_logprob": (train + rng.normal(0, 0.05, train.size)).astype(np.float32)})
    column = token_columns("engine", [x[len(p) - 1:] for x, (p, _) in zip(routes, pairs, strict=True)], info,
                           source="test")["engine_routes"]
    tokens["engine_routes"] = column.to_pylist()
    sequences = pd.DataFrame({"seq_id": range(len(pairs)), "prompt_token_ids": [p for p, _ in pairs],
                              "prompt_len": [len(p) for p, _ in pairs]})
    sequences[PROMPT_ROUTES] = prompt_column([x[:len(p) - 1] for x, (p, _) in zip(routes, pairs, strict=True)],
                                             info, source="test").to_pylist()
    write_run(path, tokens, sequences, {"engine": {"name": "vllm", "model": str(SAMPLE_MOE), "temperature": 1.0},
                                        "routing": info.to_dict()})
    return path, train


def test_replaying_the_trainers_own_routes_is_the_reference(tmp_path: Path) -> None:
    """Guards a replay column that is not the trainer under the engine's routes: engine routes equal to the
    trainer's own give the reference log-probs exactly and 100 % agreement; the budget, the routing record and the
    printed table carry both factors."""
    path, _ = routed_run(tmp_path / "own", shift=0)
    result = run_probe(path, ProbeConfig(sample=5, factors=FACTORS, device="cpu"), silent=True)
    frame = result.tokens
    np.testing.assert_allclose(frame["router_replay"], frame["reference"], atol=2e-6, rtol=0)
    agreement = result.summary["routing"]["agreement_with_reference"]
    assert agreement["engine"]["exact_rate"] == 1.0 and agreement["router_replay"]["exact_rate"] == 1.0
    assert 0.9 < agreement["router_bf16"]["exact_rate"] <= 1.0
    rows = {r["setting"]: r for r in result.summary["budget"]}
    assert {"router_replay", "router_bf16", "train_bf16_router_fp32"} <= set(rows)
    assert rows["router_replay"]["factor"] == "router_replay" and rows["router_bf16"]["factor"] == "router_precision"
    assert rows["train_bf16_router_fp32"]["baseline"] == "train_bf16"
    assert any("routing replay" in line for line in answer_lines(result.summary))
    assert PREFILL_NOTE in result.summary["notes"] and PREFILL_NOTE in probe_answer(result.summary).evidence


def test_other_engine_routes_move_the_replay(tmp_path: Path) -> None:
    """Guards forced routes that are silently ignored: engine routes one expert off everywhere move the replayed
    log-probs far from the reference, and agree with it nowhere."""
    path, _ = routed_run(tmp_path / "shifted", shift=1)
    result = run_probe(path, ProbeConfig(sample=5, factors=("router_replay",), device="cpu"), silent=True)
    frame = result.tokens
    assert np.abs(frame["router_replay"] - frame["reference"]).mean() > 1e-2
    assert result.summary["routing"]["agreement_with_reference"]["engine"]["exact_rate"] == 0.0


def test_routes_of_another_shape_skip_the_replay(tmp_path: Path) -> None:
    """Guards forcing another model's routes (top-3 routes into the sample's top-2 routers index past what its
    layers pick): router_replay is skipped with a note naming both shapes, router_precision still runs."""
    path, _ = routed_run(tmp_path / "top3", shift=0, top_k=3)
    result = run_probe(path, ProbeConfig(sample=3, factors=FACTORS, device="cpu"), silent=True, write=False)
    factors = {r["factor"] for r in result.summary["budget"]}
    assert "router_replay" not in factors and "router_precision" in factors
    assert any("router_replay skipped" in n and "top-3" in n and "top-2" in n for n in result.summary["notes"])


def test_dense_run_skips_router_factors(probe_run) -> None:
    """Guards a dense run that crashes on, or silently reports, MoE factors: both are skipped with a note naming
    why, and no budget row claims them."""
    result = run_probe(probe_run.path, ProbeConfig(sample=4, factors=FACTORS, device="cpu", name="dense"),
                       silent=True, write=False)
    assert not [r for r in result.summary["budget"] if r["factor"] in FACTORS]
    assert any("dense model" in note and "router_replay" in note for note in result.summary["notes"])
