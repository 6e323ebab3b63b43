"""Where the response lies in a dumped sample: trimming batch padding, and splitting prompt + response sequences.

Trainers dump per-token arrays in two layouts (rcdiag.importers.profiles): over the response alone, right-padded in
a batch (TRL, verl), or over the whole prompt + response sequence, where the loss mask marks the response (NeMo-RL,
prime-rl, AReaL, TRL async, OpenRLHF's and ms-swift's arrays over the tail of the ids). `response_span` finds the
[start, end) of the response in the ids; everything before it is the prompt. Masked positions inside the span (tool
and observation tokens of a multi-turn sample) stay in the response with mask 0, as every importer keeps them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Span:
    """The response is ids[start:end]; the per-token arrays start at ids index `offset` (their value j belongs
    to ids[offset + j]); the prompt is ids[prompt_start:start]."""

    prompt_start: int
    start: int
    end: int
    offset: int

    def cut(self, values: np.ndarray | None) -> np.ndarray | None:
        """The response's part of a per-token array aligned at `offset`."""
        return None if values is None else values[self.start - self.offset:self.end - self.offset]


def _last_one(mask: np.ndarray) -> int | None:
    ones = np.flatnonzero(mask != 0)
    return None if ones.size == 0 else int(ones[-1]) + 1


def response_span(n_ids: int, mask: np.ndarray | None, *, layout: str, padded: bool,
                  n_values: int | None = None, valid: np.ndarray | None = None,
                  length: int | None = None) -> Span:
    """The response span of one sample.

    `n_ids`: the number of ids; `mask`: the loss mask aligned with the per-token arrays (None: no mask);
    `n_values`: the per-token arrays' length (sequence layout: they cover the last `n_values` ids); `valid`: an
    attention mask over the ids (0 = padding, left or right); `length`: the true response length where the dump
    records it (NeMo-RL `input_lengths` gives the true sequence length instead: pass it as `valid`).

    Response layout: the response is every id, less right padding — past `length`, past the attention mask, or
    (a padded batch row) past the last mask-1 position; a padded row whose mask is all 0 (an empty completion, or
    one TRL's `mask_truncated_completions` zeroed) has an empty response: its tokens count for nothing either way.
    Sequence layout: the response starts at the first mask-1
    position and ends at the last valid id (the last mask-1 position + 1 in a padded batch without an attention
    mask); a sequence without a mask-1 position has an empty response and is all prompt.
    """
    offset = n_ids - (n_ids if n_values is None else n_values)
    lo, hi = 0, n_ids
    if valid is not None:
        where = np.flatnonzero(valid != 0)
        lo, hi = (int(where[0]), int(where[-1]) + 1) if where.size else (0, 0)
    if layout == "response":
        end = hi if valid is not None else n_ids
        if length is not None:
            end = min(length, n_ids)
        elif valid is None and padded and mask is not None:
            end = _last_one(mask) or 0
        return Span(prompt_start=0, start=0, end=end, offset=0)
    if mask is None:
        return Span(prompt_start=lo, start=hi, end=hi, offset=offset)
    in_range = mask[max(lo - offset, 0):max(hi - offset, 0)]
    first = np.flatnonzero(in_range != 0)
    if first.size == 0:
        return Span(prompt_start=lo, start=hi, end=hi, offset=offset)
    start = max(lo, offset) + int(first[0])
    end = hi
    if valid is None and padded:
        end = offset + (_last_one(mask) or 0)
    return Span(prompt_start=lo, start=start, end=max(end, start), offset=offset)
