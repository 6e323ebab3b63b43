"""Padding-free packing: bin sequences into rows of ≤ token_budget tokens, and map flat results to padded batches.

Vocabulary used throughout: a *flat* tensor holds the tokens of several sequences back to back, `[T, ...]`;
`cu_seqlens` (`[n + 1]`, int, starts at 0, non-decreasing) marks where each sequence starts and ends in it, so
sequence i is `flat[cu_seqlens[i]:cu_seqlens[i + 1]]`. A *padded batch* is `[n, L_max, ...]` plus a bool
attention mask `[n, L_max]` (True on real tokens), with padding on the left or the right.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np
import torch

PaddingSide = Literal["left", "right"]
ArrayT = TypeVar("ArrayT", torch.Tensor, np.ndarray)


# --------------------------------------------------------------------------------------------------- bin packing
def plan_rows(lengths: Sequence[int] | np.ndarray, token_budget: int) -> list[list[int]]:
    """First-fit-decreasing bin packing of sequence lengths into rows of at most `token_budget` tokens.

    Returns rows as lists of sequence indices (longest first within a row). A sequence longer than the budget
    gets a row of its own (the caller warns); zero-length sequences are left out (nothing to compute).
    Empty input gives `[]`; one sequence gives `[[0]]`.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be ≥ 1, got {token_budget}")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    rows: list[list[int]] = []
    free: list[int] = []  # remaining capacity per row
    for index in order.tolist():
        length = int(lengths[index])
        if length <= 0:
            continue
        for r, capacity in enumerate(free):
            if length <= capacity:
                rows[r].append(index)
                free[r] -= length
                break
        else:
            rows.append([index])
            free.append(max(token_budget - length, 0))
    return rows


@dataclass(frozen=True)
class PackedRow:
    """One packed row ready for the model.

    input_ids, position_ids: `[1, T]` int64, positions restart at 0 for each sequence; cu_seqlens: `[k + 1]`
    int32; max_len: longest sequence in the row; seq_index: `[k]` index of each sequence in the caller's list.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_len: int
    seq_index: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack_row(sequences: Sequence[Sequence[int] | np.ndarray], seq_index: Sequence[int]) -> PackedRow:
    """Concatenate the given sequences (token ids) into one row with restarting positions and cu_seqlens."""
    arrays = [np.asarray(sequences[i], dtype=np.int64) for i in seq_index]
    lengths = np.array([a.size for a in arrays], dtype=np.int64)
    cu = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    ids = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    positions = np.arange(ids.size, dtype=np.int64) - np.repeat(cu[:-1], lengths)
    return PackedRow(input_ids=torch.from_numpy(ids)[None], position_ids=torch.from_numpy(positions)[None],
                     cu_seqlens=torch.from_numpy(cu.astype(np.int32)), max_len=int(lengths.max(initial=0)),
                     seq_index=np.asarray(seq_index, dtype=np.int64))


def cu_seqlens_from_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """`[n]` lengths → `[n + 1]` int64 offsets starting at 0 (empty input gives `[0]`)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    cu = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    return cu


def unpack_positions(cu_seqlens: np.ndarray | torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Flat index → (sequence index, position within the sequence), both `[T]` int64."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lengths = np.diff(cu)
    seq = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    pos = np.arange(int(cu[-1]) - int(cu[0]), dtype=np.int64) - np.repeat(cu[:-1] - cu[0], lengths)
    return seq, pos


# --------------------------------------------------------------------------------------------------- padded views
def _batch_index(cu: np.ndarray, padding_side: PaddingSide) -> tuple[np.ndarray, np.ndarray, int]:
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    lengths = np.diff(cu)
    if lengths.size and lengths.min() < 0:
        raise ValueError("cu_seqlens must be non-decreasing")
    width = int(lengths.max(initial=0))
    rows, cols = unpack_positions(cu)
    if padding_side == "left":
        cols = cols + (width - lengths)[rows]
    return rows, cols, width


def pad_to_batch(flat: ArrayT, cu_seqlens: np.ndarray | torch.Tensor, padding_side: PaddingSide = "right",
                 pad_value: float | int = 0) -> tuple[ArrayT, ArrayT]:
    """Flat `[T, ...]` values → padded `[n, L_max, ...]` batch and bool attention mask `[n, L_max]`.

    `flat` is a torch tensor or numpy array (the result has the same kind, dtype and device);
    `flat[cu_seqlens[0]:cu_seqlens[-1]]` is used. Zero sequences give `[0, 0, ...]`; zero-length sequences give
    all-padding rows. `unpad_from_batch` inverts it exactly.
    """
    is_numpy = isinstance(flat, np.ndarray)
    values = torch.from_numpy(flat) if is_numpy else flat
    cu = np.asarray(cu_seqlens.cpu() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens, dtype=np.int64)
    if cu.ndim != 1 or cu.size == 0:
        raise ValueError("cu_seqlens must be a 1-D array with at least one entry (0)")
    rows, cols, width = _batch_index(cu, padding_side)
    n = cu.size - 1
    out = torch.full((n, width, *values.shape[1:]), pad_value, dtype=values.dtype, device=values.device)
    mask = torch.zeros((n, width), dtype=torch.bool, device=values.device)
    r = torch.from_numpy(rows).to(values.device)
    c = torch.from_numpy(cols).to(values.device)
    out[r, c] = values[int(cu[0]):int(cu[-1])]
    mask[r, c] = True
    return (out.numpy(), mask.numpy()) if is_numpy else (out, mask)


def unpad_from_batch(padded: ArrayT, attention_mask: ArrayT) -> tuple[ArrayT, np.ndarray]:
    """Padded `[n, L, ...]` + mask `[n, L]` → flat `[T, ...]` (row-major order of True entries) and cu_seqlens.

    Works for left and right padding (and any mask whose True entries are each row's tokens in order); the
    inverse of `pad_to_batch`. cu_seqlens is `[n + 1]` int64 numpy.
    """
    is_numpy = isinstance(padded, np.ndarray)
    values = torch.from_numpy(padded) if is_numpy else padded
    mask = torch.from_numpy(np.asarray(attention_mask)) if is_numpy else attention_mask
    mask = mask.to(torch.bool)
    if tuple(mask.shape) != tuple(values.shape[:2]):
        raise ValueError(f"attention_mask shape {tuple(mask.shape)} does not match batch {tuple(values.shape[:2])}")
    flat = values[mask]
    cu = cu_seqlens_from_lengths(mask.sum(dim=1).cpu().numpy())
    return (flat.numpy() if is_numpy else flat), cu
