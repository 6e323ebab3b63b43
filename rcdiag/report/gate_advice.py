"""The gate families for the recommendation: their sweep rows in the shape recommend's `_weigh` gives the IS
modes, a sentence per family on whether it fits this run's tail, and the setting to paste for each.

    rows = gate_rows(report)          # [{mode, threshold, level, action, ess, clipped_frac, bias, thrown, …}]
    why = gate_reasons(report)        # {gate: sentence}
"""
from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from rcdiag.analysis.correction.gate_defs import GATES
from rcdiag.report.options import ESS_TARGET
from rcdiag.report.settings import gate_settings

MASK_LIMIT = 0.10
"""The largest share of tokens a fitting gate may mask (recommend.THROWN_LIMIT's rule for masks)."""


def gate_rows(report: Any) -> list[dict[str, Any]]:
    """Every gate × δ of the report's gate sweep as recommend._weigh's rows: mode (the gate), threshold (δ),
    level, action "mask", beyond_share = the masked share (what the gate acts on), beyond_mass NaN (a gate's
    statistic is not the |ℓ| tail), bias |E[w] − 1|, thrown (masked share), and the sweep's numbers (ess,
    clipped_frac, kept_token_frac, kept_pos_frac, kept_neg_frac, …), plus framework and the snippet to paste."""
    frame = report.gate_sweep
    if frame is None or not len(frame):
        return []
    rows = []
    for r in frame.to_dict(orient="records"):
        gate = GATES[r["gate"]]
        thrown = 1.0 - r["kept_token_frac"]
        rows.append({**r, "mode": gate.name, "level": gate.level, "action": "mask", "beyond_share": thrown,
                     "beyond_mass": math.nan, "bias": abs(r["is_weight_mean"] - 1.0), "thrown": thrown,
                     "settings": asdict(gate_settings(gate.name, r["threshold_low"], r["threshold_high"],
                                                      r["threshold"]))})
    return rows


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{x:.2%}"


def gate_reasons(report: Any) -> dict[str, str]:
    """One sentence per gate family at its default δ: what it masks here (per advantage sign where it reads it),
    the survivors' ESS, and whether that fits this run's tail."""
    out = {}
    for row in gate_rows(report):
        gate = GATES[row["mode"]]
        if row["threshold"] != gate.default:
            continue
        masked, ess = row["thrown"], row["ess"]
        signs = (f" ({_pct(1 - row['kept_pos_frac'])} of A > 0, {_pct(1 - row['kept_neg_frac'])} of A < 0)"
                 if gate.signed else "")
        head = (f"{gate.name} ({gate.framework}) at δ={row['threshold']:g} masks {_pct(masked)} of tokens{signs}, "
                f"survivors' ESS {ess:.4f}")
        if masked == 0:
            why = "it fits only as a guard: nothing in this run's tail reaches its bound"
        elif masked > MASK_LIMIT:
            why = f"it does not fit: it throws away more than {MASK_LIMIT:.0%} of the batch, not just the tail"
        elif not ess >= ESS_TARGET:
            why = (f"it does not fit: what it keeps still has ESS below {ESS_TARGET} — the tail it leaves is in "
                   "the ratios, not in what this gate measures")
        else:
            why = "it fits: it removes the tail and leaves well-weighted survivors"
        out[gate.name] = f"{head}; {why}."
    return out
