"""What a report says, in order (verdict first): RunReport(s) → render blocks, PNG plots and the metrics.json dict.

Single run: title, context line (engine → trainer), the verdict (healthy / warning / alarm and why), contents,
the recommendation with the trainer settings to paste, headline cards coloured by their band, the input checks,
plots, the correction (IS modes, verl rejection options, the sweep as a mode × threshold pivot), where the
mismatch comes from, the worst tokens; raw tables folded in <details>. Each thing is said once: identical sweep
columns and rejection options that change nothing are collapsed. Several runs: the same numbers side by side
with plots coloured by run, and a link to each run's own report.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from rcdiag import __version__
from rcdiag.analysis.correction.modes import lower_for, mode_names
from rcdiag.analysis.distributions.strata import titles
from rcdiag.analysis.distributions.tails import TAIL_NAMES
from rcdiag.analysis.keys import rename
from rcdiag.analysis.verdict.health import VERDICT_MODE
from rcdiag.probe.answer import latest_answer
from rcdiag.report import figproc
from rcdiag.report.baseline import baseline_section
from rcdiag.report.build import RunReport
from rcdiag.report.context import context_line, run_context
from rcdiag.report.correction_section import correction_blocks
from rcdiag.report.lag_section import lag_section
from rcdiag.report.options import ESS_TARGET, ReportOptions
from rcdiag.report.probe_section import probe_section
from rcdiag.report.recommend import SOURCE_FIRST
from rcdiag.report.render import BADGE, Block, fmt, render_files
from rcdiag.report.routing_section import routing_section
from rcdiag.report.section import Section
from rcdiag.report.trend_section import trend_section
from rcdiag.store.names import unique_run_names

HEADLINE = ("kl", "k3_kl", "chi2_token", "log_ppl_abs_diff", "abs_log_ratio_mean", "abs_log_ratio_p99",
            "abs_log_ratio_max", "frac_outside_0.5_2", "ess", "is_weight_mean", "prob_pearson_corr")
STRATA_PLOTS = {"position": "l_by_position.png"}
STRATUM_COLUMNS = ("bucket", "tokens", "share", "mean_log_ratio", "mean_abs", "rms", "max_abs")
"""A stratum's kl is −mean_log_ratio (canonical): shown once, as mean ℓ."""


def value_of(report: RunReport, name: str) -> float:
    """A headline value: docs/metrics.md metric, else token_truncate IS metric (ess), else tail statistic."""
    if name in report.metrics:
        return report.metrics[name]
    if name in ("ess", "is_weight_mean"):
        return report.is_modes.get(VERDICT_MODE, {}).get(name, float("nan"))
    return report.tails.get(name, float("nan"))


def interval(report: RunReport, name: str) -> str:
    ci = report.intervals.get(name)
    return f"[{fmt(ci['low'])}, {fmt(ci['high'])}]" if ci and ci["low"] == ci["low"] else ""


def headline_label(name: str, report: RunReport) -> str:
    if name in ("ess", "is_weight_mean"):
        return f"{name} ({VERDICT_MODE}, C={report.options.threshold:g})"
    return name


# ----------------------------------------------------------------------------------------------- figures
def send_scan_figures(report: RunReport) -> None:
    """Send the figures the passes alone decide (ℓ's histogram, ℓ against the rollout probability, the strata) to
    the figure process as soon as the report is judged: it draws them while the bootstrap, the worst items and
    the recommendation are made, and `figures` then sends only the sweep (issue #15)."""
    report.pending_figures = figproc.submit(scan_figure_specs(report))


def figures(report: RunReport) -> Callable[[], dict[str, bytes]]:
    """Every plot of one run, sent to the figure process (but those send_scan_figures sent): call the result for
    the PNG bytes by file name."""
    if report.pending_figures is None:
        return figproc.submit(figure_specs(report))
    early, sweep = report.pending_figures, _sweep_figure_specs(report)
    rest = figproc.submit(sweep) if sweep else dict  # no sweep (refused metrics): no round trip
    return lambda: {**early(), **rest()}


def comparison_figures(reports: Sequence[RunReport]) -> Callable[[], dict[str, bytes]]:
    """figures() of several runs overlaid, one colour per run (no recommendation marked)."""
    return figproc.submit(figure_specs(reports))


