"""Engine-side replays of the probe: batched, one request at a time, and against a cached prompt (prefix caching).

Plain replays go through `rcdiag.score.replay.replay_logprobs` (prompt + response sent as a prompt with
`max_tokens=1` and prompt log-probs; RAW log-probs rescaled to log_softmax(raw / T)). This module adds what the
probe needs on top: bounded request batches (full-vocabulary prompt log-probs at T ≠ 1 are large), a batch of one
per request (batch invariance), and scoring against a prompt KV read from the prefix cache — vLLM skips *reading*
the cache for prompt-log-prob requests, so `replay_cached` turns reading back on, recovers the response tokens'
log-probs from the computed tail, and counts the cache hits.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rcdiag.score.replay import position_logprob

Pair = tuple[Sequence[int], Sequence[int]]
REQUESTS_PER_CALL = 32
"""Sequences per `llm.generate` call: bounds the memory of full-vocabulary prompt log-probs."""


def replay_pairs(llm: Any, pairs: Sequence[Pair], temperature: float, *, one_at_a_time: bool = False,
                 on_done: Callable[[int], None] | None = None) -> list[np.ndarray]:
    """float64 `[R_i]` log-probs at `temperature` of each response, `REQUESTS_PER_CALL` sequences per engine call
    (or one: `one_at_a_time`, a batch of one, the engine-side batch-invariance probe). Empty list → []."""
    from rcdiag.score.replay import replay_logprobs

    step = 1 if one_at_a_time else REQUESTS_PER_CALL
    out: list[np.ndarray] = []
    for start in range(0, len(pairs), step):
        chunk = pairs[start:start + step]
        out += replay_logprobs(llm, [p for p, _ in chunk], [r for _, r in chunk], temperature)
        if on_done is not None:
            on_done(sum(len(r) for _, r in chunk))
    return out


def response_logprobs(prompt_logprobs: list[Any] | None, prompt: Sequence[int], response: Sequence[int],
                      temperature: float) -> np.ndarray | None:
    """float64 `[R]` log-probs of the response tokens from one request's prompt log-probs (a list over the
    *computed* positions: those read from the prefix cache are missing from the front); None when a response
    position was not computed or its token is missing. Empty response: `[]`."""

    entries = list(prompt_logprobs or [])
    offset = len(prompt) + len(response) - len(entries)
    out = np.empty(len(response), dtype=np.float64)
    for j, token in enumerate(response):
        index = len(prompt) + j - offset
        if index < 0 or entries[index] is None or int(token) not in entries[index]:
            return None
        out[j] = position_logprob(entries[index], int(token), temperature)
    return out


def replay_cached(llm: Any, pairs: Sequence[Pair], temperature: float, *,
                  on_done: Callable[[int], None] | None = None, stats: dict[str, int] | None = None,
                  ) -> list[np.ndarray]:
    """Cache every distinct prompt, then replay prompt + response reading the prefix cache, so the responses
    attend to prompt KV computed in another batch (as n samples per prompt do in a rollout). A sequence whose
    response reached into the cache is re-asked without reading it. `stats` accumulates `tokens` and
    `cached_tokens` (vLLM's num_cached_tokens; 0 when prompts are shorter than a KV block)."""
    from vllm import SamplingParams

    _generate(llm, list(dict.fromkeys(tuple(int(t) for t in p) for p, _ in pairs)), SamplingParams(max_tokens=1, detokenize=False))
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0 if temperature == 1.0 else -1,
                            skip_reading_prefix_cache=False, detokenize=False)  # cached ids come back as -1
    out: list[np.ndarray] = []
    for start in range(0, len(pairs), REQUESTS_PER_CALL):
        chunk = pairs[start:start + REQUESTS_PER_CALL]
        outputs = _generate(llm, [(*map(int, p), *map(int, r)) for p, r in chunk], params)
        for (prompt, response), output in zip(chunk, outputs, strict=True):
            values = response_logprobs(output.prompt_logprobs, prompt, response, temperature)
            if values is None:
                values = replay_pairs(llm, [(prompt, response)], temperature)[0]
            out.append(values)
            if stats is not None:
                stats["tokens"] = stats.get("tokens", 0) + len(prompt) + len(response)
                stats["cached_tokens"] = stats.get("cached_tokens", 0) + int(output.num_cached_tokens or 0)
        if on_done is not None:
            on_done(sum(len(r) for _, r in chunk))
    return out


def _generate(llm: Any, sequences: Sequence[tuple[int, ...]], params: Any) -> list[Any]:
    if not sequences:
        return []
    return llm.generate([{"prompt_token_ids": list(s)} for s in sequences], params, use_tqdm=False)


def replay_distributions(llm: Any, pairs: Sequence[Pair], positions: Sequence[np.ndarray], temperature: float,
                         out: np.ndarray, *, on_done: Callable[[int], None] | None = None) -> None:
    """Fill `out` (`[K, V]` float32, K = total len(positions)) with the engine's full next-token log-probs at
    `temperature` — log_softmax(raw / T) over the whole vocabulary — at the given response positions of each
    pair (indices into its response, in order; pairs with no position are not sent).

    vLLM returns prompt log-probs raw; with `flat_logprobs` they come as flat lists (a constant number of Python
    objects whatever V), and `detokenize=False` spares decoding V strings per position."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=-1, flat_logprobs=True, detokenize=False)
    vocab = out.shape[1]
    row = 0
    todo = [(pair, np.asarray(p, np.int64)) for pair, p in zip(pairs, positions, strict=True) if len(p)]
    for start in range(len(todo)):  # one request per call: V entries per position come back as Python lists
        chunk = todo[start:start + 1]  # (8 requests of ~200 positions at V = 49k held 7 GB)
        outputs = _generate(llm, [(*map(int, p), *map(int, r)) for (p, r), _ in chunk], params)
        for ((prompt, _), wanted), output in zip(chunk, outputs, strict=True):
            flat = output.prompt_logprobs
            ids, values = np.asarray(flat.token_ids, np.int64), np.asarray(flat.logprobs, np.float64)
            starts, ends = flat.start_indices, flat.end_indices
            for j in wanted:
                q = len(prompt) + int(j)
                raw = np.full(vocab, -np.inf)
                sel = slice(starts[q], ends[q])
                keep = ids[sel] < vocab
                raw[ids[sel][keep]] = values[sel][keep]
                z = raw / temperature
                top = z.max()
                out[row] = z - top - np.log(np.exp(z - top).sum())
                row += 1
        if on_done is not None:
            on_done(sum(len(w) for _, w in chunk))
