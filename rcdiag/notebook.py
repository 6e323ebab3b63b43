"""The Jupyter layer: `Run` with notebook methods (what rcdiag.open_run returns), rich HTML, a plot accessor.

    run = rcdiag.open_run("runs/sample")
    run                                   # HTML card: source, settings, counts, headline metrics
    run.metrics(convention="verl")        # Result: a dict that renders as a table
    run.simulate("token_truncate", threshold=2.0)
    run.sweep()                           # DataFrame (mode × threshold)
    run.worst_sequences(5)                # DataFrame with prompt/response text
    run.sequence(17)                      # token-by-token view coloured by ℓ = a − b
    run.routing()                         # MoE runs with routes: agreement, |ℓ| by agreement (.by_layer …)
    run.plot.histogram(other_run)         # matplotlib Figures (rcdiag.report.plots)
    rcdiag.notebook.compare({"bf16": run, "fp32": other_run})

Everything heavy (the numba kernels, pandas, matplotlib) is imported on first use, so `rcdiag.open_run` stays
cheap; the store below knows nothing of this layer.
"""
from __future__ import annotations

import html
import warnings
from collections.abc import Mapping
from typing import Any

from rcdiag.errors import ConfigError, RcdiagError
from rcdiag.numbers import fmt
from rcdiag.store import run as store_run
from rcdiag.store import writer as store_writer
from rcdiag.store.manifest import Engine, Manifest, Trainer
from rcdiag.store.names import unique_run_names
from rcdiag.tokenizers import fast_tokenizer, run_tokenizer

HTML_METRICS_MAX_TOKENS = 2_000_000
"""A Run's HTML card computes headline metrics only up to this many token rows (one streaming pass)."""
HEADLINE = ("kl", "k3_kl", "log_ppl_abs_diff", "chi2_token", "tokens", "sequences", "empty_sequences")
WORST_BY = {"mean": "mean_log_ratio", "sum": "sum_log_ratio", "max": "max_abs_log_ratio"}
"""worst_sequences(by=…): rank by |mean ℓ| (default), |Σℓ| or max |ℓ| of the sequence."""
_CSS = ("<style>.rcdiag td,.rcdiag th{padding:2px 8px;text-align:left}.rcdiag .num{text-align:right;"
        "font-family:monospace}.rcdiag .badge{background:#dc2626;color:#fff;padding:1px 6px;border-radius:4px}"
        ".rcdiag .tok{font-family:monospace;white-space:pre;border-radius:2px;padding:0 1px}"
        ".rcdiag .masked{color:#999;text-decoration:line-through}</style>")


def _table(rows: list[tuple[str, Any]], header: tuple[str, str] | None = None) -> str:
    head = f"<tr><th>{header[0]}</th><th>{header[1]}</th></tr>" if header else ""
    body = "".join(f"<tr><td>{html.escape(str(k))}</td><td class='{_cell_class(v)}'>{html.escape(fmt(v))}</td></tr>"
                   for k, v in rows)
    return f"<table>{head}{body}</table>"


def _cell_class(value: Any) -> str:
    return "num" if isinstance(value, int | float) and not isinstance(value, bool) else "text"


class Result(dict):
    """A dict of results (metric name → value) that renders as a table in Jupyter; `title` says what it is."""

    def __init__(self, values: Mapping[str, Any], title: str = "") -> None:
        super().__init__(values)
        self.title = title

    def _repr_html_(self) -> str:
        scalars = [(k, v) for k, v in self.items() if not hasattr(v, "_repr_html_")]
        caption = f"<b>{html.escape(self.title)}</b>" if self.title else ""
        return f"<div class='rcdiag'>{_CSS}{caption}{_table(scalars, ('name', 'value'))}</div>"


# ------------------------------------------------------------------------------------------- run methods
def metrics(run: Any, convention: str | None = None, **kwargs: Any) -> Result:
    """compute_metrics(run, convention) as a Result (docs/metrics.md names plus tokens/sequences/empty_sequences)."""
    from rcdiag.analysis.conventions import DEFAULT_CONVENTION
    from rcdiag.analysis.metrics.compute import compute_metrics

    convention = convention or DEFAULT_CONVENTION
    return Result(compute_metrics(run, convention, **kwargs), f"{run.name}: metrics ({convention})")


