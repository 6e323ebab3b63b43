"""Packing and padded-batch mapping: bin packing invariants, restarting positions, exact pad/unpad round trips."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rcdiag.score.packing import (
    cu_seqlens_from_lengths,
    pack_row,
    pad_to_batch,
    plan_rows,
    unpack_positions,
    unpad_from_batch,
)

lengths_st = st.lists(st.integers(0, 50), max_size=40)


@given(lengths_st, st.integers(1, 64))
@settings(max_examples=200, deadline=None)
def test_plan_rows_places_every_sequence_once_within_budget(lengths: list[int], budget: int) -> None:
    """Guards against lost/duplicated sequences and overfull rows (a row over budget would blow memory)."""
    rows = plan_rows(lengths, budget)
    placed = sorted(i for row in rows for i in row)
    assert placed == [i for i, n in enumerate(lengths) if n > 0]
    for row in rows:
        total = sum(lengths[i] for i in row)
        assert total <= budget or len(row) == 1, (row, total, budget)
    # first-fit decreasing never leaves two rows that could be merged when both are at most half full
    loads = [sum(lengths[i] for i in row) for row in rows]
    assert sum(1 for load in loads if 2 * load <= budget) <= 1, loads


def test_plan_rows_oversized_and_empty() -> None:
    assert plan_rows([], 8) == []
    assert plan_rows([0, 0], 8) == []
    assert plan_rows([5], 8) == [[0]]
    assert plan_rows([3, 20, 5, 8], 8) == [[1], [3], [2, 0]]  # 20 alone (over budget), 8 fills a row, 5 + 3
    with pytest.raises(ValueError):
        plan_rows([1], 0)


def test_pack_row_positions_restart_and_cu_seqlens() -> None:
    seqs = [[7, 8, 9], [1], [4, 5]]
    packed = pack_row(seqs, [2, 0, 1])
    assert packed.input_ids.tolist() == [[4, 5, 7, 8, 9, 1]]
    assert packed.position_ids.tolist() == [[0, 1, 0, 1, 2, 0]]
    assert packed.cu_seqlens.tolist() == [0, 2, 5, 6] and packed.cu_seqlens.dtype == torch.int32
    assert packed.max_len == 3 and packed.num_tokens == 6 and packed.seq_index.tolist() == [2, 0, 1]


def test_unpack_positions() -> None:
    seq, pos = unpack_positions(np.array([0, 2, 2, 5]))
    assert seq.tolist() == [0, 0, 2, 2, 2] and pos.tolist() == [0, 1, 0, 1, 2]
    seq, pos = unpack_positions(np.array([0]))
    assert seq.size == 0 and pos.size == 0


def _naive_pad(flat: np.ndarray, lengths: list[int], side: str, pad: float) -> tuple[np.ndarray, np.ndarray]:
    width = max(lengths, default=0)
    out = np.full((len(lengths), width, *flat.shape[1:]), pad, dtype=flat.dtype)
    mask = np.zeros((len(lengths), width), dtype=bool)
    start = 0
    for i, n in enumerate(lengths):
        cols = slice(width - n, width) if side == "left" else slice(0, n)
        out[i, cols], mask[i, cols] = flat[start:start + n], True
        start += n
    return out, mask


@given(lengths_st, st.sampled_from(["left", "right"]), st.integers(0, 2), st.booleans())
@settings(max_examples=200, deadline=None)
def test_pad_to_batch_matches_loop_and_round_trips(lengths: list[int], side: str, extra_dims: int,
                                                   as_torch: bool) -> None:
    """Exact inverse pair, for numpy and torch, with trailing feature dims; checked against a Python loop."""
    rng = np.random.default_rng(len(lengths))
    flat = rng.normal(size=(sum(lengths), *([3] * extra_dims))).astype(np.float32)
    cu = cu_seqlens_from_lengths(lengths)
    want, want_mask = _naive_pad(flat, lengths, side, -7.0)
    data = torch.from_numpy(flat) if as_torch else flat
    padded, mask = pad_to_batch(data, cu, padding_side=side, pad_value=-7.0)
    assert type(padded) is type(data) and padded.dtype == data.dtype
    np.testing.assert_array_equal(np.asarray(padded), want)
    np.testing.assert_array_equal(np.asarray(mask), want_mask)
    back, back_cu = unpad_from_batch(padded, mask)
    np.testing.assert_array_equal(np.asarray(back), flat)
    np.testing.assert_array_equal(back_cu, cu)


def test_pad_to_batch_offset_cu_and_errors() -> None:
    flat = np.arange(10)
    padded, mask = pad_to_batch(flat, torch.tensor([4, 6, 9]), padding_side="left", pad_value=-1)
    assert padded.tolist() == [[-1, 4, 5], [6, 7, 8]] and mask.tolist() == [[False, True, True], [True] * 3]
    with pytest.raises(ValueError, match="padding_side"):
        pad_to_batch(flat, [0, 2], padding_side="middle")
    with pytest.raises(ValueError, match="non-decreasing"):
        pad_to_batch(flat, np.array([0, 3, 2]))
    with pytest.raises(ValueError, match="does not match"):
        unpad_from_batch(np.zeros((2, 3)), np.ones((2, 2), dtype=bool))