def figure_specs(reports: RunReport | Sequence[RunReport]) -> dict[str, figproc.FigureSpec]:
    """Every plot as {file name: (plots function, arguments)}: of one run (its data, the recommendation marked),
    or of several (each plot's data as {run name: data}, which the plots functions overlay)."""
    return {**scan_figure_specs(reports), **_sweep_figure_specs(reports)}


def _overlay(reports: RunReport | Sequence[RunReport]) -> tuple[bool, list[RunReport], Callable[[Callable], Any]]:
    """(one run?, the runs, each(get)): get's value of the one run, or {run name: value} over several."""
    one = isinstance(reports, RunReport)
    runs = [reports] if one else list(reports)

    def each(get: Callable[[RunReport], Any]) -> Any:
        return get(runs[0]) if one else {r.name: get(r) for r in runs}

    return one, runs, each


def scan_figure_specs(reports: RunReport | Sequence[RunReport]) -> dict[str, figproc.FigureSpec]:
    """The plots of the passes' own numbers (tails and strata): ready once a report is judged."""
    _, _, each = _overlay(reports)
    specs = {"l_histogram.png": ("log_ratio_histogram", (each(lambda r: r.scan.tails),)),
             "l_vs_rollout.png": ("log_ratio_vs_rollout", (each(lambda r: r.strata["rollout_prob"]),))}
    for stratum, file in STRATA_PLOTS.items():
        specs[file] = ("by_stratum", (each(lambda r, s=stratum: r.strata[s]), f"ℓ by {titles()[stratum]}",
                                      titles()[stratum]))
    return specs


def _sweep_figure_specs(reports: RunReport | Sequence[RunReport]) -> dict[str, figproc.FigureSpec]:
    """The sweep's plot, with one run's recommendation marked (none when no run has a sweep)."""
    one, runs, _ = _overlay(reports)
    swept = [r for r in runs if r.sweep is not None and len(r.sweep)]
    if not swept:
        return {}
    rec = runs[0].recommendation if one else None
    marked = (rec.mode, rec.threshold) if rec is not None and rec.mode and rec.family == "mode" else None
    sweeps = figproc.records(swept[0].sweep) if one else {r.name: figproc.records(r.sweep) for r in swept}
    return {"sweep.png": ("sweep_curves", (sweeps, marked,
                                           ESS_TARGET))}


# ----------------------------------------------------------------------------------------------- one run
def checks_line(report: RunReport) -> str:
    """'input checks pass' or 'N input check(s) need attention': checks are about the data's integrity, the
    verdict about the mismatch."""
    bad = [f for f in report.checks if f.severity in ("warning", "error")]
    line = f"{len(bad)} input check(s) need attention" if bad else "input checks pass"
    if report.metrics_error:  # never "pass" alone when the metrics refused (or withheld) the numbers
        line = f"{line if bad else 'the input checks pass'}, but the metrics refused the data (see Checks)"
    return line


def _summary(report: RunReport) -> str:
    c = report.counts
    o = report.options
    return (f"{report.path} — {c.get('sequences', 0):,} sequences, {c.get('token_rows', 0):,} token rows "
            f"({c.get('tokens', 0):,} valid); convention {o.convention}, threshold C={o.threshold:g}"
            f"{'' if o.lower is None else f', lower L={o.lower:g}{_lower_note(o)}'}; {checks_line(report)}."
            + ("" if o.setting is None else f" {o.setting.sentence()}"))


def _lower_note(o: ReportOptions) -> str:
    """Where the convention bounds only some modes from below, which ones L applies to."""
    modes = mode_names()
    bounded = [m for m in modes if lower_for(m, o.convention, o.lower) is not None]
    return "" if len(bounded) == len(modes) else f" (on {', '.join(bounded)}: {o.convention} bounds only those)"


def verdict_blocks(report: RunReport) -> list[Block]:
    """The context line and the coloured verdict — its cause, the evidence, what to do, the rule's source and any
    caveat (shared by the report's top and the comparison)."""
    v = report.verdict
    notes = [f"What to do: {v.cause.action}"] if v.cause.action else []
    notes += [f"Why we think so: {v.cause.source}"] if v.cause.source else []
    notes += [f"Note: {c}" for c in v.caveats]
    return [Block("context", context_line(report.manifest)),
            Block("verdict", v.headline() + verdict_phrase(report), rows=v.reasons, status=v.status, notes=notes)]