def simulate(run: Any, mode: str, threshold: float | None = None, **kwargs: Any) -> Result:
    """correction.simulate(run, mode, threshold, …) as a Result (IS metrics; `weights` DataFrame if asked)."""
    from rcdiag.analysis.correction.modes import DEFAULT_THRESHOLD
    from rcdiag.analysis.correction.modes import simulate as _simulate

    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    return Result(_simulate(run, mode, threshold, **kwargs), f"{run.name}: {mode} at C = {fmt(float(threshold))}")


def sweep(run: Any, **kwargs: Any) -> Any:
    """correction.sweep(run, …): a DataFrame, one row per mode × threshold."""
    from rcdiag.analysis.correction.modes import sweep as _sweep

    return _sweep(run, **kwargs)


def worst_sequences(run: Any, k: int = 10, by: str = "mean", tokenizer: Any = None) -> Any:
    """The k sequences with the largest |mean ℓ| (by="mean"), |Σℓ| ("sum") or max |ℓ| ("max").

    Returns a DataFrame (k rows or fewer; sequences without valid tokens are never ranked) with the
    metrics.sequence_stats columns plus prompt_id, finish_reason, reward, prompt_text and response_text — the
    response decoded from its token ids with `tokenizer` (or the run's local tokenizer) when the run lacks text.
    """
    from rcdiag.analysis.metrics.compute import sequence_stats

    if by not in WORST_BY:
        raise ConfigError(f"by={by!r}: choose from {', '.join(WORST_BY)}")
    stats = sequence_stats(run)
    stats = stats[stats["n_valid"] > 0]
    order = stats[WORST_BY[by]].abs().sort_values(ascending=False, kind="stable").index[:max(k, 0)]
    worst = stats.loc[order].reset_index(drop=True)
    columns = ["seq_id", "prompt_id", "finish_reason", "reward", "prompt_text", "response_text"]
    seqs = run.sequences(columns)
    out = worst.merge(seqs, on="seq_id", how="left")
    missing = out["response_text"].isna()
    if missing.any():
        decoder = tokenizer or local_tokenizer(run)
        if decoder is not None:
            tokens = sequence_tokens(run, out.loc[missing, "seq_id"].tolist())
            for i in out.index[missing]:
                ids = tokens.loc[tokens["seq_id"] == out.at[i, "seq_id"], "token_id"].dropna().astype(int)
                out.at[i, "response_text"] = decoder.decode(ids.tolist())
    return out


def sequence_tokens(run: Any, seq_ids: list[int]) -> Any:
    """Token rows (DataFrame, sorted by seq_id, pos) of the given sequences: only the shards whose seq_id range
    (Parquet footer statistics) holds one of them are read, with Parquet filters."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rcdiag.store.schema import TOKEN_SCHEMA

    wanted = sorted({int(s) for s in seq_ids})
    files = [f for f in run.token_files if _may_hold(f, wanted)] if wanted else []
    tables = [pq.read_table(f, filters=[("seq_id", "in", wanted)]) for f in files]
    if not tables:
        return TOKEN_SCHEMA.empty_table().to_pandas()
    return pa.concat_tables(tables).sort_by([("seq_id", "ascending"), ("pos", "ascending")]).to_pandas()


def _may_hold(file: Any, wanted: list[int]) -> bool:
    """False only when the file's seq_id statistics prove none of `wanted` is in it (no statistics: True)."""
    import bisect

    import pyarrow.parquet as pq

    metadata = pq.read_metadata(file)
    column = metadata.schema.names.index("seq_id")
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if stats is None or not stats.has_min_max:
            return True
        i = bisect.bisect_left(wanted, stats.min)
        if i < len(wanted) and wanted[i] <= stats.max:
            return True
    return False


def local_tokenizer(run: Any) -> Any | None:
    """The run's tokenizer when its manifest names a local directory that loads offline, else None."""
    return run_tokenizer(run.manifest)


