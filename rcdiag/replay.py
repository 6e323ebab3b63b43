"""Replay fixed (prompt, response) token sequences through vLLM and read back the response tokens' log-probs.

vLLM scores given tokens through *prompt log-probs*: the whole sequence is sent as a prompt with `max_tokens=1`
and `prompt_logprobs`, so every response token is scored by a prefill over the same tokens the rollout sampled
one by one in decode. Prompt log-probs come back RAW (temperature 1, whatever `logprobs_mode`), so at a sampling
temperature T ≠ 1 the full vocabulary is requested and `log_softmax(raw / T)` is applied here — exactly the
processed log-prob at T (over the full vocabulary; top-p/top-k renormalisation is not replayed). At T = 1 only the
scored token is requested (`prompt_logprobs=0`), which is much cheaper.

    llm = build_engine(EngineSettings(model="sample_data/tiny-model", dtype="float32"))
    replay_logprobs(llm, [([1, 5, 9], [17, 3])], temperature=0.7)   # [array([lp(17), lp(3)], dtype=float32)]

vLLM skips *reading* the prefix cache for prompt-log-prob requests; `read_prefix_cache=True` turns reading back
on (vLLM then returns no log-probs for the cached positions; this module recovers the response tokens' from the
tail, and re-asks a sequence whose response reached into the cache with reading off).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Pair = tuple[Sequence[int], Sequence[int]]
REQUESTS_PER_CALL = 32
"""Sequences sent to `llm.generate` at once: bounds the memory of full-vocabulary prompt log-probs."""


def _params(temperature: float, read_prefix_cache: bool) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0 if temperature == 1.0 else -1,
                          skip_reading_prefix_cache=not read_prefix_cache, detokenize=False)


def _position_logprob(entry: dict[int, Any], token: int, temperature: float) -> float:
    """log p(token) at one position from vLLM's {token_id: Logprob} dict of RAW log-probs."""
    if temperature == 1.0:
        return float(entry[token].logprob)
    raw = np.fromiter((lp.logprob for lp in entry.values()), dtype=np.float64, count=len(entry)) / temperature
    top = raw.max()
    return float(entry[token].logprob / temperature - top - np.log(np.exp(raw - top).sum()))


def response_logprobs(prompt_logprobs: list[Any] | None, prompt: Sequence[int], response: Sequence[int],
                      temperature: float) -> np.ndarray | None:
    """float32 `[R]` log-probs of the response tokens from one request's prompt log-probs (list over the
    computed prompt positions, aligned to the end of prompt + response); None when some response position was
    not computed (read from the prefix cache) or the vocabulary is incomplete. Empty response: `[]`."""
    ids = list(prompt) + list(response)
    entries = list(prompt_logprobs or [])
    offset = len(ids) - len(entries)  # positions served from the prefix cache come first and are missing
    out = np.empty(len(response), dtype=np.float32)
    for j, token in enumerate(response):
        index = len(prompt) + j - offset
        if index < 0 or entries[index] is None or token not in entries[index]:
            return None
        out[j] = _position_logprob(entries[index], int(token), temperature)
    return out


def _generate(llm: Any, pairs: Sequence[Pair], params: Any) -> list[Any]:
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p] + [int(t) for t in r]) for p, r in pairs]
    return llm.generate(prompts, params, use_tqdm=False)


def replay_logprobs(llm: Any, sequences: Sequence[Pair], temperature: float, *, one_at_a_time: bool = False,
                    read_prefix_cache: bool = False, on_done: Callable[[int], None] | None = None,
                    stats: dict[str, int] | None = None) -> list[np.ndarray]:
    """Log-probs (float32 `[R_i]`, at `temperature`) of each response under `llm`, by prefill of prompt + response.

    `llm` must be built with `max_logprobs=-1` when temperature ≠ 1 (`rcdiag.engine.EngineSettings` does).
    `one_at_a_time` sends each sequence alone (a batch of one: the engine-side batch-invariance probe);
    `on_done(n)` is called with the number of response tokens finished; `stats` (if given) accumulates
    `tokens` (prompt + response tokens sent) and `cached_tokens` (read from the prefix cache, vLLM's
    `num_cached_tokens`). Empty list → `[]`; an empty response gives an empty array.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    step = 1 if one_at_a_time else REQUESTS_PER_CALL
    results: list[np.ndarray] = []
    for start in range(0, len(sequences), step):
        chunk = sequences[start:start + step]
        outputs = _generate(llm, chunk, _params(temperature, read_prefix_cache))
        for index, ((prompt, response), output) in enumerate(zip(chunk, outputs, strict=True), start):
            values = response_logprobs(output.prompt_logprobs, prompt, response, temperature)
            if stats is not None:
                stats["tokens"] = stats.get("tokens", 0) + len(prompt) + len(response)
                stats["cached_tokens"] = stats.get("cached_tokens", 0) + int(output.num_cached_tokens or 0)
            if values is None:  # part of the response came from the prefix cache: score it without reading
                again = _generate(llm, [(prompt, response)], _params(temperature, False))[0]
                values = response_logprobs(again.prompt_logprobs, prompt, response, temperature)
            if values is None:
                raise RuntimeError(f"vLLM returned no log-prob for a response token of sequence {index}; is the "
                                   "engine built with max_logprobs=-1 (rcdiag.engine.EngineSettings)?")
            results.append(values)
            if on_done is not None:
                on_done(len(response))
    return results


def warm_prefix_cache(llm: Any, prompts: Sequence[Sequence[int]]) -> None:
    """Run each distinct prompt once (one generated token) so its full KV blocks sit in the prefix cache, as
    they do when a rollout engine samples n responses per prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    distinct = list(dict.fromkeys(tuple(int(t) for t in p) for p in prompts))
    if distinct:
        llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in distinct],
                     SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
