"""Packed padding-free scoring equals one-sequence-at-a-time and padded-batch forwards to float32 rounding.

Tolerances: float32 packed vs float32 one-at-a-time measured max |Δ| ≤ 2e-6 (often exactly 0 for sdpa_varlen);
float32 vs the float64 reference measured ≤ 3e-6; asserted with ~3× headroom.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from rcdiag.errors import ConfigError, InputError
from rcdiag.score.scoring import RescoreWarning, load_model, score_sequences
from tests.score.rescore.helpers import (
    VOCAB,
    max_diff,
    one_at_a_time,
    padded_reference,
    random_pairs,
    reference_logprobs,
)

F32_TOL = 1e-5


def test_packed_equals_one_at_a_time_and_float64(model, model64) -> None:
    rng = np.random.default_rng(1)
    pairs = random_pairs(rng, 24) + [([5], [9]), ([3, 4], []), ([2], [7, 7, 7])]
    scored = score_sequences(model, pairs, token_budget=96, chunk_tokens=17)
    diff, where = max_diff(scored, one_at_a_time(model, pairs))
    assert diff <= 5e-6, f"packed vs one-at-a-time: max |Δ| {diff:.3g} at sequence {where}"
    diff64, where64 = max_diff(scored, reference_logprobs(model64, pairs))
    assert diff64 <= F32_TOL, f"packed vs float64: max |Δ| {diff64:.3g} at sequence {where64}"
    assert scored.logprobs.dtype == np.float32 and scored.cu_seqlens[-1] == sum(len(r) for _, r in pairs)
    assert np.all(scored.logprobs < 0) and scored.logprobs.std() > 0.5  # not uniform: the lm_head is scaled


@pytest.mark.parametrize("side", ["left", "right"])
def test_packed_equals_padded_batch_with_attention_mask(model_dir, model, side) -> None:
    """The trainer's way (padded batch + 2-D mask, native sdpa) gives the same values, mapped back exactly."""
    rng = np.random.default_rng(2)
    pairs = random_pairs(rng, 10, response=(1, 30))
    reference = padded_reference(load_model(model_dir, attn="sdpa"), pairs, side)
    diff, where = max_diff(score_sequences(model, pairs, token_budget=64), reference)
    assert diff <= 5e-6, f"packed vs {side}-padded batch: max |Δ| {diff:.3g} at sequence {where}"


def test_length_one_exact_budget_and_oversized(model, model64) -> None:
    """Inputs of 1 token, exactly the budget, and over the budget (own row + warning) are all scored right."""
    rng = np.random.default_rng(3)
    budget = 32
    pairs = [([11], [12]),                                                    # input length 1
             (rng.integers(0, VOCAB, 20).tolist(), rng.integers(0, VOCAB, 13).tolist()),  # 20 + 12 = budget
             (rng.integers(0, VOCAB, 30).tolist(), rng.integers(0, VOCAB, 25).tolist()),  # 54 > budget
             ([4], [5, 6])]
    with pytest.warns(RescoreWarning, match="1 sequence"):
        scored = score_sequences(model, pairs, token_budget=budget)
    diff, where = max_diff(scored, reference_logprobs(model64, pairs))
    assert diff <= F32_TOL, f"max |Δ| {diff:.3g} at sequence {where}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        score_sequences(model, pairs[:2] + pairs[3:], token_budget=budget)  # no warning at exactly the budget


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_temperature_divides_the_logits(model, model64, temperature) -> None:
    rng = np.random.default_rng(4)
    pairs = random_pairs(rng, 6, response=(1, 20))
    scored = score_sequences(model, pairs, temperature=temperature)
    diff, _ = max_diff(scored, reference_logprobs(model64, pairs, temperature))
    assert diff <= F32_TOL
    other, _ = max_diff(scored, reference_logprobs(model64, pairs, 1.3))
    assert other > 0.05, "a different temperature must give visibly different log-probs"


