"""Matplotlib figures of the report, each a function of plain data that returns a Figure (report, notebook, app).

Figures are built on the object API (no pyplot state), so they are safe in threads and never pop up windows.
Every function accepts one run's data or a {run name: data} dict to overlay several runs.
"""
from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from rcdiag.analysis.tails import DENSITY_BINS, DENSITY_RANGE, TailAccumulator

SIZE = (6.4, 3.6)
COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


def _figure(size: tuple[float, float] = SIZE) -> tuple[Figure, Any]:
    fig = Figure(figsize=size, dpi=110)
    return fig, fig.add_subplot()


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
    ax.set_title("Distribution of the per-token log-ratio")
    ax.axvline(0, color="#555", lw=0.8, ls=":")
    if len(runs) > 1:
        ax.legend(frameon=False)
    return fig


def density_scatter(tails: TailAccumulator) -> Figure:
    """2-D histogram of b (rollout) against a (training) log-probs, log colour scale, with the diagonal."""
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
    ax.set_title("Rollout vs training log-probs (density)")
    ax.legend(loc="upper left", frameon=False)
    return fig


def by_stratum(rows: list[dict[str, Any]] | Mapping[str, list[dict[str, Any]]], title: str,
               xlabel: str) -> Figure:
    """Mean |ℓ| (bars) and mean ℓ (markers) per bucket of one stratum; rows as StrataAccumulator.finish()."""
    fig, ax = _figure()
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
    ax.set_title(title)
    ax.legend(frameon=False, fontsize=8)
    return fig


def sweep_curves(sweep: Any | Mapping[str, Any]) -> Figure:
    """ESS and clipped fraction against the threshold C, one line per mode (and run); sweep as correction.sweep."""
    fig = Figure(figsize=(9.0, 3.6), dpi=110)
    axes = fig.subplots(1, 2, gridspec_kw={"wspace": 0.3})
    runs = _runs(sweep)
    styles = ("-", "--", ":", "-.")
    for r, (name, frame) in enumerate(runs.items()):
        for (mode, group), color in zip(frame.groupby("mode", sort=False), COLORS, strict=False):
            group = group.sort_values("threshold")
            label = f"{name} {mode}".strip()
            for ax, column in zip(axes, ("ess", "clipped_frac"), strict=True):
                ax.plot(group["threshold"], group[column], styles[r % 4], marker="o", ms=3, color=color,
                        label=label)
    for ax, column, title in zip(axes, ("ess", "clipped_frac"), ("Effective sample size", "Clipped fraction"),
                                 strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("threshold C")
        ax.set_ylabel(column)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].axhline(0.9, color="#555", lw=0.8, ls=":")
    axes[1].legend(frameon=False, fontsize=7)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (Agg canvas), cropped to its artists (bbox_inches="tight": one layout pass instead
    of constrained layout's several — a third of the report's fixed start-up was figure layout)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight", pad_inches=0.08)
    return buffer.getvalue()
