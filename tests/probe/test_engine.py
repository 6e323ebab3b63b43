"""Engine side on the real vLLM CPU engine (the session engine of tests/fixtures/engine.py, float32, prefix
caching on): replaying a generated run's tokens reproduces the sampled log-probs; the probe reports decode vs
prefill, batch invariance and cached-prompt scoring without building another engine."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rcdiag.store.run import Run, open_run
from tests.fixtures.engine import ENGINE_KWARGS

pytestmark = pytest.mark.vllm

REPLAY_TOL = 2e-4
"""|replayed − sampled| bound at the run's own settings (float32 engine): prefill vs decode kernels should differ
only by float32 rounding (~1e-6 relative at |log p| ≤ 20, i.e. ≤ 2e-5); the bound leaves a 10× margin. The
exact maximum is in each probe summary (`rollout` row, `vs_baseline.max_abs`)."""


@pytest.fixture(scope="module")
def generated(vllm_engine: Any, sample_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """8 prompts × 2 samples at temperature 0.8 (≠ 1: the full-vocabulary path of the replay)."""
    from rcdiag.score.generate import GenerateConfig, generate_run
    from rcdiag.score.sample import SAMPLE_PROMPTS

    config = GenerateConfig(n=2, temperature=0.8, max_tokens=32, limit=8, **ENGINE_KWARGS)
    out = tmp_path_factory.mktemp("probe_gen") / "run"
    generate_run(sample_model, SAMPLE_PROMPTS, out, config, llm=vllm_engine, silent=True)
    return open_run(out)


def _pairs(run: Run) -> tuple[list[tuple[list[int], list[int]]], np.ndarray]:
    tokens, sequences = run.tokens(), run.sequences().set_index("seq_id")
    pairs, sampled = [], []
    for seq_id, rows in tokens.groupby("seq_id"):
        pairs.append((list(sequences.loc[seq_id, "prompt_token_ids"]), rows["token_id"].tolist()))
        sampled.append(rows["rollout_logprob"].to_numpy(np.float64))
    return pairs, np.concatenate(sampled)


def test_replay_reproduces_sampled_logprobs(vllm_engine: Any, generated: Run) -> None:
    """Prefill replay at the run's settings (temperature applied to the raw prompt log-probs) ≈ decode."""
    from rcdiag.probe.replay import replay_pairs

    pairs, sampled = _pairs(generated)
    replayed = np.concatenate(replay_pairs(vllm_engine, pairs, 0.8)).astype(np.float64)
    diff = np.abs(replayed - sampled)
    assert diff.max() <= REPLAY_TOL, f"max |replay − sampled| {diff.max():.3g} at token {int(diff.argmax())}"
    alone = np.concatenate(replay_pairs(vllm_engine, pairs[:3], 0.8, one_at_a_time=True))
    n = sum(len(r) for _, r in pairs[:3])
    assert np.abs(alone - replayed[:n]).max() <= REPLAY_TOL


def test_replay_cached_and_edges(vllm_engine: Any, generated: Run) -> None:
    """Scoring against a cached prompt agrees with the plain replay (float32 engine) and counts its tokens;
    empty input → []; an empty response → an empty array; temperature 0 is refused."""
    from rcdiag.errors import ConfigError
    from rcdiag.probe.replay import replay_cached, replay_pairs

    pairs, _ = _pairs(generated)
    stats: dict[str, int] = {}
    cached = np.concatenate(replay_cached(vllm_engine, pairs[:4], 0.8, stats=stats))
    plain = np.concatenate(replay_pairs(vllm_engine, pairs[:4], 0.8))
    assert np.abs(cached - plain).max() <= REPLAY_TOL
    assert stats["tokens"] == sum(len(p) + len(r) for p, r in pairs[:4]) and stats["cached_tokens"] >= 0
    assert replay_pairs(vllm_engine, [], 1.0) == []
    out = replay_pairs(vllm_engine, [(pairs[0][0], [])], 0.8)
    assert len(out) == 1 and out[0].size == 0
    with pytest.raises(ConfigError, match="temperature"):
        replay_pairs(vllm_engine, pairs[:1], 0.0)


def test_probe_engine_factors_with_shared_engine(vllm_engine: Any, generated: Run) -> None:
    """decode vs prefill is reported (not hidden), and every engine setting's numbers come from the given engine."""
    from rcdiag.probe.run import ProbeConfig, run_probe

    config = ProbeConfig(sample=16, factors=("decode_vs_prefill", "batch_invariance", "prefix_caching"),
                         name="engine", threads=1)
    result = run_probe(generated.path, config, llm=vllm_engine, silent=True)
    rows = {r["name"]: r for r in result.summary["settings"]}
    assert set(rows) == {"reference", "engine_replay", "engine_alone", "engine_cached_prompt", "rollout"}
    frame = result.tokens[result.tokens["mask"]]
    decode = rows["rollout"]["vs_baseline"]
    assert rows["rollout"]["factor"] == "decode_vs_prefill" and rows["rollout"]["baseline"] == "engine_replay"
    assert decode["max_abs"] == pytest.approx(np.abs(frame["rollout"] - frame["engine_replay"]).max(), rel=1e-12)
    assert decode["max_abs"] <= REPLAY_TOL
    assert any(note.startswith("decode vs prefill") for note in result.summary["notes"])
    for name in ("engine_alone", "engine_cached_prompt"):
        assert rows[name]["vs_baseline"]["max_abs"] <= REPLAY_TOL, name
    engine_vs_trainer = rows["engine_replay"]["vs_reference"]["max_abs"]
    assert engine_vs_trainer <= 1e-3, "float32 vLLM vs float32 transformers on the same tokens"


def test_exact_divergences_of_a_float32_engine_are_float32_noise(vllm_engine: Any, generated: Run) -> None:
    """The `divergence` factor on the float32 engine against the float32 trainer: whole next-token distributions
    (full-vocabulary prompt log-probs at T = 0.8) must agree to float32 noise (KL and TV < 1e-4, top-1 overlap 1),
    the exact KL must be ≥ 0 everywhere, and the sampled k3 on the same positions must sit beside it."""
    from rcdiag.probe.run import ProbeConfig, run_probe

    config = ProbeConfig(sample=6, factors=("engine_numerics", "divergence"), name="div", threads=1,
                         divergence_positions=40)
    result = run_probe(generated.path, config, llm=vllm_engine, silent=True)
    record = result.summary["divergence"]["engine_replay"]
    assert record["positions"] == 40
    assert 0 <= record["kl_mu_pi"] < 1e-4 and 0 <= record["kl_pi_mu"] < 1e-4 and record["tv"] < 1e-2
    assert record["top1_overlap"] == 1.0 and record["kept_mass_mu"] == pytest.approx(1.0)
    assert abs(record["k3_minus_exact"]) < 1e-4
    frame = result.tokens
    chosen = frame["exact_kl_mu_pi"].notna()
    assert int(chosen.sum()) == 40 and (frame.loc[chosen, "exact_kl_mu_pi"] >= 0).all()
