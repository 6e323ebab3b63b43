"""Matplotlib figures of the report, each a function of plain data that returns a Figure (report, notebook, app).

Figures are built on the object API (no pyplot state), so they are safe in threads and never pop up windows.
The per-run figures accept one run's data or a {run name: data} dict to overlay several runs; the report draws
them all through rcdiag.report.figproc (by name, in a helper process).
"""
from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from rcdiag.analysis.distributions.tails import DENSITY_BINS, DENSITY_RANGE, TailAccumulator
from rcdiag.analysis.verdict.health import BY_METRIC, COLOURS

SIZE = (6.4, 3.6)
COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")
SIDE_COLORS = {"trainer": "#2563eb", "engine": "#dc2626"}


class FixedFigure(Figure):
    """A figure whose margins were chosen to fit its artists (no layout engine, no tight crop): `png_bytes` draws it
    once. Constrained layout cost ~1 s a figure and bbox_inches="tight" a second full draw (issue #15)."""


def _figure(size: tuple[float, float] = SIZE, bottom: float = 0.15) -> tuple[Figure, Any]:
    """A FixedFigure with one axes; `bottom` leaves room for rotated bucket labels."""
    fig = FixedFigure(figsize=size, dpi=110)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=bottom, top=0.9)
    return fig, fig.add_subplot()


def _title(ax: Any, text: str, **kwargs: Any) -> None:
    """An axes title at a fixed height: matplotlib's automatic title placement measures every tick label of the
    axes on each draw (a third of a figure's drawing time) to dodge top-side labels these figures never have."""
    ax.set_title(text, y=1.0, **kwargs)


def _runs(data: Any) -> Mapping[str, Any]:
    return data if isinstance(data, Mapping) else {"": data}


def log_ratio_histogram(tails: TailAccumulator | Mapping[str, TailAccumulator], bins: int = 121) -> Figure:
    """Histogram of ℓ = a − b on a log count axis (rebinned from the fine streaming histogram)."""
    fig, ax = _figure()
    runs = _runs(tails)
    limit = max(t.max_abs for t in runs.values()) or 1e-6
    for (name, acc), color in zip(runs.items(), COLORS, strict=False):
        edges, counts = acc.signed_histogram(bins, limit)
        ax.stairs(counts, edges, color=color, fill=len(runs) == 1, alpha=0.75 if len(runs) == 1 else 1,
                  label=name or None)
    if any(t.n for t in runs.values()):
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no valid tokens", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("ℓ = a − b = log π_train − log π_rollout (nats)")
    ax.set_ylabel("tokens (log scale)")
    _title(ax, "Distribution of the per-token log-ratio")
    ax.axvline(0, color="#555", lw=0.8, ls=":")
    if len(runs) > 1:
        ax.legend(frameon=False)
    return fig


def density_scatter(tails: TailAccumulator) -> Figure:
    """2-D histogram of b (rollout) against a (training) log-probs, log colour scale, with the diagonal (the
    notebook's; the report shows log_ratio_vs_rollout instead)."""
    fig, ax = _figure((5.2, 4.4))
    counts = tails.density.T.astype(float)  # rows: b, columns: a
    lo, hi = DENSITY_RANGE
    occupied = np.flatnonzero(counts.sum(axis=0) + counts.sum(axis=1))
    start = lo + (occupied[0] if occupied.size else 0) * (hi - lo) / DENSITY_BINS
    counts[counts == 0] = np.nan
    mesh = ax.pcolormesh(np.linspace(lo, hi, DENSITY_BINS + 1), np.linspace(lo, hi, DENSITY_BINS + 1), counts,
                         norm=LogNorm(vmin=1, vmax=max(np.nanmax(counts) if occupied.size else 1, 2)),
                         cmap="viridis", shading="flat")
    fig.colorbar(mesh, ax=ax, label="tokens")
    ax.plot([lo, hi], [lo, hi], color="#dc2626", lw=0.8, ls="--", label="b = a")
    ax.set_xlim(start - 0.2, 0.05)
    ax.set_ylim(start - 0.2, 0.05)
    ax.set_xlabel("a: training log-prob")
    ax.set_ylabel("b: rollout log-prob")
    _title(ax, "Rollout vs training log-probs (density)")
    ax.legend(loc="upper left", frameon=False)
    return fig