@pytest.mark.parametrize("attn", ["sdpa", "eager", pytest.param("flex_attention", marks=pytest.mark.slow)])
def test_native_attention_implementations_agree(model_dir, model64, attn) -> None:
    """transformers' own packed detection (no 2-D mask, use_cache=False) matches the float64 reference."""
    rng = np.random.default_rng(5)
    pairs = random_pairs(rng, 8)
    scored = score_sequences(load_model(model_dir, attn=attn), pairs, token_budget=128)
    diff, where = max_diff(scored, reference_logprobs(model64, pairs))
    assert diff <= F32_TOL, f"{attn}: max |Δ| {diff:.3g} at sequence {where}"


def test_bfloat16_packed_equals_bfloat16one_at_a_time(model_dir, model64) -> None:
    """In bf16, packing changes nothing (same per-sequence kernels); bf16 itself differs from float64 by ≫ f32."""
    bf16 = load_model(model_dir, dtype="bfloat16")
    rng = np.random.default_rng(6)
    pairs = random_pairs(rng, 8, response=(1, 30))
    scored = score_sequences(bf16, pairs, token_budget=64)
    diff, where = max_diff(scored, one_at_a_time(bf16, pairs))
    assert diff <= 1e-5, f"bf16 packed vs bf16 one-at-a-time: {diff:.3g} at {where}"
    assert max_diff(scored, reference_logprobs(model64, pairs))[0] > 1e-4


def test_padded_view_of_results(model) -> None:
    pairs = [([1, 2], [3, 4, 5]), ([6], []), ([7], [8])]
    scored = score_sequences(model, pairs)
    logprobs, entropies, mask = scored.padded("left", pad_value=np.nan)
    assert mask.tolist() == [[True] * 3, [False] * 3, [False, False, True]]
    np.testing.assert_array_equal(logprobs[0], scored.logprobs[:3])
    assert logprobs[2, 2] == scored.logprobs[3] and np.isnan(logprobs[1]).all()
    assert entropies.shape == (3, 3)
    empty = score_sequences(model, [])
    assert empty.logprobs.size == 0 and empty.cu_seqlens.tolist() == [0]


def test_refusals_name_row_and_field(model) -> None:
    with pytest.raises(InputError, match=r"row 2 field 'token_id'.*outside the model's vocabulary"):
        score_sequences(model, [([1], [2]), ([1], [VOCAB])])
    with pytest.raises(InputError, match=r"row 1 field 'prompt_token_ids'.*-1"):
        score_sequences(model, [([-1], [2])])
    with pytest.raises(InputError, match="empty prompt"):
        score_sequences(model, [([], [2])])
    with pytest.raises(InputError, match=r"needs 161 positions but the model's context is 160"):
        score_sequences(model, [([1] * 100, [2] * 62)])
    with pytest.raises(ConfigError, match="unknown dtype"):
        load_model("/nonexistent", dtype="float8")
    with pytest.raises(ConfigError, match="not a model directory"):
        load_model("/nonexistent")
    with pytest.raises(ConfigError, match="unknown attention"):
        load_model("/nonexistent", attn="magic")


def test_results_do_not_depend_on_packing(model) -> None:
    """Budget 1 (every sequence alone, each with a warning), a middle budget and one row for all give the same
    values: packing only changes which rows the sequences share, never what they attend to."""
    pairs = random_pairs(np.random.default_rng(9), 12)
    one_row = score_sequences(model, pairs, token_budget=10_000)
    middle = score_sequences(model, pairs, token_budget=50)
    with pytest.warns(RescoreWarning, match="exceed the token budget 1"):
        alone = score_sequences(model, pairs, token_budget=1)
    for other in (middle, alone):
        np.testing.assert_allclose(other.logprobs, one_row.logprobs, rtol=0, atol=5e-6)
        np.testing.assert_allclose(other.entropies, one_row.entropies, rtol=0, atol=5e-6)
