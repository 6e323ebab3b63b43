"""Chunked LM-head log-probs and entropy against a float64 full-logits reference, on random and extreme inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rcdiag.score.logprobs import (
    choose_epilogue,
    chunked_logprobs,
    compiled_epilogue,
    epilogue_inplace,
    logit_transform,
)


class RecordingHead(torch.nn.Linear):
    """A real linear LM head that remembers the most rows it was given at once."""

    max_rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.max_rows = max(self.max_rows, x.shape[0])
        return super().forward(x)


def _case(n: int, vocab: int, scale: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    head = RecordingHead(32, vocab, bias=True)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, 32, generator=gen) * scale)
        head.bias.copy_(torch.randn(vocab, generator=gen))
    hidden = torch.randn(n, 32, generator=gen)
    with torch.no_grad():
        logits = hidden.double() @ head.weight.double().T + head.bias.double()
        targets = torch.randint(0, vocab, (n,), generator=gen)
    targets[0], targets[-1] = logits[0].argmax(), logits[-1].argmin()  # the likeliest and the least likely token
    return hidden, head, targets, logits


def _reference(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    logp = torch.log_softmax(logits / temperature, -1)
    return logp.gather(-1, targets[:, None])[:, 0].numpy(), (-(logp.exp() * logp).sum(-1)).numpy()


def _rounding_bound(hidden, head, temperature: float = 1.0) -> np.ndarray:
    """Per-row float32 rounding bound of the logits: 8·eps32·max_v(Σ|h·w| + |b|) / temperature."""
    with torch.no_grad():
        magnitude = hidden.abs().double() @ head.weight.abs().double().T + head.bias.abs().double()
    return (8 * 2.0**-24 * magnitude.max(-1).values / temperature).numpy()


def _assert_close(got: torch.Tensor, want: np.ndarray, what: str, bound: np.ndarray | float = 0.0) -> None:
    """|got − want| ≤ 2e-6·(1 + |want|) + bound (the logits' own float32 rounding)."""
    err = np.abs(got.numpy().astype(np.float64) - want) - 2e-6 * (1.0 + np.abs(want)) - bound
    i = int(err.argmax())
    assert err.max() <= 0, f"{what}: error exceeds the float32 bound by {err[i]:.3g} at {i} (want {want[i]})"


@pytest.mark.parametrize("scale, temperature", [(0.05, 1.0), (1.0, 0.7), (8.0, 1.0), (8.0, 2.5)])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_matches_float64_full_logits(scale, temperature, chunk) -> None:
    """scale 8 gives logits of ±hundreds (near one-hot softmax, log p of the least likely token ≈ −1000)."""
    hidden, head, targets, logits = _case(64, 500, scale)
    logp, entropy = chunked_logprobs(hidden, head, targets, temperature=temperature, chunk_tokens=chunk)
    want_lp, want_ent = _reference(logits, targets, temperature)
    assert logp.dtype == torch.float32 and entropy.dtype == torch.float32
    bound = _rounding_bound(hidden, head, temperature)
    _assert_close(logp, want_lp, "logprob", bound)
    _assert_close(entropy, want_ent, "entropy", bound)
    assert head.max_rows == min(chunk, 64), "the LM head saw more rows than one chunk"
    if scale == 8.0 and temperature == 1.0:
        assert want_lp[-1] < -100 and want_ent.min() < 1e-3  # the extreme case really is extreme


@pytest.mark.slow
def test_compiled_epilogue_matches_eager() -> None:
    """The torch.compile'd epilogue (used for large CPU workloads) agrees with float64; compiling takes 5–40 s."""
    assert choose_epilogue(1000, 32_000, "cpu")[0] == "eager"  # small: the compile would not pay off
    assert choose_epilogue(10**6, 150_000, "cuda")[0] == "eager"
    name, fn = choose_epilogue(10**6, 150_000, "cpu")
    assert name == "compiled" and fn is compiled_epilogue()
    logits = torch.randn(37, 3000) * 4
    targets = torch.randint(0, 3000, (37,))
    want_lp, want_ent = _reference(logits.double(), targets, 1.0)
    got = compiled_epilogue()(logits.clone(), targets)
    eager = epilogue_inplace(logits.clone(), targets)
    for pair in (got, eager):
        _assert_close(pair[0], want_lp, "logprob")
        _assert_close(pair[1], want_ent, "entropy")


def test_logit_transform_soft_caps_and_scales() -> None:
    class Config:
        logit_scale = 0.5
        final_logit_softcapping = 30.0

    hidden, head, targets, logits = _case(16, 200, 8.0)
    transform = logit_transform(Config())
    logp, _ = chunked_logprobs(hidden, head, targets, chunk_tokens=5, transform=transform)
    capped = torch.tanh(logits * 0.5 / 30.0) * 30.0
    _assert_close(logp, _reference(capped, targets, 1.0)[0], "capped logprob", _rounding_bound(hidden, head))
    assert logit_transform(object()) is None


def test_empty_and_invalid() -> None:
    head = torch.nn.Linear(4, 10)
    logp, entropy = chunked_logprobs(torch.zeros(0, 4), head, torch.zeros(0, dtype=torch.long))
    assert logp.shape == (0,) and entropy.shape == (0,)
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_logprobs(torch.zeros(1, 4), head, torch.zeros(1, dtype=torch.long), chunk_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs(torch.zeros(1, 4), head, torch.zeros(1, dtype=torch.long), temperature=0.0)
