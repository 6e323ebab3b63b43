"""Log-prob of the sampled token and entropy from final hidden states, with the LM head applied chunk by chunk.

Never materialises the float32 `[tokens × vocab]` logits of a whole row: only `[chunk_tokens × vocab]` at a time
(plus one same-sized buffer in the epilogue), so peak memory is bounded by the chunk, not by row length × vocab.
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

Epilogue = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def epilogue_inplace(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits `[C, V]` float32 (overwritten), targets `[C]` int64 → (log p(target) `[C]`, entropy `[C]`).

    Shifts each row by its maximum in place (z ≤ 0), exponentiates once into one extra `[C, V]` buffer, and takes
    log p(t) = z_t − log S and H = log S − Σ e·z / S from S = Σ e. Six passes over the logits and no other
    `[C, V]` temporary: logsumexp, then exp(log p) for the entropy, made nine passes and two allocations, ~1.6×
    the time at V = 49k. Both entropy terms are ≥ 0, so nothing cancels (the old −Σ p·log p summed terms of
    mixed size; this one is closer to float64). Empty input gives two empty tensors.
    """
    return _epilogue_terms(logits.sub_(logits.amax(-1, keepdim=True)), targets, inplace=True)


def _epilogue_terms(shifted: torch.Tensor, targets: torch.Tensor, *, inplace: bool,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy) from max-shifted logits z: the one formula of the eager and compiled epilogues."""
    e = torch.exp(shifted)
    total = e.sum(-1)
    dot = (e.mul_(shifted) if inplace else e * shifted).sum(-1)
    log_total = torch.log(total)
    return shifted.gather(-1, targets[:, None])[:, 0] - log_total, log_total - dot / total


def _epilogue_functional(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _epilogue_terms(logits - logits.amax(-1, keepdim=True), targets, inplace=False)


@functools.cache
def compiled_epilogue() -> Epilogue:
    """The epilogue fused by torch.compile (two passes over the logits; 3.5× faster than the eager one at
    V = 49k on 2 CPU threads; compiles on first call)."""
    return torch.compile(_epilogue_functional, dynamic=True)


COMPILE_MIN_ELEMENTS = 2_000_000_000
"""Compile the epilogue only when tokens × vocab reaches this. The compile costs 4–17 s on 2 CPU cores (idle vs
heavily loaded); on a 1024 × 49k chunk the eager epilogue takes ~150 ms of CPU per thread and the compiled one
~42 ms, i.e. compiling saves ≈2e-9 s per element (measured, 2 threads, benchmarks/bench_rescore.py): break-even at
2e9–8e9 elements (it was 1e9 against the slower eager epilogue before)."""


def choose_epilogue(n_tokens: int, vocab_size: int, device: str) -> tuple[str, Epilogue]:
    """("compiled" | "eager", epilogue) for scoring `n_tokens` positions over `vocab_size` logits.

    Compiled on CPU for large workloads, after a warm-up call that proves the compiler works (a missing C
    compiler falls back to eager with a warning); eager otherwise.
    """
    if device == "auto":
        from rcdiag.score.devices import resolve_device

        device = resolve_device(device)
    if torch.device(device).type != "cpu" or n_tokens * vocab_size < COMPILE_MIN_ELEMENTS:
        return "eager", epilogue_inplace
    fn = compiled_epilogue()
    try:
        fn(torch.zeros(2, vocab_size), torch.zeros(2, dtype=torch.int64))
    except Exception as exc:  # noqa: BLE001 - any compiler failure means "use eager"
        warnings.warn(f"torch.compile of the log-prob epilogue failed ({type(exc).__name__}: {exc}); using the "
                      "eager epilogue (slower, same results)", stacklevel=2)
        return "eager", epilogue_inplace
    return "compiled", fn


def logit_transform(config: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """Extra logit processing some architectures do after the LM head (Cohere `logit_scale`, Gemma-2
    `final_logit_softcapping`), applied in float32 before the temperature; None for plain heads (Qwen, Llama)."""
    scale = getattr(config, "logit_scale", None)
    cap = getattr(config, "final_logit_softcapping", None)
    if not scale and not cap:
        return None

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if scale:
            logits = logits * scale
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform


@torch.no_grad()
def chunked_logprobs(hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, *,
                     temperature: float = 1.0, chunk_tokens: int = 1024, epilogue: Epilogue = epilogue_inplace,
                     transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                     on_logits: Callable[[int, int, torch.Tensor], None] | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log p(target) and entropy of softmax(lm_head(hidden) / temperature).

    hidden `[N, H]` (model dtype) holds the final hidden state of the position *before* each target; targets
    `[N]` int64. The LM head runs on `chunk_tokens` rows at a time, its output is cast to float32, transformed,
    divided by `temperature`, and reduced by `epilogue`. `on_logits(start, stop, logits)` sees each chunk's
    float32 `[stop − start, V]` logits at the temperature before the epilogue overwrites them (the probe's exact
    divergences read whole distributions there). Returns two float32 `[N]` tensors on hidden's device (empty
    for N = 0).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be ≥ 1, got {chunk_tokens}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    n = hidden.shape[0]
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    entropy = torch.empty(n, dtype=torch.float32, device=hidden.device)
    targets = targets.to(device=hidden.device, dtype=torch.int64)
    for start in range(0, n, chunk_tokens):
        stop = min(start + chunk_tokens, n)
        logits = lm_head(hidden[start:stop]).float()
        if transform is not None:
            logits = transform(logits)
        if temperature != 1.0:
            logits.div_(temperature)
        if on_logits is not None:
            on_logits(start, stop, logits)
        logp[start:stop], entropy[start:stop] = epilogue(logits, targets[start:stop])
        del logits
    return logp, entropy