def compare(runs: Mapping[str, Any] | list[Any], convention: str | None = None) -> Any:
    """Headline metrics of several runs side by side: a DataFrame (rows: metrics; columns: runs).

    `runs`: {label: Run}, or a list of Runs labelled by rcdiag.store.names.unique_run_names (the directory name;
    `name-parent` when two clash, as in the comparison report). With exactly two runs a third column `difference` (second − first) is added.
    """
    import pandas as pd

    if isinstance(runs, Mapping):
        named = dict(runs)
    else:
        named = dict(zip(unique_run_names([r.path for r in runs]), runs, strict=True))
    frame = pd.DataFrame({name: pd.Series(dict(metrics(run, convention))) for name, run in named.items()})
    if len(named) == 2:
        first, second = frame.columns
        frame["difference"] = frame[second] - frame[first]
    return frame


# ------------------------------------------------------------------------------------------- HTML for a Run
def _settings(typed: Manifest) -> list[tuple[str, Any]]:
    """The card's settings rows, read from the typed manifest (old `engine.sampling` layouts included)."""
    engine, trainer = typed.engine or Engine(), typed.trainer or Trainer()
    rows = [("engine", engine.name), ("logprobs_mode", engine.logprobs_mode),
            ("engine dtype", engine.dtype), ("trainer dtype", trainer.dtype),
            ("temperature (sample / train)", f"{engine.temperature} / {trainer.temperature}"
             if typed.engine or typed.trainer else None),
            ("top_p / top_k", f"{engine.top_p} / {engine.top_k}" if typed.engine else None)]
    rows += [(f"model ({role})", ref.path) for role, ref in typed.models.items()]
    return [(k, v) for k, v in rows if v not in (None, "None / None")]


def run_html(run: Any, max_tokens: int = HTML_METRICS_MAX_TOKENS) -> str:
    """The HTML card of a Run: its context line (engine → trainer), source (retokenized flagged), settings, counts,
    what the source lacks, and — when the run has at most `max_tokens` token rows — the verdict (the same as
    `rcdiag report`'s) and the headline canonical metrics."""
    from rcdiag.report.context import context_line

    info = run.info
    source = info.source
    badge = " <span class='badge'>RETOKENIZED</span>" if source.retokenized else ""
    parts = [f"<b>Run {html.escape(run.name)}</b>{badge} <code>{html.escape(str(run.path))}</code>",
             f"<div class='context'>{html.escape(context_line(run.manifest))}</div>", _verdict_html(run, max_tokens),
             _table([("source", source.kind), ("created", info.created),
                     ("sequences", info.counts.get("sequences")), ("tokens", info.counts.get("tokens"))]
                    + _settings(info))]
    for items_of, label in ((source.lacks, "The source lacks"), (source.warnings, "Warnings")):
        if items_of:
            items = "".join(f"<li>{html.escape(str(x))}</li>" for x in items_of)
            parts.append(f"<div>{label}:<ul>{items}</ul></div>")
    parts.append(_headline_html(run, max_tokens))
    return f"<div class='rcdiag'>{_CSS}{''.join(parts)}</div>"


def _verdict_html(run: Any, max_tokens: int) -> str:
    """The run's verdict as a coloured banner (rcdiag.analysis.verdict.judge), for runs of at most `max_tokens` rows."""
    if run.num_tokens > max_tokens:
        return ""
    from rcdiag.report.build import run_verdict

    try:
        return run_verdict(run).html(max_reasons=5)
    except RcdiagError as exc:
        return f"<p>Verdict unavailable: {html.escape(str(exc))}</p>"


def _headline_html(run: Any, max_tokens: int) -> str:
    if run.num_tokens > max_tokens:
        return f"<p>{run.num_tokens:,} tokens: call <code>run.metrics()</code> for the headline metrics.</p>"
    try:
        values = metrics(run)
    except RcdiagError as exc:
        return f"<p>Metrics unavailable: {html.escape(str(exc))}</p>"
    return "<b>Headline metrics (canonical)</b>" + _table([(k, values.get(k)) for k in HEADLINE])


