"""The report.html template (Jinja2, autoescaped: every data string is escaped) and its stylesheet.

The page is self-contained: inline CSS, plots as base64 PNG, no script and no external resource. The template
only lays out; rcdiag.report.render prepares every block's strings (numbers formatted, cells aligned).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

CSS = """
body{font:15px/1.5 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1f2937;background:#f8fafc;margin:0}
main{max-width:1100px;margin:0 auto;padding:24px 32px 64px}
h1{font-size:26px;margin:8px 0 4px}h2{font-size:20px;margin:36px 0 10px;border-bottom:1px solid #e5e7eb;
padding-bottom:4px}h3{font-size:16px;margin:22px 0 8px}.context{color:#4b5563;font-size:14px}
.verdict{border-radius:12px;padding:14px 18px;margin:14px 0;color:#fff}.verdict .status{font-size:24px;
font-weight:700;letter-spacing:.03em}.verdict ul{margin:6px 0 0 18px;padding:0}.verdict li{margin:2px 0}
.verdict.healthy{background:#1a7f37}.verdict.warning{background:#b7791f}.verdict.alarm{background:#c62828}
.verdict.n\\/a{background:#6b7280}.verdict .note{margin:6px 0 0;font-size:14px}
.toc{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:8px 16px;font-size:14px}
.toc a{margin-right:14px;white-space:nowrap}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(190px,1fr));gap:12px}
.card{background:#fff;border:1px solid #e5e7eb;border-top:5px solid #9ca3af;border-radius:10px;padding:10px 14px}
.card.healthy{border-top-color:#1a7f37}.card.warning{border-top-color:#b7791f}.card.alarm{border-top-color:#c62828}
.card .label{font-size:12px;color:#6b7280;text-transform:uppercase;letter-spacing:.04em}
.card .value{font-size:22px;font-weight:600;font-variant-numeric:tabular-nums}
.card .ci,.card .band{font-size:12px;color:#6b7280}.card .st{font-size:12px;font-weight:600}
.card.healthy .st{color:#1a7f37}.card.warning .st{color:#b7791f}.card.alarm .st{color:#c62828}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #e5e7eb;padding:4px 8px;text-align:right;vertical-align:top}th{background:#f1f5f9}
td.text,th.text{text-align:left}
.finding{background:#fff;border-left:5px solid #9ca3af;border-radius:6px;padding:8px 12px;margin:8px 0}
.finding.error{border-color:#dc2626}.finding.warning{border-color:#d97706}.finding.ok{border-color:#16a34a}
.finding.info{border-color:#2563eb}.badge{font-weight:600;margin-right:6px}
.error .badge{color:#dc2626}.warning .badge{color:#b45309}.ok .badge{color:#15803d}.info .badge{color:#1d4ed8}
.fix{color:#374151;font-size:13px;margin-top:4px}.callout{background:#eef2ff;border:1px solid #c7d2fe;
border-radius:10px;padding:14px 16px;font-size:16px}img{max-width:100%;background:#fff;border:1px solid #e5e7eb;
border-radius:8px;margin:6px 0}pre{background:#0f172a;color:#e2e8f0;padding:12px;border-radius:8px;overflow:auto;
font-size:12px}code{font-size:13px}.muted{color:#6b7280}.scroll{overflow-x:auto;max-width:100%}
.finding.ok{padding:3px 12px;margin:4px 0;font-size:14px;color:#4b5563}
details{margin:8px 0}summary{cursor:pointer;color:#1d4ed8}
.snippet{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:8px 14px;margin:8px 0}
.snippet .head{font-weight:600}.snippet .src{font-size:12px;color:#6b7280}.snippet .note{font-size:13px}
"""

TEMPLATE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1"><title>{{ title }}</title>
<style>{{ css|safe }}</style></head><body><main>
{% macro table(b) -%}
<div class="scroll"><table><thead><tr>{% for h in b.headers %}<th class="{{ b.align[loop.index0] }}">{{ h }}</th>
{%- endfor %}</tr></thead><tbody>{% for row in b.cells %}<tr>{% for v in row %}
<td class="{{ b.align[loop.index0] }}">{{ v }}</td>{% endfor %}</tr>{% endfor %}</tbody></table></div>
{%- endmacro %}
{% for b in blocks %}
{%- if b.kind == "h" %}<h{{ b.level }} id="{{ b.anchor }}">{{ b.text }}</h{{ b.level }}>
{%- elif b.kind == "p" %}<p>{{ b.text }}</p>
{%- elif b.kind == "context" %}<p class="context">{{ b.text }}</p>
{%- elif b.kind == "callout" %}<div class="callout">{{ b.text }}</div>
{%- elif b.kind == "verdict" %}<div class="verdict {{ b.status }}" data-status="{{ b.status }}">
<div class="status">{{ b.text }}</div>{% if b.reasons %}<ul>{% for r in b.reasons %}<li>{{ r }}</li>{% endfor %}
</ul>{% endif %}{% for n in b.notes %}<p class="note">{{ n }}</p>{% endfor %}</div>
{%- elif b.kind == "toc" %}<nav class="toc"><b>Contents</b> {% for label, anchor in b.links %}
<a href="#{{ anchor }}">{{ label }}</a>{% endfor %}</nav>
{%- elif b.kind == "cards" %}<div class="cards">{% for c in b.cards %}<div class="card {{ c.status }}">
<div class="label">{{ c.label }}</div><div class="value">{{ c.value }}</div><div class="ci">{{ c.ci }}</div>
{% if c.status %}<div class="st">{{ c.status }}</div>{% endif %}</div>{% endfor %}</div>
{%- elif b.kind == "table" %}{{ table(b) }}
{%- elif b.kind == "rawtable" %}<details><summary>{{ b.text }}</summary>{{ table(b) }}</details>
{%- elif b.kind == "findings" %}{% for f in b.findings %}<div class="finding {{ f.severity }}"
 data-check="{{ f.name }}"><span class="badge">{{ f.badge }}</span><code>{{ f.name }}</code> — {{ f.message }}
{% if f.fix %}<div class="fix"><b>Fix:</b> {{ f.fix }}</div>{% endif %}</div>{% endfor %}
{%- elif b.kind == "settings" %}{% for s in b.snippets %}<div class="snippet"><div class="head">{{ s.framework }}
</div><div class="src">checked against {{ s.version }}: {{ s.source }}</div><pre><code>{{ s.code }}</code></pre>
{% if s.note %}<div class="note">{{ s.note }}</div>{% endif %}</div>{% endfor %}
{%- elif b.kind == "image" %}<img alt="{{ b.text }}" src="data:image/png;base64,{{ b.data }}">
{%- elif b.kind == "details" %}<details><summary>{{ b.text }}</summary><pre>{{ b.body }}</pre></details>
{%- elif b.kind == "links" %}<p>{% for label, href in b.links %}{% if not loop.first %} · {% endif %}
<a href="{{ href }}">{{ label }}</a>{% endfor %}</p>
{%- endif %}
{% endfor %}
</main></body></html>
"""


@lru_cache(maxsize=1)
def _template() -> Any:
    from jinja2 import Environment

    return Environment(autoescape=True, trim_blocks=False).from_string(TEMPLATE)


def render_page(blocks: list[dict[str, Any]], title: str) -> str:
    """The page of prepared `blocks` (dicts with a 'kind'; see render._prepare)."""
    return _template().render(blocks=blocks, title=title, css=CSS)
