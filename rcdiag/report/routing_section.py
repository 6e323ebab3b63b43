"""The report's "Routing" section and the routing cause of the verdict, for runs of mixture-of-experts models that
carry routes (rcdiag.store.routes); a dense run has neither, and costs nothing (no column is read).

`routing_findings(run)` is computed once in rcdiag.report.build.judge: the run's RoutingSummary (one pass over the
route columns, rcdiag.analysis.moe.routing) with the share measured by the newest probe that ran `router_replay`
instead of estimated, when there is one. `routing_context(ctx, report)` adds the routing cause to the verdict's
context (Context.extra). `routing_section(report)` is the section.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from rcdiag.analysis.moe.routing import (
    MIN_GROUP,
    NEAR_TIE,
    ROUTING_EXPLAINS,
    RoutingSummary,
    routing_summary,
)
from rcdiag.analysis.verdict.causes import Context, numerics
from rcdiag.analysis.verdict.routing import routing_cause
from rcdiag.errors import RcdiagError
from rcdiag.probe.files import list_probes
from rcdiag.report.render import Block, fmt
from rcdiag.report.section import Section
from rcdiag.store.files import MAX_MANIFEST_BYTES
from rcdiag.store.routes import ENGINE_ROUTES, TRAINER_ROUTES
from rcdiag.store.safefile import read_json

REPLAY_FACTOR = "router_replay"
"""The probe factor whose budget row measures the gap with the engine's routes forced in the trainer."""
FIGURE = "routing.png"


@dataclass(frozen=True)
class RoutingFindings:
    """A run's routing summary (None: a dense run, or no route column), or the error that stopped it, and the
    probe that measured the replay (its name), if any."""

    summary: RoutingSummary | None = None
    error: str | None = None
    probe: str | None = None


def replay_measurement(run_path: Any) -> tuple[float, float, str] | None:
    """(gap, gap with the engine's routes forced, probe name) from the newest probe whose budget has a
    `router_replay` row (rcdiag.probe.summary.budget: `residual_mean_abs` is the gap left with that setting, on the
    probe's own sample, against its observed `gap.mean_abs`); None without one."""
    for file in reversed(list_probes(run_path)):
        try:  # bounded, never a FIFO (rcdiag.store.safefile), as report.probe_section reads the same files
            summary = read_json(file, "probe summary", MAX_MANIFEST_BYTES)
            gap = float(summary["gap"]["mean_abs"])
        except (RcdiagError, ValueError, KeyError, TypeError):
            continue
        rows = [r for r in summary.get("budget") or [] if isinstance(r, dict) and r.get("factor") == REPLAY_FACTOR
                and isinstance(r.get("residual_mean_abs"), int | float)]
        if rows:
            left = min(float(r["residual_mean_abs"]) for r in rows)
            return gap, left, str(summary.get("name", file.stem))
    return None


def routing_findings(run: Any) -> RoutingFindings:
    """RoutingFindings of a Run (nothing read for a run without routes)."""
    try:
        summary = routing_summary(run)
    except RcdiagError as exc:
        return RoutingFindings(error=str(exc))
    if summary is None:
        return RoutingFindings()
    measured = replay_measurement(run.path)
    if measured is None:
        return RoutingFindings(summary)
    gap, left, probe = measured
    return RoutingFindings(summary.with_replay(gap, left), probe=probe)


def routing_context(ctx: Context, report: Any, values: dict[str, float]) -> Context:
    """`ctx` with the routing cause among the extra causes (when routing explains a heavy mismatch) and the
    architecture known to be 'moe' where the run carries routes; `values` are the numbers the verdict judges."""
    summary = report.routing.summary
    if summary is None:
        return ctx
    ctx = replace(ctx, architecture=ctx.architecture or "moe")
    floor = ctx.noise.floor(ctx.dtype) if ctx.noise is not None else None
    cause = routing_cause(summary, numerics(values, ctx.noise, floor, ctx))
    return ctx if cause is None else replace(ctx, extra=(*ctx.extra, cause))


def _pct(x: float) -> str:
    return f"{x:.1%}" if isinstance(x, float) and math.isfinite(x) else "n/a"


def explains_line(summary: RoutingSummary, probe: str | None = None, run: str = "RUN") -> str:
    """The section's callout: routing's share of the gap and how it was obtained, or why it is not judged."""
    if not summary.agreement:
        have = summary.sides[0] if summary.sides else "no"
        return (f"Only the {have} side's routes are in the run: agreement needs both. `rcdiag score --rescore-only "
                "RUN` records the trainer's routes beside the engine's.")
    share = summary.explains
    if share is None or not math.isfinite(share.share):
        return ("Routing's share of the gap is not computed: no token whose routes agree in every layer (or no "
                "gap) to compare with.")
    line = share.sentence()[0].upper() + share.sentence()[1:]
    if share.method == "replay":
        return f"{line} (probe '{probe}', factor router_replay)."
    note = ("" if summary.judged else f" Too few tokens to judge (fewer than {MIN_GROUP} agreeing or disagreeing "
            "tokens): the verdict does not use it.")
    return (f"{line}. Observational: the tokens whose routes agree may differ in other ways; `rcdiag probe "
            f"{run} --factors router_replay` measures it.{note} The verdict names routing when it explains at "
            f"least {ROUTING_EXPLAINS:.0%} of a heavy mismatch.")


