"""`make_report`: report one run or compare several, write the files atomically, evaluate the request's gates."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcdiag.analysis.verdict.health import at_least
from rcdiag.errors import ConfigError
from rcdiag.report import figproc, gate
from rcdiag.report.build import RunReport, build_report, finish_report, judge
from rcdiag.report.options import DEFAULT_COMPARISON_DIR, ReportOptions
from rcdiag.report.outdir import check_out_dir, write_files
from rcdiag.report.sections import comparison_files, run_files, send_scan_figures
from rcdiag.store.run import Run, open_run

__all__ = ["DEFAULT_COMPARISON_DIR", "ReportResult", "make_report"]


@dataclass
class ReportResult:
    """What `make_report` did: the reports, the output directory, the failing --fail-if (and --fail-on-drift)
    lines, and the runs whose verdict met --fail-on ('name: status')."""

    reports: list[RunReport]
    out: Path
    failures: list[str]
    fail_on: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Whether any gate of the request failed (the CLI's exit 1)."""
        return bool(self.failures or self.fail_on)


def make_report(runs: Sequence[Any], out: str | os.PathLike | None = None,
                options: ReportOptions = ReportOptions(), map_files: Any = None) -> ReportResult:
    """Report one run (into `out`, default RUN/report/) or compare several (default ./rcdiag-report/, each run's
    own report under runs/<name>/), as the whole request `options` says (rcdiag.report.options.ReportOptions:
    what to compute, the baseline, and the gates --fail-if / --fail-on / --fail-on-drift — the conditions are
    checked for syntax and names before any work). `map_files` maps the per-file passes (Ray with --ray)."""
    if not runs:
        raise ConfigError("give at least one run directory")
    figproc.prestart()  # its matplotlib import runs beside the passes
    conditions = gate.conditions(options.fail_if, options.baseline is not None)
    opened = [r if isinstance(r, Run) else open_run(r) for r in runs]
    target = Path(out) if out is not None else (
        opened[0].path / "report" if len(opened) == 1 else Path(DEFAULT_COMPARISON_DIR))
    check_out_dir(target)
    base = None if options.baseline is None else build_report(open_run(options.baseline), options, map_files)
    reports = []
    for run in opened:  # each run's scan figures are drawn while the rest of its report is made
        report = judge(run, options, map_files)
        send_scan_figures(report)
        reports.append(finish_report(report, run))
    for report in reports:
        report.baseline = base
    for run in opened:  # rewritten while the report read it: refuse the mix of two runs (rcdiag.store.run)
        run.check_unchanged()
    files = run_files(reports[0]) if len(reports) == 1 else comparison_files(reports)
    written = write_files(target, files)
    base_values = None if base is None else gate.gate_values(base)
    failures = [f"{r.name}: {line}" for r in reports
                for line in gate.evaluate(conditions, gate.gate_values(r), base_values)]
    if options.fail_on_drift:
        failures += [f"{r.name}: {r.timeline.text}" for r in reports
                     if r.timeline is not None and (r.timeline.change or r.timeline.drift)]
    fail_on = [f"{r.name}: {r.verdict.status}" for r in reports
               if options.fail_on is not None and at_least(r.verdict.status, options.fail_on)]
    return ReportResult(reports, written, failures, fail_on)
