"""One record batch of token rows as numpy, decoded once and shared by every consumer of a pass (the checks'
evidence, the chunker that cuts it into whole sequences): the report's scan and its checks used to convert the
same columns each (float64 copies, int64 copies). The per-row transcendental terms are the chunk's
(chunks.TokenChunk.terms)."""
from __future__ import annotations

from functools import cached_property

import numpy as np
import pyarrow as pa

from rcdiag.store.schema import column_as_float, mask_as_bool


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

    def column(self, name: str) -> np.ndarray:
        """A carried column by name (chunks.Chunker's `extra`): `entropy`, or `token_id` as int64-safe numpy with
        −1 for null (zero-copy when it has no nulls)."""
        if name == "token_id":
            column = self.batch.column("token_id")
            return np.asarray(column.fill_null(-1) if column.null_count else column)
        return getattr(self, name)

    def token_ids(self, rows: np.ndarray) -> np.ndarray:
        """token_id of the given rows (int64, −1 for null): only the few rows a caller reports are converted (an
        Arrow take + fill_null per batch cost more than the whole column's zero-copy view)."""
        column = self.batch.column("token_id")
        if column.null_count:
            return np.asarray(column.take(pa.array(rows, pa.int64())).fill_null(-1), dtype=np.int64)
        return np.asarray(column.to_numpy()[rows], dtype=np.int64)