def verdict_phrase(report: RunReport) -> str:
    """What the recommendation adds to the headline (Recommendation.phrase), unless a check's fix is the action;
    after a cause whose action removes the source (SOURCE_FIRST) a correction reads as the stopgap it is."""
    kind = report.verdict.cause.kind
    if kind.startswith("input"):
        return ""
    phrase = report.recommendation.phrase
    if kind in SOURCE_FIRST and report.recommendation.kind == "correct":
        return phrase.replace(" — correct with", f" — {SOURCE_FIRST[kind]}; until then, correct with", 1)
    return phrase


def _top(report: RunReport) -> Section:
    blocks = [Block("h", f"rcdiag report — {report.name}", level=1), *verdict_blocks(report),
              Block("p", _summary(report)), Block("toc")]
    if report.metrics_error:
        blocks.append(Block("callout", f"Metrics not computed: {report.metrics_error}"))
    return Section(blocks, data=run_data(report))


def _recommendation(report: RunReport) -> Section:
    rec = report.recommendation
    blocks = [Block("h", "Recommendation"), Block("callout", rec.text)]
    if rec.settings:
        bound = "δ" if rec.family == "gate" else "C"
        what = f"{rec.mode} at {bound}={rec.threshold:g}" if rec.mode else "no correction, metrics logged"
        blocks += [Block("h", f"Settings to paste ({what})", level=3), Block("settings", rows=list(rec.settings))]
    if rec.alternatives:
        cols = ("mode", "threshold", "beyond_share", "beyond_mass", "ess", "bias", "thrown", "why")
        blocks += [Block("h", "How each mode handles the tail", level=3),
                   Block("table", headers=["mode", "C", "beyond C", "|ℓ| mass beyond C", "ESS", "bias |E[w]−1|",
                                           "thrown away", "verdict"],
                         rows=[[a.get(c) for c in cols] for a in rec.alternatives])]
    if rec.gates:
        cols = ("gate", "framework", "threshold", "masked", "ess", "why")
        blocks += [Block("h", "How each gate family handles the tail (at its default δ)", level=3),
                   Block("table", headers=["gate", "framework", "δ", "masked", "ESS of survivors", "verdict"],
                         rows=[[g[c] for c in cols] for g in rec.gates])]
    return Section(blocks)


def _news(report: RunReport) -> bool:
    """Whether the timeline found a step change or a drift: then the trend comes right after the recommendation."""
    return report.timeline is not None and bool(report.timeline.change or report.timeline.drift)


def _trend_first(report: RunReport) -> Section | None:
    return trend_section(report) if _news(report) else None


def _trend(report: RunReport) -> Section | None:
    return None if _news(report) else trend_section(report)


def _headline(report: RunReport) -> Section:
    o = report.options
    return Section([
        Block("h", "Headline"),
        Block("cards", rows=[(headline_label(n, report), value_of(report, n), interval(report, n),
                              report.verdict.metric_status.get(n, "")) for n in HEADLINE]),
        Block("p", f"Colours: rcdiag's health bands (rcdiag.analysis.verdict.health; verl's documented warning levels and "
                   f"published dense/MoE ranges); mean |ℓ| against the run's own noise floor. Intervals: "
                   f"{o.level:.0%} percentile bootstrap over sequences ({o.replicates} Poisson replicates).")])


def _checks(report: RunReport) -> Section:
    return Section([Block("h", "Input checks"), Block("findings", rows=report.checks)])


def _distributions(report: RunReport) -> Section:
    return Section([Block("h", "Distributions"),
                    Block("image", "ℓ histogram (log count axis)", image="l_histogram.png"),
                    Block("image", "mismatch against the rollout probability", image="l_vs_rollout.png")])


def _raw(report: RunReport) -> Section:
    o = report.options
    return Section([Block("h", "Raw numbers"),
                    Block("rawtable", "All metrics", headers=["metric", "value", f"{o.level:.0%} CI"],
                          rows=[[k, v, interval(report, k)] for k, v in report.metrics.items()]),
                    Block("rawtable", "Tails", headers=["statistic", "value"],
                          rows=[[k, report.tails.get(k)] for k in TAIL_NAMES]),
                    Block("details", "manifest.json", rows=[json.dumps(report.manifest, indent=2, default=str)])])


