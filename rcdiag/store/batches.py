"""Row filters for a pass over a run's token batches (rcdiag.analysis.passes.engine.run_pass `keep=`): the dashboard's
filtered distributions keep only the chosen sequences' rows."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def keep_seq_ids(seq_ids: Any) -> Callable[[pa.RecordBatch], pa.Array]:
    """A keep-filter: rows whose seq_id is in `seq_ids` (any integer array-like)."""
    value_set = pa.array(np.asarray(seq_ids, dtype=np.int64), pa.int64())
    return lambda batch: pc.is_in(batch.column("seq_id"), value_set=value_set)
