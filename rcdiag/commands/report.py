"""`rcdiag report`: checks, metrics with intervals, IS simulation and a recommendation → md/html/json (+ CI gate)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rcdiag.analysis.keys import KEY_STYLES
from rcdiag.distributed import RAY_HELP
from rcdiag.errors import ConfigError
from rcdiag.report.options import CONVENTIONS, DEFAULT_COMPARISON_DIR, FAIL_ON, ReportOptions

DEFAULTS = ReportOptions()

if TYPE_CHECKING:
    from rcdiag.report.build import RunReport


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
    convention: Annotated[str | None, typer.Option(
        "--convention", help=f"Formulas: {' | '.join(CONVENTIONS)} (docs/metrics.md; default: the --keys "
        "framework's, else canonical).")] = None,
    threshold: Annotated[float | None, typer.Option(
        "--threshold", help="IS threshold C [default: the run's recorded trainer setting, else the --keys "
        f"framework's default, else {DEFAULTS.threshold}].")] = None,
    lower: Annotated[float | None, typer.Option(
        "--lower", help="Optional lower bound L [default: the run's recorded trainer setting].")] = None,
    thresholds: Annotated[str | None, typer.Option(
        "--thresholds", help="Sweep grid, comma-separated (default "
        f"{','.join(f'{c:g}' for c in DEFAULTS.thresholds)}).")] = None,
    fail_if: Annotated[list[str] | None, typer.Option(
        "--fail-if", help='Exit 1 when a condition holds, e.g. "k3_kl>1e-3" (repeatable; gate on k3_kl or '
        'abs_log_ratio_mean, which are never negative, not on the signed kl).')] = None,
    fail_on: Annotated[str | None, typer.Option(
        "--fail-on", metavar="|".join(FAIL_ON),
        help="Exit 1 when a run's verdict is this level or worse (n/a, nothing judged, meets every level).")] = None,
    baseline: Annotated[Path | None, typer.Option(
        "--baseline", help='A run to compare with (e.g. the old stack); --fail-if "k3_kl>2x" gates on the ratio.'
    )] = None,
    fail_on_drift: Annotated[bool, typer.Option(
        "--fail-on-drift", help="Exit 1 when a multi-step run's mismatch jumps or drifts up (docs/metrics.md, "
        "'Across training').")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars; only each run's verdict line "
                                                             "(what a CI log keeps).")] = False,
    ray: Annotated[str | None, typer.Option("--ray", metavar="auto|local|ADDRESS", help=RAY_HELP)] = None,
    keys: Annotated[str, typer.Option("--keys", help=f"metrics.json key names: {' | '.join(KEY_STYLES)} (the "
                                      "framework's logged keys; implies that --convention; its correction defaults "
                                      "are --threshold's when the run records none).")] = DEFAULTS.keys,
) -> None:
    """Write report.md, a self-contained report.html, PNG plots and metrics.json for one or more runs.

    The verdict comes first: healthy / warning / alarm (n/a: nothing measured) and its cause — a failed input
    check, tokens no precision explains, a jump at a named step or a drift, staleness, or numerical mismatch
    against the run's own noise floor — with the evidence, what to do, and the trainer settings to paste (verl,
    TRL, ms-swift, slime) unless a correction would hide a bug. Then the recommendation, what changed across
    training (when something did), the input checks, every metric of docs/metrics.md with a 95% bootstrap
    interval, tail statistics, ℓ by position/probability/entropy/…, the IS modes, verl's rejection options and
    the gate families at --threshold, and a threshold sweep.

    --fail-if NAME OP VALUE (OP: < <= > >= == !=) exits 1 listing the conditions that hold. NAME is a metric
    (kl, k3_kl, chi2_token …), a tail statistic (abs_log_ratio_p99 …), a count, an IS metric of
    token_truncate at --threshold (ess, clipped_frac …) or MODE.NAME (sequence_mask.kept_seq_frac). A bad
    option (a condition that does not parse, an unknown name) exits 2 with the usage, before any work.

    Examples:

        rcdiag report runs/sample

        rcdiag report runs/sample --convention verl --threshold 2 --lower 0.5 --out reports/sample

        rcdiag report runs/bf16 runs/fp16 --out reports/bf16-vs-fp16

        rcdiag report runs/sample --quiet --fail-if "k3_kl>1e-3" --fail-if "ess<0.9"

        rcdiag report runs/sample --quiet --fail-on alarm    # CI: exit 1 on an alarm verdict

        rcdiag report runs/big --ray auto    # per-file accumulators as Ray tasks; the same numbers

        rcdiag report runs/new-vllm --baseline runs/old-vllm --fail-if "k3_kl>2x"   # upgrade gate

        rcdiag report runs/steps --fail-on-drift    # per-step dumps: fail when the mismatch jumps or grows
    """
    try:  # a bad option is a usage error (exit 2), never mistaken for a gate that failed (exit 1)
        options = ReportOptions(convention=convention, threshold=threshold, lower=lower,
                                thresholds=_thresholds(thresholds), silent=quiet, keys=keys, fail_if=fail_if or (),
                                fail_on=fail_on, fail_on_drift=fail_on_drift,
                                baseline=None if baseline is None else str(baseline))
        from rcdiag.report import gate

        gate.conditions(options.fail_if, options.baseline is not None)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if ray is not None:
        from rcdiag.distributed.report import make_report_on_ray

        result = make_report_on_ray([str(r) for r in runs], out, options, ray)
    else:
        from rcdiag.report.make import make_report  # pandas and numba only when a report is made (the figure
        # process was started when the CLI resolved `report`: rcdiag.cli.COMMANDS' warm hook)

        result = make_report([str(r) for r in runs], out, options)
    if quiet:
        for report in result.reports:
            typer.echo(verdict_line(report))
    else:
        for report in result.reports:
            typer.echo(summary_line(report))
        typer.echo(f"Wrote {result.out}/report.html, report.md, metrics.json")
        runs_shown = " ".join(str(r) for r in runs)
        typer.echo(f"Next: open {result.out}/report.html in a browser, or explore with `rcdiag dashboard "
                   f"{runs_shown}`")
    if result.failures:
        header = "Failed --fail-if / --fail-on-drift conditions:" if fail_on_drift else "Failed --fail-if conditions:"
        typer.echo(header + "\n" + "\n".join(f"  {line}" for line in result.failures), err=True)
    if result.fail_on:
        typer.echo(f"--fail-on {fail_on}:\n" + "\n".join(f"  {line}" for line in result.fail_on), err=True)
    if result.failed:
        raise typer.Exit(1)


def verdict_line(report: RunReport) -> str:
    """One run's verdict in one line: 'runs/x: ALARM: … — no correction' (the --quiet output a CI log keeps)."""
    from rcdiag.report.sections import verdict_phrase  # loaded with the report; --help stays light

    return f"{report.name}: {report.verdict.headline()}{verdict_phrase(report)}"


def summary_line(report: RunReport) -> str:
    """The terminal summary of one run: its verdict with the cause, what to do, the evidence, and the input checks
    that need attention."""
    from rcdiag.report.sections import (  # loaded with the report; --help stays light
        checks_line,
        verdict_phrase,
    )

    v = report.verdict
    bad = [f for f in report.checks if f.severity in ("warning", "error")]
    what = verdict_phrase(report)
    reasons = "".join(f"\n  {r}" for r in v.reasons[:4])
    action = f"\n  What to do: {v.cause.action}" if v.cause.action else ""
    caveats = "".join(f"\n  Note: {c}" for c in v.caveats)
    return (f"{report.name}: {v.headline()}{what} "
            f"(kl={report.metrics.get('kl', float('nan')):.4g}; {checks_line(report)}){reasons}{action}{caveats}"
            + "".join(f"\n  {f.severity}: {f.name}: {f.message}" for f in bad if f.message not in reasons))
