"""Writers of the report files: a list of blocks → report.md and a self-contained report.html, plus metrics.json
and the PNG plots, all into a temporary directory renamed into place (an interrupted report never looks done).
"""
from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rcdiag.checks.evidence import Finding

BADGE = {"ok": "✓ ok", "info": "ℹ info", "warning": "⚠ warning", "error": "✗ error"}


@dataclass
class Block:
    """One piece of a report. kind: h | p | callout | cards | table | findings | image | details | links."""

    kind: str
    text: str = ""
    level: int = 2
    rows: list[Any] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    image: str = ""  # PNG file name (md link; html embeds the bytes from `images`)


def fmt(value: Any) -> str:
    """Numbers for people: NaN/None → '—', tiny or huge → 3 significant digits in e-notation, else 4 digits."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "—"
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4g}"


def slug(text: str) -> str:
    """An HTML id from a heading: 'IS modes at C=2' → 'is-modes-at-c-2'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def plain(obj: Any) -> Any:
    """JSON-safe copy: NaN/±inf → None, numpy scalars → Python, tuples → lists."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, str | bytes):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# ----------------------------------------------------------------------------------------------- markdown
def _md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return fmt(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_findings(findings: Sequence[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"- **{BADGE[f.severity]}** `{f.name}`: {f.message}")
        if f.fix and f.severity in ("warning", "error"):
            lines.append(f"  - *Fix:* {f.fix}")
    return "\n".join(lines)


MD: dict[str, Callable[[Block], str]] = {
    "h": lambda b: "#" * b.level + " " + b.text,
    "p": lambda b: b.text,
    "callout": lambda b: "> " + b.text.replace("\n", "\n> "),
    "cards": lambda b: _md_table(["metric", "value", "95% CI"], [(r[0], r[1], r[2]) for r in b.rows]),
    "table": lambda b: _md_table(b.headers, b.rows),
    "findings": lambda b: _md_findings(b.rows),
    "image": lambda b: f"![{b.text}]({b.image})",
    "details": lambda b: f"<details><summary>{b.text}</summary>\n\n```json\n{b.rows[0]}\n```\n</details>",
    "links": lambda b: " · ".join(f"[{label}]({href})" for label, href in b.rows),
}


def to_markdown(blocks: Sequence[Block]) -> str:
    return "\n\n".join(MD[b.kind](b) for b in blocks) + "\n"


# ----------------------------------------------------------------------------------------------- html
CSS = """
body{font:15px/1.5 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1f2937;background:#f8fafc;margin:0}
main{max-width:1100px;margin:0 auto;padding:24px 32px 64px}
h1{font-size:26px;margin:8px 0 4px}h2{font-size:20px;margin:36px 0 10px;border-bottom:1px solid #e5e7eb;
padding-bottom:4px}h3{font-size:16px;margin:22px 0 8px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(190px,1fr));gap:12px}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:12px 14px;box-shadow:0 1px 2px #0000000d}
.card .label{font-size:12px;color:#6b7280;text-transform:uppercase;letter-spacing:.04em}
.card .value{font-size:22px;font-weight:600;font-variant-numeric:tabular-nums}
.card .ci{font-size:12px;color:#6b7280}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #e5e7eb;padding:4px 8px;text-align:right}th{background:#f1f5f9}
td:first-child,th:first-child{text-align:left}
.finding{background:#fff;border-left:5px solid #9ca3af;border-radius:6px;padding:8px 12px;margin:8px 0}
.finding.error{border-color:#dc2626}.finding.warning{border-color:#d97706}.finding.ok{border-color:#16a34a}
.finding.info{border-color:#2563eb}.badge{font-weight:600;margin-right:6px}
.error .badge{color:#dc2626}.warning .badge{color:#b45309}.ok .badge{color:#15803d}.info .badge{color:#1d4ed8}
.fix{color:#374151;font-size:13px;margin-top:4px}.callout{background:#eef2ff;border:1px solid #c7d2fe;
border-radius:10px;padding:14px 16px;font-size:16px}img{max-width:100%;background:#fff;border:1px solid #e5e7eb;
border-radius:8px;margin:6px 0}pre{background:#0f172a;color:#e2e8f0;padding:12px;border-radius:8px;overflow:auto;
font-size:12px}code{font-size:13px}.muted{color:#6b7280}.scroll{overflow-x:auto;max-width:100%}
.finding.ok{padding:3px 12px;margin:4px 0;font-size:14px;color:#4b5563}
"""


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _html_cards(rows: Sequence[Sequence[Any]]) -> str:
    cards = "".join(f'<div class="card"><div class="label">{html.escape(str(label))}</div>'
                    f'<div class="value">{html.escape(fmt(value))}</div>'
                    f'<div class="ci">{html.escape(ci)}</div></div>' for label, value, ci in rows)
    return f'<div class="cards">{cards}</div>'


def _html_findings(findings: Sequence[Finding]) -> str:
    out = []
    for f in findings:
        fix = (f'<div class="fix"><b>Fix:</b> {html.escape(f.fix)}</div>'
               if f.fix and f.severity in ("warning", "error") else "")
        out.append(f'<div class="finding {f.severity}" data-check="{f.name}"><span class="badge">'
                   f'{BADGE[f.severity]}</span><code>{f.name}</code> — {html.escape(f.message)}{fix}</div>')
    return "".join(out)


def _html(images: dict[str, bytes]) -> dict[str, Callable[[Block], str]]:
    def image(b: Block) -> str:
        data = base64.b64encode(images[b.image]).decode()
        return f'<img alt="{html.escape(b.text)}" src="data:image/png;base64,{data}">'

    return {
        "h": lambda b: f'<h{b.level} id="{slug(b.text)}">{html.escape(b.text)}</h{b.level}>',
        "p": lambda b: f"<p>{html.escape(b.text)}</p>",
        "callout": lambda b: f'<div class="callout">{html.escape(b.text)}</div>',
        "cards": lambda b: _html_cards(b.rows),
        "table": lambda b: _html_table(b.headers, b.rows),
        "findings": lambda b: _html_findings(b.rows),
        "image": image,
        "details": lambda b: f"<details><summary>{html.escape(b.text)}</summary><pre>"
                             f"{html.escape(str(b.rows[0]))}</pre></details>",
        "links": lambda b: "<p>" + " · ".join(f'<a href="{html.escape(href)}">{html.escape(label)}</a>'
                                              for label, href in b.rows) + "</p>",
    }


def to_html(blocks: Sequence[Block], images: dict[str, bytes], title: str) -> str:
    """A self-contained page: inline CSS, plots as base64 PNG, no script, no external resource."""
    writers = _html(images)
    body = "\n".join(writers[b.kind](b) for b in blocks)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width,initial-scale=1"><title>{html.escape(title)}</title><style>{CSS}</style>'
            f"</head><body><main>\n{body}\n</main></body></html>\n")


# ----------------------------------------------------------------------------------------------- files
def render_files(blocks: Sequence[Block], images: dict[str, bytes], data: dict[str, Any],
                 title: str) -> dict[str, bytes]:
    """{file name: bytes} of one report: the PNGs, report.html (self-contained), report.md, metrics.json."""
    return {**images, "report.html": to_html(blocks, images, title).encode(),
            "report.md": to_markdown(blocks).encode(),
            "metrics.json": (json.dumps(plain(data), indent=2, allow_nan=False) + "\n").encode()}
