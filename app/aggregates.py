"""Distribution aggregates for the dashboard: rcdiag's one-pass scan (tails + strata) over the chosen sequences.

The whole run's come from the report's own pass (app.judged: shared with the Overview and rcdiag's pass cache);
a filter scans the kept sequences once. Cached on (run path, file stamp, filters); the results are small
(fixed-size histograms, per-bucket rows), never the token table. Only valid tokens (mask true, both log-probs
finite) count, as in `rcdiag report`.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from app import data, judged, runcheck
from rcdiag.analysis.distributions.strata import titles
from rcdiag.analysis.distributions.tails import DENSITY_BINS, DENSITY_RANGE, TailAccumulator
from rcdiag.report.scan import scan_run
from rcdiag.store.batches import keep_seq_ids

SHOWN_STRATA = ("position", "rollout_prob", "entropy")
"""The rcdiag.analysis.distributions.strata stratifications the Distributions page draws (the others are in the report)."""
Filters = tuple[tuple[str, ...] | None, tuple[float, float] | None, tuple[float, float] | None]
"""(finish reasons, reward range, response-length range) of data.seq_ids_where; None in a slot: no filter."""
DENSITY_CELLS = 60
"""The b-vs-a density is drawn as at most DENSITY_CELLS² cells (rebinned from the accumulator's fine grid)."""


@st.cache_data(show_spinner="Scanning the chosen sequences…", max_entries=64)
def distributions(path: str, stamp: str, filters: Filters | None) -> dict[str, Any]:
    """The scan of the sequences passing `filters` (data.seq_ids_where's (finish reasons, reward range, length
    range); None: all, i.e. the report's own pass): {"tails": TailAccumulator, "tail_stats": dict
    (rcdiag.analysis.distributions.tails TAIL_NAMES), "strata": {name: DataFrame of rcdiag.analysis.distributions.strata rows}}. Zero tokens
    → empty frames. Pass `filters` explicitly: the cache key is made from the arguments as given (small, whatever
    the run's size)."""
    if filters is None:
        scan = judged.report(path, stamp).scan
    else:
        keep_ids = data.seq_ids_where(data.sequence_index(path, stamp), *filters)
        scan = scan_run(runcheck.checked_run(path, stamp), keep=keep_seq_ids(keep_ids))
    strata = {name: pd.DataFrame(rows) for name, rows in scan.strata.finish().items()}
    return {"tails": scan.tails, "tail_stats": scan.tails.finish(), "strata": strata}


def strata_title(name: str) -> str:
    return titles().get(name, name)


def histogram(tails: TailAccumulator, limit: float | None = None, bins: int = 121) -> pd.DataFrame:
    """Nonzero bins of the ℓ histogram: (lo, hi, count); empty frame when no token."""
    if tails.n == 0:
        return pd.DataFrame({"lo": [], "hi": [], "count": []})
    edges, counts = tails.signed_histogram(bins, limit)
    frame = pd.DataFrame({"lo": edges[:-1], "hi": edges[1:], "count": counts})
    return frame[frame["count"] > 0].reset_index(drop=True)


def density(tails: TailAccumulator) -> pd.DataFrame:
    """Nonzero cells of the b-vs-a density over the occupied range, rebinned to ≤ DENSITY_CELLS² cells:
    (a_lo, a_hi, b_lo, b_hi, count)."""
    grid = tails.density
    if not grid.any():
        return pd.DataFrame({"a_lo": [], "a_hi": [], "b_lo": [], "b_hi": [], "count": []})
    lo, hi = DENSITY_RANGE
    width = (hi - lo) / DENSITY_BINS
    rows, cols = np.nonzero(grid)
    first = int(min(rows.min(), cols.min()))
    factor = max(1, -(-(DENSITY_BINS - first) // DENSITY_CELLS))
    sub = grid[first:, first:]
    pad = (-sub.shape[0]) % factor
    sub = np.pad(sub, ((0, pad), (0, pad)))
    n = sub.shape[0] // factor
    coarse = sub.reshape(n, factor, n, factor).sum(axis=(1, 3))
    ia, ib = np.nonzero(coarse)
    start = lo + first * width
    step = factor * width
    return pd.DataFrame({"a_lo": start + ia * step, "a_hi": start + (ia + 1) * step,
                         "b_lo": start + ib * step, "b_hi": start + (ib + 1) * step, "count": coarse[ia, ib]})
