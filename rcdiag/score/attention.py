"""Attention implementations for packed rows, chosen by name (`--attn`), that never attend across sequences.

Every implementation receives one packed row `[1, T]` with position ids restarting at 0 per sequence and the
`cu_seq_lens_q/k`, `max_length_q/k` keyword arguments, and never a 2-D attention mask (see
docs/design.md, "Padding-free rescoring": with a 2-D mask or a KV cache transformers silently turns packed detection off).

- `sdpa_varlen` (rcdiag's own, registered with transformers' AttentionInterface): one causal SDPA call per
  sequence, read from `cu_seq_lens_q`; no T×T mask is built. Bit-identical to one-at-a-time scoring; fastest on CPU.
- `flash_attention_2`: flash-attention varlen kernels (GPU with the `flash-attn` package).
- `sdpa`, `eager`, `flex_attention`: transformers' own packed-sequence detection from position ids (sdpa/eager
  build a dense T×T mask per row — keep the token budget small; flex compiles on first use).
"""
from __future__ import annotations

import importlib.util
from typing import Any

import torch

from rcdiag.errors import ConfigError
from rcdiag.score.config import ATTENTION, ATTN_CHOICES, SDPA_VARLEN


def sdpa_varlen_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        cu_seq_lens_q: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention within each packed sequence. query `[B, H, T, D]`, key/value `[B, H_kv, T, D]`.

    Sequence boundaries come from `cu_seq_lens_q` (`[k + 1]`); without it each batch row counts as one sequence
    (correct for unpadded batches only — padded batches are refused, since this function ignores masks).
    Returns `[B, T, H, D]` and no attention weights.
    """
    if getattr(module, "sliding_window", None):
        raise ConfigError("sdpa_varlen does not implement sliding-window attention; use --attn sdpa")
    if attention_mask is not None:
        raise ConfigError("sdpa_varlen takes packed rows without an attention mask; use --attn sdpa for "
                          "padded batches")
    gqa = query.shape[1] != key.shape[1]
    bounds = [0, query.shape[2]] if cu_seq_lens_q is None else cu_seq_lens_q.tolist()

    def causal(start: int, end: int) -> torch.Tensor:  # [B, end − start, H, D]
        return torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], is_causal=True, scale=scaling,
            enable_gqa=gqa).transpose(1, 2)

    if len(bounds) == 2:  # one sequence: the kernel's output is already laid out [B, T, H, D]
        return causal(*bounds).contiguous(), None
    # written straight into the [B, T, H, D] result (no [B, H, T, D] buffer and transposed copy per layer)
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])
    for start, end in zip(bounds[:-1], bounds[1:], strict=False):
        if end > start:
            out[:, start:end] = causal(start, end)
    return out, None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """Mask builder for sdpa_varlen: never builds a mask (boundaries come from cu_seqlens)."""
    return None


def ensure_registered() -> None:
    """Register `sdpa_varlen` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_forward)
    AttentionMaskInterface.register(SDPA_VARLEN, _no_mask)


def varlen_unsupported(config: Any) -> str | None:
    """Why sdpa_varlen cannot run this model config (sliding windows, logit soft-capping), or None."""
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return "the model uses sliding-window attention"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "the model uses sliding-window attention"
    if getattr(config, "attn_logit_softcapping", None):
        return "the model soft-caps attention logits"
    return None


def resolve_attention(requested: str, device: str, config: Any = None) -> str:
    """The attention implementation to load: `auto` → flash_attention_2 on CUDA when installed, else sdpa_varlen
    (or native sdpa when the model needs features sdpa_varlen lacks). Raises ConfigError for impossible choices."""
    if requested not in ATTN_CHOICES:
        raise ConfigError(f"unknown attention implementation {requested!r}; choose one of {', '.join(ATTN_CHOICES)}")
    kind = torch.device(device).type
    if requested == "auto":
        spec = ATTENTION["flash_attention_2"]
        if kind in spec.devices and importlib.util.find_spec(spec.requires or "") is not None:
            return spec.name
        return "sdpa" if config is not None and varlen_unsupported(config) else SDPA_VARLEN
    spec = ATTENTION[requested]
    if kind not in spec.devices:
        raise ConfigError(f"--attn {requested} runs on {'/'.join(spec.devices)} only, not on device {device!r}; "
                          "use --attn auto")
    if spec.requires and importlib.util.find_spec(spec.requires) is None:
        raise ConfigError(f"--attn {requested} needs the '{spec.requires}' package, which is not installed; "
                          "use --attn auto")
    reason = varlen_unsupported(config) if config is not None and requested == SDPA_VARLEN else None
    if reason:
        raise ConfigError(f"--attn sdpa_varlen cannot run this model: {reason}; use --attn sdpa")
    return spec.name


def packed_kwargs(cu_seqlens: torch.Tensor, max_len: int, device: torch.device | str) -> dict[str, Any]:
    """The keyword arguments a packed row's forward needs besides ids and positions (same for every impl)."""
    cu = cu_seqlens.to(device=device, dtype=torch.int32)
    return {"use_cache": False, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": int(max_len),
            "max_length_k": int(max_len)}
