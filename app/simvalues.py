"""The IS simulator's settings and values without Streamlit: which (mode, convention) pairs take a lower bound, and
how a value is written (shares in percent, weights with four decimals — never a bare "1" or "0")."""
from __future__ import annotations

from app import ui
from rcdiag.analysis.conventions import CONVENTIONS
from rcdiag.analysis.correction.modes import MODES

SHOWN = ("is_weight_mean", "ess", "clipped_frac", "kept_token_frac", "kept_seq_frac", "fraction_high",
         "fraction_low", "is_weight_std", "is_weight_min", "is_weight_max")
FRACTIONS = frozenset({"clipped_frac", "kept_token_frac", "kept_seq_frac", "fraction_high", "fraction_low",
                       "kept_pos_frac", "kept_neg_frac", "masked_seq_frac"})
"""Shares, shown in percent (a bare "1" or "0" reads as a count)."""
MEANING = {
    "is_weight_mean": "mean IS weight of the valid tokens (1 = unbiased; verl warns outside [0.5, 2])",
    "ess": "effective sample size share (1 = every token counts fully; verl warns below 0.3)",
    "clipped_frac": "share of valid tokens (or sequences) whose weight the correction changed",
    "kept_token_frac": "share of valid tokens still in the loss after the correction",
    "kept_seq_frac": "share of sequences still in the loss after the correction",
    "fraction_high": "share whose ratio is above C", "fraction_low": "share whose ratio is below L",
    "is_weight_std": "spread of the weights", "is_weight_min": "smallest weight", "is_weight_max": "largest weight"}
CURVES = ("is_weight_mean", "ess", "clipped_frac", "kept_token_frac")


def lower_refusal(mode: str, convention: str) -> str | None:
    """Why `convention` cannot take a lower bound L for `mode` (None: it can)."""
    action = MODES[mode].action
    if action in CONVENTIONS[convention].allow_lower:
        return None
    return (f"{convention} has no lower bound for {action}" + (" (only for mask modes)" if
                                                                 CONVENTIONS[convention].allow_lower else "")
            + "; use convention canonical or trl")


def shown(name: str, value: float) -> str:
    """A simulator value: shares in percent, weights with four decimals (never a bare 1 or 0)."""
    if value != value:
        return "–"
    if name in FRACTIONS:
        return f"{100 * value:.2f} %"
    return f"{value:.4f}" if 1e-3 <= abs(value) < 1e4 or value == 0 else ui.fmt(value)
