"""Overview page: headline metric cards coloured by band, the checks with their evidence, the run manifest."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import bands, data, ui

SEVERITY_ICONS = {"error": ":material/error:", "warning": ":material/warning:", "info": ":material/info:",
                  "ok": ":material/check_circle:"}
COUNTS = ("tokens", "sequences", "empty_sequences")


def render(ref: data.RunRef) -> None:
    values = data.headline(*ref.key)
    st.caption(" · ".join(f"{name.replace('_', ' ')}: {int(values[name]):,}" for name in COUNTS if name in values)
               + " · canonical convention")
    _cards(values)
    with st.expander("How the cards are coloured"):
        st.markdown(bands.__doc__.split("\n\n", 1)[1])
    _checks(ref)
    with st.expander("All metrics"):
        st.dataframe(pd.DataFrame({"metric": list(values), "value": [ui.fmt(v) for v in values.values()]}),
                     hide_index=True, key="overview_all_metrics")
    with st.expander("Manifest"):
        st.json(ref.manifest, expanded=1)


def _cards(values: dict[str, float]) -> None:
    columns = st.columns(4)
    for i, band in enumerate(bands.BANDS):
        value = values.get(band.metric)
        status = band.classify(value)
        with columns[i % 4]:
            st.html(ui.card(f"{band.label} · {band.metric}", value, status, bands.describe(band)))


def _checks(ref: data.RunRef) -> None:
    st.subheader("Checks")
    for finding in data.findings(*ref.key):
        with st.expander(f"{finding['severity']} · {finding['name']}: {finding['message']}",
                         expanded=finding["severity"] in ("error", "warning"),
                         icon=SEVERITY_ICONS.get(finding["severity"])):
            if finding.get("fix"):
                st.markdown(f"**Fix:** {finding['fix']}")
            if finding.get("evidence"):
                st.json(finding["evidence"], expanded=False)


ui.run_page("Overview", render)