def by_stratum(rows: list[dict[str, Any]] | Mapping[str, list[dict[str, Any]]], title: str,
               xlabel: str) -> Figure:
    """Mean |ℓ| (bars) and mean ℓ (markers) per bucket of one stratum; rows as StrataAccumulator.finish()."""
    fig, ax = _figure(bottom=0.3)
    runs = _runs(rows)
    labels = list(dict.fromkeys(r["bucket"] for table in runs.values() for r in table))
    width = 0.8 / max(len(runs), 1)
    x = np.arange(len(labels))
    for k, ((name, table), color) in enumerate(zip(runs.items(), COLORS, strict=False)):
        by = {r["bucket"]: r for r in table}
        mean_abs = [by[b]["mean_abs"] if b in by else np.nan for b in labels]
        mean_l = [by[b]["mean_log_ratio"] if b in by else np.nan for b in labels]
        offset = (k - (len(runs) - 1) / 2) * width
        ax.bar(x + offset, mean_abs, width=width, color=color, alpha=0.55, label=f"{name} mean |ℓ|".strip())
        ax.plot(x + offset, mean_l, "o", color=color, ms=4, label=f"{name} mean ℓ".strip())
    ax.axhline(0, color="#555", lw=0.8)
    ax.set_xticks(x, labels, rotation=35, ha="right", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("nats")
    _title(ax, title)
    ax.legend(frameon=False, fontsize=8)
    return fig


def log_ratio_vs_rollout(rows: list[dict[str, Any]] | Mapping[str, list[dict[str, Any]]]) -> Figure:
    """Mean |ℓ|, RMS and max |ℓ| against the rollout probability exp(b) (rows: the rollout_prob stratum), log y.

    Unlike a b-vs-a density (a diagonal whenever the mismatch is small), this shows where the mismatch lives:
    typically in the low-probability tokens. Several runs: one colour per run."""
    fig, ax = _figure(bottom=0.3)
    runs = _runs(rows)
    labels = list(dict.fromkeys(r["bucket"] for table in runs.values() for r in table))
    x = np.arange(len(labels))
    for (name, table), color in zip(runs.items(), COLORS, strict=False):
        by = {r["bucket"]: r for r in table}
        for column, style, what in (("mean_abs", "-o", "mean |ℓ|"), ("rms", "--s", "RMS ℓ"),
                                    ("max_abs", ":^", "max |ℓ|")):
            y = [by[b][column] if b in by and by[b][column] and by[b][column] > 0 else np.nan for b in labels]
            ax.plot(x, y, style, color=color, ms=3.5, label=f"{name} {what}".strip())
    if any(r.get("max_abs") for table in runs.values() for r in table):
        ax.set_yscale("log")
    ax.set_xticks(x, labels, rotation=35, ha="right", fontsize=8)
    ax.set_xlabel("rollout probability exp(b) (bucket)")
    ax.set_ylabel("|ℓ| (nats, log scale)")
    _title(ax, "Mismatch against the rollout probability")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=7, ncol=3 if len(runs) == 1 else 2)
    return fig


_LEVEL_MARKERS = {"token": ("o", 7.5), "sequence": ("s", 4.0)}
_ACTION_LINES = {"truncate": "-", "mask": "--"}


def _mode_style(mode: str, color: str) -> dict[str, Any]:
    """A mode's line and marker by name, so that modes whose curves coincide all stay visible: the level picks the
    marker (token: a large ●, sequence: a small ■ drawn inside it), the action the line and fill (truncate: solid
    and filled, mask: dashed and hollow, a ring around the filled one); another name gets a ◆ and a dotted line."""
    level, _, action = str(mode).partition("_")
    marker, size = _LEVEL_MARKERS.get(level, ("D", 5.0))
    line = _ACTION_LINES.get(action, ":")
    return {"marker": marker, "ms": size, "ls": line, "lw": 1.3, "color": color, "mew": 1.3,
            "mfc": "none" if line == "--" else color}


