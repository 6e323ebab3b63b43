"""Build a run's report: checks first, then metrics with bootstrap intervals, tails, strata, IS modes, a sweep
a verdict (rcdiag.analysis.verdict.health) and a recommendation acting on it
(rcdiag.report.recommend). Writing the files is `rcdiag.report.render`; the CI gate is `rcdiag.report.gate`.

    rep = rcdiag.report.build.build_report(rcdiag.open_run("runs/sample"))
    rep.metrics["kl"], rep.intervals["kl"], rep.recommendation.text
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rcdiag.analysis.correction.modes import IS_METRIC_NAMES
from rcdiag.analysis.distributions.shape import Concentration, concentration
from rcdiag.analysis.metrics.bootstrap import bootstrap
from rcdiag.analysis.metrics.floor import NoiseSummary
from rcdiag.analysis.metrics.position_noise import PositionProfile
from rcdiag.analysis.passes.accum import Totals
from rcdiag.analysis.passes.kernels import COLUMN
from rcdiag.analysis.passes.threads import in_background
from rcdiag.analysis.training.drift import Timeline, timeline
from rcdiag.analysis.verdict.causes import from_lag
from rcdiag.analysis.verdict.health import UNKNOWN, VERDICT_MODE
from rcdiag.analysis.verdict.judge import Verdict, verdict
from rcdiag.analysis.verdict.model import Context
from rcdiag.checks.evidence import Finding
from rcdiag.checks.verdicts import findings as check_findings
from rcdiag.errors import InputError
from rcdiag.probe.answer import latest_answer
from rcdiag.report.cache import cached_passes
from rcdiag.report.context import architecture, engine_replayed, precision, unrecorded
from rcdiag.report.lag_section import LagFindings, lag_findings
from rcdiag.report.options import WORST_SEQUENCES, ReportOptions
from rcdiag.report.passes import Library
from rcdiag.report.recommend import Recommendation, recommend
from rcdiag.report.routing_section import RoutingFindings, routing_context, routing_findings
from rcdiag.report.scan import Scan
from rcdiag.report.trend_section import report_trend
from rcdiag.store.run import read_columns
from rcdiag.tokenizers import fast_tokenizer, run_tokenizer


@dataclass
class RunReport:
    """One run's report content; `scan` keeps the accumulators the plots are drawn from."""

    name: str
    path: str
    manifest: dict[str, Any]
    options: ReportOptions
    checks: list[Finding]
    scan: Scan
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_error: str | None = None
    pending_intervals: Future | dict[str, dict[str, float]] = field(default_factory=dict, repr=False)
    """The bootstrap intervals, or the Future of the bootstrap still running (read them through `intervals`)."""
    pending_figures: Callable[[], dict[str, bytes]] | None = field(default=None, repr=False)
    """The scan's figures already sent to the figure process (rcdiag.report.sections.send_scan_figures): call it
    for their PNG bytes by file name."""
    tails: dict[str, float] = field(default_factory=dict)
    strata: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    worst_tokens: list[dict[str, Any]] = field(default_factory=list)
    worst_sequences: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[dict[str, Any]] = field(default_factory=list)
    is_modes: dict[str, dict[str, float]] = field(default_factory=dict)
    rejection: dict[str, dict[str, float]] = field(default_factory=dict)
    sweep: Any = None  # pandas DataFrame (correction.sweep) or None
    gate_sweep: Any = None  # pandas DataFrame (analysis.correction.gates: gate × δ) or None
    recommendation: Recommendation = field(default_factory=lambda: Recommendation("unavailable", "not made yet"))
    verdict: Verdict = field(default_factory=lambda: Verdict(UNKNOWN))
    noise: NoiseSummary | None = None  # the noise floor's evidence (rcdiag.analysis.metrics.floor)
    positions: PositionProfile | None = None  # the same per response position (analysis.metrics.position_noise)
    concentration: Concentration | None = None  # Σ|ℓ| over sequences (analysis.distributions.shape)
    context: Context = field(default_factory=Context)  # what the verdict knew besides the numbers
    trend: Any = None  # per-step DataFrame (rcdiag.analysis.training.trend) of a multi-step run, else None
    timeline: Timeline | None = None  # step change / drift across training (rcdiag.analysis.training.drift), multi-step only
    lag: LagFindings = field(default_factory=LagFindings)  # policy lag split, weights unchanged (report.lag_section)
    routing: RoutingFindings = field(default_factory=RoutingFindings)  # MoE routing agreement (routing_section)
    baseline: RunReport | None = None  # the --baseline run's report (rcdiag.report.baseline)

    @property
    def intervals(self) -> dict[str, dict[str, float]]:
        """{metric: {low, high, se}}: waits for the bootstrap when it still runs (build_report starts it on its own
        thread so that the figures and the worst items are made meanwhile)."""
        if isinstance(self.pending_intervals, Future):
            self.pending_intervals = self.pending_intervals.result()
        return self.pending_intervals

    @intervals.setter
    def intervals(self, value: dict[str, dict[str, float]]) -> None:
        self.pending_intervals = value

    @property
    def counts(self) -> dict[str, int]:
        """tokens (valid, docs/metrics.md's count), token_rows (all), sequences (B), empty_sequences."""
        keys = ("tokens", "sequences", "empty_sequences")
        counts = {k: int(self.metrics[k]) for k in keys if k in self.metrics}
        counts.setdefault("tokens", int(self.scan.checks.valid))
        counts.setdefault("sequences", int(self.scan.info.seq_id.size))
        counts["token_rows"] = int(self.scan.checks.tokens)
        return counts