# ------------------------------------------------------------------------------------------- one sequence
class SequenceView:
    """One sequence token by token: `.frame` (DataFrame: pos, token_id, text, train/rollout logprob, log_ratio,
    mask) renders in Jupyter as tokens coloured by ℓ = a − b (red: trainer higher, blue: rollout higher, scale
    ±max |ℓ| over valid tokens); masked tokens are grey and struck through."""

    def __init__(self, run: Any, seq_id: int, tokenizer: Any = None) -> None:
        frame = sequence_tokens(run, [seq_id])
        if frame.empty and seq_id not in set(run.sequences(["seq_id"])["seq_id"]):
            raise ConfigError(f"{run.name} has no sequence {seq_id}")
        frame["log_ratio"] = frame["train_logprob"].astype(float) - frame["rollout_logprob"].astype(float)
        decoder = tokenizer or fast_tokenizer(run.manifest) or local_tokenizer(run)  # fast: no transformers import
        frame["text"] = ([decoder.decode([int(t)], skip_special_tokens=False) for t in frame["token_id"]]
                         if decoder is not None else [f"⟨{t}⟩" for t in frame["token_id"]])
        self.seq_id = seq_id
        self.frame = frame[["pos", "token_id", "text", "train_logprob", "rollout_logprob", "log_ratio", "mask"]]

    def _repr_html_(self) -> str:
        valid = self.frame[self.frame["mask"]]["log_ratio"].abs()
        scale = float(valid.max()) if len(valid) and valid.notna().any() and valid.max() > 0 else 1.0
        spans = []
        for row in self.frame.itertuples():
            title = (f"pos {row.pos} id {row.token_id}: a={row.train_logprob:.4g} b={row.rollout_logprob:.4g} "
                     f"ℓ={row.log_ratio:.4g}")
            if not row.mask:
                spans.append(f"<span class='tok masked' title='masked; {html.escape(title)}'>{html.escape(row.text)}</span>")
                continue
            spans.append(f"<span class='tok' style='background:{_color(row.log_ratio / scale)}' "
                         f"title='{html.escape(title)}'>{html.escape(row.text)}</span>")
        return (f"<div class='rcdiag'>{_CSS}<b>sequence {self.seq_id}</b> (colour scale ±{fmt(scale)} nats)"
                f"<div>{''.join(spans)}</div></div>")


def _color(x: float) -> str:
    """Diverging colour for x in [−1, 1]: blue (negative) – white – red (positive), never so dark that black text
    becomes unreadable (the extremes are rgb(255,80,80) and rgb(80,80,255)); NaN → yellow."""
    if x != x:
        return "#fde047"
    x = max(-1.0, min(1.0, x))
    fade = round(255 - 175 * abs(x))
    return f"rgb(255,{fade},{fade})" if x > 0 else f"rgb({fade},{fade},255)"


# ------------------------------------------------------------------------------------------- plots
class PlotAccessor:
    """`run.plot.<name>(*other_runs)` → matplotlib Figure (rcdiag.report.plots); other runs are overlaid by name.

    The streaming scan behind histogram/density/strata runs once per run and is cached on the accessor's run.
    """

    def __init__(self, run: Any) -> None:
        self._run = run
        register_figure_display()

    def _scans(self, others: tuple[Any, ...]) -> dict[str, Any]:
        runs = (self._run, *others)
        return {r.name: _cached_scan(r) for r in runs}

    def histogram(self, *others: Any) -> Any:
        """Histogram of ℓ (log count axis); several runs overlaid."""
        from rcdiag.report.plots import log_ratio_histogram

        scans = self._scans(others)
        tails = {name: s.tails for name, s in scans.items()}
        return log_ratio_histogram(tails if others else next(iter(tails.values())))

    def density(self) -> Any:
        """2-D density of rollout vs training log-probs, with the diagonal."""
        from rcdiag.report.plots import density_scatter

        return density_scatter(_cached_scan(self._run).tails)

    def strata(self, name: str = "position", *others: Any) -> Any:
        """Mean |ℓ| and mean ℓ per bucket of a stratum (position, response_length, rollout_prob, entropy,
        token_kind, finish_reason, reward)."""
        from rcdiag.analysis.distributions.strata import titles
        from rcdiag.report.plots import by_stratum

        if name not in titles():
            raise ConfigError(f"unknown stratum {name!r}: choose from {', '.join(titles())}")
        rows = {n: s.strata.finish()[name] for n, s in self._scans(others).items()}
        return by_stratum(rows if others else next(iter(rows.values())), f"ℓ by {titles()[name]}", titles()[name])

    def sweep(self, *others: Any, **kwargs: Any) -> Any:
        """ESS and clipped fraction against the threshold, per mode (kwargs go to correction.sweep)."""
        from rcdiag.report.plots import sweep_curves

        frames = {r.name: sweep(r, **kwargs) for r in (self._run, *others)}
        return sweep_curves(frames if others else next(iter(frames.values())))

    def sequence(self, seq_id: int) -> Any:
        """ℓ per position of one sequence (bars; masked positions shaded grey)."""
        return sequence_figure(SequenceView(self._run, seq_id).frame, seq_id)