def sweep_curves(sweep: Any | Mapping[str, Any], recommended: tuple[str, float] | None = None,
                 target: float = 0.9) -> Figure:
    """ESS / N (top) and the share clipped in percent (bottom) against C on one pair of axes for every mode, so
    the modes compare on one scale: a colour per mode (several runs: a colour per run), the level in the marker
    and the action in the line (_mode_style: coinciding curves stay visible), ticks at the swept thresholds, the ESS
    target drawn and the `recommended` (mode, C) starred. `sweep`: correction.sweep's frame (or its record array:
    the columns mode, threshold, ess and clipped_frac are all it reads), or {run name: frame}.

    Two axes where one per mode and row made eight: the figure that cost the most to draw (~0.35 s of a report's
    ~0.7 s of figures, issue #15), and whose narrow facets crowded their tick labels."""
    runs = _runs(sweep)
    modes = list(dict.fromkeys(m for frame in runs.values() for m in frame["mode"]))
    fig = FixedFigure(figsize=(6.4, 5.0), dpi=110)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.11, top=0.84, hspace=0.1)
    top, bottom = fig.subplots(2, 1, sharex=True)
    ticks = sorted({float(c) for frame in runs.values() for c in frame["threshold"]})
    one = len(runs) == 1
    for r, frame in enumerate(runs.values()):
        names, thresholds = np.asarray(frame["mode"]), np.asarray(frame["threshold"], dtype=float)
        ess, clipped = np.asarray(frame["ess"], dtype=float), 100 * np.asarray(frame["clipped_frac"], dtype=float)
        for k, mode in enumerate(modes):
            rows = np.flatnonzero(names == mode)
            if not rows.size:
                continue
            rows = rows[np.argsort(thresholds[rows], kind="stable")]
            style = _mode_style(mode, COLORS[(k if one else r) % len(COLORS)])
            top.plot(thresholds[rows], ess[rows], label=mode if one else None, **style)
            bottom.plot(thresholds[rows], clipped[rows], **style)
            if recommended is not None and recommended[0] == mode and one:
                at = rows[thresholds[rows] == recommended[1]]
                star = {"marker": "*", "ls": "none", "ms": 14, "color": "#f59e0b", "mec": "#92400e", "zorder": 5}
                top.plot(thresholds[at], ess[at], label=f"recommended: {mode}, C = {recommended[1]:g}", **star)
                bottom.plot(thresholds[at], clipped[at], **star)
    top.axhline(target, color="#555", lw=0.8, ls=":")
    top.annotate(f"ESS target {target:g}", (0.01, target), xycoords=("axes fraction", "data"), fontsize=7,
                 color="#555", va="bottom")
    for ax in (top, bottom):
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    bottom.set_xticks(ticks, [f"{c:g}" for c in ticks], fontsize=8)
    bottom.set_xlabel("threshold C")
    top.set_ylabel("ESS / N")
    bottom.set_ylabel("clipped (%)")
    if one:  # the modes, then the recommendation's star
        pairs = sorted(zip(*top.get_legend_handles_labels(), strict=True), key=lambda p: p[1].startswith("recom"))
        handles, labels = [h for h, _ in pairs], [lab for _, lab in pairs]
    else:  # runs by colour, modes by marker and line
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=COLORS[r % len(COLORS)], lw=2) for r in range(len(runs))]
        handles += [Line2D([], [], **_mode_style(m, "#333")) for m in modes]
        labels = [*runs, *modes]
    if handles:
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.11, 0.955), ncol=min((len(handles) + 1) // 2, 4),
                   frameon=False, fontsize=7.5)
    fig.suptitle("Threshold sweep: effective sample size and share clipped", x=0.12, y=0.99, ha="left",
                 fontsize=11)
    return fig


LOG_PANELS = ("abs_log_ratio_mean", "k3_kl", "chi2_token", "noise_sigma", "abs_log_ratio_max")
"""Trend columns drawn on a log axis: positive and heavy-tailed, so a jump does not flatten the other steps."""


