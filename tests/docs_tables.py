"""The tables of docs/*.md that are generated from the code, and the tool that rewrites them.

A generated table sits between `<!-- generated: NAME -->` and `<!-- end generated: NAME -->` in its document;
tests/test_docs.py checks that each block equals what the code gives now, so a doc cannot drift from the layer
rules, the gate families or the health bands. After changing one of those, rewrite the blocks:

    python -m tests.docs_tables            # from the repository root
"""
from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def cell(text: object) -> str:
    """A Markdown table cell: a `|` inside it (|ℓ|, |value|) escaped so that it does not split the row."""
    return str(text).replace("|", "\\|")


def _layer_order() -> list[str]:
    from tests.test_imports import ALLOWED

    return list(ALLOWED)


def _layer_members(layer: str) -> str:
    """What makes up a layer, in words: its top-level modules (LAYER_OF) or its subpackage."""
    from tests.test_imports import LAYER_OF

    modules = sorted(m for m, name in LAYER_OF.items() if name == layer)
    if layer == "app":
        return "`app/` (the dashboard)"
    if modules:
        return ", ".join(f"`{m}`" for m in modules)
    return f"`rcdiag/{layer}/`"


def layer_table() -> str:
    """tests/test_imports.py's ALLOWED as a table: each layer, what it is, what it may import (itself included where
    the rule says so), and which other layers may import it."""
    from tests.test_imports import ALLOWED

    order = _layer_order()
    lines = ["| layer | modules | may import | imported by |", "|---|---|---|---|"]
    for layer in order:
        allowed = [other for other in order if other in ALLOWED[layer]]
        users = [other for other in order if other != layer and layer in ALLOWED[other]]
        lines.append(f"| {layer} | {_layer_members(layer)} | {', '.join(allowed) or '—'} | "
                     f"{', '.join(users) or 'nothing'} |")
    return "\n".join(lines)


def wing_table() -> str:
    """tests/test_imports.py's WINGS as a table: each wing of rcdiag/analysis/, its purpose (the wing's docstring), its
    modules and the wings it may import."""
    import ast

    from tests.test_imports import WINGS

    lines = ["| wing | what it does | modules | may import |", "|---|---|---|---|"]
    for i, name in enumerate(WINGS):
        folder = ROOT / "rcdiag" / "analysis" / name
        purpose = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        modules = ", ".join(f"`{f.stem}`" for f in sorted(folder.glob("*.py")) if f.stem != "__init__")
        lower = ", ".join(["ground", *WINGS[:i]])
        lines.append(f"| `{name}/` | {cell(' '.join(purpose.split()))} | {modules} | {lower} |")
    return "\n".join(lines)


def gate_table() -> str:
    """Every gate family of rcdiag.analysis.correction.gate_defs.GATES: framework, statistic, level, rule, bounds, default δ
    and the sweep's δ grid."""
    from rcdiag.analysis.correction.gate_defs import GATE_LIST

    lines = ["| gate | framework | statistic | level (reduce) | rule | bounds from δ | default δ | survivors "
             "weigh | sweep grid |", "|---|---|---|---|---|---|---|---|---|"]
    for g in GATE_LIST:
        level = g.level if g.level == "token" else f"{g.level} ({g.reduce})"
        bounds = g.bounds + (f", low {g.default_lower:g}" if g.default_lower is not None else "")
        clamp = f", ±{g.clamp:g} clamp" if g.clamp else ""
        grid = ", ".join(f"{x:g}" for x in g.grid)
        lines.append(f"| `{g.name}` | {g.framework} | {g.statistic}{clamp} | {level} | {g.rule} | {bounds} | "
                     f"{g.default:g} | {'ρ' if g.weight == 'ratio' else '1'} | {grid} |")
    return "\n".join(lines)


def band_table() -> str:
    """rcdiag.analysis.verdict.health.BANDS: the metric, what it is, the healthy range, the alarm edge (a warning lies
    between) and the band's source."""
    from rcdiag.analysis.verdict.health import ALARM, BANDS, HEALTHY

    lines = ["| metric | what | healthy | alarm (a warning lies between) | source |", "|---|---|---|---|---|"]
    for band in BANDS:
        cells = (f"`{band.metric}`", band.label, band.limit(HEALTHY), band.limit(ALARM), band.source)
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(lines)


TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "layers": ("design.md", layer_table),
    "wings": ("design.md", wing_table),
    "gates": ("metrics.md", gate_table),
    "bands": ("metrics.md", band_table),
}
"""Generated block name → (document under docs/, the function that renders it)."""


def block_pattern(name: str) -> re.Pattern[str]:
    """The generated block `name`: its opening marker, the body (group 1) and its closing marker."""
    return re.compile(rf"<!-- generated: {re.escape(name)} -->\n(.*?)\n<!-- end generated: {re.escape(name)} -->",
                      re.S)


def current_block(name: str) -> str | None:
    """The body of block `name` as its document holds it now (None when the markers are missing)."""
    document, _ = TABLES[name]
    match = block_pattern(name).search((DOCS / document).read_text(encoding="utf-8"))
    return None if match is None else match.group(1)


def rewrite() -> list[str]:
    """Rewrite every generated block from the code; returns the names of the blocks that changed."""
    changed = []
    for name, (document, render) in TABLES.items():
        path = DOCS / document
        text = path.read_text(encoding="utf-8")
        pattern = block_pattern(name)
        if not pattern.search(text):
            raise SystemExit(f"{path}: no '<!-- generated: {name} -->' … '<!-- end generated: {name} -->' block")
        block = f"<!-- generated: {name} -->\n{render()}\n<!-- end generated: {name} -->"
        new = pattern.sub(lambda _match, block=block: block, text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(name)
    return changed


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    done = rewrite()
    print("rewrote: " + (", ".join(done) if done else "nothing (every block is current)"))
