"""The off-policy diagnostics of METRICS.md as mergeable accumulators over token batches, per convention."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.analysis import peer_logs
from rcdiag.analysis.accum import ChunkConsumer, ExactSum, Extremum, Totals, add_range, merge_ranges, ratio
from rcdiag.analysis.chunks import DEFAULT_BATCH_ROWS, Chunker, TokenChunk, sequence_universe
from rcdiag.analysis.conventions import DEFAULT_CONVENTION, LOG_RATIO_CLAMP, Convention, get_convention
from rcdiag.analysis.engine import stream
from rcdiag.analysis.verlstats import VerlProbStats

METRIC_NAMES = ("kl", "k3_kl", "training_log_ppl", "training_ppl", "rollout_log_ppl", "rollout_ppl",
                "log_ppl_diff", "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio",
                "chi2_token", "chi2_seq")
COUNT_NAMES = ("tokens", "sequences", "empty_sequences")

_TOKEN_SUMS = ("ell", "k3", "chi2")
_SEQ_SUMS = ("train_log_ppl", "train_ppl", "rollout_log_ppl", "rollout_ppl", "diff", "abs_diff", "ppl_ratio",
             "chi2_seq")
# value of each per-sequence term on an empty row (ā = b̄ = ℓ̄ = S = 0), for conventions that score all B rows
_EMPTY_ROW_VALUE = {"train_log_ppl": 0.0, "train_ppl": 1.0, "rollout_log_ppl": 0.0, "rollout_ppl": 1.0,
                    "diff": 0.0, "abs_diff": 0.0, "ppl_ratio": 1.0, "chi2_seq": 0.0}


_K3 = {"clamped": "k3", "clamped10": "k3_10", "raw": "k3_raw"}
"""Per-sequence k3 sum column (kernels.SEQ_SUM_COLUMNS) by Convention.k3."""


def _chi2_seq_geometric(mean_ell: np.ndarray, sum_ell: np.ndarray) -> np.ndarray:
    return np.expm1(2.0 * np.clip(mean_ell, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _chi2_seq_product(mean_ell: np.ndarray, sum_ell: np.ndarray) -> np.ndarray:
    return np.expm1(2.0 * np.clip(sum_ell, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


_CHI2_SEQ = {"geometric": _chi2_seq_geometric, "product": _chi2_seq_product}


class MetricsAccumulator(ChunkConsumer):
    """Mergeable state of every METRICS.md diagnostic for one convention.

    `update(batch)` takes a RecordBatch/Table/DataFrame of token rows (a sequence may continue in the next batch;
    its rows are carried), `update_chunk(chunk)` a TokenChunk of whole sequences; `merge(other)` adds an
    accumulator over disjoint sequences (e.g. another file); `finish(totals)` gives the metrics dict.
    State is O(1): exact sums, counts and extrema; results do not depend on the batching.
    """

    def __init__(self, convention: str | Convention = DEFAULT_CONVENTION) -> None:
        self.convention = get_convention(convention)
        self.tokens = 0
        self.seen_sequences = 0
        self.valid_sequences = 0
        self.sums = {name: ExactSum() for name in _TOKEN_SUMS + _SEQ_SUMS}
        self.diff = Extremum()
        self.abs_sum, self.abs_max = ExactSum(), Extremum()  # trl's sampling_logp_difference
        self.probs = VerlProbStats() if self.convention.framework == "verl" else None  # verl's training/ keys
        self.peer = peer_logs.accumulator(self.convention.framework)  # skyrl / nemo-rl / prime-rl / roll extras
        self.seq_ranges: list[list[int]] = []  # disjoint [first, last] seq_id intervals covered
        self._chunker: Chunker | None = None

    def fresh(self) -> MetricsAccumulator:
        """An empty accumulator of the same convention (stream's per-file copies)."""
        return MetricsAccumulator(self.convention)

    # ------------------------------------------------------------------ updates
    def update(self, batch: Any, source: str = "tokens") -> None:
        """Add a batch of token rows (validated; InputError names `source`, row and column)."""
        if self._chunker is None:
            self._chunker = Chunker()
        table = batch if isinstance(batch, (pa.RecordBatch, pa.Table)) else pa.Table.from_pandas(
            batch, preserve_index=False)
        for chunk in self._chunker.push(source, table):
            self.update_chunk(chunk)

    def _flush(self) -> None:
        if self._chunker is not None:
            chunk = self._chunker.flush()
            if chunk is not None:
                self.update_chunk(chunk)

    def update_chunk(self, chunk: TokenChunk) -> None:
        """Add whole sequences."""
        if chunk.n == 0:
            return
        conv = self.convention
        counts = chunk.counts
        self.tokens += int(counts.sum())
        self.seen_sequences += int(chunk.seq_ids.size)
        add_range(self.seq_ranges, int(chunk.seq_ids[0]), int(chunk.seq_ids[-1]))
        sum_ell = chunk.sum_ell
        self.sums["ell"].add(sum_ell)
        self.sums["k3"].add(chunk.seq_column(_K3[conv.k3]))
        self.sums["chi2"].add(chunk.seq_column("chi2"))
        if conv.framework == "trl":
            self.abs_sum.add(chunk.seq_column("abs_ell"))
            self.abs_max.add(chunk.sums[2])  # ρ² − 1 = expm1(ℓ̂)·(expm1(ℓ̂) + 2), accurate for tiny ℓ
        if self.probs is not None:
            self.probs.update(chunk)
        if self.peer is not None:
            self.peer.update_chunk(chunk)
        valid = counts > 0
        self.valid_sequences += int(valid.sum())
        t = counts[valid].astype(np.float64)
        mean_a = chunk.seq_column("a")[valid] / t
        mean_b = chunk.seq_column("b")[valid] / t
        mean_ell = sum_ell[valid] / t
        with np.errstate(over="ignore"):  # a PPL beyond 1e308 is reported as inf
            terms = {"train_log_ppl": -mean_a, "train_ppl": np.exp(-mean_a), "rollout_log_ppl": -mean_b,
                     "rollout_ppl": np.exp(-mean_b), "diff": -mean_ell, "abs_diff": np.abs(mean_ell),
                     "ppl_ratio": np.exp(-mean_ell),
                     "chi2_seq": _CHI2_SEQ[conv.chi2_seq](mean_ell, sum_ell[valid])}
        for name, values in terms.items():
            self.sums[name].add(values)
        self.diff.add(-mean_ell)

    def merge(self, other: MetricsAccumulator) -> MetricsAccumulator:
        """Add `other` (same convention, disjoint sequences, e.g. another file); returns self."""
        if other.convention != self.convention:
            raise ValueError(f"cannot merge {other.convention.name} into {self.convention.name} accumulator")
        self._flush()
        other._flush()
        merge_ranges(self.seq_ranges, other.seq_ranges)
        self.tokens += other.tokens
        self.seen_sequences += other.seen_sequences
        self.valid_sequences += other.valid_sequences
        for name, total in self.sums.items():
            total.merge(other.sums[name])
        self.diff.merge(other.diff)
        self.abs_sum.merge(other.abs_sum)
        self.abs_max.merge(other.abs_max)
        if self.probs is not None:
            self.probs.merge(other.probs)
        if self.peer is not None:
            self.peer.merge(other.peer)
        return self

    # ------------------------------------------------------------------ result
    def finish(self, totals: Totals | None = None) -> dict[str, float]:
        """The metrics dict (METRICS.md names, then counts). `totals.sequences` = B, the rows of the sequences table
        (None: the sequences seen in the token rows). Zero valid tokens → every metric NaN, counts 0.
        Under trl, also TRL's `sampling_logp_difference` mean and max of |ℓ| over valid tokens (unclamped) as
        abs_log_ratio_mean / abs_log_ratio_max: 0.0 without a valid token, as TRL v1.9.0 logs. Under verl, also
        verl's `training/` debug numbers (verlstats.PROBS_NAMES). Under swift, a batch with rows but no valid token
        gives what ms-swift v4.5.2 logs for such a micro-batch (its divisors are max(count, 1)): kl = k3_kl = 0,
        chi2_token = −1, PPL 1, log-PPL and differences 0, ppl_ratio 1, chi2_seq 0."""
        self._flush()
        rows = self.seen_sequences if totals is None else int(totals.sequences)
        if rows < self.seen_sequences:
            raise ValueError(f"B = {rows} sequences is less than the {self.seen_sequences} sequences with tokens")
        empty = rows - self.valid_sequences
        counts = {"tokens": self.tokens, "sequences": rows, "empty_sequences": empty}
        extra = self.probs.finish() if self.probs is not None else {}
        if self.peer is not None:
            extra = self.peer.finish()
        if self.convention.framework == "trl":
            extra = {"abs_log_ratio_mean": self.abs_sum.value() / self.tokens if self.tokens else 0.0,
                     "abs_log_ratio_max": self.abs_max.hi if self.tokens else 0.0}
        swift_no_data = self.convention.no_data == "swift" and rows > 0
        if self.tokens == 0 and not swift_no_data:
            return {**dict.fromkeys(METRIC_NAMES, math.nan), **extra, **counts}
        n = max(self.tokens, 1)  # swift's max(N, 1); N ≥ 1 under every other convention here
        all_rows = self.convention.seq_rows == "all"
        denominator = rows if all_rows else self.valid_sequences

        def seq_mean(name: str) -> float:
            extra = empty * _EMPTY_ROW_VALUE[name] if all_rows else 0.0
            return ratio(self.sums[name].value() + extra, denominator)

        diff_max, diff_min = self.diff.hi, self.diff.lo
        if all_rows and empty:
            diff_max, diff_min = max(diff_max, 0.0), min(diff_min, 0.0)
        values = {
            "kl": -self.sums["ell"].value() / n,
            "k3_kl": self.sums["k3"].value() / n,
            "training_log_ppl": seq_mean("train_log_ppl"), "training_ppl": seq_mean("train_ppl"),
            "rollout_log_ppl": seq_mean("rollout_log_ppl"), "rollout_ppl": seq_mean("rollout_ppl"),
            "log_ppl_diff": seq_mean("diff"), "log_ppl_abs_diff": seq_mean("abs_diff"),
            "log_ppl_diff_max": diff_max, "log_ppl_diff_min": diff_min, "ppl_ratio": seq_mean("ppl_ratio"),
            "chi2_token": self.sums["chi2"].value() / n if self.tokens else -1.0,  # swift: mm(ρ², m) − 1 = −1
            "chi2_seq": seq_mean("chi2_seq"),
        }
        return {**values, **extra, **counts}


def compute_metrics(data: Any, convention: str | None = None, *, sequences: Any = None,
                    batch_rows: int = DEFAULT_BATCH_ROWS, silent: bool = True, keys: str | None = None
                    ) -> dict[str, float]:
    """Every METRICS.md diagnostic of `data` in one streaming pass.

    `data`: a `Run` (B = its sequences table, so empty responses count), or a DataFrame / Arrow table of token rows
    (seq_id int, pos int, rollout_logprob, train_logprob float; mask optional, default all valid; B = distinct
    seq_ids, or the rows of `sequences` when given). `convention`: canonical | swift | verl | trl (default
    canonical, or the framework named by `keys`). `keys`: "canonical" (METRICS.md names) or "verl" | "swift" |
    "trl": the framework's logged key names (keys.py), e.g. "rollout_corr/kl"; numbers the framework does not log
    are prefixed "rcdiag/".
    Returns {metric: float} in METRIC_NAMES order (+ trl's abs_log_ratio_mean/max under trl, verl's probs_diff_*
    and actor_probs_pearson_corr under verl) plus int counts
    `tokens` (valid), `sequences` (B) and `empty_sequences` (T_i = 0). No valid token → metrics NaN (never "no
    mismatch"), except under trl and swift, which give the framework's own logged values (finish). Bad rows
    raise InputError.
    """
    from rcdiag.analysis.keys import key_convention, rename

    accumulator = MetricsAccumulator(key_convention(keys, convention))
    rows = stream(data, [accumulator], sequences=sequences, batch_rows=batch_rows, silent=silent, desc="metrics")
    return rename(accumulator.finish(Totals(rows)), keys)


def sequence_stats(data: Any, *, sequences: Any = None, batch_rows: int = DEFAULT_BATCH_ROWS,
                   silent: bool = True) -> Any:
    """One row per sequence (pandas DataFrame, sorted by seq_id) to rank the worst sequences.

    Columns: seq_id, n_valid (T_i), sum_log_ratio (Σℓ), mean_log_ratio (ℓ̄), mean_abs_log_ratio, max_abs_log_ratio,
    training_log_ppl (−ā), rollout_log_ppl (−b̄), log_ppl_diff (b̄ − ā = −ℓ̄), seq_ratio (exp(clamp(ℓ̄, ±20)),
    canonical geometric). Sequences without valid tokens (including a Run's empty responses) have n_valid 0 and NaN.
    """
    import pandas as pd

    collector = _SequenceCollector()
    stream(data, [collector], sequences=sequences, batch_rows=batch_rows, silent=silent, desc="sequences")
    frame = collector.frame()
    universe = sequence_universe(data, sequences)
    if universe is not None:
        missing = np.setdiff1d(universe, frame["seq_id"].to_numpy(), assume_unique=True)
        if missing.size:
            extra = pd.DataFrame({"seq_id": missing, "n_valid": np.zeros(missing.size, dtype=np.int64)})
            frame = pd.concat([frame, extra], ignore_index=True).sort_values("seq_id", ignore_index=True)
    return frame


class _SequenceCollector(ChunkConsumer):
    """Per-sequence sums (O(#sequences) memory) for sequence_stats."""

    def __init__(self) -> None:
        self.parts: list[dict[str, np.ndarray]] = []

    def update_chunk(self, chunk: TokenChunk) -> None:
        self.parts.append({
            "seq_id": chunk.seq_ids, "n_valid": chunk.counts, "sum_log_ratio": chunk.sum_ell,
            "sum_abs": chunk.seq_column("abs_ell"), "max_abs_log_ratio": chunk.sums[2],
            "sum_a": chunk.seq_column("a"), "sum_b": chunk.seq_column("b")})

    def fresh(self) -> _SequenceCollector:
        return _SequenceCollector()

    def merge(self, other: _SequenceCollector) -> _SequenceCollector:
        self.parts += other.parts
        return self

    def finish(self, totals: Totals) -> Any:
        return self.frame()

    def frame(self) -> Any:
        import pandas as pd

        keys = ("seq_id", "n_valid", "sum_log_ratio", "sum_abs", "max_abs_log_ratio", "sum_a", "sum_b")
        cols = {k: np.concatenate([p[k] for p in self.parts]) if self.parts else np.zeros(0) for k in keys}
        t = cols["n_valid"].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            t = np.where(t > 0, t, np.nan)
            mean_ell = cols["sum_log_ratio"] / t
            out = {
                "seq_id": cols["seq_id"].astype(np.int64), "n_valid": cols["n_valid"].astype(np.int64),
                "sum_log_ratio": np.where(np.isnan(t), np.nan, cols["sum_log_ratio"]),
                "mean_log_ratio": mean_ell, "mean_abs_log_ratio": cols["sum_abs"] / t,
                "max_abs_log_ratio": np.where(np.isnan(t), np.nan, cols["max_abs_log_ratio"]),
                "training_log_ppl": -cols["sum_a"] / t, "rollout_log_ppl": -cols["sum_b"] / t,
                "log_ppl_diff": -mean_ell,
                "seq_ratio": np.exp(np.clip(mean_ell, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)),
            }
        return pd.DataFrame(out)
