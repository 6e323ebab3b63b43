"""Compare page: two or more runs side by side — a numeric metrics table with Δ against the first run, overlaid ℓ
histograms and strata. Colour means run everywhere (one fixed colour per run, one legend)."""
from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from app import aggregates, bands, charts, data, judged, state, ui
from app.text import md
from rcdiag.analysis.verdict.health import BY_METRIC
from rcdiag.store.names import unique_run_names

TABLE_METRICS = ("tokens", "sequences", "empty_sequences", "kl", "k3_kl", "chi2_token", "chi2_seq",
                 "log_ppl_diff", "log_ppl_abs_diff", "ppl_ratio", "abs_log_ratio_mean", "abs_log_ratio_p99",
                 "abs_log_ratio_max", "ess", "is_weight_mean", "clipped_frac")
# Rows of whole numbers: shown in full with thousands separators (the other rows: 4 significant digits). A comment,
# not a docstring: Streamlit's "magic" writes a page script's bare strings onto the page.
COUNT_METRICS = ("tokens", "sequences", "empty_sequences")
# The histograms' shared ℓ axis spans ±(largest per-run 99.9th percentile of |ℓ|): a single outlier token of one run
# does not stretch it (tokens beyond land in the outer bins, the caption gives each run's max).
RANGE_QUANTILE = 0.999


def render() -> None:
    st.header("Compare runs")
    known = list(dict.fromkeys([*st.session_state.get(ui.GIVEN, []), *st.session_state.get(ui.OPENED, [])]))
    labels = ui.run_names(known)
    by_name = {name: path for path, name in labels.items()}
    state.bind("cmp_runs", "runs", lambda raw: [by_name.get(n, n) for n in raw.split(",") if n],
               lambda runs: all(r in known for r in runs))
    st.session_state.setdefault("cmp_runs", known[:4])
    chosen = st.multiselect("Runs", known, format_func=lambda p: labels.get(p, p), key="cmp_runs",
                            help="The runs given on the command line and those opened in the sidebar. The first "
                                 "is the baseline of the Δ columns.")
    extra = st.text_input("Add a run directory", key="cmp_add", placeholder="runs/other")
    state.publish("runs", [labels[p] for p in chosen] or None)
    paths = list(dict.fromkeys([*chosen, *([extra.strip()] if extra.strip() else [])]))
    refs = [ref for ref in (_open(p) for p in paths) if ref is not None]
    if len(refs) < 2:
        st.info("Choose at least two runs to compare.")
        return
    names = unique_run_names([r.path for r in refs], [labels.get(r.path, Path(r.path).name) for r in refs])
    shown = comparison(tuple(r.key for r in refs), tuple(names))
    table = shown["table"]
    for name, key in zip(names, (r.key for r in refs), strict=True):  # each run's verdict, as its Overview says it
        st.html(f"<div data-testid='cmp-verdict'><b>{escape(name)}</b>{judged.report(*key).verdict.html(0)}</div>")
    st.caption(f"Δ columns: each run minus the first ({md(names[0])}). Click a column header to sort. A run's "
               "cell is tinted as its verdict judged that metric (the health band; mean |ℓ| against the run's own "
               "noise floor — green healthy, amber warning, red alarm; no tint: the metric has no band).")
    st.dataframe(styled_table(table, shown["tints"]), key="cmp_table", width="stretch", height=35 * (len(table) + 1) + 3, hide_index=True)
    _overlays(shown, names)


@st.cache_data(max_entries=32, show_spinner=False)
def comparison(keys: tuple[tuple[str, str], ...], names: tuple[str, ...]) -> dict[str, Any]:
    """Everything Compare draws for runs `keys` (data.RunRef.key) named `names`, computed once per selection:
    the metrics table and its band tints, each run's max |ℓ|, and the chart specs ("charts": the overlaid histogram
    on a shared axis ±`limit`, one strata chart per shown stratification) — cached here on the small keys, not on
    their frames."""
    table = metrics_table(keys, list(names))
    results = [aggregates.distributions(*key, None) for key in keys]
    limit = max((r["tails"].quantile(RANGE_QUANTILE) for r in results if r["tails"].n), default=0.0) or None
    hist = pd.concat([aggregates.histogram(r["tails"], limit).assign(run=n) for r, n in zip(results, names, strict=True)],
                     ignore_index=True)
    strata = {name: pd.concat([r["strata"][name].assign(run=n) for r, n in zip(results, names, strict=True)],
                              ignore_index=True) for name in aggregates.SHOWN_STRATA}
    runs = {"colour": "run", "runs": tuple(names)}
    specs = {"histogram": charts.spec("histogram", hist, **runs)}
    for name, frame in strata.items():
        specs[name] = charts.spec("strata", frame, title=aggregates.strata_title(name), **runs)
    judged_status = {name: judged.report(*key).verdict.metric_status for key, name in zip(keys, names, strict=True)}
    return {"table": table, "tints": tints(table, list(names), judged_status), "limit": limit,
            "max_abs": [r["tails"].max_abs for r in results], "charts": specs}


