"""The token strip: a response as inline tokens coloured by ℓ = a − b on a diverging scale, with hover details.

Sign (docs/metrics.md): ℓ = a − b with a = the trainer's log-prob and b = the engine's (rollout) log-prob. Red: ℓ > 0,
the trainer gives the token more probability than the engine (IS weight > 1: truncated or masked above C); blue:
ℓ < 0, the trainer gives it less (weight < 1). The page draws at most WINDOW tokens at a time (issue #20.11: one
400k-token response was 101 MB of HTML), each as a span of ~250 bytes, the shared style in one class.
"""
from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd

CLAMP = 20.0
"""ratio = exp(clamp(ℓ, ±20)) in the hover text (docs/metrics.md ρ_t)."""
WINDOW = 1500
"""Most tokens drawn at once (≈ 0.4 MB of HTML); longer responses are paged by position."""
STYLE = ("<style>#rcdiag-token-strip{font-family:monospace;white-space:pre-wrap;line-height:1.9;font-size:0.95em}"
         "#rcdiag-token-strip .rcdiag-tok{display:inline-block;border-right:1px solid #d4d4d8;color:#111}"
         "#rcdiag-token-strip .dark{color:#fff}"
         "#rcdiag-token-strip .off{opacity:0.45;text-decoration:line-through}</style>")
LEGEND_WORDS = ("red: the trainer gives the token more probability than the engine (ℓ = a − b > 0, IS weight > 1); "
                "blue: the trainer gives it less (ℓ < 0, weight < 1); white: both agree; grey: a log-prob missing; "
                "faded and struck through: masked (not in the loss)")


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
            f"trainer a = {a:.6g}\nengine b = {b:.6g}\nℓ = a − b = {lr:.4g}\nratio = {ratio:.4g}\n"
            f"entropy = {row['train_entropy']:.4g}" + ("" if row["mask"] else "\n(masked: not in the loss)"))


def windows(n: int, size: int = WINDOW) -> list[tuple[int, int]]:
    """[start, stop) row ranges of at most `size` tokens covering n rows (one empty window when n = 0)."""
    return [(lo, min(lo + size, n)) for lo in range(0, max(n, 1), size)]


def strip_html(tokens: pd.DataFrame, texts: list[str] | None, scale: float) -> str:
    """HTML of the strip for token rows (sorted by pos; pass one window); `texts` None shows token ids.
    Raises ValueError past WINDOW rows: the caller pages (an unbounded strip froze the browser)."""
    if len(tokens) > WINDOW:
        raise ValueError(f"{len(tokens)} tokens: draw at most {WINDOW} at a time (page by position)")
    spans = []
    records = tokens.astype(object).where(tokens.notna(), float("nan")).to_dict("records")
    for i, row in enumerate(records):
        text = texts[i] if texts is not None else f"[{row['token_id']}]"
        lr = float(row["train_logprob"]) - float(row["rollout_logprob"])
        classes = "rcdiag-tok" + (" dark" if math.isfinite(lr) and scale > 0 and abs(lr) > 0.6 * scale else "") \
            + ("" if row["mask"] else " off")
        spans.append(f'<span class="{classes}" data-pos="{row["pos"]}" title="{html.escape(hover(row, text))}" '
                     f'style="background:{colour(lr, scale)}">{html.escape(visible(text))}</span>')
    body = "".join(spans) or "<em>(empty response: no token rows)</em>"
    return f'{STYLE}<div id="rcdiag-token-strip">{body}</div>'


def legend_html(scale: float) -> str:
    """The diverging scale with its stops, and what the colours mean in words."""
    stops = np.linspace(-scale, scale, 9)
    cells = "".join(f'<span style="background:{colour(v, scale)};padding:0 6px;color:'
                    f'{"#fff" if abs(v) > 0.6 * scale else "#111"}">{v:+.2g}</span>' for v in stops)
    return (f'<div id="rcdiag-legend" style="font-size:0.85em">ℓ = a − b (trainer − engine, nats): {cells}'
            f'<br>{html.escape(LEGEND_WORDS)}</div>')