def build_report(run: Any, options: ReportOptions = ReportOptions(), map_files: Any = None) -> RunReport:
    """The full report of a Run: per token file, the scan and the library's metrics/IS accumulators, merged in
    file order (rcdiag.report.passes; `map_files` maps the files, default the builtin map, Ray tasks with
    --ray: the same numbers either way).

    NaN/±inf log-probs on valid positions do not stop the report: the checks locate them and `metrics_error`
    says why the metrics (which refuse such input) are missing.
    """
    return finish_report(judge(run, options, map_files), run)


def finish_report(report: RunReport, run: Any) -> RunReport:
    """What a judged report (`judge`) still lacks: the bootstrap intervals (started on a thread of their own), the
    worst tokens, sequences and prompts, and the recommendation. `rcdiag report` sends the figures the passes alone
    decide to the figure process in between (rcdiag.report.sections.send_scan_figures)."""
    options, scan = report.options, report.scan
    ids, sums = scan.sums.table(scan.info.seq_id)
    # no interval around numbers the metrics refused or withheld: it would look like a result
    # the bootstrap's kernel releases the GIL: it runs on its own thread while the rest of the report is made
    report.intervals = {} if report.metrics_error else in_background(
        bootstrap, sums, options.convention, replicates=options.replicates, level=options.level, seed=options.seed)
    report.worst_tokens = _decode_worst(run, scan.tails.worst_tokens())
    report.worst_sequences = _worst_sequences(run, ids, sums)
    report.prompts = worst_prompts(scan.info.prompt_id, sums)
    report.recommendation = recommend(report)
    return report


def judge(run: Any, options: ReportOptions = ReportOptions(), map_files: Any = None) -> RunReport:
    """The part of the report the verdict needs — the passes (cached: rcdiag.report.cache), the input checks, the
    tails, strata, metrics, IS modes, the noise floor, the per-step trend of a multi-step run (one more pass) and
    the verdict — without the bootstrap, worst items or recommendation (finish_report). The notebook card calls it
    too, so its verdict is the report's. The lag findings read the sequences table and hash every prompt on a
    thread of their own while the passes run (or their cache entry loads): they need nothing from them."""
    options = options.for_run(run)  # the trainer's own C and L where the run records them (ReportOptions.for_run)
    lag = in_background(lag_findings, run, options.threshold)
    scan, library = cached_passes(run, options, map_files)
    lengths = (scan.info.seq_id, scan.info.response_len)
    thresholds = options.grid
    report = RunReport(run.name, str(run.path), run.manifest, options,
                       check_findings(scan.checks, lengths, run.info, thresholds), scan)
    report.tails = scan.tails.finish()
    report.strata = scan.strata.finish()
    try:
        _library_numbers(report, library)
    except InputError as exc:
        report.metrics_error = str(exc)
    _suppress_invalidated(report)
    report.noise = scan.checks.noise.finish()
    report.positions = scan.checks.positions.finish()
    report.concentration = sequence_concentration(scan)
    report.trend = report_trend(run, options)
    report.timeline = None if report.trend is None else timeline(report.trend)
    report.lag = lag.result()
    report.routing = routing_findings(run)
    report.context = verdict_context(report)
    report.verdict = verdict(headline_values(report), report.checks, report.context)
    return report


