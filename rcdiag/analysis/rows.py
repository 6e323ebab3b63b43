"""One record batch of token rows as numpy, decoded once and shared by the passes that visit it, with the per-row
transcendental terms computed by numpy's vectorised exp/expm1/log10.

The report's scan and its checks used to convert the same columns each (float64 copies, int64 copies) and the
scan kernel called libm's exp four times and log10 once per row, one value at a time (~6 ns each); numpy's SIMD
loops take ~1 ns a value for the whole batch. numpy's SIMD results may differ from libm's in the last bit for a
few per cent of values (both are within an ulp), so sums of these terms move at the 1e-16 relative level;
counts, extrema, buckets and every comparison against a threshold (made on log-ratios, never on exp) do not.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP
from rcdiag.store.schema import column_as_float, mask_as_bool


@dataclass(frozen=True)
class RowTerms:
    """Per-row terms of valid-or-not rows (float64 [n]; any value on rows that are masked or non-finite, which
    the consumers skip): pa = exp(a), pb = exp(b), em1 = expm1(ℓ̂), rho = exp(ℓ̂), log10|ℓ| (ℓ = a − b itself
    is one subtraction the kernels make)."""

    pa: np.ndarray
    pb: np.ndarray
    em1: np.ndarray
    rho: np.ndarray
    log10_abs: np.ndarray


class BatchRows:
    """The columns of one record batch as numpy (zero-copy where the stored type allows), decoded on first use."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch

    @property
    def n(self) -> int:
        return self.batch.num_rows

    @cached_property
    def seq(self) -> np.ndarray:
        """seq_id as stored (an integer type)."""
        return np.asarray(self.batch.column("seq_id"))

    @cached_property
    def pos(self) -> np.ndarray:
        """pos as stored (an integer type)."""
        return np.asarray(self.batch.column("pos"))

    @cached_property
    def mask(self) -> np.ndarray:
        """bool [n]: valid rows (a missing mask column or a null counts as valid)."""
        return mask_as_bool(self.batch)

    @cached_property
    def train(self) -> np.ndarray:
        """train_logprob as stored float32/float64 without a copy (float64 with NaN for nulls or integers)."""
        return column_as_float(self.batch, "train_logprob")

    @cached_property
    def rollout(self) -> np.ndarray:
        """rollout_logprob as stored, as `train`."""
        return column_as_float(self.batch, "rollout_logprob")

    @cached_property
    def a(self) -> np.ndarray:
        """train_logprob as float64 [n] (NaN for null)."""
        return np.asarray(self.train, dtype=np.float64)

    @cached_property
    def b(self) -> np.ndarray:
        """rollout_logprob as float64 [n] (NaN for null)."""
        return np.asarray(self.rollout, dtype=np.float64)

    @cached_property
    def entropy(self) -> np.ndarray:
        """train_entropy as stored float32/float64 [n], NaN where unknown."""
        return column_as_float(self.batch, "train_entropy")

    def token_ids(self, rows: np.ndarray) -> np.ndarray:
        """token_id of the given rows (int64, −1 for null): only the few rows a caller reports are converted (an
        Arrow take + fill_null per batch cost more than the whole column's zero-copy view)."""
        column = self.batch.column("token_id")
        if column.null_count:
            return np.asarray(column.take(pa.array(rows, pa.int64())).fill_null(-1), dtype=np.int64)
        return np.asarray(column.to_numpy()[rows], dtype=np.int64)

    @cached_property
    def terms(self) -> RowTerms:
        a, b = self.a, self.b
        with np.errstate(all="ignore"):  # placeholders (±inf, NaN, −1e30) are skipped by the consumers
            lr = a - b
            clamped = np.clip(lr, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            return RowTerms(np.exp(a), np.exp(b), np.expm1(clamped), np.exp(clamped), np.log10(np.abs(lr)))