SECTIONS: tuple[tuple[str, Callable[[RunReport], Section | None]], ...] = (
    ("top", _top),
    ("recommendation", _recommendation),
    ("trend_first", _trend_first),
    ("headline", _headline),
    ("checks", _checks),
    ("distributions", _distributions),
    ("correction", lambda r: Section(correction_blocks(r))),
    ("where", lambda r: Section(_strata_blocks(r))),
    ("routing", routing_section),
    ("worst", lambda r: Section(_worst_blocks(r))),
    ("baseline", baseline_section),
    ("trend", _trend),
    ("lag", lambda r: Section(*lag_section(r))),
    ("probe", lambda r: Section(*probe_section(r.path))),
    ("raw", _raw),
)
"""A single run's report, in order: (name, builder). A builder takes the RunReport and gives a Section (blocks,
figures to draw, metrics.json keys) or None (nothing to say). Adding a section is one function and one row here
(docs/recipes.md)."""


def run_sections(report: RunReport) -> list[Section]:
    """Every section of one run's report that has something to say, in SECTIONS' order."""
    return [section for _, build in SECTIONS if (section := build(report)) is not None]


def run_blocks(report: RunReport) -> list[Block]:
    """The single-run report's blocks, verdict first (every section's)."""
    return [block for section in run_sections(report) for block in section.blocks]


def _strata_blocks(report: RunReport) -> list[Block]:
    answer = latest_answer(report.path)
    where = (f"The probe's answer (its section below): {answer.top_line}" if answer is not None else
             f"Which setting causes it is measured, not read off these strata: `rcdiag probe {report.path}` "
             "recomputes the tokens under each dtype, kernel and batch setting and names the one behind the gap.")
    blocks = [Block("h", "Where the mismatch comes from"), Block("callout", where)]
    names = titles()
    for stratum, file in STRATA_PLOTS.items():
        blocks.append(Block("image", f"ℓ by {names[stratum]}", image=file))
    for stratum, rows in report.strata.items():
        blocks.append(Block("rawtable", f"ℓ by {names[stratum]}", headers=list(STRATUM_COLUMNS),
                            rows=[[r[c] for c in STRATUM_COLUMNS] for r in rows]))
    return blocks


def _worst_blocks(report: RunReport) -> list[Block]:
    tok = ["seq_id", "pos", "token_id", "log_ratio", "train_logprob", "rollout_logprob", "context"]
    seq = ["seq_id", "tokens", "mean_log_ratio", "max_abs_log_ratio", "finish_reason", "reward", "response_text"]
    prompts = ["prompt_id", "samples", "tokens", "mean_abs", "kl"]
    return [Block("h", "Worst tokens by |ℓ|"),
            Block("table", headers=tok, rows=[[w.get(c, "") for c in tok] for w in report.worst_tokens]),
            Block("rawtable", "Worst sequences by |mean ℓ|", headers=seq,
                  rows=[[_short(w.get(c, "")) for c in seq] for w in report.worst_sequences]),
            Block("rawtable", "Prompts with the largest mismatch (mean |ℓ|)", headers=prompts,
                  rows=[[p[c] for c in prompts] for p in report.prompts])]


def _short(value: Any, limit: int = 160) -> Any:
    return value[:limit] + "…" if isinstance(value, str) and len(value) > limit else value


