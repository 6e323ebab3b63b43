"""Overview page: the run's verdict and context line (the same as `rcdiag report`'s: rcdiag.analysis.verdict.health,
rcdiag.report.context), headline metric cards coloured by band, the checks with their evidence, the manifest."""
from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from app import bands, charts, data, distview, judged, ui, warm
from app.text import md
from rcdiag.analysis.verdict import health
from rcdiag.report.context import context_line

# A coloured severity word, no icon: ":material/…:" icons load an icon font, and emoji show as empty boxes where
# the machine has no emoji font (headless servers, many Linux desktops).
SEVERITY_COLOURS = {"error": "red", "warning": "orange", "info": "blue", "ok": "green"}
COUNTS = ("tokens", "sequences", "empty_sequences")
FACT_SECTIONS = ("source", "engine", "trainer", "models", "counts")


def render(ref: data.RunRef) -> None:
    st.caption(md(context_line(ref.manifest)))
    report = judged.report(*ref.key)
    st.html(report.verdict.html())
    values = None
    if report.metrics_error:  # bad values on valid positions: the checks below say where they come from
        st.error(f"No metrics for this run: {md(report.metrics_error)}")
    else:
        values = judged.headline(*ref.key)
        st.caption(" · ".join(f"{name.replace('_', ' ')}: {int(values[name]):,}" for name in COUNTS
                              if name in values) + " · canonical convention")
        _cards(values, report.verdict.metric_status)
        _recommendation(ref)
        with st.expander("How the cards are coloured"):
            st.markdown(health.__doc__.split("\n\n", 1)[1])
    _distribution(ref)
    _checks(ref)
    if values is not None:
        table = st.expander("All metrics", key="overview_metrics_open", on_change="rerun")
        if table.open:  # drawn only while open: the table cost ~30 ms of every Overview
            table.dataframe(pd.DataFrame({"metric": list(values), "value": [ui.fmt(v) for v in values.values()]}),
                            hide_index=True, key="overview_all_metrics")
    st.subheader("Run settings")
    facts = manifest_facts(ref.manifest)
    if facts.empty:
        st.caption("The manifest records no engine or trainer settings.")
    else:
        st.dataframe(facts, hide_index=True, key="overview_settings", height=min(35 * (len(facts) + 1) + 3, 600))
    manifest = st.expander("Manifest", key="overview_manifest_open", on_change="rerun")
    if manifest.open:  # the JSON viewer is drawn only while open
        manifest.json(ref.manifest, expanded=1)
    warm.after_overview(*ref.key)


def manifest_facts(manifest: dict, sections: tuple[str, ...] = FACT_SECTIONS) -> pd.DataFrame:
    """(setting, value) rows of the scalar manifest entries under `sections`, nested keys joined by '.'."""
    rows: list[tuple[str, str]] = []

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif not isinstance(value, list):
            rows.append((prefix, "–" if value is None else str(value)))

    for section in sections:
        if section in manifest:
            walk(section, manifest[section])
    return pd.DataFrame(rows, columns=["setting", "value"])


def _cards(values: dict[str, float], statuses: dict[str, str]) -> None:
    """The headline cards, each coloured as the verdict judged it (mean |ℓ| against the run's noise floor)."""
    columns = st.columns(4)
    for i, band in enumerate(bands.BANDS):
        value = values.get(band.metric)
        status = statuses.get(band.metric) or band.classify(value)
        with columns[i % 4]:
            st.html(ui.card(f"{band.label} · {band.metric}", value, status, bands.describe(band)))


def _recommendation(ref: data.RunRef) -> None:
    """The report's next step (rcdiag.report.recommend); the IS simulator marks its setting on the sweep."""
    advice = judged.recommendation(*ref.key)
    where = " The IS simulator marks this setting on its sweep." if advice.get("mode") else ""
    st.info(f"**Recommendation** ({md(advice['kind'].replace('_', ' '))}). {md(advice['text'])}{where}")


def _distribution(ref: data.RunRef) -> None:
    """The ℓ histogram at a glance (the Distributions page's own chart, distview.run_histogram: not that page's
    other charts, which app.warm builds after the Overview): the width of the peak is the mismatch, the tails are
    what an IS correction clips. Drawn here, it also loads the browser's chart library while the Overview is read,
    so the first chart page opens without that wait (~0.4 s)."""
    spec = distview.run_histogram(*ref.key)
    if spec is None:
        return
    c = judged.report(*ref.key).options.threshold  # the run's own C (its recorded trainer setting, else the default)
    st.markdown(f"**Where the mismatch lies**: ℓ = log π_train − log π_rollout of every valid token (log counts). "
                f"A narrow peak at 0 is a healthy run; the tokens right of ℓ = {math.log(c):.2f} (the trainer gives "
                f"them over {c:g}× the engine's probability) are what token_truncate at C = {c:g} clips. More on "
                "the Distributions page.")
    y = {**spec["encoding"]["y"], "title": None, "axis": {"tickCount": 3}}  # the text above says "log counts"
    charts.draw(st, {**spec, "height": 140, "encoding": {**spec["encoding"], "y": y}}, key="overview_hist")


def _checks(ref: data.RunRef) -> None:
    st.subheader("Checks")
    for finding in judged.findings(*ref.key):
        severity = finding["severity"]
        with st.expander(f":{SEVERITY_COLOURS.get(severity, 'gray')}[**{md(severity)}**] · {md(finding['name'])}: "
                         f"{md(finding['message'])}", expanded=severity in ("error", "warning")):
            if finding.get("fix"):
                st.markdown(f"**Fix:** {md(finding['fix'])}")
            if finding.get("evidence"):
                st.json(finding["evidence"], expanded=False)


ui.run_page("Overview", render)
