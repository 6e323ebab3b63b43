"""Trends page: the mismatch per training step with intervals, the timeline (a step change or a drift:
rcdiag.analysis.training.drift) and the steps where the verdict changes (points coloured by the library's bands,
rcdiag.analysis.verdict.health; heavy-tailed metrics on log axes); click a step (or pick it) to see that step's verdict and
cards, its ℓ distribution against the first step and its worst sequences."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq
import streamlit as st

from app import bands, charts, data, judged, state, ui
from rcdiag.analysis.training.drift import timeline
from rcdiag.analysis.verdict import health
from rcdiag.analysis.verdict.judge import Verdict, status_changes, step_verdicts
from rcdiag.report.options import CONVENTIONS, ReportOptions
from rcdiag.report.plots import LOG_PANELS
from rcdiag.report.render import md_escape
from rcdiag.report.trend_section import LAG_COLUMNS, LAG_PANELS, PANELS, changes_text
from rcdiag.store.run import open_run

DEFAULTS = ReportOptions()
SHOWN_SEQUENCES = 25
HIST_BINS = 81


@st.cache_data(max_entries=64)
def step_log_ratios(path: str, mtime: float, seq_ids: tuple[int, int], ids: tuple[int, ...]) -> np.ndarray:
    """ℓ = a − b (float64) of the valid tokens of the sequences `ids` (whose seq_id range is `seq_ids`)."""
    run = open_run(path)
    wanted = np.asarray(ids, dtype=np.int64)
    parts = []
    for file in run.token_files:
        table = pq.read_table(file, columns=["seq_id", "train_logprob", "rollout_logprob", "mask"],
                              filters=[("seq_id", ">=", seq_ids[0]), ("seq_id", "<=", seq_ids[1])])
        table = table.filter(pc.is_in(table.column("seq_id"), value_set=pc.cast(wanted, table.schema.field(
            "seq_id").type)))
        a = table.column("train_logprob").to_numpy(zero_copy_only=False).astype(np.float64)
        b = table.column("rollout_logprob").to_numpy(zero_copy_only=False).astype(np.float64)
        mask = table.column("mask").fill_null(True).to_numpy(zero_copy_only=False)
        keep = mask & np.isfinite(a) & np.isfinite(b)
        parts.append(a[keep] - b[keep])
    return np.concatenate(parts) if parts else np.zeros(0)


def render(ref: data.RunRef) -> None:
    state.bind("trend_convention", "convention", str, CONVENTIONS.__contains__)
    state.bind("trend_threshold", "threshold", float, lambda c: c >= 1.01)
    st.session_state.setdefault("trend_threshold", float(DEFAULTS.threshold))
    left, right = st.columns(2)
    convention = left.selectbox("Convention", CONVENTIONS, key="trend_convention")
    threshold = float(right.number_input("IS threshold C", min_value=1.01, step=0.5, key="trend_threshold"))
    state.publish("convention", convention)
    state.publish("threshold", f"{threshold:g}")
    frame = data.trend_frame(*ref.key, convention, threshold)
    if len(frame) < 2:
        st.info(f"This run has one step ({int(frame['step'].iloc[0])}): nothing to trend. Runs imported from "
                "per-step dumps (verl rollout_data_dir, slime rollout ids, TRL / ms-swift logs with a step) "
                "have one row per step.")
        return
    found = timeline(frame)
    judged_run = judged.report(*ref.key)
    # the run's verdict first, as the Overview gives it: the steps below are judged on their own numbers, which
    # cannot see what the run as a whole shows (a weight sync that never ran, staleness, a bug in a few sequences)
    st.html(judged_run.verdict.html(max_reasons=2))
    if found.change is not None:  # a warning box: st.error is kept for pages that failed
        st.warning(f"**Step change.** {md_escape(found.text)}")
    elif found.drift is not None:
        st.warning(f"**Drift (warning).** {md_escape(found.text)}")
    elif judged_run.verdict.status == health.HEALTHY:
        st.success(md_escape(found.text))
    else:
        st.info(md_escape(found.text))
    context = judged_run.context
    verdicts = step_verdicts(frame.to_dict(orient="records"), context)
    frame = frame.assign(status=[v.status for v in verdicts])
    records = frame.to_dict(orient="records")
    st.markdown(md_escape(changes_text(records, status_changes(records, context))))
    start = found.change.step if found.change else found.drift.start_step if found.drift else None
    picked = _charts(frame, start)
    steps = frame["step"].astype(int).tolist()
    state.bind("trend_step", "step", int, steps.__contains__)
    if picked is not None and picked != st.session_state.get("trend_picked"):
        st.session_state["trend_step"] = picked
    st.session_state["trend_picked"] = picked
    st.session_state.setdefault("trend_step", start if start in steps else steps[-1])
    step = int(st.selectbox("Step (or click a point above)", steps, key="trend_step"))
    state.publish("step", step)
    _step_detail(ref, frame, verdicts[steps.index(step)], step)


def _charts(frame: pd.DataFrame, start: int | None) -> int | None:
    """The six per-step panels with interval bars, each point in its metric's health-band colour (a metric without
    a band, the clipped share: the step's verdict), and for a run with policy versions the stale share and the
    lag-0 floor; returns the step of a clicked point, if any."""
    cols = st.columns(3)
    picked = None
    for i, (column, title) in enumerate((*PANELS, *LAG_PANELS) if LAG_COLUMNS[0] in frame else PANELS):
        rows = frame[["step", column]].rename(columns={column: "value"})
        band = health.BY_METRIC.get(column)
        rows["band"] = [band.classify(v) for v in rows["value"]] if band else frame["status"]
        if f"{column}_low" in frame:
            rows = rows.assign(low=frame[f"{column}_low"], high=frame[f"{column}_high"])
        event = cols[i % 3].vega_lite_chart(panel_spec(rows, title, start, column in LOG_PANELS), width="stretch",
                                            key=f"trend_chart_{column}", on_select="rerun", selection_mode="pick")
        chosen = (event.selection.get("pick") or [{}])[0] if event and event.selection else {}
        if "step" in chosen:
            picked = int(chosen["step"])
    return picked


@st.cache_data(max_entries=256, show_spinner=False)
def panel_spec(rows: pd.DataFrame, title: str, start: int | None, log: bool = False) -> dict:
    """One panel's Vega-Lite spec, written as JSON (Altair took ~0.1 s a panel): rows (step, value, band[, low,
    high]); `start` the step change's (or the drift's first) step (dashed red rule) or None; `log` a log y axis
    (heavy-tailed metrics: a jump must not flatten the other steps; non-positive values are left out, a gap);
    clicking a point selects `pick`. The panel title names the metric, so the y axis has none (a long vertical axis
    title pushed the panel's title out of view); tick labels are in SI form so a 1e11 fits."""
    x = {"field": "step", "type": "quantitative", "title": "step"}
    scale = {"type": "log"} if log else {"zero": False}
    y = {"field": "value", "type": "quantitative", "title": None, "scale": scale,
         **({"axis": {"format": "~s"}} if log else {})}
    if log:
        rows = rows[rows["value"] > 0]
        if "low" in rows:
            rows = rows.assign(low=rows["low"].where(rows["low"] > 0, rows["value"]))
    colour = {"field": "band", "type": "nominal", "legend": None,
              "scale": {"domain": list(bands.COLOURS), "range": list(bands.COLOURS.values())}}
    tooltip = [{"field": f, "type": "nominal" if f == "band" else "quantitative"}
               for f in ("step", "value", "band", "low", "high") if f in rows]
    layers: list[dict] = [
        {"mark": {"type": "line", "color": "#2563eb"}, "encoding": {"x": x, "y": y}},
        {"mark": {"type": "point", "filled": True, "size": 60}, "name": "points",
         "params": [{"name": "pick", "select": {"type": "point", "fields": ["step"], "on": "click"}}],
         "encoding": {"x": x, "y": y, "color": colour, "tooltip": tooltip}}]
    if "low" in rows:
        layers.append({"mark": {"type": "rule", "color": "#2563eb"}, "encoding": {
            "x": x, "y": {"field": "low", "type": "quantitative"}, "y2": {"field": "high"}}})
    if start is not None:
        layers.append({"data": {"values": [{"step": start}]}, "mark": {"type": "rule", "color": "#dc2626",
                                                                       "strokeDash": [4, 3]},
                       "encoding": {"x": {"field": "step", "type": "quantitative"}}})
    return {"$schema": "https://vega.github.io/schema/vega-lite/v6.json", "config": charts.VIEW,
            **charts.table(rows), "title": title + (" (log)" if log else ""), "height": 200, "layer": layers}


def _step_detail(ref: data.RunRef, frame: pd.DataFrame, verdict: Verdict, step: int) -> None:
    """The chosen step: its verdict and band-coloured cards, its ℓ histogram over the first step's, its worst
    sequences."""
    row = frame[frame["step"] == step].iloc[0]
    first = int(frame["step"].iloc[0])
    st.subheader(f"Step {step}")
    st.html(verdict.html())
    cols = st.columns(4)
    shown = [b for b in bands.BANDS if b.metric in row]
    for i, band in enumerate(shown):
        value = float(row[band.metric])
        with cols[i % 4]:
            status = verdict.metric_status.get(band.metric) or band.classify(value)
            st.html(ui.card(f"{band.label} · {band.metric}", value, status, bands.describe(band)))
    st.caption(f"This step's numbers alone (input checks judge the whole run: Overview); clipped share "
               f"{ui.fmt(float(row['clipped_frac']))} at the threshold above.")
    if LAG_COLUMNS[0] in row:
        st.caption(lag_text(row, frame.attrs.get("lag_reference")))
    index = data.sequence_index(*ref.key)
    in_step = index[index["step"].fillna(0).astype(int) == step] if "step" in index else index
    first_ids = index[index["step"].fillna(0).astype(int) == first] if "step" in index else index
    st.markdown(f"**Distribution of ℓ at step {step}** (against step {first}; log counts)")
    values = {f"step {step}": _log_ratios(ref, in_step), f"step {first}": _log_ratios(ref, first_ids)}
    charts.draw(st, charts.spec("histogram", _histograms(values), colour="run", runs=tuple(values)), key="trend_hist")
    st.markdown(f"**Sequences of step {step}** (largest max |ℓ| first; the Sequences page shows each one's tokens)")
    shown = in_step.sort_values("max_abs_log_ratio", ascending=False, na_position="last").head(SHOWN_SEQUENCES)
    columns = [c for c in ("seq_id", "n_valid", "mean_abs_log_ratio", "max_abs_log_ratio", "seq_ratio",
                           "finish_reason", "reward", "prompt_id") if c in shown]
    st.dataframe(shown[columns], hide_index=True, width="stretch", key="trend_sequences")
    st.caption(f"{len(in_step):,} sequences at step {step}")


def lag_text(row: pd.Series, reference: str | None) -> str:
    """The step's policy lag in one line (rcdiag.analysis.training.lag_trend's columns): tokens, and the trajectories'
    staleness where the trainer's version is recorded."""
    text = (f"Policy lag: mean {ui.fmt(float(row['token_lag_mean']))} versions over {int(row['lag_tokens']):,} "
            f"tokens (max {ui.fmt(float(row['token_lag_max']))}), {ui.fmt(100 * float(row['stale_token_share']))} % "
            f"at lag ≥ 1; mean |ℓ| {ui.fmt(float(row['floor_abs_log_ratio_mean']))} at lag 0 (the floor), "
            f"{ui.fmt(float(row['stale_abs_log_ratio_mean']))} at lag ≥ 1.")
    if "seq_lag_mean" in row:
        text += (f" Trajectories: staleness mean {ui.fmt(float(row['seq_lag_mean']))}, max "
                 f"{ui.fmt(float(row['seq_lag_max']))}; {ui.fmt(float(row['partial_seqs']))} partial.")
    if reference == "step_newest":
        text += " (The trainer's version is not recorded: lags count from the step's newest version.)"
    return text


def _log_ratios(ref: data.RunRef, rows: pd.DataFrame) -> np.ndarray:
    ids = rows["seq_id"].astype(int)
    if ids.empty:
        return np.zeros(0)
    return step_log_ratios(*ref.key, (int(ids.min()), int(ids.max())), tuple(ids.tolist()))


def _histograms(values: dict[str, np.ndarray]) -> pd.DataFrame:
    """(lo, hi, count, run) on one set of bins for all labels, so the curves compare bin by bin; empty bins are
    left out (a gap: drawn at the log axis' floor they read as a tail the step does not have)."""
    limit = max((float(np.abs(v).max()) for v in values.values() if v.size), default=1e-6)
    frames = []
    for label, v in values.items():
        counts, edges = np.histogram(v, bins=HIST_BINS, range=(-limit, limit))
        keep = counts > 0
        frames.append(pd.DataFrame({"lo": edges[:-1][keep], "hi": edges[1:][keep], "count": counts[keep],
                                    "run": label}))
    return pd.concat(frames, ignore_index=True)


ui.run_page("Trends", render)