def sequence_figure(frame: Any, seq_id: int) -> Any:
    """Bars of ℓ = a − b per position of one sequence; masked positions shaded. `frame` as SequenceView.frame."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 2.8), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    valid = frame["mask"].to_numpy()
    ell = frame["log_ratio"].to_numpy()
    pos = frame["pos"].to_numpy()
    ax.bar(pos[valid], ell[valid], color=["#dc2626" if v > 0 else "#2563eb" for v in ell[valid]], width=0.9)
    for p in pos[~valid]:
        ax.axvspan(p - 0.5, p + 0.5, color="#ddd", lw=0)
    ax.axhline(0, color="#555", lw=0.8)
    ax.set_xlabel("response position")
    ax.set_ylabel("ℓ = a − b (nats)")
    ax.set_title(f"Sequence {seq_id}: per-token log-ratio (grey: masked)")
    return fig


def register_figure_display() -> None:
    """In IPython, show matplotlib Figures as PNG: the figures are built without pyplot, so IPython's inline
    backend never registered them and would print `<Figure size …>` instead. No-op outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    from matplotlib.figure import Figure

    from rcdiag.report.plots import png_bytes

    shell.display_formatter.formatters["image/png"].for_type(Figure, png_bytes)


def _cached_scan(run: Any) -> Any:
    """The report's one-pass scan of `run`, cached on the Run object (runs are immutable once complete)."""
    cached = run.__dict__.get("_notebook_scan")
    if cached is None:
        from rcdiag.report.scan import scan_run

        cached = scan_run(run)
        run.__dict__["_notebook_scan"] = cached
    return cached


class RoutingResult(Result):
    """A MoE run's routing (rcdiag.analysis.moe.routing.RoutingSummary, the report's numbers): the headline numbers as
    a dict; `.by_layer` (agreement and router confidence per layer), `.by_disagreement` (|ℓ| by the number of
    layers whose experts differ) and `.by_margin` (|ℓ| by the smallest router margin) as DataFrames; `.summary`
    the summary itself."""

    def __init__(self, summary: Any, probe: str | None = None) -> None:
        import pandas as pd

        from rcdiag.report.routing_section import layer_rows

        share = summary.explains
        super().__init__({
            "layers": summary.layers, "top_k": summary.top_k, "experts": summary.experts,
            "tokens": summary.tokens, "any_disagree_share": summary.any_disagree_share,
            "exact_rate": summary.exact_rate, "mean_overlap": summary.mean_overlap,
            "mean_layers_disagree": summary.mean_layers_disagree,
            "routing_explains": share.share if share else float("nan"),
            "explains_method": share.method if share else "n/a", "gap": share.gap if share else float("nan"),
            "agreeing_gap": share.agreeing_gap if share else float("nan"), "replay_probe": probe or "",
            **{f"{side}_selected_mass": c["selected_mass"] for side, c in summary.confidence.items()},
            **{f"{side}_near_tie_share": c["near_tie_share"] for side, c in summary.confidence.items()}},
            "routing (mixture of experts)")
        self.summary = summary
        self.by_layer = pd.DataFrame(layer_rows(summary))
        self.by_disagreement = pd.DataFrame(summary.by_disagreement)
        self.by_margin = pd.DataFrame(summary.by_margin)

    def _repr_html_(self) -> str:
        return super()._repr_html_() + self.by_disagreement.to_html(index=False) + self.by_layer.to_html(index=False)


