"""The report: one streaming pass per token file, checks, metrics with intervals, IS modes, a recommendation,
written as report.md / report.html / metrics.json (+ figures) and gated by --fail-if.

    from rcdiag.report import make_report, ReportOptions
    make_report(["runs/sample"], options=ReportOptions(convention="verl"))
"""
from rcdiag.lazy import lazy_face

_EXPORTS = {
    **dict.fromkeys(("RunReport", "build_report"), "rcdiag.report.build"),
    "recommend": "rcdiag.report.recommend",
    **dict.fromkeys(("DEFAULT_COMPARISON_DIR", "ReportResult", "make_report"), "rcdiag.report.make"),
    **dict.fromkeys(("CONVENTIONS", "ESS_TARGET", "MODES", "ReportOptions"), "rcdiag.report.options"),
    **dict.fromkeys(("cached_passes", "is_cached", "clear_cache"), "rcdiag.report.cache"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)  # `report --help` needs options only, not matplotlib
