"""Score token sequences with a transformers causal LM, padding-free: load the model, pack, forward, gather.

The public entry points are `load_model` and `score_sequences`; `rescore.py` applies them to a run directory, and
API users can call them on their own (prompt ids, response ids) pairs::

    model = load_model("sample_data/tiny-model", dtype="float32")
    scored = score_sequences(model, [([1, 5, 9], [17, 3]), ([1, 4], [8])], temperature=0.7)
    scored.logprobs        # float32 [3]: log p of 17, 3, 8 — response tokens back to back
    scored.padded("left")  # ([2, 2] logprobs, [2, 2] entropies, [2, 2] mask) for trainer-style tensors
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rcdiag.errors import ConfigError, InputError
from rcdiag.score.attention import ensure_registered, packed_kwargs, resolve_attention
from rcdiag.score.devices import resolve_device, torch_dtype
from rcdiag.score.engine import context_from_config
from rcdiag.score.logprobs import Epilogue, chunked_logprobs, epilogue_inplace, logit_transform
from rcdiag.score.packing import PaddingSide, cu_seqlens_from_lengths, pack_row, pad_to_batch, plan_rows

if TYPE_CHECKING:
    from rcdiag.score.routes import RouteHooks


class RescoreWarning(UserWarning):
    """Something the user should know about the rescoring (oversized rows, defaulted temperature…)."""


# --------------------------------------------------------------------------------------------------- loading
def load_config(path: str | Path, *, trust_remote_code: bool = False) -> Any:
    """The model's transformers config; ConfigError when `path` is not a local model directory."""
    from transformers import AutoConfig

    if not (Path(path) / "config.json").is_file():
        raise ConfigError(f"{path}: not a model directory (no config.json); pass --train-model with the path of "
                          "a transformers checkpoint (config.json + *.safetensors)")
    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the model config ({exc})") from None


def load_model(path: str | Path, *, dtype: str = "float32", device: str = "auto", attn: str = "auto",
               trust_remote_code: bool = False) -> Any:
    """Load a causal LM for scoring: safetensors only, `dtype` weights, eval mode, `use_cache=False`.

    `attn` is a name from `rcdiag.score.attention.ATTN_CHOICES`; the implementation actually used is
    `model.config._attn_implementation`. `device` auto: cuda when available. Raises ConfigError on a bad path, dtype, device or attention choice.
    """
    from transformers import AutoModelForCausalLM

    torch_type = torch_dtype(dtype)
    device = resolve_device(device)
    resolve_attention(attn, device)  # refuse an impossible choice before touching the disk
    config = load_config(path, trust_remote_code=trust_remote_code)
    impl = resolve_attention(attn, device, config)
    ensure_registered()
    if not list(Path(path).glob("*.safetensors")):
        raise ConfigError(f"{path}: no *.safetensors weights (rcdiag never loads pickled .bin weights)")
    try:
        # use_kernels=False: transformers ≥ 5.2x would otherwise fetch layer kernels from the hub (and refuses to
        # load without the `kernels` package); rcdiag loads nothing from a hub and scores the model's own code
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_type, attn_implementation=impl,
                                                     use_safetensors=True, trust_remote_code=trust_remote_code,
                                                     use_kernels=False)
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"{path}: cannot load the model with attention {impl!r} ({exc})") from None
    model.config.use_cache = False
    return model.to(device).eval()


def attention_used(model: Any) -> str:
    """The attention implementation the loaded model runs."""
    return str(model.config._attn_implementation)


# --------------------------------------------------------------------------------------------------- checks
def check_sequence(prompt: np.ndarray, response: np.ndarray, *, vocab_size: int, max_context: int | None,
                   source: str = "sequences", row: int | None = None) -> None:
    """Refuse a (prompt, response) pair the model cannot score: empty prompt before a response, token ids
    outside [0, vocab_size), or more than `max_context` input tokens (InputError naming source and row)."""
    if response.size and prompt.size == 0:
        raise InputError("empty prompt: the first response token has no context to be scored from",
                         file=source, row=row, field="prompt_token_ids",
                         hint="rescoring needs the prompt token ids (with BOS/chat template) the engine saw")
    for name, ids in (("prompt_token_ids", prompt), ("token_id", response)):
        bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
        if bad.size:
            raise InputError(f"token id {int(ids[bad[0]])} at index {int(bad[0])} is outside the model's vocabulary "
                             f"[0, {vocab_size})", file=source, row=row, field=name,
                             hint="was the run generated with a different tokenizer than --train-model?")
    length = prompt.size + response.size - 1
    if max_context is not None and length > max_context:
        raise InputError(f"sequence needs {length} positions but the model's context is {max_context} "
                         "(max_position_embeddings)", file=source, row=row, field="prompt_len",
                         hint="rescore with a model of longer context, or drop the over-long sequences")