def run_data(report: RunReport) -> dict[str, Any]:
    """metrics.json of one run (names as docs/metrics.md; sections as documented in the README)."""
    o = report.options
    counts_keys = ("tokens", "sequences", "empty_sequences")
    return {
        "rcdiag_version": __version__, "run": {"name": report.name, "path": report.path},
        "options": {"convention": o.convention, "threshold": o.threshold, "lower": o.lower,
                    "thresholds": list(o.thresholds), "keys": o.keys,
                    "is_setting": None if o.setting is None else {
                        "mode": o.setting.mode, "threshold": o.setting.threshold, "lower": o.setting.lower,
                        "origin": o.setting.origin, "why": o.setting.sentence()}},
        "metrics": rename({k: v for k, v in report.metrics.items() if k not in counts_keys}, o.keys),
        "metrics_error": report.metrics_error,
        "confidence_intervals": report.intervals,
        "bootstrap": {"method": "percentile, Poisson(1) weights over sequences", "replicates": o.replicates,
                      "level": o.level, "seed": o.seed},
        "tails": report.tails and rename(report.tails, o.keys), "is_modes": _renamed(report.is_modes, o.keys),
        "rejection": _renamed(report.rejection, o.keys),
        "sweep": [] if report.sweep is None else report.sweep.to_dict(orient="records"),
        "gate_sweep": [] if report.gate_sweep is None else report.gate_sweep.to_dict(orient="records"),
        "verdict": report.verdict.to_dict(), "context": {"line": context_line(report.manifest),
                                                         **run_context(report.manifest)},
        "recommendation": report.recommendation.to_dict(), "checks": [f.to_dict() for f in report.checks],
        "strata": report.strata, "prompts": report.prompts, "worst_tokens": report.worst_tokens,
        "worst_sequences": report.worst_sequences,
        "counts": report.counts, "manifest": report.manifest,
    }


def _renamed(tables: dict[str, dict[str, Any]] | None, keys: str) -> dict[str, dict[str, Any]] | None:
    """{mode or option: IS metrics} with the metrics under the chosen key names."""
    return tables and {name: rename(values, keys) for name, values in tables.items()}


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
              Block("toc"), Block("h", "Verdicts")]
    for r in reports:
        blocks += [Block("h", r.name, level=3), *verdict_blocks(r), Block("callout", r.recommendation.text)]
    blocks += [Block("h", "Input checks"), Block("table", headers=["check", *names], rows=status),
               Block("h", "Headline (95% CI)"), Block("table", headers=["metric", *names], rows=head),
               Block("h", "Distributions"), Block("image", "ℓ histograms", image="l_histogram.png"),
               Block("image", "mismatch against the rollout probability", image="l_vs_rollout.png"),
               Block("image", "ℓ by position", image="l_by_position.png"),
               Block("h", f"IS modes at C={reports[0].options.threshold:g}"),
               Block("table", headers=["mode.metric", *names], rows=is_rows)]
    if any(r.sweep is not None and len(r.sweep) for r in reports):
        blocks.append(Block("image", "sweep", image="sweep.png"))
    blocks.append(Block("rawtable", "Tails", headers=["statistic", *names],
                        rows=[[k, *(r.tails.get(k) for r in reports)] for k in TAIL_NAMES]))
    return blocks


def comparison_data(reports: Sequence[RunReport], links: dict[str, str]) -> dict[str, Any]:
    return {"rcdiag_version": __version__, "comparison": [r.name for r in reports],
            "reports": links, "runs": {r.name: run_data(r) for r in reports}}


# ----------------------------------------------------------------------------------------------- files
def run_files(report: RunReport) -> dict[str, bytes]:
    """One run's report files: SECTIONS folded — blocks in order, their figures in one request to the figure
    process, their data merged into metrics.json."""
    images = figures(report)  # first: the figure process draws them while the bootstrap finishes (build_report)
    sections = run_sections(report)
    section_figures = {name: spec for section in sections for name, spec in section.figures.items()}
    more = figproc.submit(section_figures) if section_figures else dict  # dict(): no figures, no round trip
    data = {key: value for section in sections for key, value in section.data.items()}
    return render_files([b for section in sections for b in section.blocks], {**images(), **more()}, data,
                        f"rcdiag report — {report.name}")


def comparison_files(reports: Sequence[RunReport]) -> dict[str, bytes]:
    """The comparison report at the top, each run's full report under runs/<name>/."""
    for report, name in zip(reports, unique_run_names([r.path for r in reports], [r.name for r in reports]),
                            strict=True):
        report.name = name
    links = {r.name: f"runs/{r.name}" for r in reports}
    images = comparison_figures(reports)  # before anything reads an interval (the bootstraps run meanwhile)
    blocks = comparison_blocks(reports, links)
    files = render_files(blocks, images(), comparison_data(reports, links), "rcdiag comparison")
    for r in reports:
        files.update({f"{links[r.name]}/{k}": v for k, v in run_files(r).items()})
    return files
