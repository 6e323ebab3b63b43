"""The baseline comparison of `rcdiag report RUN --baseline OTHER_RUN`: ratios to the baseline, and whether each
change is beyond both runs' bootstrap intervals.

Meant for CI that gates a vLLM / transformers / kernel upgrade on the same prompts: the old stack's run is the
baseline, `--fail-if "k3_kl>2x"` fails when the new stack's mismatch doubled (rcdiag.report.gate).
"""
from __future__ import annotations

import math
from typing import Any

from rcdiag.report.gate import gate_values
from rcdiag.report.render import Block, fmt
from rcdiag.report.section import Section

COMPARED = ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_abs_diff", "abs_log_ratio_mean", "abs_log_ratio_max",
            "ess", "clipped_frac")
"""Names compared with the baseline (gate names: metrics, tails, token_truncate IS metrics)."""


def _verdict(name: str, value: float, base: float, ci: dict[str, float] | None,
             base_ci: dict[str, float] | None) -> str:
    """worse / better when the intervals do not overlap, 'within noise' when they do; without intervals (maxima,
    shares) only 'higher' / 'lower' / 'equal' — no claim beyond noise."""
    if not (math.isfinite(value) and math.isfinite(base)):
        return "—"
    if ci and base_ci and all(math.isfinite(v) for v in (ci["low"], ci["high"], base_ci["low"], base_ci["high"])):
        if ci["low"] > base_ci["high"] or ci["high"] < base_ci["low"]:
            higher = ci["low"] > base_ci["high"]
            return "worse" if higher != (name == "ess") else "better"
        return "within noise"
    return "higher" if value > base else "lower" if value < base else "equal"


def comparison_rows(values: dict[str, float], base: dict[str, float], intervals: dict[str, Any],
                    base_intervals: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per COMPARED name: value, baseline, ratio (value / baseline), verdict."""
    rows = []
    for name in COMPARED:
        v, b = values.get(name, math.nan), base.get(name, math.nan)
        ratio = v / b if b and math.isfinite(b) else math.nan
        rows.append({"metric": name, "value": v, "baseline": b, "ratio": ratio,
                     "verdict": _verdict(name, v, b, intervals.get(name), base_intervals.get(name))})
    return rows


def baseline_section(report: Any) -> Section | None:
    """The section comparing `report` with its baseline report (`report.baseline`); None without one."""
    base = report.baseline
    if base is None:
        return None
    rows = comparison_rows(gate_values(report), gate_values(base), report.intervals, base.intervals)
    worse = [r["metric"] for r in rows if r["verdict"] == "worse"]
    text = (f"Worse than the baseline {base.name} beyond both bootstrap intervals: {', '.join(worse)} — the new "
            "stack adds mismatch; find the setting that changed with `rcdiag probe` before upgrading."
            if worse else f"No metric is worse than the baseline {base.name} beyond the bootstrap intervals "
            "(healthy for this upgrade).")
    blocks = [Block("h", f"Against the baseline {base.name}"), Block("callout", text),
              Block("table", headers=["metric", "this run", "baseline", "ratio", "verdict"],
                    rows=[[r["metric"], r["value"], r["baseline"], fmt(r["ratio"]) + ("×" if math.isfinite(r["ratio"]) else ""), r["verdict"]]
                          for r in rows])]
    return Section(blocks, data={"baseline": {"run": {"name": base.name, "path": base.path}, "comparison": rows}})
