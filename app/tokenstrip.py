"""The token strip: a response as inline tokens coloured by ℓ = a − b on a diverging scale, with hover details."""
from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd

CLAMP = 20.0
"""ratio = exp(clamp(ℓ, ±20)) in the hover text (METRICS.md ρ_t)."""


def colour(lr: float, scale: float) -> str:
    """Diverging colour of ℓ: blue (a < b, trainer less sure) – white (0) – red (a > b); grey when not finite."""
    if not math.isfinite(lr):
        return "#d0d0d0"
    t = max(-1.0, min(1.0, lr / scale)) if scale > 0 else 0.0
    fade = int(round(255 * (1 - abs(t))))
    return f"rgb(255,{fade},{fade})" if t > 0 else f"rgb({fade},{fade},255)"


def visible(text: str) -> str:
    """Token text with line breaks and tabs made visible (the strip is one flowing line)."""
    return text.replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍") or "∅"


def hover(row: dict, text: str) -> str:
    """The hover text of one token: text, id, position, both log-probs, ℓ, ratio, entropy, mask."""
    a, b = row["train_logprob"], row["rollout_logprob"]
    lr = a - b
    ratio = math.exp(max(-CLAMP, min(CLAMP, lr))) if math.isfinite(lr) else float("nan")
    return (f"{text!r} · id {row['token_id']} · pos {row['pos']}\n"
            f"train a = {a:.6g}\nrollout b = {b:.6g}\nℓ = a − b = {lr:.4g}\nratio = {ratio:.4g}\n"
            f"entropy = {row['train_entropy']:.4g}" + ("" if row["mask"] else "\n(masked: not in the loss)"))


def strip_html(tokens: pd.DataFrame, texts: list[str] | None, scale: float) -> str:
    """HTML of the strip for one sequence's token rows (sorted by pos); `texts` None shows token ids."""
    spans = []
    records = tokens.astype(object).where(tokens.notna(), float("nan")).to_dict("records")
    for i, row in enumerate(records):
        text = texts[i] if texts is not None else f"[{row['token_id']}]"
        lr = float(row["train_logprob"]) - float(row["rollout_logprob"])
        dark = math.isfinite(lr) and scale > 0 and abs(lr) > 0.6 * scale
        style = (f"display:inline-block;background:{colour(lr, scale)};color:{'#fff' if dark else '#111'};"
                 "border-right:1px solid #fff;"
                 + ("" if row["mask"] else "opacity:0.45;text-decoration:line-through;"))
        spans.append(f'<span class="rcdiag-tok" data-pos="{row["pos"]}" title="{html.escape(hover(row, text))}" '
                     f'style="{style}">{html.escape(visible(text))}</span>')
    body = "".join(spans) or "<em>(empty response: no token rows)</em>"
    return ('<div id="rcdiag-token-strip" style="font-family:monospace;white-space:pre-wrap;'
            f'line-height:1.9;font-size:0.95em">{body}</div>')


def legend_html(scale: float) -> str:
    """A small legend of the diverging scale."""
    stops = np.linspace(-scale, scale, 9)
    cells = "".join(f'<span style="background:{colour(v, scale)};padding:0 6px">{v:+.2g}</span>' for v in stops)
    return f'<div style="font-size:0.8em">ℓ = a − b: {cells} (masked tokens faded and struck through)</div>'