def verdict_context(report: RunReport) -> Context:
    """What the verdict knows besides the numbers: each side's precision as recorded, the architecture, whether
    the rollout side is a replay, the timeline, whether the metrics refused the data, the causes the lag split and
    the routing agreement contribute, the shape of the mismatch (by position, over sequences) and what the run
    does not record."""
    ctx = Context(dtype=precision(report.manifest), architecture=architecture(report.manifest),
                  replay=engine_replayed(report.manifest), timeline=report.timeline, noise=report.noise,
                  refused=report.metrics_error, extra=tuple(c for c in (from_lag(report.lag.cause),) if c),
                  probe=None if (answer := latest_answer(report.path)) is None else answer.top_line,
                  positions=report.positions, concentration=report.concentration,
                  unknown=unrecorded(report.manifest))
    return routing_context(ctx, report, headline_values(report))


def sequence_concentration(scan: Scan) -> Concentration | None:
    """How Σ|ℓ| spreads over the scan's sequences (their per-sequence table's T and Σ|ℓ|)."""
    ids, sums = scan.sums.table()
    if not len(ids):
        return None
    return concentration(ids, sums[:, COLUMN["T"]], sums[:, COLUMN["sum_abs"]])


def headline_values(report: RunReport) -> dict[str, float]:
    """What the verdict judges: the metrics, the tail statistics, ESS / IS weight mean of token_truncate at
    --threshold (health.VERDICT_MODE) and the noise floor's evidence."""
    point = report.is_modes.get(VERDICT_MODE, {})
    noise = report.noise.values() if report.noise is not None else {}
    return {**report.tails, **report.metrics, **{k: point[k] for k in ("ess", "is_weight_mean") if k in point},
            **noise}


def run_verdict(run: Any) -> Verdict:
    """The verdict `rcdiag report RUN` gives, without writing a report (the notebook card): judge() with the
    report's defaults — one cached pass instead of a pass per metric family."""
    return judge(run).verdict


INVALIDATING = {"huge_negative"}
"""Placeholder kinds the metrics accept (finite) although one value dominates every mean (-1e9 and below).
Positive log-probs and 0.0 are flagged by the check but left in: a log-prob of +1e-3 is impossible yet moves no
mean by more than itself."""


def _suppress_invalidated(report: RunReport) -> None:
    """Placeholder values the metrics accept (-1e30 is finite) still make every mean meaningless (kl = -2e27):
    when the placeholders check found such values, withhold the metrics, IS numbers and intervals, as for refused
    data."""
    finding = next((f for f in report.checks if f.name == "placeholders"), None)
    kinds = {k for side in (finding.evidence.get("counts", {}) if finding else {}).values() for k in side}
    if report.metrics_error or not kinds & INVALIDATING:
        return
    report.metrics_error = f"withheld: {finding.message} — these values would dominate every mean"
    report.metrics, report.is_modes, report.intervals = {}, {}, {}
    report.tails = {k: v for k, v in report.tails.items() if not k.endswith("_mean")}  # order statistics stay


def _library_numbers(report: RunReport, library: Library | InputError) -> None:
    """metrics, IS modes, rejection options and the sweep from the merged accumulators (raises the InputError the
    metrics refused the data with)."""
    if isinstance(library, InputError):
        raise library
    o = report.options
    numbers = library.finish(Totals(library.rows))
    report.metrics = numbers["metrics"]
    records = [{"mode": m.name, "threshold": m.upper, **r} for m, r in zip(library.grid, numbers["sweep"],
                                                                           strict=True)]
    report.is_modes = {r["mode"]: {k: r[k] for k in IS_METRIC_NAMES} for r in records if r["threshold"] == o.threshold}
    chosen = [r for r in records if r["threshold"] in o.thresholds]
    report.sweep = pd.DataFrame.from_records(chosen, columns=["mode", "threshold", *IS_METRIC_NAMES])
    report.rejection = numbers["rejection"]
    report.gate_sweep = numbers["gates"]


