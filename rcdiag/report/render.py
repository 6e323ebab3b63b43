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
from dataclasses import dataclass, field, replace
from typing import Any

from rcdiag.checks.evidence import Finding
from rcdiag.numbers import fmt  # re-exported: the report's cells use the one formatter
from rcdiag.report.template import render_page

BADGE = {"ok": "✓ ok", "info": "ℹ info", "warning": "⚠ warning", "error": "✗ error"}


@dataclass
class Block:
    """One piece of a report. kind: h | p | context | callout | verdict (text: the line, rows: reasons) | toc |
    cards (rows: label, value, CI[, status]) | table | rawtable (a table folded in <details>) | findings |
    settings (rows: Snippet dicts) | image | details | links."""

    kind: str
    text: str = ""
    level: int = 2
    rows: list[Any] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    image: str = ""  # PNG file name (md link; html embeds the bytes from `images`)
    status: str = ""  # verdict: healthy | warning | alarm
    notes: list[str] = field(default_factory=list)  # verdict: what to do, the rule's source, caveats (labelled)


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
_MD_SPECIAL = re.compile(r"([\\`*\[\]|#])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def md_escape(value: Any) -> str:
    """A data-derived string made inert in Markdown: HTML (&, <, >) as entities, Markdown's markup characters
    backslash-escaped, newlines as spaces (so a response text cannot open a link, a table cell or a tag)."""
    text = html.escape(str(value), quote=False).replace("\r", " ").replace("\n", " ")
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), text)


def numeric_column(rows: Sequence[Sequence[Any]], j: int) -> bool:
    """Whether column j holds only numbers (right-aligned); text columns are left-aligned."""
    values = [row[j] for row in rows if j < len(row) and row[j] is not None and row[j] != ""]
    return bool(values) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    align = ["---:" if numeric_column(rows, j) else ":---" for j in range(len(headers))]
    lines = ["| " + " | ".join(md_escape(h) for h in headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(md_escape(fmt(v)) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_findings(findings: Sequence[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"- **{BADGE[f.severity]}** `{f.name}`: {md_escape(f.message)}")
        if f.fix and f.severity in ("warning", "error"):
            lines.append(f"  - *Fix:* {md_escape(f.fix)}")
    return "\n".join(lines)


def _md_settings(snippets: Sequence[dict[str, Any]]) -> str:
    out = []
    for s in snippets:
        fence = "````" if "```" in s["code"] else "```"
        out.append(f"**{md_escape(s['framework'])}** (checked against {md_escape(s['version'])}: "
                   f"{md_escape(s['source'])})\n\n{fence}{s['language']}\n{s['code']}\n{fence}"
                   + (f"\n\n{md_escape(s['note'])}" if s.get("note") else ""))
    return "\n\n".join(out)


def _md_verdict(b: Block) -> str:
    return (f"> **{md_escape(b.text)}**" + "".join(f"\n> - {md_escape(r)}" for r in b.rows)
            + "".join(f"\n>\n> {md_escape(n)}" for n in b.notes))


MD: dict[str, Callable[[Block], str]] = {
    "h": lambda b: "#" * b.level + " " + md_escape(b.text),
    "p": lambda b: md_escape(b.text),
    "context": lambda b: "*" + md_escape(b.text) + "*",
    "callout": lambda b: "> " + md_escape(b.text),
    "verdict": _md_verdict,
    "toc": lambda b: "**Contents:** " + " · ".join(f"[{md_escape(label)}](#{anchor})" for label, anchor in b.rows),
    "cards": lambda b: _md_table(["metric", "value", "95% CI", "status"], [list(r) + [""] * (4 - len(r))
                                                                          for r in b.rows]),
    "table": lambda b: _md_table(b.headers, b.rows),
    "rawtable": lambda b: f"<details><summary>{html.escape(b.text)}</summary>\n\n{_md_table(b.headers, b.rows)}"
                          "\n\n</details>",
    "findings": lambda b: _md_findings(b.rows),
    "settings": lambda b: _md_settings(b.rows),
    "image": lambda b: f"![{md_escape(b.text)}]({b.image})",
    "details": lambda b: f"<details><summary>{html.escape(b.text)}</summary>\n\n```json\n{b.rows[0]}\n```\n</details>",
    "links": lambda b: " · ".join(f"[{md_escape(label)}]({href})" for label, href in b.rows),
}


def with_toc(blocks: Sequence[Block]) -> list[Block]:
    """The blocks with each 'toc' block listing the level-2 headings."""
    links = [(b.text, slug(b.text)) for b in blocks if b.kind == "h" and b.level == 2]
    return [replace(b, rows=links) if b.kind == "toc" else b for b in blocks]


def to_markdown(blocks: Sequence[Block]) -> str:
    return "\n\n".join(MD[b.kind](b) for b in with_toc(blocks)) + "\n"


# ----------------------------------------------------------------------------------------------- html
def _prepare(b: Block, images: dict[str, bytes]) -> dict[str, Any]:
    """A block as the template's plain strings (the template escapes them)."""
    item: dict[str, Any] = {"kind": b.kind, "text": b.text, "level": b.level, "status": b.status}
    if b.kind in ("table", "rawtable"):
        item.update(headers=b.headers, cells=[[fmt(v) for v in row] for row in b.rows],
                    align=["num" if numeric_column(b.rows, j) else "text" for j in range(len(b.headers))])
    elif b.kind == "h":
        item["anchor"] = slug(b.text)
    elif b.kind == "verdict":
        item["reasons"] = [str(r) for r in b.rows]
        item["notes"] = [str(n) for n in b.notes]
    elif b.kind in ("toc", "links"):
        item["links"] = b.rows
    elif b.kind == "cards":
        item["cards"] = [{"label": str(r[0]), "value": fmt(r[1]), "ci": r[2], "status": r[3] if len(r) > 3 else ""}
                         for r in b.rows]
    elif b.kind == "findings":
        item["findings"] = [{"severity": f.severity, "name": f.name, "badge": BADGE[f.severity],
                             "message": f.message,
                             "fix": f.fix if f.fix and f.severity in ("warning", "error") else ""} for f in b.rows]
    elif b.kind == "settings":
        item["snippets"] = b.rows
    elif b.kind == "image":
        item["data"] = base64.b64encode(images[b.image]).decode()
    elif b.kind == "details":
        item["body"] = str(b.rows[0])
    return item


def to_html(blocks: Sequence[Block], images: dict[str, bytes], title: str) -> str:
    """A self-contained page (rcdiag.report.template): inline CSS, plots as base64 PNG, no script, no external
    resource; every string escaped by Jinja2's autoescape."""
    return render_page([_prepare(b, images) for b in with_toc(blocks)], title)


# ----------------------------------------------------------------------------------------------- files
def render_files(blocks: Sequence[Block], images: dict[str, bytes], data: dict[str, Any],
                 title: str) -> dict[str, bytes]:
    """{file name: bytes} of one report: the PNGs, report.html (self-contained), report.md, metrics.json."""
    return {**images, "report.html": to_html(blocks, images, title).encode(),
            "report.md": to_markdown(blocks).encode(),
            "metrics.json": (json.dumps(plain(data), indent=2, allow_nan=False) + "\n").encode()}
