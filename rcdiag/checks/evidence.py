"""Alignment and convention checks that run before any statistic: each returns a Finding with the fix.

One streaming pass (`CheckAccumulator.update` per record batch, `merge` across files, `findings` at the end)
gathers every check's evidence in O(#sequences) memory; `run_checks(run)` is the one-call form. Checks never
raise on bad values (NaN, ±inf, placeholders): they exist to report those, which the metrics would reject.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.analysis.metrics.floor import NoiseEvidence
from rcdiag.analysis.metrics.position_noise import PositionNoise
from rcdiag.analysis.passes.accum import BatchConsumer, Totals
from rcdiag.analysis.passes.engine import Fresh, run_pass
from rcdiag.analysis.passes.rows import BatchRows
from rcdiag.checks.evidence_kernel import KINDS, batch_evidence
from rcdiag.store.files import DEFAULT_READ_ROWS

SEVERITIES = ("ok", "info", "warning", "error")
SIDES = {"rollout_logprob": "rollout (engine) b", "train_logprob": "training a"}
CHECK_COLUMNS = ("seq_id", "pos", "rollout_logprob", "train_logprob", "mask")
HUGE_NEGATIVE = -1e9
MIN_TOKENS = 50
"""Fewer valid tokens than this: the statistical checks (temperature, offset, quantisation) report 'info'."""


@dataclass(frozen=True)
class Finding:
    """One check's verdict. `fix` names the framework setting that removes the problem ('' when ok)."""

    name: str
    severity: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------------- quantisation
@dataclass(frozen=True)
class Grid:
    """A storage dtype's value grid inside float32: `low_bits` mantissa bits are zero, ulp = 2^(e − mantissa)."""

    name: str
    low_bits: int
    mantissa: int


GRIDS = (Grid("bfloat16", 16, 7), Grid("float16", 13, 10))


_GRID_LOW_BITS = np.array([g.low_bits for g in GRIDS], dtype=np.int64)


class _SideStats:
    """Per-column placeholder counts and storage-grid evidence (mergeable)."""

    KINDS = KINDS

    def __init__(self) -> None:
        self.counts = dict.fromkeys(self.KINDS, 0)
        self.first: dict[str, dict[str, Any]] = {}
        self.pos0 = 0  # placeholders at pos 0 (the classic "first token missing" pattern)
        self.checked = 0
        self.on_grid = {g.name: 0 for g in GRIDS}
        self.exponents = np.zeros(256, dtype=np.int64)

    def add(self, evidence: tuple[np.ndarray, ...], side: int, values: np.ndarray, where: dict[str, np.ndarray],
            file: str, row0: int) -> None:
        """Add one batch's evidence for this side (row `side` of each evidence_kernel.batch_evidence output)."""
        counts, first, pos0, checked, on_grid, exponents = (part[side] for part in evidence)
        for kind, count, i in zip(self.KINDS, counts.tolist(), first.tolist(), strict=True):
            self.counts[kind] += count
            if count and kind not in self.first:
                self.first[kind] = {"file": file, "row": row0 + i, "seq_id": int(where["seq_id"][i]),
                                    "pos": int(where["pos"][i]), "value": float(values[i])}
        self.pos0 += int(pos0)
        self.checked += int(checked)
        for grid, count in zip(GRIDS, on_grid.tolist(), strict=True):
            self.on_grid[grid.name] += count
        self.exponents += exponents

    def merge(self, other: _SideStats) -> None:
        for kind in self.KINDS:
            self.counts[kind] += other.counts[kind]
        for kind, loc in other.first.items():
            self.first.setdefault(kind, loc)
        self.pos0 += other.pos0
        self.checked += other.checked
        for name in self.on_grid:
            self.on_grid[name] += other.on_grid[name]
        self.exponents += other.exponents

    def grid(self) -> Grid | None:
        """The coarsest storage grid (bf16, then fp16) that ≥ 99% of the stored values sit on."""
        if self.checked < MIN_TOKENS:
            return None
        for grid in GRIDS:
            if self.on_grid[grid.name] >= 0.99 * self.checked:
                return grid
        return None

    def half_ulp(self, grid: Grid) -> dict[str, float]:
        """Rounding bound |x − stored| ≤ ulp/2 of the stored values: mean, p99, max and E[ulp²] (floor model)."""
        exps = np.flatnonzero(self.exponents)
        counts = self.exponents[exps]
        half = np.ldexp(1.0, exps - 127 - grid.mantissa) / 2
        cum = np.cumsum(counts) / counts.sum()
        return {"mean": float((half * counts).sum() / counts.sum()),
                "p99": float(half[min(int(np.searchsorted(cum, 0.99)), half.size - 1)]),
                "max": float(half[-1]), "ulp_sq_mean": float((4 * half**2 * counts).sum() / counts.sum())}