def model_limits(config: Any) -> tuple[int, int | None]:
    """(vocab_size, max_position_embeddings or None) of a transformers config (engine.context_from_config)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size), context_from_config(config)


# --------------------------------------------------------------------------------------------------- scoring
@dataclass(frozen=True)
class ScoredTokens:
    """Flat per-response-token results: logprobs, entropies `[N]` float32; cu_seqlens `[n + 1]` int64 (response
    tokens of sequence i are `[cu_seqlens[i], cu_seqlens[i + 1])`; empty responses have zero length)."""

    logprobs: np.ndarray
    entropies: np.ndarray
    cu_seqlens: np.ndarray

    def per_sequence(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(logprobs, entropies) of each sequence."""
        bounds = zip(self.cu_seqlens[:-1], self.cu_seqlens[1:], strict=True)
        return [(self.logprobs[s:e], self.entropies[s:e]) for s, e in bounds]

    def padded(self, padding_side: PaddingSide = "right", pad_value: float = 0.0,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """([n, R_max] logprobs, [n, R_max] entropies, [n, R_max] bool mask), padded on `padding_side`."""
        logprobs, mask = pad_to_batch(self.logprobs, self.cu_seqlens, padding_side, pad_value)
        entropies, _ = pad_to_batch(self.entropies, self.cu_seqlens, padding_side, pad_value)
        return logprobs, entropies, mask


def _row_gather(row_seqs: np.ndarray, row_cu: np.ndarray, prompt_lens: np.ndarray, out_cu: np.ndarray,
                ) -> tuple[np.ndarray, np.ndarray]:
    """For a packed row: indices into the row of the hidden states that predict each response token, and the
    destination of each in the flat output."""
    response_lens = out_cu[row_seqs + 1] - out_cu[row_seqs]
    first = row_cu[:-1] + prompt_lens[row_seqs] - 1  # hidden state before the first response token
    rel = np.arange(int(response_lens.sum())) - np.repeat(cu_seqlens_from_lengths(response_lens)[:-1],
                                                           response_lens)
    source = np.repeat(first, response_lens) + rel
    dest = np.repeat(out_cu[row_seqs], response_lens) + rel
    return source, dest


@torch.inference_mode()
def score_sequences(model: Any, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                    temperature: float = 1.0, token_budget: int = 4096, chunk_tokens: int = 1024,
                    epilogue: Epilogue = epilogue_inplace, on_row: Callable[[int], None] | None = None,
                    source: str = "sequences",
                    on_logits: Callable[[np.ndarray, torch.Tensor], None] | None = None,
                    routes: RouteHooks | None = None) -> ScoredTokens:
    """Log-prob and entropy of every response token under `model`, from packed rows of ≤ token_budget tokens.

    `sequences` holds (prompt ids, response ids) pairs; the model input is prompt + response[:-1] (the last
    response token needs no hidden state after it), and response token t is scored from the position before
    it, with logits divided by `temperature`. `on_row(n_tokens)` is called after each row; `on_logits(indices,
    logits)` with each LM-head chunk's float32 logits at the temperature and the flat output index of each of its
    rows (rcdiag.score.logprobs.chunked_logprobs). An empty list gives
    empty arrays and cu_seqlens `[0]`; pairs with an empty response contribute nothing.
    """
    vocab_size, max_context = model_limits(model.config)
    prompts = [np.asarray(p, dtype=np.int64) for p, _ in sequences]
    responses = [np.asarray(r, dtype=np.int64) for _, r in sequences]
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        check_sequence(prompt, response, vocab_size=vocab_size, max_context=max_context, source=source, row=i + 1)
    out_cu = cu_seqlens_from_lengths([r.size for r in responses])
    prompt_lens = np.array([p.size for p in prompts], dtype=np.int64)
    inputs = [np.concatenate([p, r[:-1]]) if r.size else p[:0] for p, r in zip(prompts, responses, strict=True)]
    rows = plan_rows([x.size for x in inputs], token_budget)
    oversized = [i for row in rows for i in row if inputs[i].size > token_budget]
    if oversized:
        warnings.warn(f"{len(oversized)} sequence(s) exceed the token budget {token_budget} (longest "
                      f"{max(inputs[i].size for i in oversized)} tokens) and get a row of their own; raise "
                      "--token-budget if memory allows", RescoreWarning, stacklevel=2)
    logprobs = np.empty(int(out_cu[-1]), dtype=np.float32)
    entropies = np.empty_like(logprobs)
    all_targets = np.concatenate(responses) if responses else np.zeros(0, dtype=np.int64)
    base, head, transform = model.base_model, model.get_output_embeddings(), logit_transform(model.config)
    device = model.device
    if routes is not None:
        routes.start(logprobs.size)
    for row in rows:
        packed = pack_row(inputs, row)
        if routes is not None:
            routes.begin_row(packed.seq_index, np.diff(packed.cu_seqlens.numpy()))
        hidden = base(input_ids=packed.input_ids.to(device), position_ids=packed.position_ids.to(device),
                      **packed_kwargs(packed.cu_seqlens, packed.max_len, device)).last_hidden_state[0]
        src, dest = _row_gather(packed.seq_index, packed.cu_seqlens.numpy().astype(np.int64), prompt_lens, out_cu)
        if routes is not None:
            routes.end_row(src, dest)
        targets = torch.from_numpy(all_targets[dest])
        hook = None if on_logits is None else (
            lambda start, stop, logits, dest=dest: on_logits(dest[start:stop], logits))
        lp, ent = chunked_logprobs(hidden[torch.from_numpy(src).to(device)], head, targets,
                                   temperature=temperature, chunk_tokens=chunk_tokens, epilogue=epilogue,
                                   transform=transform, on_logits=hook)
        logprobs[dest], entropies[dest] = lp.cpu().numpy(), ent.cpu().numpy()
        if on_row is not None:
            on_row(packed.num_tokens)
    return ScoredTokens(logprobs=logprobs, entropies=entropies, cu_seqlens=out_cu)
