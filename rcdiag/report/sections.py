"""What a report says, in order (checks first): RunReport(s) → render blocks, PNG plots and the metrics.json dict.

Single run: title, checks, headline cards with 95 % intervals, the recommendation, plots, every metric, tails,
IS modes, rejection options, the sweep, strata, worst tokens and sequences, manifest. Several runs: the same
numbers side by side with overlaid plots, and a link to each run's own report.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rcdiag import __version__
from rcdiag.analysis.strata import titles
from rcdiag.analysis.tails import TAIL_NAMES
from rcdiag.report import plots
from rcdiag.report.build import RunReport
from rcdiag.report.probe_section import probe_section
from rcdiag.report.render import BADGE, Block, fmt, render_files

HEADLINE = ("kl", "k3_kl", "chi2_token", "log_ppl_abs_diff", "ess", "abs_log_ratio_mean", "abs_log_ratio_p99",
            "abs_log_ratio_max", "frac_outside_0.8_1.25", "prob_pearson_corr")
IS_COLUMNS = ("is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max", "ess", "clipped_frac",
              "fraction_high", "fraction_low", "kept_token_frac", "kept_seq_frac")
STRATA_PLOTS = {"position": "l_by_position.png", "rollout_prob": "l_by_rollout_prob.png"}
STRATUM_COLUMNS = ("bucket", "tokens", "share", "kl", "mean_log_ratio", "mean_abs", "rms", "max_abs")


def value_of(report: RunReport, name: str) -> float:
    """A headline value: METRICS.md metric, else token_truncate IS metric (ess), else tail statistic."""
    if name in report.metrics:
        return report.metrics[name]
    if name == "ess":
        return report.is_modes.get("token_truncate", {}).get("ess", float("nan"))
    return report.tails.get(name, float("nan"))


def interval(report: RunReport, name: str) -> str:
    ci = report.intervals.get(name)
    return f"[{fmt(ci['low'])}, {fmt(ci['high'])}]" if ci and ci["low"] == ci["low"] else ""


def headline_label(name: str, report: RunReport) -> str:
    return f"ess (token_truncate, C={report.options.threshold:g})" if name == "ess" else name


# ----------------------------------------------------------------------------------------------- figures
def figures(report: RunReport) -> dict[str, bytes]:
    """PNG bytes of every plot of one run, by file name."""
    s = report.scan
    figs = {"l_histogram.png": plots.log_ratio_histogram(s.tails),
            "b_vs_a_density.png": plots.density_scatter(s.tails)}
    for stratum, file in STRATA_PLOTS.items():
        figs[file] = plots.by_stratum(report.strata[stratum], f"ℓ by {titles()[stratum]}", titles()[stratum])
    if report.sweep is not None and len(report.sweep):
        figs["sweep.png"] = plots.sweep_curves(report.sweep)
    return {name: plots.png_bytes(fig) for name, fig in figs.items()}


def comparison_figures(reports: Sequence[RunReport]) -> dict[str, bytes]:
    runs = {r.name: r for r in reports}
    figs = {"l_histogram.png": plots.log_ratio_histogram({n: r.scan.tails for n, r in runs.items()})}
    for stratum, file in STRATA_PLOTS.items():
        figs[file] = plots.by_stratum({n: r.strata[stratum] for n, r in runs.items()},
                                      f"ℓ by {titles()[stratum]}", titles()[stratum])
    sweeps = {n: r.sweep for n, r in runs.items() if r.sweep is not None and len(r.sweep)}
    if sweeps:
        figs["sweep.png"] = plots.sweep_curves(sweeps)
    return {name: plots.png_bytes(fig) for name, fig in figs.items()}


# ----------------------------------------------------------------------------------------------- one run
def _summary(report: RunReport) -> str:
    c = report.counts
    o = report.options
    bad = [f for f in report.checks if f.severity in ("warning", "error")]
    verdict = (f"{len(bad)} check(s) need attention" if bad else "all checks pass")
    if report.metrics_error:
        verdict = f"{verdict if bad else 'the checks pass'}, but the metrics refused the data (see Checks)"
    return (f"{report.path} — {c.get('sequences', 0):,} sequences, {c.get('token_rows', 0):,} token rows "
            f"({c.get('tokens', 0):,} valid); convention {o.convention}, threshold C={o.threshold:g}"
            f"{'' if o.lower is None else f', lower L={o.lower:g}'}; {verdict}.")


def _is_table(numbers: dict[str, dict[str, float]], first: str) -> Block:
    return Block("table", headers=[first, *IS_COLUMNS],
                 rows=[[mode, *(v.get(c) for c in IS_COLUMNS)] for mode, v in numbers.items()])


def run_blocks(report: RunReport) -> list[Block]:
    """The single-run report, checks first."""
    o = report.options
    blocks = [Block("h", f"rcdiag report — {report.name}", level=1), Block("p", _summary(report)),
              Block("h", "Checks"), Block("findings", rows=report.checks)]
    if report.metrics_error:
        blocks.append(Block("callout", f"Metrics not computed: {report.metrics_error}"))
    blocks += [Block("h", "Headline"),
               Block("cards", rows=[(headline_label(n, report), value_of(report, n), interval(report, n))
                                    for n in HEADLINE]),
               Block("p", f"Intervals: {o.level:.0%} percentile bootstrap over sequences ({o.replicates} Poisson "
                          "replicates)."),
               Block("h", "Recommendation"), Block("callout", report.recommendation.get("text", "")),
               Block("h", "Distributions"),
               Block("image", "ℓ histogram (log count axis)", image="l_histogram.png"),
               Block("image", "rollout vs training log-prob density", image="b_vs_a_density.png"),
               Block("h", "All metrics"),
               Block("table", headers=["metric", "value", f"{o.level:.0%} CI"],
                     rows=[[k, v, interval(report, k)] for k, v in report.metrics.items()]),
               Block("h", "Tails"), Block("table", headers=["statistic", "value"],
                                          rows=[[k, report.tails.get(k)] for k in TAIL_NAMES])]
    blocks += _correction_blocks(report)
    blocks += _strata_blocks(report)
    blocks += _worst_blocks(report)
    blocks.append(Block("details", "manifest.json", rows=[json.dumps(report.manifest, indent=2, default=str)]))
    return blocks


def _correction_blocks(report: RunReport) -> list[Block]:
    o = report.options
    blocks = [Block("h", f"IS modes at C={o.threshold:g}"), _is_table(report.is_modes, "mode")]
    if report.rejection:
        blocks += [Block("h", "Rejection options (verl, on token_truncate)", level=3),
                   _is_table(report.rejection, "option")]
    if report.sweep is not None and len(report.sweep):
        blocks += [Block("h", "Threshold sweep"), Block("image", "ESS and clipped fraction", image="sweep.png"),
                   Block("table", headers=["mode", "threshold", *IS_COLUMNS],
                         rows=report.sweep[["mode", "threshold", *IS_COLUMNS]].values.tolist())]
    return blocks


def _strata_blocks(report: RunReport) -> list[Block]:
    blocks = [Block("h", "Where the mismatch comes from")]
    names = titles()
    for stratum, rows in report.strata.items():
        blocks.append(Block("h", f"ℓ by {names[stratum]}", level=3))
        if stratum in STRATA_PLOTS:
            blocks.append(Block("image", f"ℓ by {names[stratum]}", image=STRATA_PLOTS[stratum]))
        blocks.append(Block("table", headers=list(STRATUM_COLUMNS),
                            rows=[[r[c] for c in STRATUM_COLUMNS] for r in rows]))
    return blocks


def _worst_blocks(report: RunReport) -> list[Block]:
    tok = ["seq_id", "pos", "token_id", "log_ratio", "train_logprob", "rollout_logprob", "context"]
    seq = ["seq_id", "tokens", "mean_log_ratio", "max_abs_log_ratio", "finish_reason", "reward", "response_text"]
    prompts = ["prompt_id", "samples", "tokens", "mean_abs", "kl"]
    return [Block("h", "Prompts with the largest mismatch (mean |ℓ|)"),
            Block("table", headers=prompts, rows=[[p[c] for c in prompts] for p in report.prompts]),
            Block("h", "Worst tokens by |ℓ|"),
            Block("table", headers=tok, rows=[[w.get(c, "") for c in tok] for w in report.worst_tokens]),
            Block("h", "Worst sequences by |mean ℓ|"),
            Block("table", headers=seq, rows=[[_short(w.get(c, "")) for c in seq] for w in report.worst_sequences])]


def _short(value: Any, limit: int = 160) -> Any:
    return value[:limit] + "…" if isinstance(value, str) and len(value) > limit else value


def run_data(report: RunReport) -> dict[str, Any]:
    """metrics.json of one run (names as METRICS.md; sections as documented in the README)."""
    o = report.options
    counts_keys = ("tokens", "sequences", "empty_sequences")
    return {
        "rcdiag_version": __version__, "run": {"name": report.name, "path": report.path},
        "options": {"convention": o.convention, "threshold": o.threshold, "lower": o.lower,
                    "thresholds": list(o.thresholds)},
        "metrics": {k: v for k, v in report.metrics.items() if k not in counts_keys},
        "metrics_error": report.metrics_error,
        "confidence_intervals": report.intervals,
        "bootstrap": {"method": "percentile, Poisson(1) weights over sequences", "replicates": o.replicates,
                      "level": o.level, "seed": o.seed},
        "tails": report.tails, "is_modes": report.is_modes, "rejection": report.rejection,
        "sweep": [] if report.sweep is None else report.sweep.to_dict(orient="records"),
        "recommendation": report.recommendation, "checks": [f.to_dict() for f in report.checks],
        "strata": report.strata, "prompts": report.prompts, "worst_tokens": report.worst_tokens,
        "worst_sequences": report.worst_sequences,
        "counts": report.counts, "manifest": report.manifest,
    }


# ----------------------------------------------------------------------------------------------- comparison
def comparison_blocks(reports: Sequence[RunReport], links: dict[str, str]) -> list[Block]:
    names = [r.name for r in reports]
    checks = list(dict.fromkeys(f.name for r in reports for f in r.checks))
    status = [[c, *(BADGE[next((f.severity for f in r.checks if f.name == c), "ok")] for r in reports)]
              for c in checks]
    head = [[headline_label(n, reports[0]),
             *(f"{fmt(value_of(r, n))} {interval(r, n)}".strip() for r in reports)] for n in HEADLINE]
    modes = list(reports[0].is_modes)
    is_rows = [[f"{m}.{c}", *(r.is_modes.get(m, {}).get(c) for r in reports)] for m in modes
               for c in ("ess", "clipped_frac", "is_weight_mean", "kept_token_frac")]
    blocks = [Block("h", f"rcdiag comparison — {' vs '.join(names)}", level=1),
              Block("links", rows=[(f"{n}: full report", f"{links[n]}/report.html") for n in names]),
              Block("h", "Checks"), Block("table", headers=["check", *names], rows=status),
              Block("h", "Headline (95% CI)"), Block("table", headers=["metric", *names], rows=head),
              Block("h", "Recommendations")]
    blocks += [Block("callout", f"{r.name}: {r.recommendation.get('text', '')}") for r in reports]
    blocks += [Block("h", "Distributions"), Block("image", "ℓ histograms", image="l_histogram.png"),
               Block("image", "ℓ by position", image="l_by_position.png"),
               Block("image", "ℓ by rollout probability", image="l_by_rollout_prob.png"),
               Block("h", "Tails"), Block("table", headers=["statistic", *names],
                                          rows=[[k, *(r.tails.get(k) for r in reports)] for k in TAIL_NAMES]),
               Block("h", f"IS modes at C={reports[0].options.threshold:g}"),
               Block("table", headers=["mode.metric", *names], rows=is_rows)]
    if any(r.sweep is not None and len(r.sweep) for r in reports):
        blocks.append(Block("image", "sweep", image="sweep.png"))
    return blocks


def comparison_data(reports: Sequence[RunReport], links: dict[str, str]) -> dict[str, Any]:
    return {"rcdiag_version": __version__, "comparison": [r.name for r in reports],
            "reports": links, "runs": {r.name: run_data(r) for r in reports}}


# ----------------------------------------------------------------------------------------------- files
def run_files(report: RunReport) -> dict[str, bytes]:
    """One run's report files; the latest `rcdiag probe` of the run (if any) goes before the manifest."""

    blocks = run_blocks(report)
    probe_blocks, probe_images, probe_data = probe_section(report.path)
    blocks[-1:-1] = probe_blocks
    return render_files(blocks, {**figures(report), **probe_images}, {**run_data(report), **probe_data},
                        f"rcdiag report — {report.name}")


def unique_names(reports: Sequence[RunReport]) -> list[str]:
    """Run names made unique (a second 'run' becomes 'run-2') for the comparison's sub-directories."""
    seen: dict[str, int] = {}
    out = []
    for r in reports:
        # a run opened as "x/.." or "." is named ".." or "": as a folder it would write over the comparison
        name = "run" if r.name in ("", ".", "..") or "/" in r.name or "\\" in r.name else r.name
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out


def comparison_files(reports: Sequence[RunReport]) -> dict[str, bytes]:
    """The comparison report at the top, each run's full report under runs/<name>/."""
    for report, name in zip(reports, unique_names(reports), strict=True):
        report.name = name
    links = {r.name: f"runs/{r.name}" for r in reports}
    files = render_files(comparison_blocks(reports, links), comparison_figures(reports),
                         comparison_data(reports, links), "rcdiag comparison")
    for r in reports:
        files.update({f"{links[r.name]}/{k}": v for k, v in run_files(r).items()})
    return files