# ----------------------------------------------------------------------------------------------- worst items
def _worst_sequences(run: Any, ids: np.ndarray, sums: np.ndarray) -> list[dict[str, Any]]:
    """The WORST_SEQUENCES sequences by |mean ℓ| (then max |ℓ|), with their prompt and response text."""
    T = sums[:, 0]
    scored = np.flatnonzero(T > 0)
    if not scored.size:
        return []
    mean = sums[scored, 3] / T[scored]
    order = scored[np.lexsort((-sums[scored, 5], -np.abs(mean)))[:WORST_SEQUENCES]]
    texts = _sequence_texts(run, ids[order])
    return [{"seq_id": int(ids[i]), "tokens": int(T[i]), "mean_log_ratio": float(sums[i, 3] / T[i]),
             "max_abs_log_ratio": float(sums[i, 5]), "sum_log_ratio": float(sums[i, 3]),
             **texts.get(int(ids[i]), {})} for i in order]


def worst_prompts(prompt_id: np.ndarray, sums: np.ndarray, top: int = WORST_SEQUENCES) -> list[dict[str, Any]]:
    """ℓ by prompt: the `top` prompts by token-weighted mean |ℓ| over all their samples (prompt_id aligned with the
    rows of `sums`, sorted by seq_id). Empty when no prompt has a valid token or prompt ids are unknown."""
    keys = np.array(["" if p is None else str(p) for p in prompt_id], dtype=object)
    if not keys.size or not any(keys):
        return []
    names, inverse = np.unique(keys, return_inverse=True)
    tokens = np.bincount(inverse, weights=sums[:, 0], minlength=names.size)
    abs_sum = np.bincount(inverse, weights=sums[:, 4], minlength=names.size)
    kl_sum = np.bincount(inverse, weights=sums[:, 2] - sums[:, 1], minlength=names.size)
    samples = np.bincount(inverse, minlength=names.size)
    scored = np.flatnonzero(tokens > 0)
    order = scored[np.lexsort((names[scored], -abs_sum[scored] / tokens[scored]))][:top]
    return [{"prompt_id": str(names[i]), "samples": int(samples[i]), "tokens": int(tokens[i]),
             "mean_abs": float(abs_sum[i] / tokens[i]), "kl": float(kl_sum[i] / tokens[i])} for i in order]


def _sequence_texts(run: Any, wanted: np.ndarray) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    columns = ["seq_id", "prompt_id", "prompt_text", "response_text", "finish_reason", "reward"]
    for file in run.sequence_files:
        table = read_columns(file, columns, filters=[("seq_id", "in", wanted.tolist())])
        for row in table.to_pylist():
            out[int(row.pop("seq_id"))] = row
    return out


def _decode_worst(run: Any, worst: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add the token's text and ±6 tokens of context where the run's tokenizer loads from a local directory: its
    tokenizer.json through the light `tokenizers` package, as the notebook and the dashboard decode (importing
    transformers for an AutoTokenizer took 7.9 s of the sample run's 9.5 s report, issue #15), else transformers."""
    tokenizer = fast_tokenizer(run.manifest) or run_tokenizer(run.manifest)
    if tokenizer is None or not worst:
        return worst
    wanted = sorted({w["seq_id"] for w in worst})
    rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for file in run.token_files:
        table = pq.read_table(file, columns=["seq_id", "pos", "token_id"], filters=[("seq_id", "in", wanted)])
        for seq in np.unique(np.asarray(table.column("seq_id"))):
            part = table.filter(pc.equal(table.column("seq_id"), seq))
            rows[int(seq)] = (np.asarray(part.column("pos")), np.asarray(part.column("token_id").fill_null(0)))
    for item in worst:
        pos, ids = rows.get(item["seq_id"], (np.zeros(0), np.zeros(0)))
        at = int(np.searchsorted(pos, item["pos"]))
        item["token_text"] = tokenizer.decode([int(item["token_id"])], skip_special_tokens=False)
        item["context"] = (tokenizer.decode(ids[max(at - 6, 0):at].tolist(), skip_special_tokens=False) + "⟦"
                           + item["token_text"] + "⟧"
                           + tokenizer.decode(ids[at + 1:at + 7].tolist(), skip_special_tokens=False))
    return worst
