"""The report's pass: its consumers — the scan (checks, tails, strata, per-sequence sums) and the library
accumulators (metrics, the IS sweep, verl's rejection options) — run by the one pass engine
(rcdiag.analysis.passes.engine), a token file at a time on a thread per core or, with `--ray`, as Ray tasks
(rcdiag.distributed.report), merged in file order: the same bits either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rcdiag.analysis.correction.advantages import Advantages, run_advantages
from rcdiag.analysis.correction.gates import GateAccumulator, report_gates
from rcdiag.analysis.correction.modes import ISAccumulator, ISGroup, get_mode, lower_for, mode_names
from rcdiag.analysis.correction.rejection import REJECTION_OPTIONS, rejection_bound
from rcdiag.analysis.metrics.compute import MetricsAccumulator
from rcdiag.analysis.passes.accum import ChunkConsumer, Totals
from rcdiag.analysis.passes.chunks import TokenChunk
from rcdiag.analysis.passes.engine import MapFiles, compile_notice, run_pass
from rcdiag.errors import InputError
from rcdiag.report.options import ReportOptions
from rcdiag.report.scan import Scan, scan_parts, sequence_info
from rcdiag.store.run import Run


@dataclass
class Library(ChunkConsumer):
    """The library accumulators of the report (metrics, the IS sweep grid, verl's rejection options), fed the
    same chunks in one pass and mergeable over disjoint files; `rows` = B, the rows of the sequences table."""

    options: ReportOptions
    grid: list[Any]
    metrics: MetricsAccumulator
    sweep: ISAccumulator
    rejections: dict[str, ISAccumulator]
    rows: int = 0
    gates: GateAccumulator | None = None
    """The gate families' sweep (rcdiag.analysis.correction.gates), or None (a file whose advantages cannot be read)."""

    def __post_init__(self) -> None:
        self._group = ISGroup(list(self.rejections.values()))

    def update_chunk(self, chunk: TokenChunk) -> None:
        self.metrics.update_chunk(chunk)
        self.sweep.update_chunk(chunk)
        self._group.update_chunk(chunk)
        if self.gates is not None:
            self.gates.update_chunk(chunk)

    def fresh(self) -> Library:
        twin = library_accumulators(self.options)
        twin.gates = None if self.gates is None else self.gates.fresh()
        return twin

    def merge(self, other: Library) -> Library:
        self.metrics.merge(other.metrics)
        self.sweep.merge(other.sweep)
        for name, acc in self.rejections.items():
            acc.merge(other.rejections[name])
        # a file whose advantages could not be read has no gate numbers: then the run has none (not a part's)
        self.gates = None if self.gates is None or other.gates is None else self.gates.merge(other.gates)
        self.rows = max(self.rows, other.rows)
        return self

    def finish(self, totals: Totals) -> dict[str, Any]:
        """{"metrics": dict, "sweep": [one dict per grid mode], "rejection": {option: dict}, "gates": the gate
        sweep's DataFrame or None}."""
        return {"metrics": self.metrics.finish(totals), "sweep": self.sweep.finish(totals),
                "rejection": {opt: acc.finish(totals)[0] for opt, acc in self.rejections.items()},
                "gates": None if self.gates is None else self.gates.frame(int(totals.sequences))}


def library_accumulators(options: ReportOptions) -> Library:
    """Fresh accumulators for `options` (fed in ONE pass; the same numbers as compute_metrics / simulate / sweep,
    which each make their own pass)."""
    o = options
    thresholds = tuple(dict.fromkeys((*o.thresholds, o.threshold)))
    grid = [get_mode(m).with_bounds(c, lower_for(m, o.convention, o.lower)) for m in mode_names()
            for c in thresholds]
    tis = [get_mode("token_truncate").with_bounds(o.threshold, lower_for("token_truncate", o.convention, o.lower))]
    rejections = {opt: ISAccumulator(tis, o.convention, rejection=[rejection_bound(opt, o.threshold)])
                  for opt in REJECTION_OPTIONS}
    return Library(o, grid, MetricsAccumulator(o.convention), ISAccumulator(grid, o.convention), rejections)


@dataclass(frozen=True)
class ReportParts:
    """The engine's `make` for the report: a file's scan (its own shard's sequences, finish reasons relabelled to
    the whole run's so partial strata line up when merged) and fresh library accumulators. Picklable: a Ray task
    receives it."""

    options: ReportOptions
    finish_labels: tuple[str, ...] | None = None
    advantages: tuple[Advantages, Advantages] | None = None
    """The whole run's (advantages, rewards) for the gates (analysis.correction.advantages.run_advantages: GRPO groups span
    files), or None: each shard's token rows carry theirs."""
    gates: bool = True
    """False when the run's advantage columns were refused: no gate sweep (the rest of the report stands)."""

    def __call__(self, shard: Run | None) -> list[Any]:
        o = self.options
        library = library_accumulators(o)
        try:  # a bad advantage or reward column costs the gates only
            library.gates = report_gates(shard, self.advantages) if self.gates else None
        except InputError:
            library.gates = None
        return [scan_parts(shard, o.threshold, o.lower, self.finish_labels), library]


def run_passes(run: Run, options: Any, map_files: MapFiles | None = None) -> tuple[Scan, Library | InputError]:
    """The report's pass over `run`: (the merged scan, the library accumulators with `.rows` = B — or the
    InputError the metrics refused the data with; the scan still sees every row)."""
    compile_notice(options.silent)  # before anything compiles: a one-file run's pass shows no bar
    info = sequence_info(run)  # the whole run's, once: each file's task reads only its own shard
    try:
        advantages, gates = run_advantages(run), True
    except InputError:
        advantages, gates = None, False
    merged = run_pass(run, ReportParts(options, tuple(info.finish_labels), advantages, gates), map_files=map_files,
                      silent=options.silent or len(run.token_files) < 2, desc=f"report {run.name}")
    scan, library = merged.consumers
    scan.info = info
    if merged.error is not None:
        return scan, merged.error
    library.rows = merged.sequences
    return scan, library