def layer_rows(summary: RoutingSummary) -> list[dict[str, Any]]:
    """One row per MoE layer: agreement, and each side's selected mass, mean margin and near-tie share."""
    rows = []
    for layer in range(summary.layers):
        row = {"layer": layer, "exact": summary.exact_by_layer[layer], "overlap": summary.overlap_by_layer[layer]}
        for side, conf in summary.confidence.items():
            row[f"{side}_mass"] = conf["selected_mass_by_layer"][layer]
            row[f"{side}_margin"] = conf["margin_by_layer"][layer]
            row[f"{side}_near_tie"] = conf["near_tie_by_layer"][layer]
        rows.append(row)
    return rows


def _shape(summary: RoutingSummary) -> str:
    experts = f" of {summary.experts}" if summary.experts else ""
    sides = ". ".join(f"{side.capitalize()} routes: {what.get(kind, kind)}" for side, kind, what in
                      (("engine", summary.engine, ENGINE_ROUTES), ("trainer", summary.trainer, TRAINER_ROUTES))
                      if kind)
    return (f"{summary.layers} MoE layers × top-{summary.top_k}{experts} experts. {summary.tokens:,} of "
            f"{summary.valid_tokens:,} valid tokens carry routes on {' and '.join(summary.sides)}"
            + (f" ({summary.scored:,} with both log-probs)" if summary.scored != summary.tokens else "")
            + (f". {sides}." if sides else "."))


def routing_section(report: Any) -> Section | None:
    """The Routing section (blocks, its figure, metrics.json `routing`), None for a run without routes."""
    found = report.routing
    if found.error:
        return Section([Block("h", "Routing (mixture of experts)"),
                        Block("callout", f"Routing not computed: {found.error}")], data={"routing": {"error":
                                                                                                    found.error}})
    summary = found.summary
    if summary is None:
        return None
    blocks = [Block("h", "Routing (mixture of experts)"), Block("p", _shape(summary)),
              Block("callout", explains_line(summary, found.probe, str(report.path)))]
    rows = layer_rows(summary)
    figures = {}
    if summary.agreement:
        blocks.append(Block("table", headers=["tokens with a differing layer", "(token, layer) choices that agree",
                                              "mean overlap |∩|/k", "mean layers that differ"],
                            rows=[[_pct(summary.any_disagree_share), _pct(summary.exact_rate),
                                   _pct(summary.mean_overlap), fmt(summary.mean_layers_disagree)]]))
        blocks.append(Block("image", "disagreement by layer, |ℓ| by agreement and by router margin", image=FIGURE))
        figures[FIGURE] = ("routing_panels", (rows, summary.by_disagreement, summary.by_margin))
        blocks.append(Block("h", "|ℓ| by the number of layers whose experts differ", level=3))
        blocks.append(Block("table", headers=["layers that differ", "tokens", "share of tokens", "mean |ℓ|"],
                            rows=[[r["layers_disagree"], r["tokens"], _pct(r["share"]), fmt(r["mean_abs_log_ratio"])]
                                  for r in summary.by_disagreement]))
    sides = list(summary.confidence)
    headers = ["layer", *(["same experts", "overlap"] if summary.agreement else [])]
    for side in sides:
        headers += [f"{side} selected mass", f"{side} mean margin", f"{side} near ties (< {NEAR_TIE:g})"]
    blocks.append(Block("h", "By layer: agreement and router confidence", level=3))
    blocks.append(Block("table", headers=headers, rows=[
        [r["layer"], *([_pct(r["exact"]), _pct(r["overlap"])] if summary.agreement else []),
         *[x for side in sides for x in (_pct(r[f"{side}_mass"]), fmt(r[f"{side}_margin"]),
                                         _pct(r[f"{side}_near_tie"]))]] for r in rows]))
    if summary.by_margin:
        blocks.append(Block("p", f"Router confidence: the selected experts' softmax mass and the margin log p_k − "
                                 f"log p_(k+1) between the k-th chosen and the best unchosen expert; a near tie "
                                 f"(< {NEAR_TIE:g} nats) is where a rounding difference flips the choice. By the "
                                 f"token's smallest margin over layers ({summary.margin_side} router):"))
        blocks.append(Block("table", headers=["margin (nats)", "tokens", "with a differing layer", "mean |ℓ|"],
                            rows=[[f"{r['margin_low']:g}–{r['margin_high']:g}", r["tokens"],
                                   _pct(r["disagree_share"]), fmt(r["mean_abs_log_ratio"])]
                                  for r in summary.by_margin if r["tokens"]]))
    data = {**summary.to_dict(), "replay_probe": found.probe}
    return Section(blocks, figures=figures, data={"routing": data})