def _open(path: str) -> data.RunRef | None:
    try:
        return ui.open_allowed(path)
    except Exception as exc:  # one bad run must not hide the others
        st.error(f"{md(path)}: {md(exc)}")
        return None


def metrics_table(keys: tuple[tuple[str, str], ...], names: list[str]) -> pd.DataFrame:
    """Rows: metrics (TABLE_METRICS and the health bands' metrics present in any run) of the runs `keys`
    (data.RunRef.key); columns: metric, each run's value (float, NaN when the run
    lacks it), then 'Δ run' = run − first run for the other runs. Numbers stay numbers, so columns sort."""
    values = {name: judged.headline(*key) for key, name in zip(keys, names, strict=True)}
    wanted = dict.fromkeys([*TABLE_METRICS, *(b.metric for b in bands.BANDS)])
    rows = [m for m in wanted if any(m in v for v in values.values())]
    table = pd.DataFrame({"metric": rows})
    for name, v in values.items():
        table[name] = [float(v.get(m, float("nan"))) for m in rows]
    for name in names[1:]:
        table[f"Δ {name}"] = table[name] - table[names[0]]
    return table


def styled_table(table: pd.DataFrame, cell_tints: pd.DataFrame) -> Any:
    """The metrics table as shown: band tints, counts in full (45,533, where `%.4g` showed 45530), other numbers
    to 4 significant digits — a Styler, so the cells stay numbers and the columns still sort."""
    styled = table.style.apply(lambda _: cell_tints, axis=None).format(lambda v: cell_text(v, False))
    counts = table.index[table["metric"].isin(COUNT_METRICS)]
    if len(counts):
        styled = styled.format(lambda v: cell_text(v, True), subset=(counts, [c for c in table.columns
                                                                              if c != "metric"]))
    return styled


def cell_text(value: object, count: bool) -> str:
    """A Compare cell as shown: a count in full (45,533; a Δ −43,730), any other number to 4 significant digits;
    NaN (a run that lacks the metric) as —; text (the metric's name) as it is."""
    if isinstance(value, str):
        return value
    number = float(value)
    if number != number:
        return "—"
    if count and number == round(number) and abs(number) < 2 ** 53:
        return f"{int(number):,}"
    return f"{number:.4g}"


def tints(table: pd.DataFrame, names: list[str], judged_status: dict[str, dict[str, str]] | None = None
          ) -> pd.DataFrame:
    """CSS per cell of `table`: each run's value in a light tint of the status its verdict gave the metric
    (`judged_status`: Verdict.metric_status, where mean |ℓ| is judged against the run's floor), else of its health
    band (rcdiag.analysis.verdict.health); a Styler applies it, so the values stay numbers and the columns sort."""
    out = pd.DataFrame("", index=table.index, columns=table.columns)
    judged_status = judged_status or {}
    for row, metric in table["metric"].items():
        band = BY_METRIC.get(metric)
        for name in names if band else ():
            status = judged_status.get(name, {}).get(metric) or band.classify(table.at[row, name])
            if status != bands.UNKNOWN:
                out.at[row, name] = f"background-color: {bands.COLOURS[status]}2e"
    return out


def _overlays(shown: dict[str, Any], names: list[str]) -> None:
    st.markdown("**ℓ histograms** (log counts, overlaid)")
    charts.draw(st, shown["charts"]["histogram"], key="cmp_hist")
    if shown["limit"]:
        st.caption(f"Axis ±{ui.fmt(shown['limit'])} nats (the largest per-run 99.9th percentile of |ℓ|); tokens "
                   "beyond count in the outer bins. Largest |ℓ|: " + ", ".join(
                       f"{md(n)} {ui.fmt(m)}" for m, n in zip(shown["max_abs"], names, strict=True)))
    cols = st.columns(len(aggregates.SHOWN_STRATA))
    for col, name in zip(cols, aggregates.SHOWN_STRATA, strict=True):
        title = aggregates.strata_title(name)
        col.markdown(f"**ℓ by {title}** ({charts.STRATA_DASHES})")
        charts.draw(col, shown["charts"][name], key=f"cmp_by_{name}")


ui.guarded(render)