def trend_panels(frame: Any, marks: Sequence[tuple[int, str]], panels: Sequence[tuple[str, str]]) -> Figure:
    """Panels of per-step values, `panels` = (trend column, title) each (the report's six: trend_section.PANELS),
    with their bootstrap intervals as bars, log axes for LOG_PANELS, and a dashed line at each (step, label) of
    `marks` (the step change, or where a drift starts)."""
    fig = Figure(figsize=(10.5, 5.6), dpi=110, layout="constrained")
    axes = fig.subplots(2, (len(panels) + 1) // 2, sharex=True, squeeze=False)
    steps = frame["step"].to_numpy()
    for ax, (column, title) in zip(axes.flat, panels, strict=True):
        values = frame[column].to_numpy(dtype=float) if column in frame else np.full(steps.size, np.nan)
        log = column in LOG_PANELS
        if log:
            values = np.where(values > 0, values, np.nan)  # a gap, not a floor, where a step has nothing
        if f"{column}_low" in frame:
            low = frame[f"{column}_low"].to_numpy(dtype=float)
            high = frame[f"{column}_high"].to_numpy(dtype=float)
            err = np.vstack([np.clip(values - low, 0, None), np.clip(high - values, 0, None)])
            err = np.where(np.isfinite(err), err, 0.0)
            if log:
                err[0] = np.minimum(err[0], values * 0.999)  # a log axis cannot draw a bar below 0
            ax.errorbar(steps, values, yerr=err, color=COLORS[0], marker="o", ms=3, lw=1.2, capsize=2)
        else:
            ax.plot(steps, values, color=COLORS[0], marker="o", ms=3, lw=1.2)
        if column in BY_METRIC:  # each point in its health band's colour
            ax.scatter(steps, values, c=[COLOURS[BY_METRIC[column].classify(v)] for v in values], s=18, zorder=3)
        if log and np.isfinite(values).any():
            ax.set_yscale("log")
        for step, label in marks:
            ax.axvline(step, color=COLORS[1], ls="--", lw=1, label=label)
        ax.set_title(title + (" (log)" if log else ""), fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step")
    mark = f"; dashed: {marks[0][1]} at step {marks[0][0]}" if marks else ""
    fig.suptitle("Mismatch per training step (bars: bootstrap interval; points: health band green / amber / red"
                 f"{mark})", fontsize=11)
    return fig


def budget_bars(summary: Mapping[str, Any]) -> Figure:
    """A probe summary's horizontal bars: the residual gap if the run changed each setting, as a share of the
    observed gap (1 = unchanged; rcdiag.probe.summary.residual), coloured by side, best first. No finite row → an
    empty axis with a note."""
    rows = sorted((r for r in summary.get("budget") or [] if isinstance(r.get("residual"), int | float)
                   and math.isfinite(r["residual"])), key=lambda r: r["residual"])
    fig = Figure(figsize=(6.4, 0.35 * max(len(rows), 3) + 1.2), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    if not rows:
        ax.text(0.5, 0.5, "no residual gaps (the observed gap is 0, or a probe made before them)", ha="center",
                va="center", transform=ax.transAxes)
        return fig
    labels = [r.get("change") or r["setting"] for r in rows]
    values = [max(r["residual"], 1e-6) for r in rows]
    ax.barh(range(len(rows)), values, color=[SIDE_COLORS.get(r["side"], "#555") for r in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="#111", linewidth=1, linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("residual ÷ observed gap (log; dashed: unchanged)", fontsize=8)
    ax.set_title("Residual gap if you change one setting", fontsize=10)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (Agg canvas) from ONE draw when its layout already fits (a FixedFigure, or a layout
    engine such as constrained); any other figure is cropped to its artists (bbox_inches="tight", a second draw)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fits = isinstance(fig, FixedFigure) or fig.get_layout_engine() is not None
    fig.savefig(buffer, format="png", **({} if fits else {"bbox_inches": "tight", "pad_inches": 0.08}))
    return buffer.getvalue()


def _log_if_positive(ax: Any, values: Sequence[float]) -> None:
    """A log y axis when every value is positive and they span more than a factor of 10 (|ℓ| grows by orders of
    magnitude with disagreeing layers: one linear axis hides the small bars)."""
    if values and min(values) > 0 and max(values) > 10 * min(values):
        ax.set_yscale("log")


def routing_panels(layers: Sequence[Mapping[str, Any]], disagreement: Sequence[Mapping[str, Any]],
                   margins: Sequence[Mapping[str, Any]]) -> Figure:
    """An MoE run's routing (rcdiag.analysis.moe.routing.RoutingSummary rows): the share of tokens whose expert set
    differs between the sides per layer (and 1 − the mean overlap |∩|/k), on an axis scaled to them, mean |ℓ| by the number of layers whose experts
    differ (bar labels: tokens), and mean |ℓ| with the share of tokens that disagree somewhere by the token's
    smallest k/(k+1) router margin (omitted without router probabilities)."""
    panels = 3 if margins else 2
    fig = Figure(figsize=(4.2 * panels, 3.4), dpi=110, layout="constrained")
    axes = fig.subplots(1, panels)
    ax = axes[0]
    x = np.arange(len(layers))
    other = [1.0 - r["exact"] for r in layers]
    unshared = [1.0 - r["overlap"] for r in layers]
    ax.bar(x, other, color=COLORS[0], label="another expert set")
    ax.plot(x, unshared, "o-", color=COLORS[1], label="experts not shared, 1 − |∩|/k")
    ax.set_xticks(x, [str(r["layer"]) for r in layers], fontsize=8 if len(layers) <= 16 else 6)
    top = max((v for v in (*other, *unshared) if math.isfinite(v)), default=0.0)
    ax.set_ylim(0, min(1.0, top * 1.25) or 0.01)  # disagreement is a few %: a 0–1 axis shows flat full bars
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=None))
    ax.set_xlabel("MoE layer", fontsize=8)
    ax.set_ylabel("share of tokens", fontsize=8)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Disagreement by layer", fontsize=10)
    ax = axes[1]
    rows = [r for r in disagreement if r["tokens"]]
    values = [r["mean_abs_log_ratio"] if math.isfinite(r["mean_abs_log_ratio"]) else 0.0 for r in rows]
    bars = ax.bar(range(len(rows)), values, color=COLORS[2])
    ax.bar_label(bars, [f"{r['tokens']:,}" for r in rows], fontsize=7)
    _log_if_positive(ax, values)
    ax.set_xticks(range(len(rows)), [r["layers_disagree"] for r in rows], fontsize=8)
    ax.set_xlabel("layers whose experts differ", fontsize=8)
    ax.set_ylabel("mean |ℓ| (bar labels: tokens)", fontsize=8)
    ax.set_title("|ℓ| by routing disagreement", fontsize=10)
    if margins:
        ax = axes[2]
        rows = [r for r in margins if r["tokens"]]
        labels = [f"{r['margin_low']:g}–{r['margin_high']:g}" if math.isfinite(r["margin_high"]) else
                  f"≥{r['margin_low']:g}" for r in rows]
        values = [r["mean_abs_log_ratio"] if math.isfinite(r["mean_abs_log_ratio"]) else 0.0 for r in rows]
        ax.bar(range(len(rows)), values, color=COLORS[3], label="mean |ℓ|")
        _log_if_positive(ax, values)
        ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=30)
        ax.set_xlabel("smallest k/(k+1) router margin (nats)", fontsize=8)
        ax.set_ylabel("mean |ℓ|", fontsize=8)
        twin = ax.twinx()
        twin.plot(range(len(rows)), [r["disagree_share"] for r in rows], "o-", color=COLORS[4],
                  label="tokens with a differing layer")
        twin.set_ylim(0, 1.05)
        twin.tick_params(labelsize=7)
        twin.legend(fontsize=7, loc="upper right")
        ax.set_title("|ℓ| by router margin", fontsize=10)
    return fig