def routing(run: Any) -> RoutingResult:
    """The routing of a run with routes (what the report's Routing section shows, with a probe's measured replay
    where there is one); ConfigError for a run without routes."""
    from rcdiag.report.routing_section import routing_findings

    found = routing_findings(run)
    if found.error:
        raise ConfigError(f"{run.path}: routing not computed: {found.error}")
    if found.summary is None:
        raise ConfigError(f"{run.path}: no routes in this run (no 'routing' section or route columns: a dense "
                          "model, or a run scored without route capture)")
    return RoutingResult(found.summary, found.probe)


# ------------------------------------------------------------------------------------------- the Run
class Run(store_run.Run):
    """A run directory with notebook conveniences (rcdiag.store.Run plus metrics, simulate, sweep, worst
    sequences, one sequence, plots and an HTML card)."""

    def verdict(self) -> Any:
        """The verdict `rcdiag report RUN` gives (rcdiag.analysis.verdict.judge.Verdict: status, cause with evidence and
        action, reasons; shown as the coloured banner in Jupyter), from the report's cached pass."""
        from rcdiag.report.build import run_verdict

        return run_verdict(self)

    def metrics(self, convention: str | None = None, **kwargs: Any) -> Result:
        """Every docs/metrics.md diagnostic (rcdiag.compute_metrics) as a dict that renders in Jupyter."""
        return metrics(self, convention, **kwargs)

    def simulate(self, mode: str, threshold: float | None = None, **kwargs: Any) -> Result:
        """One IS correction (rcdiag.simulate) as a dict that renders in Jupyter."""
        return simulate(self, mode, threshold, **kwargs)

    def sweep(self, **kwargs: Any) -> Any:
        """IS metrics per mode × threshold (rcdiag.sweep): a DataFrame."""
        return sweep(self, **kwargs)

    def worst_sequences(self, k: int = 10, by: str = "mean", tokenizer: Any = None) -> Any:
        """The k sequences with the largest |mean ℓ| ("mean"), |Σℓ| ("sum") or max |ℓ| ("max"), with text."""
        return worst_sequences(self, k, by, tokenizer)

    def routing(self) -> RoutingResult:
        """MoE routing agreement and |ℓ| by agreement (RoutingResult: a dict of headline numbers with .by_layer,
        .by_disagreement, .by_margin frames); ConfigError for a run without routes."""
        return routing(self)

    def sequence(self, seq_id: int, tokenizer: Any = None) -> SequenceView:
        """One sequence token by token (`.frame`; renders coloured by ℓ in Jupyter)."""
        return SequenceView(self, seq_id, tokenizer)

    @property
    def plot(self) -> PlotAccessor:
        """Figures: run.plot.histogram(), .density(), .strata(name), .sweep(), .sequence(seq_id)."""
        return PlotAccessor(self)

    def _repr_html_(self) -> str:
        return run_html(self)


def open_run(path: Any) -> Run:
    """Open a complete run directory (RunDirError if it is not one) with the notebook conveniences."""
    return Run(path)


class MaskWarning(UserWarning):
    """Token rows came without a `mask` column: every row counts as a valid (loss-bearing) token."""


def write_run(path: Any, tokens: object, sequences: object | None = None, manifest: dict[str, Any] | None = None,
              *, tokenizer: str | None = None, **kwargs: Any) -> Run:
    """rcdiag.store.write_run, returning the notebook Run (same arguments: `write_run(path, tokens, sequences,
    manifest)`). `tokenizer`: the policy's tokenizer directory, recorded as the manifest's `tokenizer` section so
    reports, the dashboard and `run.sequence(i)` show token text instead of `[id]`. Tokens without a `mask` column
    are all counted as valid; a MaskWarning says so (prompt or padding rows in them would skew every metric)."""
    if tokenizer is not None:
        from rcdiag.store.manifest import abs_path

        manifest = {**(manifest or {}), "tokenizer": {"path": abs_path(tokenizer)}}
    columns = tokens.keys() if isinstance(tokens, Mapping) else getattr(
        tokens, "column_names", getattr(tokens, "columns", ["mask"]))  # Arrow table, DataFrame
    if "mask" not in list(columns):
        warnings.warn("the tokens have no 'mask' column: every row counts as a valid response token; add a "
                      "boolean 'mask' (False for prompt/padding/tool tokens) if some rows are not trained on",
                      MaskWarning, stacklevel=2)
    return Run(store_writer.write_run(path, tokens, sequences, manifest, **kwargs).path)
