"""`rcdiag report`: checks, metrics with intervals, IS simulation and a recommendation → md/html/json (+ CI gate)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rcdiag.distributed import RAY_HELP
from rcdiag.errors import ConfigError
from rcdiag.report.options import CONVENTIONS, DEFAULT_COMPARISON_DIR, ReportOptions

DEFAULTS = ReportOptions()


def _thresholds(text: str | None) -> tuple[float, ...]:
    if text is None:
        return DEFAULTS.thresholds
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--thresholds {text!r}: expected numbers separated by commas, e.g. 1.1,1.5,2,5") from None
    if not values:
        raise ConfigError("--thresholds: give at least one threshold")
    return values


def command(
    runs: Annotated[list[Path], typer.Argument(help="Run directories; several give a side-by-side comparison.")],
    out: Annotated[Path | None, typer.Option(
        "--out", help=f"Output directory (default RUN/report/; ./{DEFAULT_COMPARISON_DIR}/ for several runs). "
        "A previous report there is replaced.")] = None,
    convention: Annotated[str, typer.Option(
        "--convention", help=f"Formulas: {' | '.join(CONVENTIONS)} (METRICS.md).")] = DEFAULTS.convention,
    threshold: Annotated[float, typer.Option("--threshold", help="IS threshold C.")] = DEFAULTS.threshold,
    lower: Annotated[float | None, typer.Option("--lower", help="Optional lower bound L.")] = None,
    thresholds: Annotated[str | None, typer.Option(
        "--thresholds", help="Sweep grid, comma-separated (default "
        f"{','.join(f'{c:g}' for c in DEFAULTS.thresholds)}).")] = None,
    fail_if: Annotated[list[str] | None, typer.Option(
        "--fail-if", help='Exit 1 when a condition holds, e.g. "kl>1e-3" (repeatable).')] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or summary.")] = False,
    ray: Annotated[str | None, typer.Option("--ray", metavar="auto|local|ADDRESS", help=RAY_HELP)] = None,
) -> None:
    """Write report.md, a self-contained report.html, PNG plots and metrics.json for one or more runs.

    Checks (alignment, placeholders, temperature, top-p/top-k, storage precision) come first; then every
    METRICS.md metric with a 95% bootstrap interval, tail statistics, ℓ by position/probability/entropy/…,
    the four IS modes and verl's rejection options at --threshold, a threshold sweep and a recommendation.

    --fail-if NAME OP VALUE (OP: < <= > >= == !=) exits 1 listing the conditions that hold. NAME is a metric
    (kl, k3_kl, chi2_token …), a tail statistic (abs_log_ratio_p99 …), a count, an IS metric of
    token_truncate at --threshold (ess, clipped_frac …) or MODE.NAME (sequence_mask.kept_seq_frac).

    Examples:

        rcdiag report runs/sample

        rcdiag report runs/sample --convention verl --threshold 2 --lower 0.5 --out reports/sample

        rcdiag report runs/bf16 runs/fp16 --out reports/bf16-vs-fp16

        rcdiag report runs/sample --quiet --fail-if "kl>1e-3" --fail-if "ess<0.9"

        rcdiag report runs/big --ray auto    # per-file accumulators as Ray tasks; the same numbers
    """
    options = ReportOptions(convention=convention, threshold=threshold, lower=lower,
                            thresholds=_thresholds(thresholds), silent=quiet)
    if ray is not None:
        from rcdiag.distributed.report import make_report_on_ray

        result = make_report_on_ray([str(r) for r in runs], out, options, fail_if or (), ray)
    else:
        from rcdiag.report.make import make_report  # matplotlib and pandas only when a report is made

        result = make_report([str(r) for r in runs], out, options, fail_if or ())
    if not quiet:
        for report in result.reports:
            bad = [f for f in report.checks if f.severity in ("warning", "error")]
            typer.echo(f"{report.name}: kl={report.metrics.get('kl', float('nan')):.4g}, "
                       f"{len(bad)} check(s) need attention"
                       + "".join(f"\n  {f.severity}: {f.name}: {f.message}" for f in bad))
        typer.echo(f"Wrote {result.out}/report.html, report.md, metrics.json")
    if result.failures:
        typer.echo("Failed --fail-if conditions:\n" + "\n".join(f"  {line}" for line in result.failures), err=True)
        raise typer.Exit(1)
