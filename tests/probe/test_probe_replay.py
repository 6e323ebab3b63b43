"""`rcdiag.probe.replay.response_logprobs` (prompt log-probs → response log-probs at a temperature) against float64 references, on
random full-vocabulary raw log-probs and on the prefix-cache layouts vLLM returns (no vLLM engine needed)."""
from __future__ import annotations

import numpy as np
import pytest
from vllm.logprobs import Logprob

from rcdiag.probe.replay import response_logprobs


def _raw_entries(rng: np.random.Generator, n: int, vocab: int) -> tuple[list, np.ndarray]:
    """vLLM-style prompt log-probs (None at position 0, then {token: Logprob} over the whole vocabulary, RAW =
    log_softmax at temperature 1) and the float64 logits behind them `[n, vocab]`."""
    logits = rng.normal(0, 4, (n, vocab))
    raw = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    entries = [None] + [{t: Logprob(logprob=float(raw[i, t])) for t in rng.permutation(vocab)} for i in range(1, n)]
    return entries, logits


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3, 0.05])
def test_temperature_applied_to_raw_logprobs(temperature: float) -> None:
    rng = np.random.default_rng(int(temperature * 100))
    prompt, response = [5, 9, 2], [7, 1, 1, 30, 0]
    entries, logits = _raw_entries(rng, len(prompt) + len(response), 31)
    got = response_logprobs(entries, prompt, response, temperature)
    scaled = logits / temperature
    expected = [scaled[len(prompt) + j, tok] - np.logaddexp.reduce(scaled[len(prompt) + j])
                for j, tok in enumerate(response)]
    assert got.dtype == np.float64
    # raw log-probs are float32-rounded by vLLM; the bound is float32 rounding × 1/T
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6 / temperature * max(1, np.abs(expected).max()))


def test_prefix_cached_positions_are_missing_from_the_front() -> None:
    """With reading from the prefix cache on, vLLM returns log-probs only for the positions it computed: the
    tail. The response must still be found; a response that reached into the cache gives None."""
    rng = np.random.default_rng(0)
    prompt, response = list(range(1, 9)), [3, 4, 5]
    entries, _ = _raw_entries(rng, len(prompt) + len(response), 12)
    full = response_logprobs(entries, prompt, response, 1.0)
    tail = entries[5:]  # the first 5 positions were served from the cache
    np.testing.assert_array_equal(response_logprobs(tail, prompt, response, 1.0), full)
    assert response_logprobs(entries[len(prompt) + 1:], prompt, response, 1.0) is None


def test_edges() -> None:
    assert response_logprobs([None, {}], [1], [], 1.0).size == 0
    assert response_logprobs(None, [1], [2], 1.0) is None
    assert response_logprobs([None, {3: Logprob(logprob=-0.5)}], [1], [2], 1.0) is None  # token not returned