# ----------------------------------------------------------------------------------------------- accumulator
class CheckAccumulator(BatchConsumer):
    """Evidence for every check, updated per record batch of token columns (CHECK_COLUMNS) and mergeable."""

    columns = CHECK_COLUMNS

    def __init__(self) -> None:
        self.sides = {name: _SideStats() for name in SIDES}
        self.tokens = 0
        self.valid = 0
        self.fit = np.zeros(6)  # n, Σa, Σb, Σa², Σab, Σb² over clean valid tokens
        self.offset = np.zeros(9)  # Σ(b−a) on b>a, #b>a, #b<a, #|b−a| ≤ 1e-6, Σ(−a) and # on b = 0 rows,
        # #b>a and #b<a where both p < ½, Σ(b−a) signed (evidence_kernel.batch_evidence)
        self.shift = np.zeros(4)  # #pairs, Σ|a_t − b_{t−1}|, Σ|a_t − b_t|, Σ|a_t − b_{t+1}|  (shift −1, 0, +1)
        self.seq_ids: list[np.ndarray] = []
        self.seq_counts: list[np.ndarray] = []
        self.seq_maxpos: list[np.ndarray] = []
        self.noise = NoiseEvidence()
        """The noise floor's evidence and the temperature signature (rcdiag.analysis.metrics.floor)."""
        self.positions = PositionNoise()
        """The same rows' noise per response-position band (rcdiag.analysis.metrics.position_noise)."""

    def update(self, batch: pa.RecordBatch, file: str = "<data>", row0: int = 0, rows: BatchRows | None = None) -> None:
        """Add one record batch (CHECK_COLUMNS); `rows`: its columns already decoded by another pass."""
        rows = rows or BatchRows(batch)
        seq, pos, a, b, valid = rows.seq, rows.pos, rows.a, rows.b, rows.mask
        where = {"seq_id": seq, "pos": pos}
        sides, fit, offset, shift, ids, counts, maxpos = batch_evidence(seq, pos, a, b, valid, HUGE_NEGATIVE,
                                                                        _GRID_LOW_BITS)
        self.sides["train_logprob"].add(sides, 0, a, where, file, row0)
        self.sides["rollout_logprob"].add(sides, 1, b, where, file, row0)
        self.tokens += seq.size
        self.valid += int(valid.sum())
        self.fit += fit
        self.offset += offset
        self.shift += shift
        self.seq_ids.append(ids)
        self.seq_counts.append(counts)
        self.seq_maxpos.append(maxpos)
        gap, log10_u = self.noise.update(a, b, valid)
        self.positions.update(pos, a, b, valid, gap, log10_u)

    def update_batch(self, rows: BatchRows, file: str, row0: int) -> None:
        self.update(rows.batch, file, row0, rows)

    def fresh(self) -> CheckAccumulator:
        return CheckAccumulator()

    def finish(self, totals: Totals) -> CheckAccumulator:
        """Itself: the checks are judged from this evidence (rcdiag.checks.verdicts.findings)."""
        return self

    def merge(self, other: CheckAccumulator) -> CheckAccumulator:
        for name, side in self.sides.items():
            side.merge(other.sides[name])
        self.tokens += other.tokens
        self.valid += other.valid
        self.fit += other.fit
        self.offset += other.offset
        self.shift += other.shift
        self.seq_ids += other.seq_ids
        self.seq_counts += other.seq_counts
        self.seq_maxpos += other.seq_maxpos
        self.noise.merge(other.noise)
        self.positions.merge(other.positions)
        return self

    def per_sequence(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(seq_id, token rows, max pos) per sequence seen, sorted by seq_id (a sequence may span batches)."""
        if not self.seq_ids:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        ids = np.concatenate(self.seq_ids)
        uniq, inverse = np.unique(ids, return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate(self.seq_counts), minlength=uniq.size)
        maxpos = np.full(uniq.size, -1, dtype=np.int64)
        np.maximum.at(maxpos, inverse, np.concatenate(self.seq_maxpos))
        return uniq, counts.astype(np.int64), maxpos


# ----------------------------------------------------------------------------------------------- entry points
def accumulate(run: Any, *, silent: bool = True, batch_size: int = DEFAULT_READ_ROWS) -> CheckAccumulator:
    """One streaming pass over a Run's token files (progress bar in tokens unless `silent`)."""
    return run_pass(run, Fresh((CheckAccumulator(),)), batch_rows=batch_size, desc="checks",
                    silent=silent).consumers[0]


def sequence_lengths(run: Any) -> tuple[np.ndarray, np.ndarray]:
    """(seq_id, response_len) from the sequences files; response_len −1 where unknown. O(#sequences)."""
    table = run.sequence_table(["seq_id", "response_len"])
    ids = np.asarray(table.column("seq_id"), dtype=np.int64)
    column = table.column("response_len")
    lengths = np.asarray(column.fill_null(-1) if column.null_count else column, dtype=np.int64)
    return ids, lengths
