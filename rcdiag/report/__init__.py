"""The report: one streaming pass per token file, checks, metrics with intervals, IS modes, a recommendation,
written as report.md / report.html / metrics.json (+ figures) and gated by --fail-if.

    from rcdiag.report import make_report, ReportOptions
    make_report(["runs/sample"], options=ReportOptions(convention="verl"))
"""
from rcdiag.report.build import RunReport, build_report
from rcdiag.report.make import DEFAULT_COMPARISON_DIR, ReportResult, make_report
from rcdiag.report.options import CONVENTIONS, ESS_TARGET, MODES, ReportOptions
from rcdiag.report.recommend import recommend

__all__ = ["CONVENTIONS", "DEFAULT_COMPARISON_DIR", "ESS_TARGET", "MODES", "ReportOptions", "ReportResult",
           "RunReport", "build_report", "make_report", "recommend"]
